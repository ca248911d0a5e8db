"""The headline's two plots (issue 55 item 6), drawn from the results files by ``python -m benchmarks.render`` and
checked by ``--check`` as every figure is (benchmarks/render/figures.py): the training step's speed against FP32 by
link rate for FP32, each TorchRec codec and DLAC, and the accuracy-bytes frontier of the Criteo sample, AUROC
difference against forward and against total bytes per step for every arm and codec. README.md and
docs/benchmarks.md show them under the headline (benchmarks/render/readme.py)."""

from __future__ import annotations

from typing import Any

from benchmarks.lib.e2e import VARIANTS
from benchmarks.render.core import Results
from benchmarks.render.figures import Figure
from benchmarks.render.frontier import FRONTIER_FILE

SPEED_SVG = "speed_by_link.svg"
FRONTIER_SVG = "frontier_criteo.svg"

# The e2e runs plotted: the suite's run (filled markers, joined across rates) and the race runs (hollow markers).
SPEED_RUNS = ("e2e_throttled.json", "e2e_unthrottled.json")
RACE_RUNS = ("e2e_qcomm_race.json", "e2e_qcomm_race_10gbit.json")
RATES = (("1gbit", "1 Gbit/s"), ("10gbit", "10 Gbit/s"), ("unthrottled", "unthrottled"))
# What a user can choose, in legend order (the ceiling is a bound, not a choice, and is left out).
SPEED_VARIANTS = ("fp32", "qcomm_int8_fp16", "qcomm_fp8", "qcomm_mx4", "qcomm_mx4_bf16", "dlac_bf16", "dlac_dlac",
                  "dlac_auto")
COLORS = {"fp32": "0.35", "qcomm_int8_fp16": "tab:orange", "qcomm_fp8": "tab:brown", "qcomm_mx4": "tab:red",
          "qcomm_mx4_bf16": "tab:pink", "dlac_bf16": "tab:cyan", "dlac_dlac": "tab:blue", "dlac_auto": "tab:green"}


def draw_speed(results: Results, fig: Any) -> None:
    """Speed-up over FP32 (pooled medians, bars over the per-repeat ratios) at each link rate of the e2e runs."""
    ax = fig.subplots()
    x = {rate: i for i, (rate, _) in enumerate(RATES)}
    offset = {v: (i - len(SPEED_VARIANTS) / 2) * 0.06 for i, v in enumerate(SPEED_VARIANTS)}
    labels: dict[str, str] = {}
    failed: set[str] = set()
    for names, hollow in ((SPEED_RUNS, False), (RACE_RUNS, True)):
        rows = [r for n in names if results.get(n) for r in results.get(n)["results"]]
        failed |= {f.get("label") or f["variant"] for n in names if results.get(n)
                   for f in results.get(n).get("failed") or []}
        for variant in SPEED_VARIANTS:
            mine = sorted((r for r in rows if r["variant"] == variant and r["rate"] in x
                           and r.get("speedup_vs_fp32") is not None), key=lambda r: x[r["rate"]])
            if not mine:
                continue
            labels.setdefault(variant, VARIANTS[variant].label)
            xs = [x[r["rate"]] + offset[variant] + (0.02 if hollow else 0) for r in mine]
            color = COLORS[variant]
            # The bars span the per-repeat ratios; the pooled median's ratio need not lie inside them.
            ax.vlines(xs, [min(r["speedup_vs_fp32_per_repeat"]) for r in mine],
                      [max(r["speedup_vs_fp32_per_repeat"]) for r in mine], color=color, linewidth=1)
            ax.plot(xs, [r["speedup_vs_fp32"] for r in mine], "s" if hollow else "o", color=color,
                    markerfacecolor="white" if hollow else color, linestyle="none" if hollow else "-", linewidth=1,
                    label=None if hollow else labels[variant])
    for variant in SPEED_VARIANTS:  # a variant only the race ran still needs its legend entry
        if variant in labels and labels[variant] not in ax.get_legend_handles_labels()[1]:
            ax.plot([], [], "s", color=COLORS[variant], markerfacecolor="white", label=labels[variant])
    ax.plot([], [], "s", color="0.5", markerfacecolor="white", label="hollow: the race runs (e2e_qcomm_race*)")
    for label in sorted(failed):
        ax.plot([], [], "x", color="0.5", label=f"{label}: could not run (TorchRec's error on this machine)")
    ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(RATES)), [name for _, name in RATES])
    ax.set(xlabel="link rate (loopback throttled; 2 gloo ranks on a 2-core CPU, batch 4096 per rank)",
           ylabel="speed-up over FP32 (pooled median)",
           title="Training step against uncompressed FP32 by link rate (bars: the per-repeat ratios)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()


def draw_frontier(results: Results, fig: Any) -> None:
    """AUROC difference from uncompressed (mean over seeds, bars two standard errors) against forward and against
    total bytes per step, every arm and codec of the Criteo-sample frontier."""
    data = results.get(FRONTIER_FILE)
    f = data["frontier"][0]
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig.set_size_inches(10, 5.5)
    forward, total = fig.subplots(1, 2, sharey=True)
    for ax, key, what in ((forward, "fwd_bytes_per_step", "forward bytes per step (KiB)"),
                          (total, "total_bytes_per_step", "bytes per step, both directions (KiB)")):
        for p in f["points"]:
            seeds = max(len(p["seeds"]), 1)
            err = 2 * p["delta_sd"] / seeds ** 0.5
            style = {"uncompressed": ("X", "0.35"), "qcomm": ("s", "tab:orange"), "dlac": ("o", "tab:blue")}[p["kind"]]
            marker, color = ("*", "tab:green") if p["variant"] == "DLAC default" else style
            ax.errorbar(p[key] / 1024, p["delta_mean"], yerr=err, fmt=marker, color=color, capsize=2,
                        markersize=9 if marker == "*" else 6)
            name = p["variant"].removeprefix("qcomm ").removeprefix("constant ").removeprefix("DLAC ")
            ax.annotate(name, (p[key] / 1024, p["delta_mean"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.axhline(0.0, color="0.6", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel=what)
    forward.set(ylabel="AUROC minus uncompressed's (mean over seeds; bars: 2 SE)",
                title="forward bytes (what the frontier judges)", ylim=None)
    total.set(title="both directions (DLAC's arms send bf16 gradients)")
    forward.plot([], [], "o", color="tab:blue", label="DLAC, constant eps")
    forward.plot([], [], "*", color="tab:green", markersize=9, label="DLAC default (DLACCallback())")
    forward.plot([], [], "s", color="tab:orange", label="TorchRec qcomm (forward/backward)")
    forward.plot([], [], "X", color="0.35", label="uncompressed")
    forward.legend(fontsize=7, loc="lower right")
    cfg = data.get("config", {})
    failed = sorted({e["variant"] for e in data.get("failed") or []})
    fig.suptitle(f"Accuracy-bytes frontier, Criteo sample, {cfg.get('criteo_epochs')} epochs x"
                 f" {len(cfg.get('seeds', []))} seeds" + (f"; {', '.join(failed)} could not run" if failed else "")
                 + "\nDLAC-gradient arms (DLAC in both directions) not yet run", fontsize=9)
    fig.tight_layout()


FIGURES = {
    f"docs/figures/{SPEED_SVG}": Figure((*SPEED_RUNS, *RACE_RUNS), draw_speed),
    f"docs/figures/{FRONTIER_SVG}": Figure((FRONTIER_FILE,), draw_frontier),
}
BLOCKS: dict = {}
