"""Validation of settings shared by the policy and the layers above it: relative error bounds and counts."""

from __future__ import annotations

import math
from typing import Any


def check_relative_bound(value: float, option: str) -> float:
    """Return ``value`` as a float if it is a valid relative error bound; otherwise raise naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{option}={value!r} must be a finite number in (0, 1).")
    if not 0 < value < 1:
        raise ValueError(
            f"{option}={value} is out of range: a relative error bound must be in (0, 1) (a fraction of each chunk's"
            " value range; the paper uses 0.01 to 0.05)."
        )
    return float(value)


def check_count(value: Any, option: str, minimum: int) -> int:
    """Return ``value`` if it is a whole number >= ``minimum``; otherwise raise naming ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{option}={value!r} must be a whole number >= {minimum}.")
    return value
