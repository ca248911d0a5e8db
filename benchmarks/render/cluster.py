"""Cluster shape: docs/benchmarks.md's ratio, metadata, codec time and speed against the ceiling at 8 and 16 ranks and
26 to 1,000 tables."""

from __future__ import annotations

from benchmarks.lib.cluster_scale import table
from benchmarks.lib.rule import verdict_text
from benchmarks.render.core import Block, Results, source_line


def cluster_scale(results: Results) -> list[str]:
    d = results.get("cluster_scale.json")
    cfg = d["config"]
    lines = [
        source_line("cluster_scale.json", d, results.shown), "",
        f"Every table {cfg['rows']:,} rows of dim {cfg['dim']}, batches of {cfg['batch_size']} per rank, eps"
        f" {cfg['eps']} both directions, all ranks of a launch on one loopback shaped to {cfg['rate']} (and on this"
        f" machine's {d['metadata'].get('cores')} cores); {cfg['warmup']} warm-up steps, then {cfg['repeats']} pairs"
        f" of {cfg['block']}-step blocks (DLAC, ceiling) in ABBA order. A step is the slowest rank's; encode,"
        " exchange and decode are the forward exchange's, backward the whole gradient exchange, per step and rank;"
        " metadata is 56 bytes per chunk (the 48-byte header and the size record) against the forward bytes sent.", "",
        *table(d["results"]), "",
    ]
    for t in d.get("targets") or []:
        lines.append(f"- {t['target']}: {verdict_text(t)}")
    by = {(r["world_size"], r["tables"]): r for r in d["results"]}
    big, small = by.get((16, 500)), by.get((16, 26))
    if big and small:
        fwd = big["forward_ratio"] / small["forward_ratio"]
        bwd = big["backward_ratio"] / small["backward_ratio"]
        lines += ["", f"Direction by direction (not a target of its own, read after the run): the forward exchange,"
                  f" whose chunks are the tables' pooled embeddings and so the same data per table whatever their"
                  f" number, keeps {fwd:.2f}x of its 26-table ratio at 500 tables x 16 ranks"
                  f" ({big['forward_ratio']:.1f}x against {small['forward_ratio']:.1f}x); the gradients sent back"
                  f" depend on the whole model, whose dense part grows with the table count, and compress"
                  f" {bwd:.2f}x as well ({big['backward_ratio']:.1f}x against {small['backward_ratio']:.1f}x). The"
                  f" per-chunk metadata stays the same share of the bytes at every chunk count."]
    return lines


BLOCKS = {"cluster_scale": Block(("cluster_scale.json",), cluster_scale)}
