"""Iteration-wise level: the multiplier m(t) that loosens every table's bound early in training.

Early iterations tolerate more error (the model is far from converged and its gradients are large), so the bound
of every table is multiplied by ``m(t)``, which starts at ``c`` and decays to 1 over the first ``T`` iterations:

=========  ==================================================  ==========================
schedule   m(t) for 0 <= t < T                                  shape
=========  ==================================================  ==========================
step       c - (c - 1) * floor(stages * t / T) / stages          ``stages`` equal plateaus
linear     c - (c - 1) * t / T                                  straight line
log        c - (c - 1) * ln(1 + t) / ln(1 + T)                  falls fast, then slowly
constant   c                                                    flat, then drops to 1
=========  ==================================================  ==========================

and ``m(t) = 1`` for ``t >= T`` in every schedule. ``step`` is ``linear`` sampled at the start of each stage, so
both reach 1 at ``T``. ``c = 1`` turns the iteration-wise level off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from lightning_dlac.checks import parse_enum


class ScheduleKind(str, Enum):
    """Shape of the decay of m(t) from ``c`` to 1."""

    STEP = "step"
    LINEAR = "linear"
    LOG = "log"
    CONSTANT = "constant"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class DecaySchedule:
    """The iteration-wise multiplier ``m(t)``; call it with the iteration number.

    Args:
        kind: ``"step"``, ``"linear"``, ``"log"`` or ``"constant"``.
        c: Multiplier at iteration 0 (>= 1; the paper uses 2).
        T: Length of the early stage in iterations (> 0); ``m(t) = 1`` from ``T`` on.
        stages: Number of plateaus of the ``step`` schedule (the paper uses 10).

    Raises:
        ValueError: If ``kind`` is not a schedule, ``c`` is not a finite number >= 1, or ``T`` or ``stages`` is not
            a positive whole number.
    """

    kind: ScheduleKind | str = ScheduleKind.STEP
    c: float = 2.0
    T: int = 1000
    stages: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", parse_enum(ScheduleKind, self.kind, "schedule"))
        if isinstance(self.c, bool) or not isinstance(self.c, (int, float)) or not math.isfinite(self.c):
            raise ValueError(f"c={self.c!r} must be a finite number >= 1.")
        if self.c < 1:
            raise ValueError(f"c={self.c} must be >= 1: m(t) loosens the bounds early on and never tightens them.")
        if isinstance(self.T, bool) or not isinstance(self.T, int) or self.T <= 0:
            raise ValueError(f"T={self.T!r} must be a positive whole number of iterations (the early-stage length).")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages <= 0:
            raise ValueError(f"stages={self.stages!r} must be a positive whole number.")

    def as_dict(self) -> dict[str, str | float | int]:
        """The schedule as plain data, for checkpoints and reports.

        Returns:
            ``{"kind", "c", "T", "stages"}``; ``DecaySchedule(**d)`` rebuilds it.
        """
        return {"kind": str(self.kind), "c": self.c, "T": self.T, "stages": self.stages}

    def __call__(self, t: int) -> float:
        """The multiplier at one iteration.

        Args:
            t: The iteration, counted from 0.

        Returns:
            ``m(t)``: ``c`` at 0, down to 1 at ``T`` and after.

        Raises:
            ValueError: If ``t`` is negative.
        """
        if t < 0:
            raise ValueError(f"iteration {t} must be >= 0.")
        if t >= self.T or self.c == 1:
            return 1.0
        c, T = float(self.c), self.T
        if self.kind is ScheduleKind.STEP:
            return c - (c - 1.0) * ((self.stages * t) // T) / self.stages
        if self.kind is ScheduleKind.LINEAR:
            return c - (c - 1.0) * t / T
        if self.kind is ScheduleKind.LOG:
            return c - (c - 1.0) * math.log1p(t) / math.log1p(T)
        return c
