"""Criteo TSV files (Kaggle ``train.txt`` format) read whole into memory: for small files and samples.

Every line is parsed by the converter's parser (:func:`lightning_dlac.criteo.read_tsv`: native, or its pure-Python
reference), so this module accepts exactly the lines ``dlac preprocess criteo`` accepts and names a bad one the same
way. For full-size data convert once with ``dlac preprocess criteo`` and train with
:class:`~lightning_dlac.examples.binary.CriteoBinaryDataModule`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torchrec.datasets.utils import Batch
from typing_extensions import override

from lightning_dlac.criteo import dense_log1p, dense_torchrec, read_tsv

from .base import DEFAULT_MAX_ROWS, RowSplitsDataModule, table_sizes

__all__ = ["TSV_SIZE_WARNING_BYTES", "CriteoTSVDataModule"]

# CriteoTSVDataModule holds the whole file in memory on every rank (about 300 MB per million rows): past this file
# size (about a million rows) it warns and points to `dlac preprocess criteo` + CriteoBinaryDataModule.
TSV_SIZE_WARNING_BYTES: int = 200 * 2**20
_DENSE_TRANSFORMS = ("log1p", "torchrec")

# One split in memory: labels [N] float32, dense [N, 13] float32, ids [N, 26] int64 (already modulo the table sizes).
_Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class CriteoTSVDataModule(RowSplitsDataModule):
    """Criteo Kaggle display-advertising TSV files (``train.txt`` format) as DLRM batches: for small files.

    Every rank reads the whole file into memory, which suits samples up to about a million rows. For full-size data
    (Kaggle's 45.8M rows, the 1TB days) convert once with ``dlac preprocess criteo`` and train with
    :class:`~lightning_dlac.examples.binary.CriteoBinaryDataModule`, where each rank reads only its rows; past
    :data:`TSV_SIZE_WARNING_BYTES` this module warns and says so.

    Each line is a 0/1 label, 13 integer features and 26 hex-hashed categoricals, tab-separated, an empty field
    meaning missing, checked as :mod:`lightning_dlac.criteo.spec` defines (the first bad line stops ``setup`` with
    the file and line number). Dense features: missing -> 0, then ``dense_transform``. Categoricals:
    ``int(hex, 16) % table_size``; a missing categorical becomes id 0 (so id 0 mixes "missing" with the hashed
    values that land on 0, as in the DLRM reference's preprocessing).

    Files are parsed once in :meth:`setup` by the converter's parser (native, or without a C++ compiler its
    pure-Python reference; ``DLAC_PREPROCESS_IMPL`` chooses; their rates: docs/benchmarks.md, 'Data: Criteo
    preprocessing and loading'). Without ``val_path`` the last ``val_fraction`` of the training rows (Criteo is
    time-ordered, so the latest ones) are held out. Training rows are then shuffled once with ``seed`` (the order is
    the same every epoch). Rows are cut into batches, the remainder dropped, and rank ``r`` of ``W`` takes global
    batches ``r, r + W, ...`` up to the same count on every rank.

    Args:
        train_path: Path of the training TSV.
        val_path: Path of the validation TSV; ``None`` holds out the last ``val_fraction`` of ``train_path``.
        num_embeddings_per_feature: Rows of each of the 26 tables; ``None`` uses the Criteo Kaggle sizes capped
            at ``max_rows``.
        max_rows: Cap on table sizes when ``num_embeddings_per_feature`` is ``None``.
        batch_size: Samples per batch, per rank.
        max_samples: Read at most this many rows of each file (``None``: all).
        val_fraction: Fraction of the training rows held out when ``val_path`` is ``None``.
        shuffle: Shuffle the training rows (once, with ``seed``) before batching.
        seed: Seed of the shuffle.
        num_workers: DataLoader worker processes.
        dense_transform: ``log1p`` (``log(1 + max(x, 0))``, the DLRM reference's) or ``torchrec``
            (``log(x - min + 2)`` with the minimum of the rows read, what ``dlac preprocess criteo`` and TorchRec's
            converter store).

    Raises:
        ValueError: If ``dense_transform`` is not one of its choices, ``max_samples`` is below 1, ``val_fraction``
            is outside [0, 1), or a table size is invalid.
        FileNotFoundError: If a TSV file is missing.
    """

    def __init__(
        self,
        train_path: str,
        val_path: str | None = None,
        num_embeddings_per_feature: list[int] | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        batch_size: int = 512,
        max_samples: int | None = None,
        val_fraction: float = 0.2,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        dense_transform: str = "log1p",
    ) -> None:
        num_embeddings_per_feature = table_sizes(num_embeddings_per_feature, max_rows)
        super().__init__(num_embeddings_per_feature, batch_size, num_workers)
        self._save_hyperparameters()
        if dense_transform not in _DENSE_TRANSFORMS:
            raise ValueError(f"dense_transform must be one of {_DENSE_TRANSFORMS}, got {dense_transform!r}.")
        self.dense_transform = dense_transform
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be a positive row count or None, got {max_samples}.")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}.")
        # Fail at construction (before any process is launched), naming the option; setup() checks again.
        self._check_file(train_path, "train_path")
        if val_path is not None:
            self._check_file(val_path, "val_path")
        self._warn_if_large([train_path] + ([val_path] if val_path is not None else []), max_samples)
        self.train_path = train_path
        self.val_path = val_path
        self.max_samples = max_samples
        self.val_fraction = val_fraction
        self.shuffle = shuffle
        self.seed = seed
        self._splits: dict[str, _Rows] | None = None

    def _check_file(self, path: str | None, argument: str) -> Path:
        file = Path(path).expanduser() if path is not None else None
        if file is None or not file.is_file():
            raise FileNotFoundError(
                f"Criteo TSV file not found: {str(file) if file else None!r}. Set `{argument}` of"
                f" {type(self).__name__} to an existing Criteo Kaggle train.txt-format file (on the command line:"
                f" --data.{argument}=/path/to/train.txt)."
            )
        return file

    @staticmethod
    def _warn_if_large(paths: list[str], max_samples: int | None) -> None:
        # A Criteo line is about 150-200 bytes: max_samples bounds what is read.
        size = sum(Path(p).expanduser().stat().st_size for p in paths)
        if max_samples is not None:
            size = min(size, 200 * max_samples * len(paths))
        if size > TSV_SIZE_WARNING_BYTES:
            rank_zero_warn(
                f"CriteoTSVDataModule reads {size / 2**20:.0f} MiB of TSV into memory on every rank (about 300 MB per"
                " million rows, per rank). Convert once with `dlac preprocess criteo --output DIR FILE...` and use"
                " CriteoBinaryDataModule (examples/configs/dlrm_criteo_binary.yaml), which reads only each rank's"
                " rows; or set max_samples."
            )

    def _read(self, path: str, argument: str) -> _Rows:
        rows = read_tsv(self._check_file(path, argument), self.max_samples)
        if self.dense_transform == "torchrec":
            dense = dense_torchrec(rows.dense, rows.dense_min)
        else:
            dense = dense_log1p(rows.dense)
        ids = rows.sparse % np.asarray(self.num_embeddings_per_feature, dtype=np.int64)
        return torch.from_numpy(rows.labels.astype(np.float32)), torch.from_numpy(dense), torch.from_numpy(ids)

    @override
    def setup(self, stage: str) -> None:
        if self._splits is not None:
            return
        train = self._read(self.train_path, "train_path")
        if self.val_path is not None:
            val = self._read(self.val_path, "val_path")
        else:
            cut = train[0].shape[0] - int(round(self.val_fraction * train[0].shape[0]))
            val = tuple(t[cut:] for t in train)
            train = tuple(t[:cut] for t in train)
        if self.shuffle:
            perm = torch.randperm(train[0].shape[0], generator=torch.Generator().manual_seed(self.seed))
            train = tuple(t[perm] for t in train)
        self._splits = {"train": train, "val": val}  # type: ignore[dict-item]
        self.check_split_sizes(repr(self.train_path), "Lower `batch_size` or raise `max_samples`.")

    def split_rows(self, split: str) -> int:
        """Rows in a split, before cutting into batches.

        Args:
            split: ``"train"`` or ``"val"``.

        Returns:
            The split's rows (0 for another split).

        Raises:
            RuntimeError: If ``setup`` has not read the files yet.
        """
        if self._splits is None:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for batches.")
        return int(self._splits[split][0].shape[0]) if split in self._splits else 0

    def read_batch(self, split: str, index: int) -> Batch:
        """Read one global batch of a split: its rows ``[index * batch_size, (index + 1) * batch_size)``.

        Args:
            split: ``"train"`` or ``"val"``.
            index: The global batch index.

        Returns:
            The batch.
        """
        labels, dense, ids = self._splits[split]  # type: ignore[index]
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        # KJT values are key-major: all samples of cat_0, then cat_1, ...
        return self.make_batch(dense[rows].contiguous(), ids[rows].t().contiguous().view(-1), labels[rows].contiguous())
