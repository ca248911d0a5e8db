"""The registry of every rendered block, by name, from the section modules, and the rendering of a document's
blocks from a results directory."""

from __future__ import annotations

import re

from benchmarks.render import (
    accuracy,
    calibration,
    checkpoint,
    cluster,
    codec,
    data,
    e2e,
    frontier,
    plots,
    readme,
    reliability,
    scaling,
    strategy,
    suite,
    topology,
)
from benchmarks.render.core import BLOCK, Block, Results, awaiting
from benchmarks.render.figures import Figure

SECTIONS = (readme, plots, suite, codec, e2e, topology, scaling, strategy, accuracy, calibration, frontier, data,
            checkpoint, cluster, reliability)
BLOCKS: dict[str, Block] = {}
FIGURES: dict[str, Figure] = {}  # the SVG's path from the repository root -> the figure
for _section in SECTIONS:
    _twice = set(BLOCKS) & set(_section.BLOCKS)
    if _twice:
        raise RuntimeError(f"{_section.__name__} renders blocks another section renders: {sorted(_twice)}")
    BLOCKS.update(_section.BLOCKS)
    FIGURES.update(getattr(_section, "FIGURES", {}))


def render_block(name: str, results: Results) -> str:
    """The body of block ``name`` (between its markers) from ``results``."""
    if name not in BLOCKS:
        raise KeyError(f"no renderer for block {name!r}; known: {sorted(BLOCKS)}")
    block = BLOCKS[name]
    missing = [f for f in block.files if results.get(f) is None]
    lines = awaiting(missing + [f for f in block.optional if results.get(f) is None]) if missing \
        else block.render(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def render_text(text: str, results: Results) -> str:
    """``text`` with every block re-rendered."""
    def one(m: re.Match) -> str:
        name = m["name"]
        return f"<!-- BEGIN render:{name} -->\n{render_block(name, results)}<!-- END render:{name} -->"

    return BLOCK.sub(one, text)


def blocks_in(text: str) -> dict[str, str]:
    """Block name -> body of every marked block of ``text``."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def summary(results: Results) -> tuple[list[str], list[str]]:
    """Every judged target and every benchmark error in the results files the blocks used."""
    targets, errors = [], []
    for name in sorted(results.used):
        data = results.get(name)
        judged = data.get("targets") or []
        # calibration_bench.json keeps its thresholds under "targets" (a mapping); its block judges them itself.
        # e2e_topology.json judges dlac estimate's predictions apart from its speed targets (estimate_check).
        for t in [*(judged if isinstance(judged, list) else []), *(data.get("estimate_check") or [])]:
            where = t.get("rate") or f"{t.get('payload')} eps {t.get('eps')}"
            verdict = "not judged" if t["met"] is None else "met" if t["met"] else "NOT met"
            targets.append(f"{name}: {where}: {t['target']}: {verdict}")
        for e in data.get("errors", []) or []:
            errors.append(f"{name}: {e['message']}")
    return targets, errors
