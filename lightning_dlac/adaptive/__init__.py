"""Error-bound policy: the bound types, table-wise calibration and iteration-wise decay (plain functions and small
dataclasses; torch, no Lightning, no TorchRec).

| module | job |
|---|---|
| ``bounds`` | the bound types: :class:`ErrorBounds` (what the exchanges read), probes, classes, validation |
| ``calibration`` | per-table statistics measured on the payload and its gradient |
| ``policy`` | statistics to one bound per table (gradient, noise, homogenization, sensitivity) |
| ``calibrator`` | the table-wise level's state machine, driven by ``DLACCallback`` or a plain loop |
| ``schedule`` | the iteration-wise multiplier ``m(t)`` |
"""

from lightning_dlac.adaptive.bounds import (
    BoundSource,
    Calibration,
    ClassBounds,
    ErrorBounds,
    ProbeBounds,
    TableClass,
    check_relative_bound,
)
from lightning_dlac.adaptive.calibration import (
    CalibrationStats,
    TableStats,
    distinct_rows,
    homogenization_counts,
    homogenization_index,
    value_homogenization_counts,
    value_homogenization_index,
)
from lightning_dlac.adaptive.calibrator import CalibrationSettings, Calibrator
from lightning_dlac.adaptive.policy import (
    HomogenizationThresholds,
    class_table_bounds,
    classify,
    gradient_table_bounds,
    noise_table_bounds,
    relative_noise_budget,
    sensitivity_classes,
    sensitivity_table_bounds,
)
from lightning_dlac.adaptive.schedule import DecaySchedule, ScheduleKind
from lightning_dlac.checks import check_count  # public here since before lightning_dlac.checks existed

__all__ = [
    "BoundSource",
    "Calibration",
    "CalibrationSettings",
    "CalibrationStats",
    "Calibrator",
    "ClassBounds",
    "DecaySchedule",
    "ErrorBounds",
    "HomogenizationThresholds",
    "ProbeBounds",
    "ScheduleKind",
    "TableClass",
    "TableStats",
    "check_count",
    "check_relative_bound",
    "class_table_bounds",
    "classify",
    "distinct_rows",
    "gradient_table_bounds",
    "homogenization_counts",
    "homogenization_index",
    "noise_table_bounds",
    "relative_noise_budget",
    "sensitivity_classes",
    "sensitivity_table_bounds",
    "value_homogenization_counts",
    "value_homogenization_index",
]
