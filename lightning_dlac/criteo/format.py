"""The Criteo format in one place: columns, feature names, table sizes, the binary file layout and the dense transforms.

Every other part of :mod:`lightning_dlac.criteo` (the line specification, the converter, the readers) and the example
DataModules import these; none defines its own.

A Criteo line is a 0/1 label, 13 integer features and 26 hex-hashed categorical features, tab-separated, an empty
field meaning missing (:mod:`lightning_dlac.criteo.spec` says exactly which lines are valid). In TorchRec's binary
layout a file ``<stem>`` becomes three ``.npy`` arrays (:func:`binary_paths`), and MLPerf DLRM v2's multi-hot ids a
fourth file (:func:`multi_hot_path`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "BINARY_OUTPUTS",
    "CRITEO_KAGGLE_CARDINALITIES",
    "DENSE_COLUMNS",
    "DENSE_NAMES",
    "FEATURE_NAMES",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS_PER_FEATURE",
    "MULTI_HOT_SUFFIX",
    "MULTI_HOT_TABLES_MEMBER",
    "NUM_FIELDS",
    "SPARSE_COLUMNS",
    "CriteoFormatError",
    "binary_paths",
    "capped_cardinalities",
    "check_multi_hot_sizes",
    "check_per_feature",
    "dense_log1p",
    "dense_torchrec",
    "multi_hot_path",
]

DENSE_COLUMNS = 13
SPARSE_COLUMNS = 26
NUM_FIELDS = 1 + DENSE_COLUMNS + SPARSE_COLUMNS
# TorchRec's names (torchrec.datasets.criteo.DEFAULT_INT_NAMES / DEFAULT_CAT_NAMES), the KeyedJaggedTensor keys.
DENSE_NAMES: tuple[str, ...] = tuple(f"int_{k}" for k in range(DENSE_COLUMNS))
FEATURE_NAMES: tuple[str, ...] = tuple(f"cat_{k}" for k in range(SPARSE_COLUMNS))

# Distinct values per categorical feature in Criteo Kaggle's train.txt, in column order, as the DLRM reference
# (facebookresearch/dlrm, --data-set=kaggle, no --max-ind-range) sizes its embedding tables.
CRITEO_KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# MLPerf DLRM v2's pooling factors (ids per sample) of the 26 Criteo categorical features, in feature order
# (torchrec_dlrm's --multi_hot_sizes for the synthetic multi-hot Criteo 1TB dataset).
MLPERF_MULTI_HOT_SIZES: tuple[int, ...] = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
# MLPerf DLRM v2's table sizes for Criteo 1TB (torchrec_dlrm's --num_embeddings_per_feature: the largest capped at
# 40M rows), which its multi-hot dataset was materialised for.
MLPERF_NUM_EMBEDDINGS_PER_FEATURE: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976,
    14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip

# (suffix, dtype, columns) of TorchRec's three binary files per stem, in this order.
BINARY_OUTPUTS: tuple[tuple[str, np.dtype, int], ...] = (
    ("dense", np.dtype(np.float32), DENSE_COLUMNS),
    ("sparse", np.dtype(np.int64), SPARSE_COLUMNS),
    ("labels", np.dtype(np.int32), 1),
)
MULTI_HOT_SUFFIX = "sparse_multi_hot"
# The extra member of a multi-hot .npz naming the table sizes the bags were drawn for; MLPerf's readers load members
# "0".."25" by name and ignore it, CriteoBinaryDataModule checks it against its num_embeddings_per_feature.
MULTI_HOT_TABLES_MEMBER = "num_embeddings_per_feature"


class CriteoFormatError(ValueError):
    """A Criteo TSV line that does not parse; ``path`` and ``line`` say where.

    Args:
        message: What is wrong, naming the file and line.
        path: The file.
        line: The line, 1-based.
    """

    def __init__(self, message: str, path: str, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def binary_paths(directory: str | os.PathLike, stem: str) -> tuple[Path, Path, Path]:
    """The .npy paths of one stem of TorchRec's binary layout.

    Args:
        directory: The directory holding the files.
        stem: Their common stem (``"day_0"``, ``"train"``).

    Returns:
        The ``(dense, sparse, labels)`` paths, in TorchRec's naming (``<stem>_dense.npy``, ...).
    """
    d = Path(directory)
    return tuple(d / f"{stem}_{suffix}.npy" for suffix, _, _ in BINARY_OUTPUTS)  # type: ignore[return-value]


def multi_hot_path(directory: str | os.PathLike, stem: str) -> Path:
    """The path of the .npz holding MLPerf DLRM v2's multi-hot ids of one stem.

    Args:
        directory: The directory holding the files.
        stem: Their common stem.

    Returns:
        ``<directory>/<stem>_sparse_multi_hot.npz``.
    """
    return Path(directory) / f"{stem}_{MULTI_HOT_SUFFIX}.npz"


def capped_cardinalities(max_rows: int) -> list[int]:
    """Criteo Kaggle's cardinalities with every table capped at ``max_rows`` rows (CPU-sized tables).

    Args:
        max_rows: The largest table size to allow; larger tables are hashed down to it.

    Returns:
        26 table sizes, one per feature in :data:`FEATURE_NAMES` order.

    Raises:
        ValueError: If ``max_rows`` is below 1.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be a positive number of embedding rows, got {max_rows}.")
    return [min(n, max_rows) for n in CRITEO_KAGGLE_CARDINALITIES]


def check_per_feature(
    values: Sequence[int], what: str, unit: str = "value", hint: str = "", count: int = SPARSE_COLUMNS
) -> list[int]:
    """Check that ``values`` are ``count`` integers of at least 1, one per categorical feature.

    Args:
        values: One value per categorical feature (pooling factors, table sizes).
        what: The option's name, for the message.
        unit: What one value is, for the message ("pooling factor").
        hint: Appended to the message on a wrong count (e.g. a valid value to copy).
        count: How many categorical features there are (Criteo's 26 unless a model says otherwise).

    Returns:
        ``values`` as a list of ints.

    Raises:
        ValueError: If there are not ``count`` values or one is below 1; the message names ``what``.
    """
    sizes = [int(v) for v in values]
    if len(sizes) != count:
        raise ValueError(f"{what} needs one {unit} per categorical feature ({count}), got {len(sizes)}{hint}.")
    if min(sizes) < 1:
        raise ValueError(f"{what} must all be at least 1, got {sizes}.")
    return sizes


def check_multi_hot_sizes(multi_hot_sizes: Sequence[int], count: int = SPARSE_COLUMNS) -> list[int]:
    """Check that ``multi_hot_sizes`` are ``count`` pooling factors of at least 1.

    Args:
        multi_hot_sizes: Ids per sample of each categorical feature.
        count: How many categorical features there are (Criteo's 26 unless a model says otherwise).

    Returns:
        The sizes as a list of ints.

    Raises:
        ValueError: If there are not ``count`` sizes or one is below 1; the message names the option.
    """
    hint = f"; e.g. MLPerf DLRM v2's {list(MLPERF_MULTI_HOT_SIZES)}" if count == SPARSE_COLUMNS else ""
    return check_per_feature(multi_hot_sizes, "multi_hot_sizes", "pooling factor", hint, count=count)


def dense_torchrec(raw: np.ndarray, minimum: int) -> np.ndarray:
    """TorchRec's dense transform of raw int32 integer features: ``log(x - minimum + 2)`` as float32.

    It is computed as ``BinaryCriteoUtils.tsv_to_npys`` does (int32 arithmetic, wrapping included).

    Args:
        raw: Integer features, int32 (missing = 0).
        minimum: The smallest integer feature of the file (``dlac preprocess criteo``) or of the rows read.

    Returns:
        The transformed features, float32, the shape of ``raw``.
    """
    with np.errstate(over="ignore"):
        shift = np.int32(minimum) - np.int32(2)
        shifted = np.array(raw, dtype=np.int32)
        shifted -= shift
    return np.log(shifted, dtype=np.float32)


def dense_log1p(raw: np.ndarray) -> np.ndarray:
    """The DLRM reference's dense transform: negative -> 0, then ``log(1 + x)``, as float32.

    Args:
        raw: Integer features.

    Returns:
        The transformed features, float32, the shape of ``raw``.
    """
    return np.log1p(np.maximum(np.asarray(raw, dtype=np.float64), 0.0)).astype(np.float32)
