"""Launching ranks, and reading what a failed launch left."""

from __future__ import annotations

import re
from typing import Any


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
