"""The checkpoint benchmark's tables (``python -m benchmarks.checkpoint_bench``): save and load per rank by model
scale, with and without checksums, and the restart after a killed worker phase by phase (docs/benchmarks.md,
docs/multinode.md).
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.lib.rule import span


def per_scale(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per table scale: the slowest rank's median save and load with checksums (the default) and
    without, the slowest rank's CRC32 of its own files, the sizes."""
    def slowest(ranks: list[dict[str, Any]], key: str) -> float:
        return max(statistics.median(r[key]) for r in ranks)

    rows = {(row["scale"], row.get("verify", True)): row["ranks"] for row in results if row["kind"] == "save_load"}
    out = []
    for (scale, verify), ranks in rows.items():
        if not verify:
            continue
        plain = rows.get((scale, False))
        out.append(dict(scale=scale, table_rows=ranks[0]["table_rows"], total_bytes=ranks[0]["total_bytes"],
                        shard_bytes=max(r["rank_shard_bytes"] for r in ranks),
                        save_s=slowest(ranks, "save_s"), load_s=slowest(ranks, "load_s"),
                        save_plain_s=slowest(plain, "save_s") if plain else None,
                        load_plain_s=slowest(plain, "load_s") if plain else None,
                        checksum_s=max(r.get("checksum_s", float("nan")) for r in ranks),
                        checksum_bytes=max(r.get("checksum_bytes", 0) for r in ranks),
                        repeats=len(ranks[0]["save_s"])))  # fmt: skip
    return out


def restart_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r["kind"] == "restart"]


def _checksum(s: dict[str, Any]) -> str:
    """The slowest rank's CRC32 of its own files: time, size, rate."""
    mib = s["checksum_bytes"] / 2**20
    return f"{s['checksum_s']:.2f} s ({mib:.0f} MiB, {mib / s['checksum_s']:,.0f} MiB/s)"


def model_name(scale: int) -> str:
    return "demo (dlrm_synthetic.yaml)" if scale == 1 else f"demo, tables x{scale}"


def tables(results: list[dict[str, Any]]) -> list[str]:
    """The markdown tables of a results file's rows (docs/benchmarks.md's ``render:checkpoint`` block)."""
    lines = ["| model | table rows | checkpoint | largest rank's shards | save per rank (median) | load per rank"
             " (median) | the same with `CheckpointOptions(verify=False)`: save / load | CRC32 of a rank's own files |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in per_scale(results):
        plain = (f"{s['save_plain_s']:.2f} s / {s['load_plain_s']:.2f} s" if s["save_plain_s"] is not None
                 else "not measured")  # fmt: skip
        lines.append(f"| {model_name(s['scale'])} | {s['table_rows']:,} | {s['total_bytes'] / 2**20:.0f} MiB |"
                     f" {s['shard_bytes'] / 2**20:.0f} MiB | {s['save_s']:.2f} s | {s['load_s']:.2f} s | {plain} |"
                     f" {_checksum(s)} |")
    restarts = restart_runs(results)
    if restarts:
        lines += ["", "| run | killed after step | resumed from | kill to first resumed step | of which: respawn |"
                  " imports + CLI | rendezvous | shard + restore + sanity | first step | back at the killed step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for i, r in enumerate(restarts):
            lines.append(f"| {i + 1} | {r['kill_step']} | {r['resumed_from']} | {r['kill_to_first_step_s']:.1f} s |"
                         f" {r['detect_and_respawn_s']:.1f} s | {r['imports_and_cli_s']:.1f} s |"
                         f" {r['rendezvous_s']:.1f} s | {r['shard_restore_sanity_s']:.1f} s |"
                         f" {r['first_step_s']:.1f} s | {r['kill_to_killed_step_s']:.1f} s |")  # fmt: skip
    return lines


def multinode_lines(results: list[dict[str, Any]]) -> list[str]:
    """What a failure costs, for docs/multinode.md's ``render:multinode_restart`` block: save and load per rank by
    model, the restart's phases run by run, and the sentence that sums them up."""
    scales = per_scale(results)
    restarts = restart_runs(results)
    head = " | ".join(f"{model_name(s['scale'])}: {s['total_bytes'] / 2**20:.0f} MiB checkpoint" for s in scales)
    lines = [f"| what | {head} |", "|---|" + "---|" * len(scales),
             f"| save, per rank (`trainer.save_checkpoint`: shards, checksums, `meta.pt`, fsync, checks, switch;"
             f" median of {scales[0]['repeats']}, the slower rank) | "
             + " | ".join(f"{s['save_s']:.2f} s" for s in scales) + " |",
             "| load, per rank (checks + checksums + shards + fused optimizer state; page cache warm) | "
             + " | ".join(f"{s['load_s']:.2f} s" for s in scales) + " |",
             "| the same without checksums (`CheckpointOptions(verify=False)`): save / load | "
             + " | ".join(f"{s['save_plain_s']:.2f} s / {s['load_plain_s']:.2f} s" if s["save_plain_s"] is not None
                          else "not measured" for s in scales) + " |",
             "| CRC32 of one rank's own files (what each rank adds to a save) | "
             + " | ".join(_checksum(s) for s in scales) + " |"]  # fmt: skip
    measured = [s for s in scales if s["save_plain_s"] is not None]
    if measured:
        lines += ["", "The checksums (`CheckpointOptions(verify=True)`, the default) add "
                  + ", ".join(f"{s['save_s'] - s['save_plain_s']:.2f} s to a save and"
                              f" {s['load_s'] - s['load_plain_s']:.2f} s to a load per rank for the"
                              f" {s['total_bytes'] / 2**20:.0f} MiB checkpoint" for s in measured)
                  + " (differences of medians on this machine; the CRC32 alone runs at "
                  + " and ".join(f"{s['checksum_bytes'] / 2**20 / s['checksum_s']:,.0f} MiB/s" for s in measured)
                  + " from the page cache)."]  # fmt: skip
    if not restarts:
        return lines + ["", "(This run measured no restart: `--restarts 0`.)"]
    first = restarts[0]
    runs = " | ".join(f"run {i + 1}" for i in range(len(restarts)))
    lines += ["", f"| restart of the demo (`dlrm_elastic.yaml`), one of 2 workers killed after step"
              f" {first['kill_step']} | {runs} |", "|---|" + "---|" * len(restarts)]
    for label, key in (
            (f"from the kill to the first resumed step ({first['resumed_from'] + 1})", "kill_to_first_step_s"),
            ("of which: torchrun notices and starts new workers", "detect_and_respawn_s"),
            ("imports and argument parsing", "imports_and_cli_s"), ("rendezvous", "rendezvous_s"),
            ("sharding, checkpoint load, sanity validation", "shard_restore_sanity_s"),
            ("the first step", "first_step_s"),
            (f"from the kill until the run is back at step {first['kill_step']}"
             f" ({first['kill_step'] - first['resumed_from']} steps replayed)", "kill_to_killed_step_s")):
        lines.append(f"| {label} | " + " | ".join(f"{r[key]:.1f} s" for r in restarts) + " |")
    total = [r["kill_to_first_step_s"] for r in restarts]
    imports = [r["imports_and_cli_s"] for r in restarts]
    lines += ["", f"So a failure costs the restart (here {span(total, '.0f')} s, of which {span(imports, '.0f')} s"
              " are the new processes' Python imports and argument parsing) plus the steps since the last checkpoint,"
              " trained again on the same batches; nothing else is lost."]
    return lines
