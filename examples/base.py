"""The public base of the example DataModules: a global stream of batches, sharded by rank.

A data source is a subclass of :class:`RankShardedDataModule` that writes only the reading part::

    num_batches(split)        -> int     how many batches the split holds in all ranks together
    read_batch(split, index)  -> Batch   global batch ``index`` of ``split``, the same whichever process reads it

and passes the table layout to ``__init__``. The base does the rest, the same way for every source:

- **Sharding.** Rank ``r`` of ``W`` reads global batches ``r, r + W, r + 2W, ...``, ``num_batches(split) // W`` of
  them, so every rank gets the same number of batches (the remainder is dropped) and no collective waits on a rank
  that ran out of data. The rank comes from the attached Trainer, else ``torch.distributed``, else ``(0, 1)``;
  :meth:`~RankShardedDataModule.set_rank` pins it (tests, benchmarks).
- **Loaders.** Every DataLoader is made by :meth:`~RankShardedDataModule.dataloader`, over an
  :class:`~torch.utils.data.IterableDataset` (:class:`RankBatches`) that already holds only this rank's batches, so
  Lightning never adds a ``DistributedSampler``. DataLoader workers split a rank's batches round-robin, which is
  also the order the DataLoader collects them in: the stream is the same for any ``num_workers``.
- **Resuming.** Every loader is a :class:`ResumableDataLoader`: Lightning's stateful-dataloader protocol
  (``state_dict`` / ``load_state_dict``) puts the number of batches this rank has been served in the epoch into
  every checkpoint, and a run resumed from it starts the epoch at the next batch, so it sees exactly the batches the
  interrupted one had left, on every rank. Every source gets this from the base.
- **Layout.** ``num_embeddings_per_feature``, ``feature_names`` and ``num_dense_features`` are attributes a model
  is sized from (the ``dlac`` CLI links them to the model's arguments).
- **Checks.** Every batch a loader serves is checked against that layout (:func:`check_batch`): its feature names,
  its dense width, ids and lengths that agree, ids inside their tables. A source that gets one wrong fails at the
  batch with both numbers named, not steps later inside TorchRec.

Batches are :class:`torchrec.datasets.utils.Batch` (dense ``[B, D]`` float32, a KeyedJaggedTensor of the
categoricals, labels ``[B]`` float32); :meth:`RankShardedDataModule.make_batch` assembles one with the source's own
feature names. docs/data.md, "Adding your own data source", has a complete example.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from typing_extensions import override

from lightning_dlac.criteo.format import DENSE_COLUMNS, FEATURE_NAMES, capped_cardinalities

__all__ = [
    "DEFAULT_MAX_ROWS",
    "SPLITS",
    "RankBatches",
    "RankShardedDataModule",
    "ResumableDataLoader",
    "RowSplitsDataModule",
    "check_batch",
    "make_batch",
    "stream_seed",
    "table_sizes",
]

# Lightning warns about every IterableDataset that defines __len__, since a dataset whose DataLoader workers each
# yield everything would be counted wrongly. RankBatches splits its batches among the workers (each yields its own
# share), so its length is exact: the warning would only hide the ones that matter.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")

SPLITS = ("train", "val", "test", "predict")
# Rows per table when none are given: 26 x 10k x dim 64 float32 is ~67 MB, comfortable on a CPU.
DEFAULT_MAX_ROWS: int = 10_000
# Ids index int64 tensors and the synthetic permutation multiplies two ids; 2**31 keeps that product in int64.
_MAX_TABLE_ROWS: int = 2**31 - 1


def table_sizes(
    num_embeddings_per_feature: Sequence[int] | None, max_rows: int = DEFAULT_MAX_ROWS, any_count: bool = False
) -> list[int]:
    """The table sizes a DataModule was given, or Criteo Kaggle's 26 capped at ``max_rows`` when ``None``.

    Args:
        num_embeddings_per_feature: The sizes given, one per categorical feature; ``None``: Criteo Kaggle's.
        max_rows: The cap on Criteo Kaggle's sizes.
        any_count: Accept any number of tables (a synthetic source); otherwise exactly Criteo's 26.

    Returns:
        The table sizes, as ints.

    Raises:
        ValueError: No size, not one size per Criteo feature (unless ``any_count``), or a size outside
            ``[1, 2**31 - 1]``.
    """
    if num_embeddings_per_feature is None:
        return capped_cardinalities(max_rows)
    sizes = [int(n) for n in num_embeddings_per_feature]
    if any_count and not sizes:
        raise ValueError("num_embeddings_per_feature is empty: give at least one table size.")
    if not any_count and len(sizes) != len(FEATURE_NAMES):
        raise ValueError(
            f"num_embeddings_per_feature needs one table size per categorical feature ({len(FEATURE_NAMES)}), "
            f"got {len(sizes)}. Leave it unset to use the Criteo Kaggle sizes capped at max_rows."
        )
    names = range(len(sizes)) if any_count else FEATURE_NAMES
    bad = [(name, n) for name, n in zip(names, sizes) if not 1 <= n <= _MAX_TABLE_ROWS]
    if bad:
        raise ValueError(f"Every table size must lie in [1, {_MAX_TABLE_ROWS}]; got (table, size) {bad[:8]}.")
    return sizes


def stream_seed(seed: int, split: int, index: int) -> int:
    """A well-mixed 63-bit seed for one (seed, split, index); nearby tuples give unrelated streams.

    Args:
        seed: The DataModule's seed.
        split: The split's number.
        index: The global batch index.

    Returns:
        The seed, in ``[0, 2**63)``.
    """
    return int(np.random.SeedSequence([seed, split, index]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def make_batch(
    dense: torch.Tensor,
    ids: torch.Tensor,
    labels: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    feature_names: Sequence[str],
) -> Batch:
    """Assemble a :class:`~torchrec.datasets.utils.Batch` from dense features, ids and labels.

    A DataModule calls its :meth:`RankShardedDataModule.make_batch`, which passes its own feature names.

    Args:
        dense: Dense features ``[B, D]`` float32.
        ids: Categorical ids in the KeyedJaggedTensor's key-major order: every sample's ids of the first feature,
            then of the second, ... (int64).
        labels: ``[B]`` float32.
        lengths: Ids per sample and feature, ``[F * B]`` int32, key-major; ``None``: one id each (one-hot).
        feature_names: The keys, one per feature.

    Returns:
        The batch, its sparse features a KeyedJaggedTensor keyed by ``feature_names``.
    """
    if lengths is None:
        lengths = torch.ones(len(feature_names) * dense.shape[0], dtype=torch.int32)
    sparse = KeyedJaggedTensor(keys=list(feature_names), values=ids, lengths=lengths)
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels)


def _some(names: Sequence[str], shown: int = 8) -> str:
    return str(list(names[:shown]))[:-1] + (", ...]" if len(names) > shown else "]")


def check_batch(
    batch: Any, feature_names: Sequence[str], num_dense_features: int, num_embeddings_per_feature: Sequence[int],
    where: str = "the batch",
) -> None:
    """Refuse a batch that does not match the layout its DataModule declares, naming what differs and both numbers.

    Checks the keys, the dense width, the labels' length, ids against lengths (``F x B`` lengths that sum to the
    number of ids), and every feature's ids against its table (``0 <= id < rows``). The cost is a pass over the
    lengths and ids, small beside a training step.

    Args:
        batch: The batch to check.
        feature_names: The categorical features the DataModule declares, in key order.
        num_dense_features: The dense features per sample it declares.
        num_embeddings_per_feature: Each feature's table size.
        where: How messages name the batch.

    Raises:
        TypeError: Not a :class:`~torchrec.datasets.utils.Batch`.
        ValueError: A part of the batch disagrees with the layout.
    """
    if not isinstance(batch, Batch):
        raise TypeError(f"{where} is a {type(batch).__name__}, not a torchrec.datasets.utils.Batch: build it with"
                        " self.make_batch(dense, ids, labels).")  # fmt: skip
    names, kjt = list(feature_names), batch.sparse_features
    if list(kjt.keys()) != names:
        raise ValueError(
            f"{where} has {len(kjt.keys())} categorical features {_some(list(kjt.keys()))} but the DataModule declares"
            f" {len(names)}: {_some(names)}. Build batches with self.make_batch(...), which uses the DataModule's"
            " feature_names, or pass feature_names= to RankShardedDataModule.__init__."
        )
    dense = batch.dense_features
    if dense.dim() != 2 or dense.shape[1] != num_dense_features:
        raise ValueError(
            f"{where} has dense features of shape {list(dense.shape)} but the DataModule declares"
            f" num_dense_features={num_dense_features}: pass num_dense_features={dense.shape[-1]} to"
            " RankShardedDataModule.__init__ (or fix the dense block)."
        )
    samples = dense.shape[0]
    if batch.labels.numel() != samples:
        raise ValueError(f"{where} has {batch.labels.numel()} labels for {samples} samples (dense rows).")
    lengths, values = kjt.lengths(), kjt.values()
    if lengths.numel() != len(names) * samples:
        raise ValueError(
            f"{where} has {lengths.numel()} lengths for {len(names)} features x {samples} samples"
            f" ({len(names) * samples} expected, one per sample and feature, feature by feature)."
        )
    total = int(lengths.sum())
    if total != values.numel():
        raise ValueError(
            f"{where} has {values.numel()} ids but its lengths sum to {total}: with {len(names)} features x {samples}"
            f" samples, one-hot ids number {len(names) * samples}. Give ids feature by feature (every sample's ids of"
            " the first feature, then of the second, ...) and lengths for multi-hot features."
        )
    if values.numel() == 0:
        return
    per_feature = lengths.view(len(names), samples).sum(dim=1).tolist()
    for name, rows, chunk in zip(names, num_embeddings_per_feature, torch.split(values, per_feature)):
        if chunk.numel() and (int(chunk.min()) < 0 or int(chunk.max()) >= rows):
            raise ValueError(
                f"{where}: feature {name!r} has ids from {int(chunk.min())} to {int(chunk.max())}, outside its table"
                f" of {rows} rows (ids must lie in [0, {rows})). Raise num_embeddings_per_feature for {name!r} or map"
                " its ids into the table (e.g. modulo its size)."
            )


class RankBatches(IterableDataset):
    """One rank's batches of one split: ``read(index)`` for its global ``indices``, in order.

    DataLoader workers split them round-robin (worker ``w`` of ``K`` takes the ``j``-th batch when ``j % K == w``),
    which is also the order the DataLoader collects them in, so the stream is the same for any ``num_workers``.

    Args:
        read: Global batch index -> Batch.
        indices: The global indices this rank reads, in order.
    """

    def __init__(self, read: Callable[[int], Batch], indices: Sequence[int]) -> None:
        self._read = read
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        for j, index in enumerate(self.indices):
            if j % num_workers == worker:
                yield self._read(index)

    def skip(self, count: int) -> RankBatches:
        """The same batches without the first ``count``.

        Args:
            count: How many batches to skip.

        Returns:
            A dataset of the rest.
        """
        return RankBatches(self._read, self.indices[count:])


class ResumableDataLoader(DataLoader):
    """A DataLoader over one rank's batches that resumes mid-epoch: Lightning's stateful-dataloader protocol.

    Lightning saves :meth:`state_dict` in every checkpoint (the fit loop's ``combined_loader`` entry) and, when a
    run resumes from one, calls :meth:`load_state_dict` before it iterates the loader again. The state is the number
    of batches of the current pass handed to the training loop; the next pass starts after them, and the passes
    after that start from the beginning. It counts what the loop received, not what workers have prefetched.

    Every rank is served the same number of batches (:class:`RankShardedDataModule` gives each the same count and
    training steps in lock-step), so the state rank 0 writes into the checkpoint positions every rank.

    Args:
        dataset: This rank's batches.
        num_workers: DataLoader worker processes (persistent across epochs when there are any).
        world_size: The number of ranks the batches are shared among; kept in the state, so that a resume on
            another number of ranks is told that it cannot be exact.
        **kwargs: Other :class:`~torch.utils.data.DataLoader` arguments (Lightning passes them when it rebuilds the
            loader, as it does for prediction).
    """

    _STATE_VERSION = 1

    def __init__(self, dataset: RankBatches, num_workers: int = 0, world_size: int = 1, **kwargs: Any) -> None:
        # batch_size=None: the dataset yields whole Batches, which the DataLoader passes through untouched.
        kwargs.setdefault("batch_size", None)
        kwargs.setdefault("persistent_workers", num_workers > 0)
        super().__init__(dataset, num_workers=num_workers, **kwargs)
        self._served = 0  # batches of the current pass handed out so far
        self._resume_at = 0  # where the next pass starts (set by load_state_dict)
        self.world_size = world_size

    def __iter__(self) -> Iterator[Batch]:
        start, self._resume_at = self._resume_at, 0
        self._served = start
        if start == 0:
            batches = super().__iter__()
        else:
            # A loader of its own for the rest of this pass: persistent workers hold a copy of the whole dataset
            # and serve the passes after this one from the beginning.
            rest = DataLoader(self.dataset.skip(start), batch_size=None, num_workers=self.num_workers)
            batches = iter(rest)
        return self._counted(batches)

    def _counted(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        for batch in batches:
            self._served += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position in this pass, for a checkpoint.

        Returns:
            ``{"served": batches handed out, "batches": batches per pass, "world_size": ..., "version": ...}``.
        """
        return {"version": self._STATE_VERSION, "served": self._served, "batches": len(self.dataset),
                "world_size": self.world_size}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Start the next pass after the ``served`` batches of a saved :meth:`state_dict`.

        A finished pass starts the next one from the beginning. A state saved on another number of ranks or batches
        per pass is applied with a warning that the resumed epoch cannot be exact.

        Args:
            state_dict: What :meth:`state_dict` returned.

        Raises:
            ValueError: ``state_dict`` is not a state this class wrote.
        """
        if not isinstance(state_dict, dict) or state_dict.get("version") != self._STATE_VERSION:
            raise ValueError(
                f"{type(self).__name__} cannot resume from the data-loader state {state_dict!r}: it was not written by"
                f" this version of {type(self).__name__} (state version {self._STATE_VERSION}). Resume from a"
                " checkpoint of the same lightning-dlac version, or start the epoch over."
            )
        served, batches, world = int(state_dict["served"]), int(state_dict["batches"]), int(state_dict["world_size"])
        if (batches, world) != (len(self.dataset), self.world_size):
            rank_zero_warn(
                f"Resuming the data in the middle of an epoch that had {batches} batches per rank on {world} rank(s)"
                f" with {len(self.dataset)} batches per rank on {self.world_size}: each rank starts at its batch"
                f" {min(served, len(self.dataset))} of the epoch, so this epoch's remaining batches are not exactly"
                " those the interrupted run had left (some are read twice or not at all)."
            )
        self._resume_at = served if served < min(batches, len(self.dataset)) else 0


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"Need 0 <= rank < world_size, got rank={rank}, world_size={world_size}.")


class RankShardedDataModule(LightningDataModule):
    """Base of DataModules that serve a global stream of ready batches, each rank its share (module docstring).

    Subclasses implement :meth:`num_batches` and :meth:`read_batch`, and load whatever they read in ``setup`` (or
    lazily). ``train_dataloader`` and ``val_dataloader`` are provided; a source with a test (or predict) split adds
    ``def test_dataloader(self): return self.dataloader("test")``.

    Args:
        num_embeddings_per_feature: Rows of each categorical feature's table.
        batch_size: Samples per batch, per rank.
        num_workers: DataLoader worker processes.
        feature_names: The categorical features, in KeyedJaggedTensor key order (default ``cat_0``, ``cat_1``, ...,
            one per table, as the example DLRM names them).
        num_dense_features: Dense features per sample (default 13, Criteo's).

    Raises:
        ValueError: If ``batch_size`` is below 1, ``num_workers`` is negative, or the table sizes and features
            differ in number.
    """

    def __init__(
        self,
        num_embeddings_per_feature: Sequence[int],
        batch_size: int,
        num_workers: int = 0,
        feature_names: Sequence[str] | None = None,
        num_dense_features: int = DENSE_COLUMNS,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        if num_workers < 0:
            raise ValueError(f"num_workers must be non-negative, got {num_workers}.")
        if feature_names is None:
            feature_names = [f"cat_{i}" for i in range(len(num_embeddings_per_feature))]
        if len(num_embeddings_per_feature) != len(feature_names):
            raise ValueError(
                f"num_embeddings_per_feature has {len(num_embeddings_per_feature)} table sizes for"
                f" {len(feature_names)} features {list(feature_names)}: give one per feature."
            )
        self.num_embeddings_per_feature: list[int] = [int(n) for n in num_embeddings_per_feature]
        self.feature_names: list[str] = list(feature_names)
        self.num_dense_features: int = int(num_dense_features)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self._rank_override: tuple[int, int] | None = None

    # ---------------------------------------------------------------------------------------- the reading part

    def num_batches(self, split: str) -> int:
        """Global batches in a split, all ranks together. Implement in a subclass.

        Args:
            split: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.

        Returns:
            How many batches the split holds.

        Raises:
            NotImplementedError: Always, here: a subclass implements it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement num_batches(split) -> int (global batches in the split, all ranks"
            " together) and read_batch(split, index) -> Batch to be a RankShardedDataModule."
        )

    def read_batch(self, split: str, index: int) -> Batch:
        """Read one global batch of a split. Implement in a subclass.

        The batch is a pure function of ``split`` and ``index``, whichever process calls it (DataLoader workers
        included).

        Args:
            split: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.
            index: The global batch index, in ``[0, num_batches(split))``.

        Returns:
            The batch (build it with :meth:`make_batch`).

        Raises:
            NotImplementedError: Always, here: a subclass implements it.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement read_batch(split, index) -> Batch (global batch `index` of the"
            " split) to be a RankShardedDataModule."
        )

    def make_batch(
        self, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> Batch:
        """Assemble a batch with this DataModule's feature names (what ``read_batch`` returns).

        Args:
            dense: Dense features ``[B, num_dense_features]`` float32.
            ids: Categorical ids feature by feature: every sample's ids of the first feature, then of the second, ...
                (int64).
            labels: ``[B]`` float32.
            lengths: Ids per sample and feature, ``[F * B]`` int32, feature by feature; ``None``: one id each.

        Returns:
            The batch, keyed by this DataModule's ``feature_names``.
        """
        return make_batch(dense, ids, labels, lengths, feature_names=self.feature_names)

    def checked_batch(self, split: str, index: int) -> Batch:
        """:meth:`read_batch`, checked against the declared layout (:func:`check_batch`): what the loaders serve.

        Args:
            split: The split.
            index: The global batch index.

        Returns:
            The batch.

        Raises:
            TypeError: If ``read_batch`` did not return a ``Batch``.
            ValueError: If the batch disagrees with the declared layout.
        """
        batch = self.read_batch(split, index)
        check_batch(batch, self.feature_names, self.num_dense_features, self.num_embeddings_per_feature,
                    where=f"{type(self).__name__}.read_batch({split!r}, {index})")  # fmt: skip
        return batch

    # --------------------------------------------------------------------------------------- ranks and sharding

    def set_rank(self, rank: int, world_size: int) -> None:
        """Pin this datamodule to one rank of a world, overriding the trainer and torch.distributed.

        Args:
            rank: The rank it reads for.
            world_size: The number of ranks.

        Raises:
            ValueError: If not ``0 <= rank < world_size``.
        """
        _check_rank(rank, world_size)
        self._rank_override = (rank, world_size)

    def _rank_and_world(self) -> tuple[int, int]:
        if self._rank_override is not None:
            return self._rank_override
        trainer = self.trainer
        if trainer is not None:
            rank, world = int(trainer.global_rank), int(trainer.world_size)
        elif dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = 0, 1
        _check_rank(rank, world)
        return rank, world

    @property
    def rank(self) -> int:
        """The rank this process reads for."""
        return self._rank_and_world()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks the batches are shared among."""
        return self._rank_and_world()[1]

    def batches_per_rank(self, split: str) -> int:
        """Batches each rank reads from a split, the same on every rank.

        Args:
            split: The split.

        Returns:
            ``num_batches(split) // world_size``.
        """
        return self.num_batches(split) // self.world_size

    def dataset(self, split: str) -> RankBatches:
        """This rank's batches of a split: global batches ``rank, rank + W, ...``.

        Args:
            split: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.

        Returns:
            The batches, each checked against the declared layout when read.

        Raises:
            ValueError: If ``split`` is not one of those.
        """
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not one of {SPLITS}.")
        rank, world = self._rank_and_world()
        indices = [rank + world * j for j in range(self.num_batches(split) // world)]
        return RankBatches(functools.partial(self.checked_batch, split), indices)

    def dataloader(self, split: str) -> ResumableDataLoader:
        """The DataLoader of a split for this rank, resumable mid-epoch; every loader of the datamodule is made here.

        Args:
            split: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.

        Returns:
            The loader.
        """
        return ResumableDataLoader(self.dataset(split), num_workers=self.num_workers, world_size=self.world_size)

    @override
    def train_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("train")

    @override
    def val_dataloader(self) -> ResumableDataLoader:
        return self.dataloader("val")

    def _save_hyperparameters(self) -> None:
        """Save the caller's ``__init__`` arguments (table sizes already resolved) as hparams, not for the logger:
        the model sized from this datamodule logs the resolved table sizes, and Lightning refuses to log both when
        the CLI recorded this one's unresolved default (None). LightningCLI's config.yaml and the checkpoint still
        hold every datamodule argument."""
        self.save_hyperparameters(logger=False, frame=inspect.currentframe().f_back)

    def __getstate__(self) -> dict[str, Any]:
        # DataLoader workers started with "spawn" get a pickled copy of the datamodule (read_batch is its method);
        # the Trainer it is attached to stays in the main process.
        return {**self.__dict__, "trainer": None}




class RowSplitsDataModule(RankShardedDataModule):
    """A :class:`RankShardedDataModule` whose splits are rows read from files, cut into batches.

    A split holds ``split_rows(split) // batch_size`` global batches (the last partial one is dropped).

    Subclasses implement :meth:`split_rows` and :meth:`read_batch`, and call :meth:`check_split_sizes` at the end of
    ``setup``, once the rows are known.
    """

    def split_rows(self, split: str) -> int:
        """Rows in a split before cutting into batches. Implement in a subclass.

        Args:
            split: The split.

        Returns:
            Its rows (0 for a split the source lacks).

        Raises:
            NotImplementedError: Always, here: a subclass implements it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement split_rows(split) -> int.")

    def num_batches(self, split: str) -> int:
        """Global batches of a split.

        Args:
            split: The split.

        Returns:
            Its rows // ``batch_size``.
        """
        return self.split_rows(split) // self.batch_size

    @property
    def num_train_batches(self) -> int:
        """Training batches per rank per epoch (the same on every rank)."""
        return self.batches_per_rank("train")

    @property
    def num_val_batches(self) -> int:
        """Validation batches per rank (the same on every rank)."""
        return self.batches_per_rank("val")

    @property
    def num_test_batches(self) -> int:
        """Test batches per rank (the same on every rank)."""
        return self.batches_per_rank("test")

    def check_split_sizes(self, source: str, fix: str) -> None:
        """Fail when the rows give less than one training batch per rank; warn when validation makes no full batch.

        Args:
            source: What the rows came from, as the user named it (for the message).
            fix: What to do about too few rows (appended to the message).

        Raises:
            ValueError: If ``source`` gives less than one training batch per rank.
        """
        per_step = f"batch_size={self.batch_size} x world_size={self.world_size}"
        if self.num_train_batches == 0:
            raise ValueError(f"{source} gives {self.split_rows('train')} training rows, fewer than one batch per rank"
                             f" ({per_step}). {fix}")
        if self.num_val_batches == 0 and self.split_rows("val") > 0:
            rank_zero_warn(f"{self.split_rows('val')} validation rows make no full batch per rank ({per_step});"
                           " validation is empty.")
