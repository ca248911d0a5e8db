"""Figures (SVG) drawn from results files, and the check that each committed figure was drawn from the committed file.

A figure is a function of its results file, but its bytes are also a function of matplotlib's version and fonts, so
``--check`` does not compare bytes: every SVG carries the SHA-256 of the results files it was drawn from in its
description (:func:`fingerprint`), and the check compares that with the files now.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.render.core import Results

FINGERPRINT = re.compile(r"drawn from (?P<files>[^<]*?) sha256 (?P<hash>[0-9a-f]{64})")


@dataclass(frozen=True)
class Figure:
    """A figure: the results files it is drawn from and what draws it onto a matplotlib figure."""

    files: tuple[str, ...]
    draw: Callable[[Results, Any], None]


def fingerprint(results: Results, files: tuple[str, ...]) -> str:
    """The description an SVG drawn from ``files`` carries: their names and the SHA-256 of their bytes together.

    Args:
        results: The results directory.
        files: The results files' names.

    Returns:
        ``"drawn from a.json, b.json sha256 <hex>"``.
    """
    digest = hashlib.sha256()
    for name in files:
        digest.update((results.directory / name).read_bytes())
    return f"drawn from {', '.join(files)} sha256 {digest.hexdigest()}"


def write_figure(figure: Figure, results: Results, path: Path) -> None:
    """Draw ``figure`` from ``results`` into the SVG ``path`` (no date in it, so an unchanged file draws the same).

    Args:
        figure: The figure.
        results: The results directory.
        path: Where the SVG goes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "lightning-dlac"
    fig = plt.figure(figsize=(8, 5))
    figure.draw(results, fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None, "Description": fingerprint(results, figure.files)})
    plt.close(fig)


def stale(figure: Figure, results: Results, path: Path) -> str | None:
    """Why the committed SVG at ``path`` is not the one ``results`` draw, or None when it is.

    Args:
        figure: The figure.
        results: The results directory.
        path: The committed SVG.

    Returns:
        The reason, or None.
    """
    if not path.is_file():
        return "missing"
    found = FINGERPRINT.search(path.read_text())
    if found is None:
        return "carries no fingerprint of its results files"
    if found.group(0) != fingerprint(results, figure.files):
        return "drawn from other results files"
    return None
