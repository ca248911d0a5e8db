"""The old home of the example DataModules, kept so that configs and code naming ``lightning_dlac.examples.data.X``
keep working. New code imports from where each now lives:

| name | module |
|---|---|
| ``SyntheticCriteoDataModule`` | :mod:`lightning_dlac.examples.synthetic` |
| ``CriteoTSVDataModule``, ``TSV_SIZE_WARNING_BYTES`` | :mod:`lightning_dlac.examples.tsv` |
| ``CriteoBinaryDataModule`` | :mod:`lightning_dlac.examples.binary` |
| ``RankShardedDataModule``, ``DEFAULT_MAX_ROWS``, ``make_batch`` | :mod:`lightning_dlac.examples.base` |
| the Criteo constants, ``capped_cardinalities``, ``multi_hot_from_one_hot`` | :mod:`lightning_dlac.criteo` |
"""

from lightning_dlac.criteo import (
    CRITEO_KAGGLE_CARDINALITIES,
    FEATURE_NAMES,
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS_PER_FEATURE,
    capped_cardinalities,
    multi_hot_from_one_hot,
)
from lightning_dlac.criteo import DENSE_COLUMNS as NUM_DENSE_FEATURES

from .base import DEFAULT_MAX_ROWS, RankShardedDataModule, make_batch
from .binary import CriteoBinaryDataModule
from .synthetic import SyntheticCriteoDataModule
from .tsv import TSV_SIZE_WARNING_BYTES, CriteoTSVDataModule

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "DEFAULT_MAX_ROWS",
    "FEATURE_NAMES",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS_PER_FEATURE",
    "NUM_DENSE_FEATURES",
    "CriteoBinaryDataModule",
    "CriteoTSVDataModule",
    "RankShardedDataModule",
    "SyntheticCriteoDataModule",
    "TSV_SIZE_WARNING_BYTES",
    "capped_cardinalities",
    "make_batch",
    "multi_hot_from_one_hot",
]
