"""Launching ranks, and reading what a failed launch left."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from benchmarks.lib.paths import REPO

# What a launcher (Lightning's, torchrun) sets in a rank's environment: a fresh launch from a benchmark must not
# inherit them, or it would join the benchmark's own process group instead of making its own.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_MAX_RESTARTS", "GROUP_WORLD_SIZE", "PL_GLOBAL_SEED")  # fmt: skip


def run_ranks(fn: Any, world_size: int = 2, *args: Any, **kwargs: Any) -> list[Any]:
    """:func:`lightning_dlac.testing.run_ranks`, the launcher the tests use too (imported on first use: the GPU
    scripts need only torch)."""
    from lightning_dlac.testing import run_ranks as launch

    return launch(fn, world_size, *args, **kwargs)


def error_line(text: str) -> str:
    """The exception line of a failed launch's traceback (the last line that names an error), else the text's last
    line, at most 500 characters: what a results file records of a launch that raised."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Failed)\b", line)]
    return (named or lines or [""])[-1][:500]


def child_env() -> dict[str, str]:
    """The environment of a launch a benchmark starts as a command of its own (``python -m benchmarks.<script>
    --child ...``, or ``torchrun``): no launcher variables, one thread per process, and the repository first on
    ``PYTHONPATH``, since the command runs in a working directory of its own and imports ``benchmarks``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p))
    return env


def is_tc_rate(rate: str) -> bool:
    """Whether ``rate`` is a rate ``tc`` takes (``1gbit``, ``500mbit``, ``2.5gbit``) or ``unthrottled``."""
    return rate == "unthrottled" or re.fullmatch(r"\d+(\.\d+)?([kmg]?bit|[kmg]?bps)", rate) is not None


def shape_loopback(rate: str) -> None:
    """Inside a private network namespace (``unshare -n``): bring its loopback up and shape it to ``rate`` with a
    token bucket (``tc qdisc add dev lo root tbf rate <rate> burst 1mb latency 20ms``), or leave it unshaped for
    ``unthrottled``. Every process of the namespace shares that one link."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if rate != "unthrottled":
        subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "1mb", "latency",
                        "20ms"], check=True)  # fmt: skip
