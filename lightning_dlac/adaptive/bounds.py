"""The bound types, in one place: what a relative error bound is, who holds a table's bound, and what the policy and
the exchange pass each other.

| type | what |
|---|---|
| :class:`ErrorBounds` | the per-table bounds every compressed all-to-all reads at each call; the policy writes them |
| :class:`ProbeBounds` | the bounds of one sensitivity probe: some tables at a candidate, the rest exact |
| :class:`BoundSource` | what an exchange reads its bounds from (either of the two above) |
| :class:`ClassBounds`, :class:`TableClass` | the bound of each table class (tight / base / loose) |
| :class:`Calibration` | one finished calibration: from when its bounds apply |

A relative bound is a fraction of each chunk's value range, in (0, 1) (:func:`check_relative_bound`); 0 means
"send exactly" where a probe asks for it. Data flow: policy (``m(t)`` x class bound) -> :class:`ErrorBounds` ->
exchange (per chunk) -> codec header (``abs_eb``, ``step``) -> decoder.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch

# Moved to the checkers' home; still importable from here, where plugin/callback.py takes it.
from lightning_dlac.checks import check_count

__all__ = [
    "BoundSource",
    "Calibration",
    "ClassBounds",
    "ErrorBounds",
    "ProbeBounds",
    "TableClass",
    "check_count",
    "check_relative_bound",
]


def check_relative_bound(value: float, option: str) -> float:
    """Check that ``value`` is a valid relative error bound, a finite number in (0, 1).

    Args:
        value: The bound.
        option: The option it was given as, for the message (``"eps"``, ``"bound of table 't_cat_0'"``).

    Returns:
        ``value`` as a float.

    Raises:
        ValueError: If ``value`` is not a finite number in (0, 1); the message names ``option``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{option}={value!r} must be a finite number in (0, 1).")
    if not 0 < value < 1:
        raise ValueError(
            f"{option}={value} is out of range: a relative error bound must be in (0, 1) (a fraction of each chunk's"
            " value range; the paper uses 0.01 to 0.05)."
        )
    return float(value)


class BoundSource(Protocol):
    """Where an exchange reads its per-table relative bounds.

    Either :class:`ErrorBounds` or a calibration probe's :class:`ProbeBounds`; a bound of 0 sends that table exactly.
    """

    def effective_many(self, tables: Sequence[str]) -> torch.Tensor:
        """The bounds the exchange encodes ``tables`` with now.

        Args:
            tables: Table names, in the exchange's column order.

        Returns:
            One relative bound per table, a float32 tensor (what the codec takes); 0 sends the table exactly.
        """


class ErrorBounds:
    """The per-table relative error bounds that every compressed all-to-all reads at each call.

    This is the one interface between the policy (``DLACCallback``) and the communication layer: the policy sets
    table bounds and the iteration multiplier ``m(t)``; the exchange encodes table ``t`` with
    ``min(bound[t] * multiplier, max_eps)``.

    Args:
        default_eps: Bound of every table that has not been set.
        max_eps: Upper clamp of the effective bound.

    Raises:
        ValueError: If either bound is not in (0, 1).
    """

    def __init__(self, default_eps: float = 0.01, max_eps: float = 0.5) -> None:
        self._default = check_relative_bound(default_eps, "default_eps")
        self._max = check_relative_bound(max_eps, "max_eps")
        self._table: dict[str, float] = {}
        self._multiplier = 1.0
        self._lock = threading.Lock()

    @property
    def default_eps(self) -> float:
        """Bound of tables the policy has not set."""
        return self._default

    @property
    def max_eps(self) -> float:
        """Upper clamp of every effective bound."""
        return self._max

    @property
    def multiplier(self) -> float:
        """The iteration-wise multiplier m(t) applied to every table's bound."""
        return self._multiplier

    def set_multiplier(self, value: float) -> None:
        """Set the iteration-wise multiplier m(t).

        Args:
            value: The multiplier, positive and finite.

        Raises:
            ValueError: If ``value`` is not positive and finite.
        """
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"multiplier={value!r} must be a positive finite number.")
        self._multiplier = float(value)

    def set_table_bounds(self, bounds: Mapping[str, float]) -> None:
        """Set the base bound of some tables (others keep theirs).

        Args:
            bounds: ``{table: relative bound}``.

        Raises:
            ValueError: If a bound is not in (0, 1); the message names the table.
        """
        checked = {name: check_relative_bound(eps, f"bound of table {name!r}") for name, eps in bounds.items()}
        with self._lock:
            self._table.update(checked)

    def clear_table_bounds(self) -> None:
        """Forget every table bound set so far (tables fall back to ``default_eps``)."""
        with self._lock:
            self._table.clear()

    def table_bounds(self) -> dict[str, float]:
        """The base bounds set so far.

        Returns:
            ``{table: base bound}`` (without the multiplier), a copy.
        """
        return dict(self._table)

    def effective(self, table: str) -> float:
        """The bound that a table is encoded with now.

        Args:
            table: The table's name.

        Returns:
            ``min(base bound * multiplier, max_eps)``, the base bound ``default_eps`` where none was set.
        """
        return min(self._table.get(table, self._default) * self._multiplier, self._max)

    def effective_many(self, tables: Iterable[str]) -> torch.Tensor:
        """Effective bounds of several tables.

        Args:
            tables: Table names.

        Returns:
            Each table's :meth:`effective` bound, as the float32 tensor the codec takes.
        """
        return torch.tensor([self.effective(t) for t in tables], dtype=torch.float32)


class ProbeBounds:
    """The bounds of one sensitivity probe: the named tables at the given bound, every other table exactly (0).

    Args:
        bounds: ``{table: relative bound}`` of the probed tables.

    Raises:
        ValueError: If a bound is not in (0, 1).
    """

    def __init__(self, bounds: Mapping[str, float]) -> None:
        self._bounds = {t: check_relative_bound(eps, f"probe bound of table {t!r}") for t, eps in bounds.items()}

    def effective_many(self, tables: Sequence[str]) -> torch.Tensor:
        """Bounds of ``tables`` in this probe.

        Args:
            tables: Table names, in the exchange's column order.

        Returns:
            The probed tables' bounds and 0 for every other, as the float32 tensor the codec takes.
        """
        return torch.tensor([self._bounds.get(t, 0.0) for t in tables], dtype=torch.float32)


class TableClass(str, Enum):
    """Error-bound class of a table."""

    TIGHT = "tight"
    BASE = "base"
    LOOSE = "loose"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ClassBounds:
    """Relative bound of each table class; ``tight <= base <= loose``.

    Args:
        tight: Bound of the tight class (``DLACCallback(tight_eps=...)``).
        base: Bound of the base class (``base_eps``).
        loose: Bound of the loose class (``loose_eps``).

    Raises:
        ValueError: If a bound is not in (0, 1), or they are not ordered ``tight <= base <= loose``.
    """

    tight: float = 0.01
    base: float = 0.03
    loose: float = 0.05

    def __post_init__(self) -> None:
        for name in ("tight", "base", "loose"):
            check_relative_bound(getattr(self, name), f"{name}_eps")
        if not self.tight <= self.base <= self.loose:
            raise ValueError(
                f"class bounds must satisfy tight_eps <= base_eps <= loose_eps, got tight_eps={self.tight},"
                f" base_eps={self.base}, loose_eps={self.loose}."
            )

    def __getitem__(self, cls: TableClass | str) -> float:
        return getattr(self, TableClass(cls).value)

    def candidates(self) -> tuple[float, ...]:
        """The distinct class bounds.

        Returns:
            The bounds, ascending, each once.
        """
        return tuple(sorted({self.tight, self.base, self.loose}))


@dataclass(frozen=True)
class Calibration:
    """One finished calibration: from when its bounds apply, what it measured and what it chose.

    Args:
        at: The training batch from which its bounds apply.
        batches: How many batches it measured.
        counts: How many tables landed in each class, ``{class: tables}``.
        again: Whether it replaced an earlier calibration.
    """

    at: int
    batches: int
    counts: dict[str, int]
    again: bool
