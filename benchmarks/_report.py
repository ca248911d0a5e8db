"""What the benchmark scripts share: the generated block of docs/benchmarks.md and the results JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch


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


def write_results(path: Path, command: str, config: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The run's results as JSON, with the command, configuration and machine they came from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(command=command, config=config, cpu_count=os.cpu_count(),
                                    torch=torch.__version__, results=rows), indent=2))
