"""What the benchmark scripts share: the paths, the rank launcher, the results JSON with the metadata of the run,
the rule that says whether a target is met, and the generated blocks of the markdown files (benchmarks/render.py
writes those). Every script imports it as ``from common import ...`` (a script's own folder is on its path); none
imports tests/ or another script's private names.

Every results file is ``{"metadata": ..., "config": ..., "results": ..., ...}``; the metadata says where the figures
came from: git commit (and whether the tree had changes outside benchmarks/results/), date, command line and
arguments, cores, the load average before and after, the versions of torch / torchrec / lightning / fbgemm-gpu, and
the depth of the suite that ran it (``DLAC_BENCH_DEPTH``, set by benchmarks/suite.py). Files written before this
layout (``command``, ``config``, ``cpu_count``, ``torch`` at the top) read as the same shape through
:func:`load_results`, with what they do not record marked as such.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if importlib.util.find_spec("lightning_dlac") is None:  # the GPU image runs the checkout's package, not installed
    sys.path.insert(0, str(REPO))
RESULTS = HERE / "results"
# The real Criteo sample of the team's checkout (../shared/data), beside the repository; scripts that need it say so.
CRITEO_SAMPLE = REPO.parent / "shared" / "data" / "criteo_kaggle_head10k.tsv"
PACKAGES = ("torch", "torchrec", "lightning", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy", "lightning-dlac")

# The rule every "met" in README.md and docs/benchmarks.md follows (docs/benchmarks.md states it at the top).
RULE = ("A target is met only when the pooled median meets it and at least two thirds of the repeats do.")


def run_ranks(fn: Any, world_size: int = 2, *args: Any, **kwargs: Any) -> list[Any]:
    """:func:`lightning_dlac.testing.run_ranks`, the launcher the tests use too (imported on first use: the GPU
    scripts need only torch)."""
    from lightning_dlac.testing import run_ranks as launch

    return launch(fn, world_size, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# Metadata


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    found["python"] = platform.python_version()
    return found


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def start_run(script: str, arguments: dict[str, Any] | None = None, argv: Sequence[str] | None = None
              ) -> dict[str, Any]:
    """The metadata of a run starting now: call it first thing in ``main`` (the load average before is read here).

    Args:
        script: The script's path from the repository root, e.g. ``benchmarks/e2e_bandwidth.py``.
        arguments: The parsed arguments (``vars(args)``).
        argv: The command line's arguments (default ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {
        "command": " ".join(["python", script, *(shlex.quote(a) for a in argv)]),
        "argv": argv,
        "arguments": _jsonable(arguments or {}),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if dirty is None else bool(dirty),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "depth": os.environ.get("DLAC_BENCH_DEPTH"),
        "cores": os.cpu_count(),
        "cpu": _cpu_name(),
        "platform": platform.platform(),
        "loadavg_before": list(os.getloadavg()),
        "versions": _versions(),
    }


def finish_run(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` with the end of the run: the load average after, the date and the seconds it took."""
    now = datetime.datetime.now(datetime.timezone.utc)
    started = datetime.datetime.fromisoformat(metadata["date"])
    return dict(metadata, finished=now.isoformat(timespec="seconds"), loadavg_after=list(os.getloadavg()),
                wall_s=round((now - started).total_seconds(), 1))


def write_results(path: Path, metadata: dict[str, Any], config: dict[str, Any], results: Any, **extra: Any) -> None:
    """The run's results as JSON: ``metadata`` (finished here: the load average after), ``config`` and ``results``,
    and any ``extra`` sections."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(metadata=finish_run(metadata), config=_jsonable(config), results=results, **extra)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def load_results(path: Path) -> dict[str, Any]:
    """A results file with its metadata; files from before the metadata layout get the metadata they have
    (command, cores, torch version) and ``None`` for the rest."""
    data = json.loads(Path(path).read_text())
    if "metadata" not in data:
        data["metadata"] = {
            "command": data.get("command"), "git_commit": None, "date": None, "depth": None,
            "cores": data.get("cpu_count"), "loadavg_before": None, "loadavg_after": None,
            "versions": {"torch": data["torch"]} if "torch" in data else {}, "legacy": True,
        }
    return data


# ---------------------------------------------------------------------------------------------------------------------
# The rule


def error_line(text: str) -> str:
    """The exception line of a failed launch's traceback (the last line that names an error), else the text's last
    line, at most 500 characters: what a results file records of a launch that raised."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Failed)\b", line)]
    return (named or lines or [""])[-1][:500]


def median_and_range(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of ``values``."""
    ordered = sorted(values)
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return mid, ordered[0], ordered[-1]


def judge(name: str, pooled: float, per_repeat: Sequence[float], threshold: float, at_least: bool = True,
          **about: Any) -> dict[str, Any]:
    """A target judged by :data:`RULE`: ``pooled`` (the pooled median's figure) and each of ``per_repeat`` compared
    with ``threshold`` (``>=`` when ``at_least``, else ``<=``); met when the pooled figure meets it and at least two
    thirds of the repeats do. ``about`` is kept in the record (what was compared with what)."""

    def meets(v: float) -> bool:
        return math.isfinite(v) and (v >= threshold if at_least else v <= threshold)

    meeting = sum(1 for v in per_repeat if meets(v))
    met = bool(per_repeat) and meets(pooled) and 3 * meeting >= 2 * len(per_repeat)
    return dict(target=name, threshold=threshold, at_least=at_least, pooled=pooled, per_repeat=list(per_repeat),
                repeats_meeting=meeting, repeats=len(per_repeat), met=met, **about)


def span(values: Sequence[float], fmt: str = ".2f") -> str:
    """``lo-hi`` of ``values`` (``lo to hi`` where a bound is negative; the value itself where there is one)."""
    lo, hi = min(values), max(values)
    if len(values) == 1 or f"{lo:{fmt}}" == f"{hi:{fmt}}":
        return f"{lo:{fmt}}"
    return f"{lo:{fmt}} to {hi:{fmt}}" if lo < 0 or hi < 0 else f"{lo:{fmt}}-{hi:{fmt}}"


def verdict_text(t: dict[str, Any], fmt: str = ".2f") -> str:
    """``**met**`` / ``**not met**`` with the pooled figure, the per-repeat range and how many repeats met it."""
    reps = t["per_repeat"]
    spread = f"; per repeat {span(reps, fmt)}, {t['repeats_meeting']} of {t['repeats']} meet it" if reps \
        else "; no repeats"
    word = "met" if t["met"] else "not met"
    if t.get("invalid"):
        word = "not judged (benchmark error)"
    return f"**{word}**: {t['pooled']:{fmt}}{spread}"


# ---------------------------------------------------------------------------------------------------------------------
# Markdown blocks


def write_generated_block(path: Path, section: str, begin: str, end: str, lines: list[str]) -> None:
    """Put ``lines`` between the ``begin`` / ``end`` markers of ``path`` (replacing what was there), else right under
    the ``section`` heading, else in a new section at the end. Hand-written text outside the markers stays."""
    block = "\n".join([begin, *lines, end])
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    elif section in text:
        at = text.index(section) + len(section)
        text = text[:at] + "\n\n" + block + "\n" + text[at:]
    else:
        text = text.rstrip("\n") + f"\n\n{section}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
