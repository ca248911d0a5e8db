"""Results files: the JSON every benchmark writes, with the metadata of the run that made it.

Every results file is ``{"metadata": ..., "config": ..., "results": ..., ...}``; the metadata says where the figures
came from: git commit (and whether the tree had changes outside benchmarks/results/), date, command line and
arguments, cores, processor, the load average before and after, the wall time, the versions of torch / torchrec /
lightning / fbgemm-gpu, and the depth of the suite that ran it (``DLAC_BENCH_DEPTH``, set by
``python -m benchmarks.suite``). Files written before this layout (``command``, ``config``, ``cpu_count``, ``torch``
at the top) read as the same shape through :func:`load_results`, with what they do not record marked as such.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.lib.paths import REPO

# The requirements files that pin the measured environment (torch, fbgemm, torchrec), from the repository root.
PINS = ("requirements/cpu.txt", "requirements/torchrec.txt")
PACKAGES = ("torch", "torchrec", "lightning", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy", "lightning-dlac")


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


def start_run(module: str, arguments: dict[str, Any] | None = None, argv: Sequence[str] | None = None
              ) -> dict[str, Any]:
    """The metadata of a run starting now: call it first thing in ``main`` (the load average before is read here).

    Args:
        module: The script's module, ``benchmarks.<name>`` (its ``__spec__.name``): the command is recorded as
            ``python -m <module> <argv>``, the way it runs from the repository root.
        arguments: The parsed arguments (``vars(args)``).
        argv: The command line's arguments (default ``sys.argv[1:]``).

    Returns:
        The metadata dict to pass to :func:`write_results`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {
        "command": " ".join(["python", "-m", module, *(shlex.quote(a) for a in argv)]),
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


def pinned_versions() -> dict[str, str]:
    """The versions the requirements files pin (``name==version`` lines of :data:`PINS`), by package name."""
    pinned = {}
    for name in PINS:
        for line in (REPO / name).read_text().splitlines():
            package, sep, version = line.split("#", 1)[0].strip().partition("==")
            if sep:
                pinned[package.split("[", 1)[0].strip()] = version.strip()
    return pinned
