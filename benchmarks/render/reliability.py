"""Long runs: docs/reliability.md's soak (memory, files, threads and step time over a 20,000-step run) and its plot."""

from __future__ import annotations

from typing import Any

from benchmarks.lib.soak import table
from benchmarks.render.core import Block, Results, source_line
from benchmarks.render.figures import Figure


def soak(results: Results) -> list[str]:
    d = results.get("soak.json")
    cfg, outcome = d["config"], d["outcome"]
    saves = len(outcome["checkpoints"])
    return [
        source_line("soak.json", d, results.shown), "",
        f"{min(outcome['steps']):,} training steps on {cfg['world_size']} ranks ({cfg['model']}; batches of"
        f" {cfg['batch_size']} per rank, epochs of {cfg['epoch_batches']:,}, a 4-batch validation after each), a"
        f" checkpoint every {cfg['checkpoint_every']:,} steps ({', '.join(outcome['checkpoints'])} at the end:"
        f" {'the save replaced in place each time' if saves == 1 else f'{saves} entries'}), the callback calibrating"
        f" first at step {cfg['calibration_start']} and every {cfg['recalibrate_every']:,} after;"
        f" the report was {'written' if outcome['report_written'] else '**not** written'}. Growth is the Theil-Sen"
        f" slope after the first {cfg['warmup']:,} steps, as a share of the median; step time is the median of each"
        " window of 250 steps, leaving out the steps that checkpointed, validated or began an epoch, in CPU seconds"
        " (the process's, all threads: what the run itself spends, which its neighbours on the machine do not move)"
        " and in wall-clock seconds, judged only where the machine's load average stayed within 25% of its median.",
        "",
        *table(d["judgement"]), "",
        "![Resident memory and step time over the soak](figures/soak.svg)",
    ]


def draw_soak(results: Results, fig: Any) -> None:
    d = results.get("soak.json")
    warmup = d["config"]["warmup"]
    memory, cpu, wall = fig.subplots(3, 1, sharex=True)
    load = wall.twinx()
    for r in d["results"]:
        samples = [s for s in r["samples"] if s["step"] > 0]
        memory.plot([s["step"] for s in samples], [s["rss"] / 2**20 for s in samples], label=f"rank {r['rank']}")
        for ax, key in ((cpu, "step_cpu_windows"), (wall, "step_windows")):
            ax.plot([w[0] for w in r[key]], [w[1] * 1e3 for w in r[key]], label=f"rank {r['rank']}")
    first = d["results"][0]["samples"]
    load.plot([s["step"] for s in first if "load" in s], [s["load"] for s in first if "load" in s], color="0.6",
              linewidth=0.8, linestyle=":", label="load average")
    load.set_ylabel("load average", fontsize=8)
    for ax in (memory, cpu, wall):
        ax.axvspan(0, warmup, color="0.9", label="warm-up")
        ax.legend(fontsize=7, loc="lower right")
    memory.set(ylabel="resident (MiB)", title="Soak: 2 ranks, DLACStrategy + DLACCallback, checkpoints")
    cpu.set(ylabel="step CPU (ms)")
    wall.set(xlabel="training step", ylabel="step wall (ms)")
    fig.tight_layout()


BLOCKS = {"soak": Block(("soak.json",), soak)}
FIGURES = {"docs/figures/soak.svg": Figure(("soak.json",), draw_soak)}
