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
    return lines


BLOCKS = {"cluster_scale": Block(("cluster_scale.json",), cluster_scale)}
