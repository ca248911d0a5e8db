"""Error-bound policy: table-wise calibration and iteration-wise decay (plain functions, no Lightning)."""

from lightning_dlac.adaptive.calibration import (
    CalibrationStats,
    TableStats,
    distinct_rows,
    homogenization_counts,
    homogenization_index,
    value_homogenization_counts,
    value_homogenization_index,
)
from lightning_dlac.adaptive.calibrator import Calibration, CalibrationSettings, Calibrator, ProbeBounds
from lightning_dlac.adaptive.policy import (
    ClassBounds,
    HomogenizationThresholds,
    TableClass,
    class_table_bounds,
    classify,
    gradient_table_bounds,
    sensitivity_classes,
    sensitivity_table_bounds,
)
from lightning_dlac.adaptive.schedule import DecaySchedule, ScheduleKind

__all__ = [
    "Calibration",
    "CalibrationSettings",
    "CalibrationStats",
    "Calibrator",
    "ClassBounds",
    "DecaySchedule",
    "HomogenizationThresholds",
    "ProbeBounds",
    "ScheduleKind",
    "TableClass",
    "TableStats",
    "class_table_bounds",
    "classify",
    "distinct_rows",
    "gradient_table_bounds",
    "homogenization_counts",
    "homogenization_index",
    "sensitivity_classes",
    "sensitivity_table_bounds",
    "value_homogenization_counts",
    "value_homogenization_index",
]
