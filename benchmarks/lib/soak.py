"""The soak run's sampler and its judgement: what a long DLACStrategy run does to memory, files, threads and step time.

:class:`Sampler` is a Lightning callback each rank runs: it times every training step (from one step's end to the
next one's, so data loading, the step and the callbacks count; steps that checkpointed or validated are marked), in
wall-clock seconds and in the CPU seconds the process used (all its threads), and every ``every`` steps reads the
process's resident memory, open file descriptors and threads from /proc, and the machine's load average. After the
warm-up, a quantity is *flat* when its Theil-Sen slope (the median of the slopes between all pairs of samples, which
a few outliers such as a checkpoint step cannot move) grows it by less than :data:`GROWTH_LIMIT` of its median per
10,000 steps. File descriptors and threads must not grow at all.

Which step time is judged: the CPU time. On a machine shared with other work, the wall time of a step follows the
machine's load (other jobs starting and stopping move it several-fold), so a wall-time slope measures the
neighbours; a step's CPU time is what the run itself spends, and grows when the run's own work per step grows (a list
scanned every step, a cache that never shrinks). The wall time's slope is reported beside it with the load average,
and judged too when the load stayed within :data:`CALM_LOAD` of its median.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

GROWTH_LIMIT = 0.02  # issue 56: growth under 2% per 10,000 steps after warm-up
CALM_LOAD = 0.25  # the wall time is judged when every load-average sample lies within 25% of their median
PER_STEPS = 10_000
WINDOW = 250  # steps per window of the step-time series (the median of each window is one point)

try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # the parent process judges without Lightning
    _Callback = object


def read_proc() -> dict[str, int]:
    """This process's resident memory (bytes), open file descriptors and threads, from /proc.

    Returns:
        ``{"rss": ..., "fds": ..., "threads": ...}``.
    """
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    threads = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": threads}


class Sampler(_Callback):
    """Times every training step and samples /proc every ``every`` steps; :meth:`result` is what the rank measured.

    Args:
        every: Steps between two /proc samples.
    """

    def __init__(self, every: int = 100) -> None:
        self.every = every
        self.step_s: list[float] = []
        self.step_cpu_s: list[float] = []
        self.marked: list[int] = []  # steps whose time includes a checkpoint or a validation
        self.samples: list[dict[str, Any]] = []
        self._last: tuple[float, float] | None = None
        self._mark = False

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        now = (time.perf_counter(), time.process_time())
        if self._last is not None:
            self.step_s.append(now[0] - self._last[0])
            self.step_cpu_s.append(now[1] - self._last[1])
            if self._mark:
                self.marked.append(len(self.step_s))
        self._last, self._mark = now, False
        step = trainer.global_step
        if step % self.every == 0:
            self.samples.append({"step": step, **read_proc(), "load": os.getloadavg()[0]})

    def on_save_checkpoint(self, *args: Any) -> None:
        self._mark = True

    def on_validation_start(self, *args: Any) -> None:
        self._mark = True

    def on_train_epoch_start(self, *args: Any) -> None:
        self._mark = True  # a new epoch's first step waits for the loader's iterator

    def result(self, rank: int) -> dict[str, Any]:
        """What this rank measured.

        Args:
            rank: The rank.

        Returns:
            ``{"rank", "step_s", "step_cpu_s", "marked", "samples"}``.
        """
        return {"rank": rank, "step_s": self.step_s, "step_cpu_s": self.step_cpu_s, "marked": self.marked,
                "samples": self.samples}


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """The median of the slopes between every pair of points (robust to a few outliers).

    Args:
        xs: Abscissae.
        ys: Ordinates.

    Returns:
        The slope (0 with fewer than two distinct abscissae).
    """
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]  # fmt: skip
    return statistics.median(slopes) if slopes else 0.0


def step_windows(step_s: list[float], marked: list[int], window: int = WINDOW) -> list[tuple[int, float]]:
    """The median step time of each window of ``window`` steps, the marked steps left out.

    Args:
        step_s: Seconds of every training step, in order (step ``k + 1`` at index ``k``).
        marked: Steps whose time includes a checkpoint, a validation or an epoch start.
        window: Steps per window.

    Returns:
        ``(middle step, median seconds)`` per full window.
    """
    skip = set(marked)
    out = []
    for start in range(0, len(step_s) - window + 1, window):
        times = [step_s[k] for k in range(start, start + window) if k + 1 not in skip]
        out.append((start + window // 2, statistics.median(times)))
    return out


def growth(points: list[tuple[float, float]], warmup: int) -> dict[str, float]:
    """The growth per :data:`PER_STEPS` steps after ``warmup`` steps, as a share of the median.

    Args:
        points: ``(step, value)`` pairs.
        warmup: Steps left out at the start.

    Returns:
        ``{"slope_per_10k": ..., "median": ..., "growth": slope_per_10k / median, "first": ..., "last": ...}``.
    """
    kept = [(x, y) for x, y in points if x >= warmup]
    xs, ys = [float(x) for x, _ in kept], [float(y) for _, y in kept]
    slope = theil_sen(xs, ys) * PER_STEPS
    median = statistics.median(ys) if ys else 0.0
    return {"slope_per_10k": slope, "median": median, "growth": slope / median if median else 0.0,
            "first": ys[0] if ys else 0.0, "last": ys[-1] if ys else 0.0, "points": len(ys)}  # fmt: skip


def judge(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Every rank's growth of memory, step CPU and wall time, files and threads, and the targets.

    Args:
        ranks: What each rank's :class:`Sampler` measured.
        warmup: Steps left out at the start.

    Returns:
        ``{"per_rank": [...], "load": {...}, "targets": [...]}``; a target is met when every rank meets it; the wall
        time's target is judged (``met`` not None) only when the load average stayed calm (module docstring).
    """
    per_rank = []
    loads = []
    for r in ranks:
        samples = [s for s in r["samples"] if s["step"] > 0]
        after = [s for s in samples if s["step"] >= warmup]
        loads += [s["load"] for s in after if "load" in s]
        fds = [s["fds"] for s in after]
        threads = [s["threads"] for s in after]
        per_rank.append({"rank": r["rank"], "rss": growth([(s["step"], s["rss"]) for s in samples], warmup),
                         "step_cpu_s": growth(step_windows(r["step_cpu_s"], r["marked"]), warmup),
                         "step_s": growth(step_windows(r["step_s"], r["marked"]), warmup),
                         "fds": {"min": min(fds), "max": max(fds), "first": fds[0], "last": fds[-1]},
                         "threads": {"min": min(threads), "max": max(threads), "first": threads[0],
                                     "last": threads[-1]}})  # fmt: skip
    load = {"min": min(loads), "median": statistics.median(loads), "max": max(loads)} if loads else None
    calm = load is not None and load["max"] <= (1 + CALM_LOAD) * load["median"] \
        and load["min"] >= (1 - CALM_LOAD) * load["median"]
    limit = f"< {GROWTH_LIMIT:.0%} per {PER_STEPS:,} steps"

    def grows(key: str) -> dict[str, Any]:
        values = [p[key]["growth"] for p in per_rank]
        return {"threshold": GROWTH_LIMIT, "values": values, "met": all(v < GROWTH_LIMIT for v in values)}

    wall = grows("step_s")
    if not calm:
        wall["met"] = None
        wall["not_judged"] = ("the machine's load average varied from {min:.1f} to {max:.1f} (median {median:.1f})"
                              .format(**load) if load else "no load average was recorded")
    targets = [
        {"target": f"resident memory growth after warm-up {limit}", **grows("rss")},
        {"target": f"step CPU time growth after warm-up {limit}", **grows("step_cpu_s")},
        {"target": f"step wall time growth after warm-up {limit}", **wall},
        {"target": "open files after warm-up never above their first sample", "threshold": 0,
         "values": [p["fds"]["max"] - p["fds"]["first"] for p in per_rank],
         "met": all(p["fds"]["max"] <= p["fds"]["first"] for p in per_rank)},
        {"target": "threads after warm-up never above their first sample", "threshold": 0,
         "values": [p["threads"]["max"] - p["threads"]["first"] for p in per_rank],
         "met": all(p["threads"]["max"] <= p["threads"]["first"] for p in per_rank)},
    ]  # fmt: skip
    return {"per_rank": per_rank, "load": load, "targets": targets}


def table(result: dict[str, Any]) -> list[str]:
    """The soak's figures as a markdown table, one row per rank, then the targets.

    Args:
        result: What :func:`judge` returned (the ``judgement`` of a results file).

    Returns:
        The lines.
    """
    out = ["| rank | resident memory after warm-up | growth per 10k steps | median step CPU time | growth per 10k"
           " steps | median step wall time | growth per 10k steps | open files | threads |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for p in result["per_rank"]:
        rss, cpu, wall = p["rss"], p["step_cpu_s"], p["step_s"]
        out.append(
            f"| {p['rank']} | {rss['first'] / 2**20:.0f} -> {rss['last'] / 2**20:.0f} MiB | {rss['growth']:+.2%} |"
            f" {cpu['median'] * 1e3:.1f} ms | {cpu['growth']:+.2%} | {wall['median'] * 1e3:.1f} ms |"
            f" {wall['growth']:+.2%} | {p['fds']['min']}-{p['fds']['max']} |"
            f" {p['threads']['min']}-{p['threads']['max']} |"
        )
    out += ["", "| target | per rank | verdict |", "|---|---|---|"]
    for t in result["targets"]:
        values = ", ".join(f"{v:+.2%}" if isinstance(v, float) else f"{v:+d}" for v in t["values"])
        verdict = f"not judged: {t['not_judged']}" if t["met"] is None else "**met**" if t["met"] else "**missed**"
        out.append(f"| {t['target']} | {values} | {verdict} |")
    return out


def rank_file(out: str | Path, rank: int) -> Path:
    """Where rank ``rank`` of a soak child writes its measurements.

    Args:
        out: The prefix.
        rank: The rank.

    Returns:
        The path.
    """
    return Path(f"{out}.rank{rank}.json")
