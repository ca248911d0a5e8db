"""Deprecated: the Criteo converter moved to :mod:`lightning_dlac.criteo` (``dlac preprocess criteo`` is unchanged).

This module only re-exports the public names it used to define, so old imports keep working for now; import them
from :mod:`lightning_dlac.criteo` instead. ``python -m lightning_dlac.preprocess`` still runs the command.
"""

from __future__ import annotations

import sys
import warnings

from lightning_dlac.criteo import (
    DENSE_COLUMNS,
    SPARSE_COLUMNS,
    CriteoConversion,
    CriteoFormatError,
    MultiHotMaterialization,
    MultiHotMember,
    binary_paths,
    check_criteo_binary,
    check_criteo_multi_hot,
    materialize_multi_hot,
    multi_hot_path,
    preprocess_criteo,
    read_multi_hot_layout,
)
from lightning_dlac.criteo.command import main

__all__ = [
    "CriteoConversion",
    "CriteoFormatError",
    "DENSE_COLUMNS",
    "MultiHotMaterialization",
    "MultiHotMember",
    "SPARSE_COLUMNS",
    "binary_paths",
    "check_criteo_binary",
    "check_criteo_multi_hot",
    "main",
    "materialize_multi_hot",
    "multi_hot_path",
    "preprocess_criteo",
    "read_multi_hot_layout",
]

warnings.warn(
    "lightning_dlac.preprocess is deprecated and will be removed: import from lightning_dlac.criteo instead"
    " (the `dlac preprocess criteo` command is unchanged).",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
