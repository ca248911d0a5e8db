"""Checkpoints and restarts: docs/benchmarks.md's save and load per rank, docs/multinode.md's restart after a killed
worker and the checkpoint interval it suggests."""

from __future__ import annotations

import statistics

from benchmarks.lib.checkpoint import model_name, multinode_lines, per_scale, restart_runs
from benchmarks.lib.checkpoint import tables as checkpoint_tables
from benchmarks.render.core import Block, Results, source_line


def checkpoint(results: Results) -> list[str]:
    d = results.get("checkpoint_bench.json")
    return [source_line("checkpoint_bench.json", d, results.shown), "", *checkpoint_tables(d["results"])]


def multinode_restart(results: Results) -> list[str]:
    d = results.get("checkpoint_bench.json")
    return [source_line("checkpoint_bench.json", d, results.shown) + " Checkpoints on local disk; the load average"
            " says how busy the machine was (a loaded machine's times are well above an idle node's).", "",
            *multinode_lines(d["results"])]


# An example job's mean time between failures of the whole job, for the checkpoint interval (an assumption, stated as
# one: a rank lost every 4 hours).
EXAMPLE_MTBF_S = 4 * 3600


def restart_interval(results: Results) -> list[str]:
    """Young's checkpoint interval for an example job, with the save and restart times measured here."""
    d = results.get("checkpoint_bench.json")
    scales = per_scale(d["results"])
    restarts = restart_runs(d["results"])
    if not scales or not restarts:
        return [source_line("checkpoint_bench.json", d, results.shown), "", "(This run measured no save or restart.)"]
    big = max(scales, key=lambda sc: sc["scale"])
    c = big["save_s"]
    r = statistics.median(x["kill_to_first_step_s"] for x in restarts)
    m = EXAMPLE_MTBF_S
    t = (2 * c * m) ** 0.5
    return [source_line("checkpoint_bench.json", d, results.shown), "",
            f"For example, with the save measured here for the {model_name(big['scale'])} model,"
            f" `C = {c:.2f} s`, and the restart measured here (kill to the first resumed step), `R = {r:.1f} s`, on a"
            f" job that loses a rank every {m / 3600:.0f} hours (`M = {m:,} s`, an assumption): `T = {t:.0f} s`,"
            f" costing {c / t:.2%} of the time in saves and {t / 2 / m:.2%} in replayed steps, plus `R / M`"
            f" ({r / m:.2%}) for restarts."]


BLOCKS = {
    "checkpoint": Block(("checkpoint_bench.json",), checkpoint),
    "multinode_restart": Block(("checkpoint_bench.json",), multinode_restart),
    "restart_interval": Block(("checkpoint_bench.json",), restart_interval),
}
