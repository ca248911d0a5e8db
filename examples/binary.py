"""Criteo in TorchRec's binary layout (``<stem>_{dense,sparse,labels}.npy``, or MLPerf's multi-hot ``.npz``): full size.

:class:`CriteoBinaryDataModule` reads the files ``dlac preprocess criteo`` (or TorchRec's converter, or MLPerf's
materialisation) writes. Opening reads and checks only the headers (:mod:`lightning_dlac.criteo.binary`); each rank
then reads only its own batches, each when it is needed, so a rank holds one batch in memory whatever the data size.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from typing_extensions import override

from lightning_dlac.criteo import (
    FEATURE_NAMES,
    binary_paths,
    check_criteo_binary,
    check_criteo_multi_hot,
    check_multi_hot_sizes,
    multi_hot_path,
    read_npy_header,
)

from .base import DEFAULT_MAX_ROWS, ResumableDataLoader, RowSplitsDataModule, make_batch, table_sizes

__all__ = ["CriteoBinaryDataModule"]

_DAYS_1TB = 24


# One file segment of a split: (the stem's (dense, sparse, labels) paths, first row, rows, the stem's multi-hot arrays
# (the .npz path and each feature's member) or None when the one-hot sparse file is read).
_Segment = tuple[tuple[Path, Path, Path], int, int, "tuple[Path, list] | None"]


class _BinaryBatches:
    """Picklable ``global_index -> Batch`` over a split of TorchRec-layout ``.npy`` files.

    The split is a list of ``(dense, sparse, labels paths, first row, rows, multi-hot)`` segments read as one
    concatenation; global batch ``g`` is its rows ``[g * B, (g + 1) * B)`` (or batch ``order[g]`` when shuffled).
    Files are opened lazily in each process (DataLoader workers included). By default each batch's rows are read
    with ``pread`` into fresh arrays, so a rank's resident memory is one batch whatever the data size; with
    ``mmap_mode`` the files are memory-mapped through TorchRec's ``load_npy_range(mmap_mode=True)`` instead
    (zero-copy from the page cache, but the mapped pages count in the rank's RSS, and the kernel maps neighbours of
    the pages read, so it grows beyond the rank's share: docs/benchmarks.md, 'Data: Criteo preprocessing and
    loading').

    With ``multi_hot_sizes`` the categorical ids come from each stem's ``_sparse_multi_hot.npz`` instead: one
    ``[rows, multi_hot_sizes[t]]`` array per feature, stored uncompressed, so each is read (or memory-mapped) at its
    member's offset like a ``.npy``. Its ids are used as they are (they were taken modulo the table sizes when the
    file was materialised); one outside its table stops training with an error naming the file.
    """

    def __init__(
        self,
        segments: list[_Segment],
        table_sizes: Sequence[int],
        batch_size: int,
        order: np.ndarray | None,
        mmap_mode: bool = False,
        multi_hot_sizes: Sequence[int] | None = None,
    ) -> None:
        self.segments = segments
        self.batch_size = batch_size
        self.order = order
        self.mmap_mode = mmap_mode
        self.table_sizes = [int(n) for n in table_sizes]
        self.hashes = np.asarray(table_sizes, dtype=np.int64).reshape(1, -1)
        self.bounds = np.cumsum([0, *(rows for _, _, rows, _ in segments)])
        self.multi_hot_sizes = list(multi_hot_sizes) if multi_hot_sizes is not None else None
        if self.multi_hot_sizes is None:
            self.lengths = torch.ones(len(FEATURE_NAMES) * batch_size, dtype=torch.int32)
        else:
            self.lengths = torch.tensor(self.multi_hot_sizes, dtype=torch.int32).repeat_interleave(batch_size)
        self._arrays: list | None = None

    @property
    def num_rows(self) -> int:
        return int(self.bounds[-1])

    def __getstate__(self) -> dict:
        # Open files and memory maps are reopened in the receiving process rather than pickled.
        return {**self.__dict__, "_arrays": None}

    def __del__(self) -> None:
        if not getattr(self, "mmap_mode", True) and getattr(self, "_arrays", None):
            for fd in {fd for files in self._arrays for fd, _, _, _ in files}:
                os.close(fd)

    def _open(self) -> list:
        """Per segment, its arrays in the order (dense, sparse (one array, or one per feature), labels)."""
        if self._arrays is not None:
            return self._arrays
        arrays = []
        if self.mmap_mode:
            from torchrec.datasets.criteo import BinaryCriteoUtils

            for (dense, sparse, labels), first, rows, multi_hot in self.segments:
                load = functools.partial(
                    BinaryCriteoUtils.load_npy_range, start_row=first, num_rows=rows, mmap_mode=True
                )
                if multi_hot is None:
                    middle = [load(str(sparse))]
                else:
                    npz, members = multi_hot
                    maps = [np.memmap(npz, m.dtype, "r", offset=m.offset, shape=(m.rows, m.cols)) for m in members]
                    middle = [a[first : first + rows] for a in maps]
                arrays.append((load(str(dense)), *middle, load(str(labels))))
        else:
            for (dense, sparse, labels), first, _, multi_hot in self.segments:
                files = []
                for p in (dense, sparse, labels) if multi_hot is None else (dense, labels):
                    offset, shape, _, dtype = read_npy_header(p)
                    start = offset + first * shape[1] * dtype.itemsize
                    files.append((os.open(p, os.O_RDONLY), start, shape[1] * dtype.itemsize, (dtype, shape[1])))
                if multi_hot is not None:
                    npz, members = multi_hot
                    fd = os.open(npz, os.O_RDONLY)  # one descriptor for all of the file's members
                    row = [m.cols * m.dtype.itemsize for m in members]
                    files[1:1] = [(fd, m.offset + first * r, r, (m.dtype, m.cols)) for m, r in zip(members, row)]
                arrays.append(files)
        self._arrays = arrays
        return arrays

    def _read(self, k: int, lo: int, n: int) -> tuple[np.ndarray, ...]:
        """Rows ``[lo, lo + n)`` of segment ``k``."""
        if self.mmap_mode:
            out = tuple(a[lo : lo + n] for a in self._open()[k])
        else:
            parts = []
            for fd, offset, row_bytes, (dtype, cols) in self._open()[k]:
                data = os.pread(fd, n * row_bytes, offset + lo * row_bytes)
                if len(data) != n * row_bytes:
                    raise OSError(f"short read from {self.segments[k][0]}: the file changed while training?")
                parts.append(np.frombuffer(data, dtype=dtype).reshape(n, cols))
            out = tuple(parts)
        if self.segments[k][3] is not None:
            self._check_ids(k, lo, out[1:-1])
        return out

    def _check_ids(self, k: int, lo: int, features: Sequence[np.ndarray]) -> None:
        """Multi-hot ids are not hashed: name the file if one lies outside its table."""
        for t, (ids, rows) in enumerate(zip(features, self.table_sizes)):
            if ids.size and (int(ids.max()) >= rows or int(ids.min()) < 0):
                npz = self.segments[k][3][0]
                first = self.segments[k][1] + lo
                bad = int(ids.max()) if int(ids.max()) >= rows else int(ids.min())
                raise ValueError(
                    f"{npz}: feature {FEATURE_NAMES[t]} holds id {bad} (rows {first}..{first + len(ids) - 1}), outside"
                    f" its table of {rows} rows (num_embeddings_per_feature[{t}]). The file was materialised for other"
                    " table sizes: set num_embeddings_per_feature to those (MLPerf's own files:"
                    " MLPERF_NUM_EMBEDDINGS_PER_FEATURE), or re-materialise it with `dlac preprocess criteo"
                    " --multi-hot-sizes ... --num-embeddings-per-feature ... --overwrite` (docs/data.md)."
                )

    def _rows(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        pieces = []
        k = int(np.searchsorted(self.bounds, lo, side="right")) - 1
        while lo < hi:
            start, stop = int(self.bounds[k]), int(self.bounds[k + 1])
            take = min(hi, stop) - lo
            pieces.append(self._read(k, lo - start, take))
            lo += take
            k += 1
        if len(pieces) == 1:
            return pieces[0]
        return tuple(np.concatenate(parts) for parts in zip(*pieces))

    def __call__(self, index: int) -> Batch:
        g = int(self.order[index]) if self.order is not None else index
        dense, *sparse, labels = self._rows(g * self.batch_size, (g + 1) * self.batch_size)
        if self.multi_hot_sizes is None:
            # Ids modulo the table sizes (TorchRec's `hashes`), then key-major for the KJT: all of cat_0, then cat_1...
            ids = torch.from_numpy(np.ascontiguousarray((sparse[0] % self.hashes).T)).view(-1)
        else:
            # Feature-major, each feature's [B, P] ids sample by sample: the KJT's values with lengths P.
            ids = torch.from_numpy(np.concatenate([f.reshape(-1) for f in sparse]).astype(np.int64))
        dense = torch.from_numpy(np.array(dense, dtype=np.float32))
        labels = torch.from_numpy(labels.reshape(-1).astype(np.float32))
        return make_batch(dense, ids, labels, self.lengths, feature_names=FEATURE_NAMES)


class CriteoBinaryDataModule(RowSplitsDataModule):
    """Criteo in TorchRec's binary layout (``<stem>_{dense,sparse,labels}.npy``), memory-mapped: full-size data.

    Create the files once with ``dlac preprocess criteo --output DATA_DIR day_0 ... day_23`` (Criteo 1TB) or
    ``... train.txt`` (Kaggle); TorchRec's ``scripts/npy_preproc_criteo.py`` writes the same files. Dense features
    are TorchRec's ``log(x - min + 2)``, categoricals are taken modulo the table sizes when batches are built (as
    TorchRec's ``InMemoryBinaryCriteoIterDataPipe(mmap_mode=True, hashes=...)`` does), labels become float32.

    Multi-hot (MLPerf DLRM v2): with ``multi_hot_sizes`` the categoricals come from ``<stem>_sparse_multi_hot.npz``
    (``<stem>_sparse.npy`` is then not needed), as torchrec_dlrm's ``MultiHotCriteoIterDataPipe`` reads MLPerf's
    dataset; ``dlac preprocess criteo --multi-hot-sizes mlperf ...`` materialises them from the one-hot days.

    Splits:

    - by day (``val_stems`` non-empty, the default when ``day_23`` is present): train on ``train_stems`` (default
      ``day_0`` .. ``day_22``), validate on the first half of the ``val_stems`` rows and test on the second half, as
      TorchRec's DLRM example does with day 23;
    - by fraction (the default for a lone ``train`` stem, Criteo Kaggle): of the ``train_stems`` rows, the last
      ``test_fraction`` are the test split, the ``val_fraction`` before them validation, the rest training (Criteo
      is time-ordered; the defaults hold out Kaggle's seventh day, half for validation and half for test, as the
      DLRM reference does).

    Global batch ``g`` of a split is its rows ``[g * batch_size, (g + 1) * batch_size)`` and rank ``r`` of ``W``
    reads batches ``r, r + W, ...`` (TorchRec's batch interleaving), the same number on every rank (remainders are
    dropped). Only a rank's batches are read, each when it is needed (``pread`` of its rows, or from a memory map with
    ``mmap_mode``), so opening costs milliseconds and a rank holds one batch in memory, not its share of the data.
    ``shuffle`` permutes the order of whole training batches once with ``seed`` (rows stay contiguous, so reads stay
    sequential).

    Args:
        data_dir: Directory holding the ``.npy`` files.
        train_stems: Training stems; ``None``: ``day_0`` .. ``day_22`` if ``day_23`` is there, else ``train``.
        val_stems: Held-out stems split in half for validation and test; ``None``: ``["day_23"]`` when training on
            1TB days, else none (fraction split). ``[]`` forces the fraction split.
        num_embeddings_per_feature: Rows of each of the 26 tables (ids are taken modulo these); ``None`` uses the
            Criteo Kaggle sizes capped at ``max_rows``.
        max_rows: Cap on table sizes when ``num_embeddings_per_feature`` is ``None``.
        batch_size: Samples per batch, per rank.
        val_fraction: Fraction of the rows held out for validation in the fraction split.
        test_fraction: Fraction of the rows held out for test in the fraction split.
        max_samples: Use at most the first this many rows of each split (``None``: all): quick runs on big data.
        shuffle: Shuffle the order of training batches (once, with ``seed``).
        seed: Seed of the shuffle.
        num_workers: DataLoader worker processes.
        mmap_mode: Memory-map the files (TorchRec's ``load_npy_range(mmap_mode=True)``) instead of reading each
            batch's rows: zero-copy from the page cache, but the mapped pages count in the rank's resident memory.
        multi_hot_sizes: Ids per sample of each of the 26 features (MLPerf DLRM v2: :data:`MLPERF_MULTI_HOT_SIZES`).
            Set, the categoricals are read from ``<stem>_sparse_multi_hot.npz`` (MLPerf's layout: one int32
            ``[rows, multi_hot_sizes[t]]`` array per feature, members ``"0"`` .. ``"25"``, written by ``dlac
            preprocess criteo --multi-hot-sizes`` or MLPerf's materialisation script) instead of
            ``<stem>_sparse.npy``, each rank reading its rows in place as with the ``.npy`` files, and KJT lengths are
            the pooling factors. Ids are used as stored: the file must have been materialised for
            ``num_embeddings_per_feature`` (checked at construction when the file records its table sizes, and
            per batch: an id outside its table raises an error naming the file). ``None``: one-hot.

    Raises:
        ValueError: If a fraction is outside [0, 1) or they sum to 1 or more, ``max_samples`` is below 1, the stems
            are empty or overlap, a table size or multi-hot size is invalid, or a file is invalid (the message names
            it).
        FileNotFoundError: If ``data_dir`` or a stem's file is missing (the message says how to create it).
    """

    def __init__(
        self,
        data_dir: str,
        train_stems: list[str] | None = None,
        val_stems: list[str] | None = None,
        num_embeddings_per_feature: list[int] | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        batch_size: int = 512,
        val_fraction: float = 1 / 14,
        test_fraction: float = 1 / 14,
        max_samples: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        mmap_mode: bool = False,
        multi_hot_sizes: list[int] | None = None,
    ) -> None:
        num_embeddings_per_feature = table_sizes(num_embeddings_per_feature, max_rows)
        super().__init__(num_embeddings_per_feature, batch_size, num_workers)
        self._save_hyperparameters()
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {value}.")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be below 1, got {val_fraction + test_fraction}.")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be a positive row count or None, got {max_samples}.")
        directory = Path(data_dir).expanduser()
        if not directory.is_dir():
            raise FileNotFoundError(
                f"Criteo binary directory not found: {str(directory)!r}. Set `data_dir` of {type(self).__name__} to"
                " the --output of `dlac preprocess criteo` (on the command line: --data.data_dir=/path/to/dir)."
            )
        day_23 = (directory / "day_23_dense.npy").is_file()
        if train_stems is None:
            train_stems = [f"day_{d}" for d in range(_DAYS_1TB - 1)] if day_23 else ["train"]
        if val_stems is None:
            val_stems = ["day_23"] if day_23 and all(s.startswith("day_") for s in train_stems) else []
        if not train_stems:
            raise ValueError("train_stems is empty: name at least one <stem> of <stem>_dense.npy.")
        overlap = sorted(set(train_stems) & set(val_stems))
        if overlap:
            raise ValueError(f"{overlap} are both training and held-out stems; a stem belongs to one of them.")
        if multi_hot_sizes is not None:
            multi_hot_sizes = check_multi_hot_sizes(multi_hot_sizes)
        self.multi_hot_sizes = multi_hot_sizes
        # Headers only: fails here, before any process is launched, naming the file and the problem.
        self._multi_hot: dict[str, tuple[Path, list] | None] = {}
        self._rows: dict[str, int] = {}
        for stem in [*train_stems, *val_stems]:
            if multi_hot_sizes is None:
                self._rows[stem] = check_criteo_binary(directory, stem)
                self._multi_hot[stem] = None
            else:
                rows, members = check_criteo_multi_hot(directory, stem, multi_hot_sizes, num_embeddings_per_feature)
                self._rows[stem] = rows
                self._multi_hot[stem] = (multi_hot_path(directory, stem), members)
        self.data_dir = directory
        self.train_stems = list(train_stems)
        self.val_stems = list(val_stems)
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.max_samples = max_samples
        self.shuffle = shuffle
        self.seed = seed
        self.mmap_mode = mmap_mode
        self._splits = self._plan_splits()
        # One reader per (split, world size), opened lazily in each process that reads (DataLoader workers too).
        self._readers: dict[tuple[str, int], _BinaryBatches] = {}

    def _segments(self, stems: list[str], lo: int, hi: int) -> list[_Segment]:
        """Rows ``[lo, hi)`` of the concatenation of ``stems``, as per-file segments."""
        if self.max_samples is not None:
            hi = min(hi, lo + self.max_samples)
        out, start = [], 0
        for stem in stems:
            n = self._rows[stem]
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                out.append((binary_paths(self.data_dir, stem), a - start, b - a, self._multi_hot[stem]))
            start += n
        return out

    def _plan_splits(self) -> dict[str, list[_Segment]]:
        total = sum(self._rows[s] for s in self.train_stems)
        if self.val_stems:
            held = sum(self._rows[s] for s in self.val_stems)
            half = (held + 1) // 2  # TorchRec: the first ceil(n / 2) rows validate, the rest test
            return {
                "train": self._segments(self.train_stems, 0, total),
                "val": self._segments(self.val_stems, 0, half),
                "test": self._segments(self.val_stems, half, held),
            }
        num_test = int(round(self.test_fraction * total))
        num_val = int(round(self.val_fraction * total))
        cut = total - num_val - num_test
        return {
            "train": self._segments(self.train_stems, 0, cut),
            "val": self._segments(self.train_stems, cut, cut + num_val),
            "test": self._segments(self.train_stems, cut + num_val, total),
        }

    def split_rows(self, split: str) -> int:
        """Rows in a split, before cutting into batches.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"``.

        Returns:
            The split's rows (within ``max_samples``).
        """
        return sum(rows for _, _, rows, _ in self._splits[split])

    @override
    def setup(self, stage: str) -> None:
        self.check_split_sizes(f"{self.data_dir} ({self.train_stems})",
                               "Lower `batch_size`, raise `max_samples`, or add training stems.")

    def read_batch(self, split: str, index: int) -> Batch:
        """Read one global batch of a split: its rows ``[g * B, (g + 1) * B)``.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"``.
            index: The global batch index: ``g = index``, or the shuffled ``g`` with ``shuffle``.

        Returns:
            The batch.
        """
        world_size = self.world_size
        reader = self._readers.get((split, world_size))
        if reader is None:
            order = None
            if split == "train" and self.shuffle:
                # Whole batches are permuted (rows stay contiguous, reads sequential); the same order on every rank.
                order = np.random.default_rng(self.seed).permutation(self.num_batches(split) // world_size * world_size)
            reader = _BinaryBatches(self._splits[split], self.num_embeddings_per_feature, self.batch_size, order,
                                    self.mmap_mode, self.multi_hot_sizes)  # fmt: skip
            self._readers[(split, world_size)] = reader
        return reader(index)

    @override
    def test_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("test")
