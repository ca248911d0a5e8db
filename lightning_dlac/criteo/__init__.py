"""The Criteo click logs: format, the one line specification, the converter, writers, multi-hot ids and readers.

| module | job |
|---|---|
| ``format`` | columns, feature names, table sizes, the binary file names, the dense transforms |
| ``spec`` | the one definition of a valid TSV line: the pure-Python reference parser |
| ``parser`` | native parser or reference (``DLAC_PREPROCESS_IMPL``), block parsing, :func:`read_tsv` |
| ``writers`` | ``.npy`` headers, positioned writes, stored ``.npz`` (zip) files |
| ``convert`` | TSV to TorchRec's binary layout, streamed and in parallel |
| ``multi_hot`` | MLPerf DLRM v2's multi-hot bags and their ``.npz`` files |
| ``binary`` | reading the binary layouts back: header checks and member offsets |

Importing it needs only NumPy (torch is imported where a function needs it), so ``dlac preprocess --help`` is
instant (the command is :mod:`lightning_dlac.commands.preprocess`). The DataModules that train on these files live
in ``lightning_dlac.examples`` (``tsv``, ``binary``).
"""

from lightning_dlac.criteo.binary import (
    MultiHotMember,
    check_criteo_binary,
    check_criteo_multi_hot,
    read_multi_hot_layout,
    read_npy_header,
)
from lightning_dlac.criteo.convert import CriteoConversion, preprocess_criteo
from lightning_dlac.criteo.format import (
    CRITEO_KAGGLE_CARDINALITIES,
    DENSE_COLUMNS,
    DENSE_NAMES,
    FEATURE_NAMES,
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS_PER_FEATURE,
    SPARSE_COLUMNS,
    CriteoFormatError,
    binary_paths,
    capped_cardinalities,
    check_multi_hot_sizes,
    dense_log1p,
    dense_torchrec,
    multi_hot_path,
)
from lightning_dlac.criteo.multi_hot import MultiHotMaterialization, materialize_multi_hot, multi_hot_from_one_hot
from lightning_dlac.criteo.parser import CriteoRows, read_tsv, resolve_parser

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "DENSE_COLUMNS",
    "DENSE_NAMES",
    "FEATURE_NAMES",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS_PER_FEATURE",
    "SPARSE_COLUMNS",
    "CriteoConversion",
    "CriteoFormatError",
    "CriteoRows",
    "MultiHotMaterialization",
    "MultiHotMember",
    "binary_paths",
    "capped_cardinalities",
    "check_criteo_binary",
    "check_criteo_multi_hot",
    "check_multi_hot_sizes",
    "dense_log1p",
    "dense_torchrec",
    "materialize_multi_hot",
    "multi_hot_from_one_hot",
    "multi_hot_path",
    "preprocess_criteo",
    "read_multi_hot_layout",
    "read_npy_header",
    "read_tsv",
    "resolve_parser",
]
