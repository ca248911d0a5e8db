"""The rule every "met" in README.md and docs/ follows, and the few phrases that report a judged target."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# The rule every "met" in README.md and docs/benchmarks.md follows (docs/benchmarks.md states it at the top).
RULE = ("A target is met only when the pooled median meets it and at least two thirds of the repeats do.")


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
