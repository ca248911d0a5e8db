"""Table-wise level: turn calibration statistics into one relative error bound per table.

Three policies:

- ``homogenization`` (the paper's): classify each table by its homogenization index at the index bound into
  *tight* (the bound erases differences between its embeddings: index below ``tight_below``), *loose* (it keeps
  them: index at least ``loose_from``) or *base*, and give each class its bound (default 0.01 / 0.03 / 0.05).
- ``gradient`` (beyond the paper): give each table the largest candidate bound whose expected
  first-order change of a sample's loss (:meth:`TableStats.gradient_sensitivity`, from the loss gradients the
  backward exchange carries) stays within ``tolerance`` of the mean loss; a table whose every candidate exceeds it
  gets the smallest candidate.
- ``noise`` (beyond the paper; scale-free; ``DLACCallback``'s default): the variance the codec's error on each table
  adds to a batch's loss, as a share of the loss's minibatch variance (:meth:`TableStats.noise_share`), summed over
  tables, may reach a budget; within it, tables are loosened greedily where a looser candidate saves the most
  bytes per share of noise it adds. The budget is either absolute (``noise_budget``) or, by default, a fraction of
  the noise every table at its loosest candidate would add (:func:`relative_noise_budget`), which holds however the
  statistic's level moves from one data set, or one point of a run, to another (docs/adaptive.md derives both).
- ``sensitivity`` (beyond the paper): give each table the largest candidate bound whose measured loss change stays
  within ``tolerance`` of the exact loss (and whose smaller candidates do too); a table whose every candidate exceeds
  it gets the smallest candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_dlac.adaptive.bounds import ClassBounds, TableClass
from lightning_dlac.adaptive.calibration import TableStats


@dataclass(frozen=True)
class HomogenizationThresholds:
    """Class boundaries on the homogenization index: below ``tight_below`` tight, from ``loose_from`` loose, else base.

    Args:
        tight_below: An index below this is tight.
        loose_from: An index at least this is loose.

    Raises:
        ValueError: If a threshold is not in [0, 1], or ``tight_below > loose_from``.
    """

    tight_below: float = 0.9
    loose_from: float = 0.99

    def __post_init__(self) -> None:
        for name in ("tight_below", "loose_from"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name}={v!r} must be a number in [0, 1] (a homogenization index).")
        if self.tight_below > self.loose_from:
            raise ValueError(
                f"tight_below={self.tight_below} must be <= loose_from={self.loose_from}: a table cannot be both"
                " tight and loose."
            )


# Which homogenization index classifies: "vector" (the paper's: distinct quantized / distinct raw vectors) or "value"
# (the same per coordinate; see TableStats.index_of).
INDEX_KINDS = ("vector", "value")


def classify(
    stats: Mapping[str, TableStats], thresholds: HomogenizationThresholds, index: str = "vector"
) -> dict[str, TableClass]:
    """Classify every table by its homogenization index.

    Args:
        stats: Every table's calibration statistics.
        thresholds: The class boundaries on the index.
        index: Which index: ``"vector"`` (the paper's) or ``"value"`` (per coordinate).

    Returns:
        ``{table: class}``.

    Raises:
        ValueError: If ``index`` is neither ``"vector"`` nor ``"value"``.
    """
    if index not in INDEX_KINDS:
        raise ValueError(f"index={index!r} is not supported; choose one of {', '.join(map(repr, INDEX_KINDS))}.")
    classes = {}
    for name, s in stats.items():
        h = s.index_of(index)
        if h < thresholds.tight_below:
            classes[name] = TableClass.TIGHT
        elif h >= thresholds.loose_from:
            classes[name] = TableClass.LOOSE
        else:
            classes[name] = TableClass.BASE
    return classes


def class_table_bounds(classes: Mapping[str, TableClass], bounds: ClassBounds) -> dict[str, float]:
    """The bound of every classified table.

    Args:
        classes: ``{table: class}``.
        bounds: The bound of each class.

    Returns:
        ``{table: its class's bound}``.
    """
    return {name: bounds[cls] for name, cls in classes.items()}


def check_tolerance(tolerance: float, option: str = "sensitivity_tolerance") -> float:
    """Validate a tolerance of the loss-based modes (a relative loss change, > 0), named ``option`` in errors."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance):
        raise ValueError(f"{option}={tolerance!r} must be a positive finite number.")
    if tolerance <= 0:
        raise ValueError(
            f"{option}={tolerance} must be > 0: it is the largest relative change of the training loss a table's"
            " error may cause (e.g. 0.001 = 0.1%)."
        )
    return float(tolerance)


def sensitivity_table_bounds(stats: Mapping[str, TableStats], tolerance: float) -> dict[str, float]:
    """The sensitivity mode's bounds: per table, the largest candidate whose probed loss change stays within bounds.

    A candidate qualifies when it and every smaller candidate change the loss by at most ``tolerance``; a table whose
    every candidate exceeds it gets the smallest candidate.

    Args:
        stats: Every table's calibration statistics.
        tolerance: The largest relative loss change (:meth:`TableStats.sensitivity`) a bound may cause.

    Returns:
        ``{table: bound}``; tables without probes are left out.

    Raises:
        ValueError: If ``tolerance`` is not a positive finite number.
    """
    tolerance = check_tolerance(tolerance)
    chosen = {}
    for name, s in stats.items():
        sens = s.sensitivity()
        if sens is None:
            continue
        best = min(s.candidates)
        for eps in sorted(sens):  # ascending; stop at the first bound that hurts, so noise cannot skip over one
            if abs(sens[eps]) > tolerance:
                break
            best = eps
        chosen[name] = best
    return chosen


def gradient_table_bounds(stats: Mapping[str, TableStats], tolerance: float) -> dict[str, float]:
    """The gradient mode's bounds: per table, the largest candidate whose gradient sensitivity is within tolerance.

    The gradient sensitivity is the expected RMS change of a sample's loss, relative to the mean loss; a table whose
    every candidate exceeds ``tolerance`` gets the smallest candidate. The statistic is an expectation proportional
    to the bound, so no candidate is skipped over by noise.

    Args:
        stats: Every table's calibration statistics.
        tolerance: The largest gradient sensitivity a bound may have.

    Returns:
        ``{table: bound}``; tables without observed gradients are left out.

    Raises:
        ValueError: If ``tolerance`` is not a positive finite number.
    """
    tolerance = check_tolerance(tolerance, "gradient_tolerance")
    chosen = {}
    for name, s in stats.items():
        sens = s.gradient_sensitivity()
        if sens is None:
            continue
        within = [eps for eps, change in sens.items() if change <= tolerance]
        chosen[name] = max(within) if within else min(s.candidates)
    return chosen


def sensitivity_classes(table_bounds: Mapping[str, float], bounds: ClassBounds) -> dict[str, TableClass]:
    """Name the class of per-table bounds by the nearest class bound, for reporting.

    Args:
        table_bounds: ``{table: bound}`` a loss-based mode chose.
        bounds: The bound of each class.

    Returns:
        ``{table: the class whose bound is nearest}`` (the looser one on a tie).
    """
    out = {}
    for name, eps in table_bounds.items():
        out[name] = min(TableClass, key=lambda c: (abs(bounds[c] - eps), -bounds[c]))
    return out


def check_fraction(fraction: float, option: str = "noise_fraction") -> float:
    """Validate a fraction in (0, 1], named ``option`` in errors."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(
            f"{option}={fraction!r} must be a number in (0, 1]: the share of the noise every table at its loosest"
            " candidate would add that the chosen bounds may add (e.g. 0.1)."
        )
    return float(fraction)


def relative_noise_budget(stats: Mapping[str, TableStats], fraction: float) -> float | None:
    """The noise mode's default budget: ``fraction`` of the noise every table would add at its largest candidate.

    That noise is the sum over tables of their noise share there (:meth:`TableStats.noise_share`). Errors on different
    tables are independent, so their shares add; to first order a zero-mean perturbation of a model's score moves its
    loss, and its AUROC, in proportion to the perturbation's variance. Bounds whose shares sum to ``fraction`` of the
    all-loosest sum therefore cost about ``fraction`` of what every table loose costs, on any data set and at any point
    of a run, whatever the statistic's level there (docs/adaptive.md).

    Args:
        stats: Every table's calibration statistics.
        fraction: The share, in (0, 1].

    Returns:
        The budget; 0 when every share is 0 (no table's error reaches the loss); ``None`` when no table has a share.

    Raises:
        ValueError: If ``fraction`` is not in (0, 1].
    """
    fraction = check_fraction(fraction)
    loosest = [share[max(share)] for s in stats.values() if (share := s.noise_share()) is not None]
    return fraction * sum(loosest) if loosest else None


def noise_table_bounds(stats: Mapping[str, TableStats], budget: float) -> dict[str, float]:
    """The noise mode's bounds: per table, a candidate such that the tables' noise shares sum to at most ``budget``.

    A noise share (:meth:`TableStats.noise_share`) is the variance the codec adds to a batch's loss over the loss's
    minibatch variance. Among such bounds, the fewest compressed bytes a greedy search finds: every table starts at
    the smallest candidate, then, while a move fits in what is left of the budget, the one table whose next larger
    candidate saves the most bytes per share of noise added takes it. The shares of independent errors add, so the
    budget bounds the noise the codec adds to the whole loss.

    Args:
        stats: Every table's calibration statistics.
        budget: The largest sum of noise shares, > 0.

    Returns:
        ``{table: bound}``; tables without observed gradients or noise are left out.

    Raises:
        ValueError: If ``budget`` is not a positive finite number.
    """
    budget = check_tolerance(budget, "noise_budget")
    shares = {name: share for name, s in stats.items() if (share := s.noise_share()) is not None}
    steps = {name: sorted(share) for name, share in shares.items()}
    at = dict.fromkeys(shares, 0)  # each table's index into its ascending candidates
    used = sum(shares[name][steps[name][0]] for name in shares)
    while True:
        best, best_rate = None, 0.0
        for name, i in at.items():
            if i + 1 >= len(steps[name]):
                continue
            nbytes = stats[name].encoded_bytes
            saved = nbytes[i] - nbytes[i + 1]
            added = shares[name][steps[name][i + 1]] - shares[name][steps[name][i]]
            if saved <= 0 or used + added > budget:
                continue
            rate = saved / max(added, 1e-300)
            if rate > best_rate:
                best, best_rate = name, rate
        if best is None:
            break
        i = at[best]
        used += shares[best][steps[best][i + 1]] - shares[best][steps[best][i]]
        at[best] = i + 1
    return {name: steps[name][i] for name, i in at.items()}
