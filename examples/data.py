"""Criteo-like DataModules for the example DLRM: a synthetic default, TorchRec's binary Criteo layout (full-size
Kaggle and 1TB, memory-mapped) and a Criteo TSV reader for small files.

All yield ready :class:`torchrec.datasets.utils.Batch` objects (dense ``[B, 13]`` float32, a
:class:`~torchrec.sparse.jagged_tensor.KeyedJaggedTensor` with keys ``cat_0`` .. ``cat_25``, labels ``[B]``
float32) from an :class:`~torch.utils.data.IterableDataset` that already holds only this rank's batches. Being
iterable, Lightning never injects a ``DistributedSampler`` on top, so the sharding below is the only one, and
every rank gets exactly the same number of batches (remainders are dropped) so collectives never wait on a rank
that ran out of data.

All expose ``num_embeddings_per_feature``, ``feature_names`` and ``num_dense_features`` so a model can be
configured from the datamodule.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from typing_extensions import override

log = logging.getLogger(__name__)

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "DEFAULT_MAX_ROWS",
    "FEATURE_NAMES",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS_PER_FEATURE",
    "NUM_DENSE_FEATURES",
    "CriteoBinaryDataModule",
    "CriteoTSVDataModule",
    "SyntheticCriteoDataModule",
    "TSV_SIZE_WARNING_BYTES",
    "capped_cardinalities",
    "multi_hot_from_one_hot",
]

# Distinct values per categorical feature in Criteo Kaggle's train.txt, in column order, as the DLRM reference
# (facebookresearch/dlrm, --data-set=kaggle, no --max-ind-range) sizes its embedding tables.
CRITEO_KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
FEATURE_NAMES: tuple[str, ...] = tuple(DEFAULT_CAT_NAMES)
NUM_DENSE_FEATURES: int = len(DEFAULT_INT_NAMES)
# Rows per table when none are given: 26 x 10k x dim 64 float32 is ~67 MB, comfortable on a CPU.
DEFAULT_MAX_ROWS: int = 10_000
# Ids index int64 tensors and the synthetic permutation multiplies two ids; 2**31 keeps that product in int64.
_MAX_TABLE_ROWS: int = 2**31 - 1

_TRAIN, _VAL, _CALIBRATION, _MODEL = 0, 1, 2, 3
# CriteoTSVDataModule parses in Python on every rank (about 12 s and 1.8 GB per million rows): past this file size
# (about a million rows) it warns and points to `dlac preprocess criteo` + CriteoBinaryDataModule.
TSV_SIZE_WARNING_BYTES: int = 200 * 2**20
_DENSE_TRANSFORMS = ("log1p", "torchrec")


def capped_cardinalities(max_rows: int) -> list[int]:
    """Criteo Kaggle's cardinalities with every table capped at ``max_rows`` rows (CPU-sized tables).

    Args:
        max_rows: The largest table size to allow; larger tables are hashed down to it.

    Returns:
        26 table sizes, one per feature in :data:`FEATURE_NAMES` order.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be a positive number of embedding rows, got {max_rows}.")
    return [min(n, max_rows) for n in CRITEO_KAGGLE_CARDINALITIES]


def _resolve_table_sizes(num_embeddings_per_feature: Sequence[int] | None, max_rows: int) -> list[int]:
    if num_embeddings_per_feature is None:
        return capped_cardinalities(max_rows)
    sizes = [int(n) for n in num_embeddings_per_feature]
    if len(sizes) != len(FEATURE_NAMES):
        raise ValueError(
            f"num_embeddings_per_feature needs one table size per categorical feature ({len(FEATURE_NAMES)}), "
            f"got {len(sizes)}. Leave it unset to use the Criteo Kaggle sizes capped at max_rows."
        )
    bad = [(name, n) for name, n in zip(FEATURE_NAMES, sizes) if not 1 <= n <= _MAX_TABLE_ROWS]
    if bad:
        raise ValueError(f"Every table size must lie in [1, {_MAX_TABLE_ROWS}]; got {bad}.")
    return sizes


def _rank_and_world(datamodule: LightningDataModule) -> tuple[int, int]:
    """This process's (rank, world size): the attached trainer's, else torch.distributed's, else (0, 1)."""
    trainer = datamodule.trainer
    if trainer is not None:
        return int(trainer.global_rank), int(trainer.world_size)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"Need 0 <= rank < world_size, got rank={rank}, world_size={world_size}.")


class _RankBatches(IterableDataset):
    """This rank's batches, ``batch_fn(global_index)`` for ``global_index = rank + world_size * j``.

    DataLoader workers split the rank's batches round-robin (worker ``w`` of ``K`` takes ``j % K == w``), which is
    also the order the DataLoader collects them in, so the stream is the same for any ``num_workers``.
    """

    def __init__(self, batch_fn: Callable[[int], Batch], num_batches: int, rank: int, world_size: int) -> None:
        self._batch_fn = batch_fn
        self._num_batches = num_batches
        self._rank = rank
        self._world_size = world_size

    def global_indices(self) -> list[int]:
        """Indices into the global batch stream that this rank reads, in order."""
        return [self._rank + self._world_size * j for j in range(self._num_batches)]

    def __len__(self) -> int:
        return self._num_batches

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        for j, index in enumerate(self.global_indices()):
            if j % num_workers == worker:
                yield self._batch_fn(index)


def _make_batch(dense: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> Batch:
    """Assemble a Batch; ``ids`` holds values in key-major order, ``lengths`` is ``[F * B]`` int32."""
    sparse = KeyedJaggedTensor(keys=list(FEATURE_NAMES), values=ids, lengths=lengths)
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels)


def _dataloader(dataset: _RankBatches, num_workers: int) -> DataLoader:
    # batch_size=None: the dataset yields whole Batches, which the DataLoader passes through untouched.
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, persistent_workers=num_workers > 0)


def _stream_seed(seed: int, split: int, index: int) -> int:
    """A well-mixed 63-bit seed for one (seed, split, index); nearby tuples give unrelated streams."""
    return int(np.random.SeedSequence([seed, split, index]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


_HASH_MASK = (1 << 62) - 1
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
MULTI_HOT_DISTRIBUTIONS = ("per_id", "independent")


def _check_multi_hot_sizes(multi_hot_sizes: Sequence[int]) -> list[int]:
    sizes = [int(p) for p in multi_hot_sizes]
    if len(sizes) != len(FEATURE_NAMES):
        raise ValueError(
            f"multi_hot_sizes needs one pooling factor per categorical feature ({len(FEATURE_NAMES)}), got"
            f" {len(sizes)}; e.g. MLPerf DLRM v2's {list(MLPERF_MULTI_HOT_SIZES)}."
        )
    if min(sizes) < 1:
        raise ValueError(f"multi_hot_sizes must all be at least 1, got {sizes}.")
    return sizes


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic), masked to 62 non-negative bits."""
    x = x ^ (x >> 30)  # arithmetic shifts on negatives differ from SplitMix's logical ones; still a fixed bijection
    x = x * -4658895280553007687  # 0xbf58476d1ce4e5b9 as a signed int64
    x = x ^ (x >> 27)
    x = x * -7723592293110705685  # 0x94d049bb133111eb
    x = x ^ (x >> 31)
    return x & _HASH_MASK


def multi_hot_from_one_hot(
    ids: torch.Tensor, multi_hot_sizes: Sequence[int], num_embeddings_per_feature: Sequence[int], salt: int = 0
) -> torch.Tensor:
    """Expand one-hot categorical ids into multi-hot bags the way MLPerf DLRM v2 materialises Criteo 1TB: the bag of
    id ``i`` of table ``t`` is ``[i, h(t, i, 1), ..., h(t, i, P_t - 1)]``, a fixed function of ``i``, with the extra
    ids uniform over the table (MLPerf draws them once per id into a table; a hash needs no ``n x P`` table, so
    full-size tables cost nothing).

    Args:
        ids: One-hot ids ``[F, B]`` (table-major, as a KeyedJaggedTensor with one id per sample holds them).
        multi_hot_sizes: Ids per bag of each table (:data:`MLPERF_MULTI_HOT_SIZES` for DLRM v2).
        num_embeddings_per_feature: Rows of each table; the extra ids lie in ``[0, rows)``.
        salt: Seed of the hash (the same on every rank, so ranks expand ids alike).

    Returns:
        KeyedJaggedTensor values: table ``t``'s ``B * P_t`` ids (sample-major), tables concatenated in order.
    """
    if ids.dim() != 2 or ids.size(0) != len(multi_hot_sizes) or len(multi_hot_sizes) != len(num_embeddings_per_feature):
        raise ValueError(
            f"ids must be [tables, batch] with one multi_hot_sizes and num_embeddings_per_feature entry per table;"
            f" got ids {list(ids.shape)}, {len(multi_hot_sizes)} sizes, {len(num_embeddings_per_feature)} tables."
        )
    ids = ids.long()
    bags = []
    for table, (pool, rows) in enumerate(zip(multi_hot_sizes, num_embeddings_per_feature)):
        one = ids[table].unsqueeze(1)  # [B, 1]: slot 0 of every bag
        if int(pool) > 1:
            slot = torch.arange(1, int(pool), dtype=torch.int64)  # slots 1 .. P - 1, broadcast over the samples
            extra = _mix64(((one * 1_000_003 + table) * 1_009 + slot) ^ salt) % int(rows)
            one = torch.cat([one, extra], dim=1)
        bags.append(one.reshape(-1))  # [B * P], sample-major
    return torch.cat(bags) if bags else ids.new_empty(0)


class _SyntheticCriteoGenerator:
    """The hidden model behind the synthetic data, and the sampler that draws batches from it.

    Every table's ids follow a truncated Zipf law over ranks (rank 0 hottest), mapped to ids by a fixed
    affine permutation ``id = (a * rank + b) mod n`` with ``gcd(a, n) = 1``: a bijection that needs no
    ``n``-sized permutation table, so full Criteo sizes cost nothing. Ranks are drawn by inverting the CDF of the
    continuous power law on ``[1, n + 1)`` and flooring, which is close to discrete Zipf and fully vectorized.

    The label logit is ``bias + sum over informative tables of effect[table][rank] (mean over pooled ids)
    + w . (dense - mean)``; ``bias`` is calibrated so that about ``positive_rate`` of labels are 1.
    """

    # Only the hottest ranks of a table carry a hidden effect, so the effect tables stay small for any table size.
    max_effect_rows = 1 << 16
    informative_fraction = 0.35
    effect_scale = 0.6
    dense_weight_scale = 0.4

    def __init__(
        self,
        table_sizes: Sequence[int],
        zipf_alpha: float,
        ids_per_feature: int,
        seed: int,
        positive_rate: float = 0.25,
        multi_hot_sizes: Sequence[int] | None = None,
        multi_hot_distribution: str = "per_id",
    ) -> None:
        self.ids_per_feature = ids_per_feature
        self.seed = seed
        self.multi_hot_sizes = list(multi_hot_sizes) if multi_hot_sizes is not None else None
        self.multi_hot_distribution = multi_hot_distribution
        # Salt of the per-id multi-hot hash: a pure function of the seed, so every rank expands ids alike.
        self._multi_hot_salt = _stream_seed(seed, _MODEL, 2) & _HASH_MASK
        num_tables = len(table_sizes)
        rng = random.Random(_stream_seed(seed, _MODEL, 0))
        gen = torch.Generator().manual_seed(_stream_seed(seed, _MODEL, 1))

        n = torch.tensor(table_sizes, dtype=torch.float64).unsqueeze(1)
        self._n = n.long()
        if abs(zipf_alpha - 1.0) < 1e-9:
            self._zipf = ("log", n + 1)
        else:
            e = 1.0 - zipf_alpha
            self._zipf = ("pow", (n + 1) ** e - 1.0, 1.0 / e)

        mult, shift = [], []
        for size in table_sizes:
            a = rng.randrange(1, size) if size > 2 else 1
            while math.gcd(a, size) != 1:
                a = rng.randrange(1, size)
            mult.append(a)
            shift.append(rng.randrange(size))
        self._mult = torch.tensor(mult, dtype=torch.int64).unsqueeze(1)
        self._shift = torch.tensor(shift, dtype=torch.int64).unsqueeze(1)

        num_informative = max(1, round(self.informative_fraction * num_tables))
        informative = set(rng.sample(range(num_tables), num_informative))
        self.informative_tables = sorted(informative)
        rows = [min(size, self.max_effect_rows) for size in table_sizes]
        self._effect_rows = torch.tensor(rows, dtype=torch.int64).unsqueeze(1)
        self._effect_offsets = torch.tensor([0, *np.cumsum(rows)[:-1].tolist()], dtype=torch.int64).unsqueeze(1)
        effects = torch.randn(sum(rows), generator=gen) * self.effect_scale
        keep = torch.cat([torch.full((r,), float(t in informative)) for t, r in enumerate(rows)])
        self._effects = effects * keep

        # Dense features look like Criteo's after log(1 + x): non-negative counts with a heavy tail and many zeros.
        self._dense_mu = torch.rand(NUM_DENSE_FEATURES, generator=gen) * 4.0 - 0.5
        self._dense_sigma = torch.rand(NUM_DENSE_FEATURES, generator=gen) * 1.0 + 0.75
        self._dense_w = torch.randn(NUM_DENSE_FEATURES, generator=gen) * self.dense_weight_scale
        self._dense_center = torch.zeros(NUM_DENSE_FEATURES)
        self._bias = 0.0
        self._calibrate(positive_rate)

    def _calibrate(self, positive_rate: float, num_samples: int = 16_384) -> None:
        gen = torch.Generator().manual_seed(_stream_seed(self.seed, _CALIBRATION, 0))
        dense, _, _, effect = self._draw(num_samples, gen)
        self._dense_center = dense.mean(dim=0)
        logit = effect + (dense - self._dense_center) @ self._dense_w
        lo, hi = -20.0, 20.0
        for _ in range(50):
            mid = (lo + hi) / 2
            if torch.sigmoid(logit + mid).mean().item() < positive_rate:
                lo = mid
            else:
                hi = mid
        self._bias = (lo + hi) / 2

    def _ranks(self, u: torch.Tensor) -> torch.Tensor:
        """Zipf ranks [F, k] from uniforms [F, k] (inverse CDF of the continuous power law, floored)."""
        if self._zipf[0] == "log":
            x = self._zipf[1] ** u
        else:
            x = (u * self._zipf[1] + 1.0) ** self._zipf[2]
        return torch.minimum(x.long() - 1, self._n - 1).clamp_(min=0)

    def _effect(self, rank: torch.Tensor) -> torch.Tensor:
        """The hidden effect of each rank, same shape."""
        hot = rank < self._effect_rows
        return self._effects[self._effect_offsets + torch.where(hot, rank, 0)] * hot

    def _draw(
        self, batch_size: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Features without labels: (dense [B, 13], ids [F * B * P], lengths [F * B], summed effect [B])."""
        if self.multi_hot_sizes is not None:
            return self._draw_multi_hot(batch_size, gen)
        num_tables, pool = self._n.shape[0], self.ids_per_feature
        u = torch.rand(num_tables, batch_size * pool, generator=gen, dtype=torch.float64)
        rank = self._ranks(u)
        ids = (self._mult * rank + self._shift) % self._n

        effect = self._effect(rank)
        effect = effect.view(num_tables, batch_size, pool).mean(dim=2).sum(dim=0, dtype=torch.float32)

        dense = self._dense(batch_size, gen)
        lengths = torch.full((num_tables * batch_size,), pool, dtype=torch.int32)
        return dense, ids.view(-1), lengths, effect

    def _dense(self, batch_size: int, gen: torch.Generator) -> torch.Tensor:
        z = torch.randn(batch_size, NUM_DENSE_FEATURES, generator=gen)
        return torch.log1p(torch.floor(torch.exp(z * self._dense_sigma + self._dense_mu)))

    def _draw_multi_hot(
        self, batch_size: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :meth:`_draw`, table ``t`` with ``multi_hot_sizes[t]`` ids per sample.

        ``"per_id"``: one Zipf id per sample and table, expanded into a fixed bag by :func:`multi_hot_from_one_hot`
        (MLPerf DLRM v2's materialisation), the effect that of the one-hot id. ``"independent"``: every id of the bag
        its own Zipf draw, the effect the bag's mean (bags repeat far less within a batch).
        """
        sizes = self.multi_hot_sizes
        num_tables = len(sizes)
        if self.multi_hot_distribution == "per_id":
            rank = self._ranks(torch.rand(num_tables, batch_size, generator=gen, dtype=torch.float64))
            ids = (self._mult * rank + self._shift) % self._n
            effect = self._effect(rank).sum(dim=0, dtype=torch.float32)
            values = multi_hot_from_one_hot(ids, sizes, self._n.view(-1).tolist(), self._multi_hot_salt)
        else:
            pool = max(sizes)
            rank = self._ranks(torch.rand(num_tables, batch_size * pool, generator=gen, dtype=torch.float64))
            ids = ((self._mult * rank + self._shift) % self._n).view(num_tables, batch_size, pool)
            effects = self._effect(rank).view(num_tables, batch_size, pool)
            means = [effects[t, :, :p].mean(dim=1) for t, p in enumerate(sizes)]
            effect = torch.stack(means).sum(dim=0, dtype=torch.float32)
            values = torch.cat([ids[t, :, :p].reshape(-1) for t, p in enumerate(sizes)])
        lengths = torch.tensor(sizes, dtype=torch.int32).repeat_interleave(batch_size)
        return self._dense(batch_size, gen), values, lengths, effect

    def batch(self, index: int, split: int = _TRAIN, batch_size: int = 512) -> Batch:
        """Batch ``index`` of ``split``, a pure function of (seed, split, index)."""
        gen = torch.Generator().manual_seed(_stream_seed(self.seed, split, index))
        dense, ids, lengths, effect = self._draw(batch_size, gen)
        logit = self._bias + effect + (dense - self._dense_center) @ self._dense_w
        labels = (torch.rand(batch_size, generator=gen) < torch.sigmoid(logit)).float()
        return _make_batch(dense, ids, lengths, labels)

    def logits(self, batch: Batch) -> torch.Tensor:
        """The true logit of each sample in a batch drawn from this model (for tests and oracle AUC)."""
        num_tables, batch_size = self._n.shape[0], batch.dense_features.size(0)
        pools = self.multi_hot_sizes or [self.ids_per_feature] * num_tables
        per_table = batch.sparse_features.values().split([p * batch_size for p in pools])
        if self.multi_hot_sizes is not None and self.multi_hot_distribution == "per_id":
            bags = [v.view(batch_size, p)[:, :1] for v, p in zip(per_table, pools)]  # the one-hot id leads its bag
        else:
            bags = [v.view(batch_size, p) for v, p in zip(per_table, pools)]
        effect = torch.zeros(batch_size)
        for t, ids in enumerate(bags):
            # Invert the affine permutation: rank = (id - b) * a^-1 mod n.
            n, a, b = int(self._n[t]), int(self._mult[t]), int(self._shift[t])
            rank = ((ids - b) % n * (pow(a, -1, n) if n > 1 else 0)) % n
            hot = rank < self._effect_rows[t]
            effect += (self._effects[self._effect_offsets[t] + torch.where(hot, rank, 0)] * hot).mean(dim=1)
        return self._bias + effect + (batch.dense_features - self._dense_center) @ self._dense_w


class _RankShardedDataModule(LightningDataModule):
    """What both Criteo-layout datamodules share: the exposed table layout, the rank this process reads for, and
    DataLoaders over this rank's ready batches."""

    def __init__(self, num_embeddings_per_feature: list[int], batch_size: int, num_workers: int) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.num_embeddings_per_feature: list[int] = num_embeddings_per_feature
        self.feature_names: list[str] = list(FEATURE_NAMES)
        self.num_dense_features: int = NUM_DENSE_FEATURES
        self.batch_size = batch_size
        self.num_workers = num_workers
        self._rank_override: tuple[int, int] | None = None
        self._rank, self._world_size = 0, 1

    def _save_hyperparameters(self) -> None:
        """Save the caller's ``__init__`` arguments (table sizes already resolved) as hparams, not for the logger:
        the model sized from this datamodule logs the resolved table sizes, and Lightning refuses to log both when
        the CLI recorded this one's unresolved default (None). LightningCLI's config.yaml and the checkpoint still
        hold every datamodule argument."""
        self.save_hyperparameters(logger=False, frame=inspect.currentframe().f_back)

    def _set_rank(self, rank: int, world_size: int) -> None:
        """Pin this datamodule to one rank of a world, overriding trainer and torch.distributed (for tests)."""
        _check_rank(rank, world_size)
        self._rank_override = (rank, world_size)
        self._rank, self._world_size = rank, world_size

    def _resolve_rank(self) -> None:
        self._rank, self._world_size = self._rank_override or _rank_and_world(self)
        _check_rank(self._rank, self._world_size)

    def train_dataset(self) -> _RankBatches:
        """This rank's training batches (an IterableDataset of ready Batches)."""
        raise NotImplementedError

    def val_dataset(self) -> _RankBatches:
        """This rank's validation batches (an IterableDataset of ready Batches)."""
        raise NotImplementedError

    @override
    def train_dataloader(self) -> DataLoader:
        return _dataloader(self.train_dataset(), self.num_workers)

    @override
    def val_dataloader(self) -> DataLoader:
        return _dataloader(self.val_dataset(), self.num_workers)


class SyntheticCriteoDataModule(_RankShardedDataModule):
    """Synthetic Criteo-like click data with a planted, learnable signal: the embedded default dataset.

    Ids are Zipf-distributed per table (a few hot ids take most lookups, as in Criteo), the hot ids scattered
    over the table by a fixed per-table permutation. About a third of the tables carry a hidden random effect per
    id, the 13 dense features a linear effect, and labels are ``Bernoulli(sigmoid(logit))`` with about 25% positives,
    so AUC is meaningful and well above 0.5 once the model learns.

    The data is a pure function of ``seed``: global batch ``i`` of a split is drawn from a generator seeded by
    ``(seed, split, i)``, and rank ``r`` of ``W`` reads batches ``i = r, r + W, r + 2W, ...``. Every epoch
    replays the same ``num_train_batches`` training batches; validation is a separate, fixed stream.

    Args:
        num_embeddings_per_feature: Rows of each of the 26 tables; ``None`` uses the Criteo Kaggle sizes capped
            at ``max_rows``.
        max_rows: Cap on table sizes when ``num_embeddings_per_feature`` is ``None``.
        batch_size: Samples per batch, per rank.
        num_train_batches: Training batches per rank per epoch.
        num_val_batches: Validation batches per rank.
        zipf_alpha: Zipf exponent of the id distribution (0 is uniform; larger is more skewed).
        ids_per_feature: Ids per feature per sample, the same for every feature; above 1 every id of a bag is its
            own Zipf draw. For per-feature pooling factors use ``multi_hot_sizes``.
        seed: Seed of the hidden model and of every batch.
        num_workers: DataLoader worker processes.
        multi_hot_sizes: Ids per sample of each of the 26 features (multi-hot features, KeyedJaggedTensor lengths
            above 1), e.g. :data:`MLPERF_MULTI_HOT_SIZES` for MLPerf DLRM v2; ``None``: ``ids_per_feature`` for all.
        multi_hot_distribution: How bags are drawn with ``multi_hot_sizes``: ``"per_id"`` (MLPerf's
            materialisation: one Zipf id per sample expanded into a bag that is a fixed function of that id, see
            :func:`multi_hot_from_one_hot`; the planted effect is the id's, so the signal stays learnable) or
            ``"independent"`` (every id of a bag its own Zipf draw, the effect the bag's mean: bags repeat far
            less within a batch, a harder case for the codec's dedup).
    """

    def __init__(
        self,
        num_embeddings_per_feature: list[int] | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        batch_size: int = 512,
        num_train_batches: int = 64,
        num_val_batches: int = 8,
        zipf_alpha: float = 1.05,
        ids_per_feature: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        multi_hot_sizes: list[int] | None = None,
        multi_hot_distribution: str = "per_id",
    ) -> None:
        num_embeddings_per_feature = _resolve_table_sizes(num_embeddings_per_feature, max_rows)
        super().__init__(num_embeddings_per_feature, batch_size, num_workers)
        self._save_hyperparameters()
        if ids_per_feature < 1:
            raise ValueError(f"ids_per_feature must be at least 1, got {ids_per_feature}.")
        if multi_hot_sizes is not None:
            multi_hot_sizes = _check_multi_hot_sizes(multi_hot_sizes)
            if ids_per_feature != 1:
                raise ValueError(
                    f"ids_per_feature={ids_per_feature} and multi_hot_sizes both set the ids per feature; give only"
                    " multi_hot_sizes (one pooling factor per feature)."
                )
        if multi_hot_distribution not in MULTI_HOT_DISTRIBUTIONS:
            raise ValueError(
                f"multi_hot_distribution={multi_hot_distribution!r} is not supported; choose one of"
                f" {', '.join(map(repr, MULTI_HOT_DISTRIBUTIONS))}."
            )
        self.multi_hot_sizes = multi_hot_sizes
        self.multi_hot_distribution = multi_hot_distribution
        for name, value in (("num_train_batches", num_train_batches), ("num_val_batches", num_val_batches)):
            if value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}.")
        if zipf_alpha < 0:
            raise ValueError(f"zipf_alpha must be >= 0 (0 is uniform), got {zipf_alpha}.")
        self.num_train_batches = num_train_batches
        self.num_val_batches = num_val_batches
        self.zipf_alpha = zipf_alpha
        self.ids_per_feature = ids_per_feature
        self.seed = seed
        self._generator: _SyntheticCriteoGenerator | None = None

    @property
    def generator(self) -> _SyntheticCriteoGenerator:
        """The hidden model the data is drawn from (built on first use)."""
        if self._generator is None:
            self._generator = _SyntheticCriteoGenerator(
                self.num_embeddings_per_feature, self.zipf_alpha, self.ids_per_feature, self.seed,
                multi_hot_sizes=self.multi_hot_sizes, multi_hot_distribution=self.multi_hot_distribution,
            )
        return self._generator

    @override
    def setup(self, stage: str) -> None:
        self._resolve_rank()
        self.generator  # noqa: B018 - build the hidden model once, before workers fork

    def _split_dataset(self, split: int, num_batches: int) -> _RankBatches:
        batch_fn = functools.partial(self.generator.batch, split=split, batch_size=self.batch_size)
        return _RankBatches(batch_fn, num_batches, self._rank, self._world_size)

    def train_dataset(self) -> _RankBatches:
        """This rank's training batches (an IterableDataset of ready Batches)."""
        return self._split_dataset(_TRAIN, self.num_train_batches)

    def val_dataset(self) -> _RankBatches:
        """This rank's validation batches (an IterableDataset of ready Batches)."""
        return self._split_dataset(_VAL, self.num_val_batches)


_NUM_FIELDS = 1 + NUM_DENSE_FEATURES + len(FEATURE_NAMES)


def _parse_criteo_tsv(
    path: Path, table_sizes: Sequence[int], max_samples: int | None, dense_transform: str = "log1p"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Parse a Criteo Kaggle TSV into (labels [N] float32, dense [N, 13] float32, ids [N, 26] int64).

    Dense (missing -> 0): ``log1p``: negative -> 0, then ``log(1 + x)``; ``torchrec``: ``log(x - min + 2)`` with the
    minimum over the rows read, in int32 then float32 exactly as TorchRec's ``tsv_to_npys`` (and so ``dlac
    preprocess criteo``) computes it. Categoricals: ``int(hex, 16) % table_size``; a missing categorical becomes id 0,
    which it shares with the hashed values that land on 0.
    """
    labels: list[int] = []
    dense: list[list[int]] = []
    cats: list[list[int]] = []
    sizes = list(table_sizes)
    with path.open("r", encoding="utf-8", errors="replace", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            if max_samples is not None and len(labels) >= max_samples:
                break
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != _NUM_FIELDS:
                raise ValueError(
                    f"{path}, line {lineno}: expected {_NUM_FIELDS} tab-separated fields (label, "
                    f"{NUM_DENSE_FEATURES} integer, {len(FEATURE_NAMES)} categorical), got {len(fields)}. "
                    "Criteo's test.txt has no label column and cannot be used here."
                )
            try:
                label = int(fields[0])
                row_dense = [int(v) if v else 0 for v in fields[1 : 1 + NUM_DENSE_FEATURES]]
                row_cats = [int(v, 16) % n if v else 0 for v, n in zip(fields[1 + NUM_DENSE_FEATURES :], sizes)]
            except ValueError:
                raise ValueError(f"{path}, line {lineno}: {_describe_bad_field(fields)}") from None
            if label not in (0, 1):
                raise ValueError(f"{path}, line {lineno}: the label must be 0 or 1, got {fields[0]!r}.")
            # int(v, 16) also takes signs, spaces, underscores: one isalnum over the joined row rejects them cheaply.
            joined = "".join(fields[1 + NUM_DENSE_FEATURES :])
            if not (joined.isascii() and (joined.isalnum() or not joined)):
                raise ValueError(f"{path}, line {lineno}: {_describe_bad_field(fields, strict_hex=True)}")
            labels.append(label)
            dense.append(row_dense)
            cats.append(row_cats)
    n = len(labels)
    if dense_transform == "torchrec":
        raw = np.asarray(dense, dtype=np.int32).reshape(n, NUM_DENSE_FEATURES)
        if n:
            raw -= raw.min() - 2
        dense_arr = np.log(raw, dtype=np.float32)
    else:
        dense_arr = np.log1p(np.maximum(np.asarray(dense, dtype=np.float64).reshape(n, NUM_DENSE_FEATURES), 0.0))
    return (
        torch.tensor(labels, dtype=torch.float32),
        torch.from_numpy(dense_arr.astype(np.float32)),
        torch.tensor(cats, dtype=torch.int64).reshape(n, len(FEATURE_NAMES)),
    )


def _describe_bad_field(fields: list[str], strict_hex: bool = False) -> str:
    """Name the first field of a row that does not parse, for an error message."""
    try:
        int(fields[0])
    except ValueError:
        return f"the label is not an integer: {fields[0]!r}."
    for k, v in enumerate(fields[1 : 1 + NUM_DENSE_FEATURES]):
        try:
            int(v) if v else 0
        except ValueError:
            return f"integer feature {DEFAULT_INT_NAMES[k]} (field {2 + k}) is not an integer: {v!r}."
    for k, v in enumerate(fields[1 + NUM_DENSE_FEATURES :]):
        try:
            if v:
                int(v, 16)
                if strict_hex and not (v.isascii() and v.isalnum()):
                    raise ValueError
        except ValueError:
            field = 2 + NUM_DENSE_FEATURES + k
            return f"categorical feature {FEATURE_NAMES[k]} (field {field}) is not a hex string: {v!r}."
    return "the row does not parse."


class _RowBatches:
    """Picklable ``global_index -> Batch`` over contiguous row slices of parsed tensors."""

    def __init__(self, labels: torch.Tensor, dense: torch.Tensor, ids: torch.Tensor, batch_size: int) -> None:
        self.labels, self.dense, self.ids, self.batch_size = labels, dense, ids, batch_size
        self.lengths = torch.ones(ids.shape[1] * batch_size, dtype=torch.int32)

    def __call__(self, index: int) -> Batch:
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        # KJT values are key-major: all samples of cat_0, then cat_1, ...
        ids = self.ids[rows].t().contiguous().view(-1)
        return _make_batch(self.dense[rows].contiguous(), ids, self.lengths, self.labels[rows].contiguous())


class CriteoTSVDataModule(_RankShardedDataModule):
    """Criteo Kaggle display-advertising TSV files (``train.txt`` format) as DLRM batches: for small files.

    Every rank parses the whole file in Python into memory, which suits samples up to about a million rows. For
    full-size data (Kaggle's 45.8M rows, the 1TB days) convert once with ``dlac preprocess criteo`` and train with
    :class:`CriteoBinaryDataModule`, where each rank memory-maps only its rows; past
    :data:`TSV_SIZE_WARNING_BYTES` this module warns and says so.

    Each line is a 0/1 label, 13 integer features and 26 hex-hashed categoricals, tab-separated, an empty field
    meaning missing. Dense features: missing or negative -> 0, then ``log(1 + x)``. Categoricals:
    ``int(hex, 16) % table_size``; a missing categorical becomes id 0 (so id 0 mixes "missing" with the hashed
    values that land on 0, as in the DLRM reference's preprocessing).

    Files are parsed once in :meth:`setup` into tensors (plain Python, about 12 s per million rows here, so use
    ``max_samples`` for large files). Without ``val_path`` the last ``val_fraction`` of the training rows (Criteo
    is time-ordered, so the latest ones) are held out. Training rows are then shuffled once with ``seed`` (the
    order is the same every epoch). Rows are cut into batches, the remainder dropped, and rank ``r`` of ``W`` takes
    global batches ``r, r + W, ...`` up to the same count on every rank.

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
            (``log(x - min + 2)`` per file, what ``dlac preprocess criteo`` and TorchRec's converter store).
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
        num_embeddings_per_feature = _resolve_table_sizes(num_embeddings_per_feature, max_rows)
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
        self._train: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._val: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

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
                f"CriteoTSVDataModule parses {size / 2**20:.0f} MiB of TSV in Python on every rank (about 12 s and"
                " 1.8 GB of memory per million rows, per rank). Convert once with `dlac preprocess criteo --output"
                " DIR FILE...` and use CriteoBinaryDataModule (examples/configs/dlrm_criteo_binary.yaml), which"
                " memory-maps only each rank's rows; or set max_samples."
            )

    def _read(self, path: str, argument: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        file = self._check_file(path, argument)
        return _parse_criteo_tsv(file, self.num_embeddings_per_feature, self.max_samples, self.dense_transform)

    @override
    def setup(self, stage: str) -> None:
        self._resolve_rank()
        if self._train is not None:
            return
        train = self._read(self.train_path, "train_path")
        if self.val_path is not None:
            val = self._read(self.val_path, "val_path")
        else:
            num_val = int(round(self.val_fraction * train[0].shape[0]))
            cut = train[0].shape[0] - num_val
            val = tuple(t[cut:] for t in train)
            train = tuple(t[:cut] for t in train)
        if self.shuffle:
            perm = torch.randperm(train[0].shape[0], generator=torch.Generator().manual_seed(self.seed))
            train = tuple(t[perm] for t in train)
        self._train, self._val = train, val  # type: ignore[assignment]
        if self.num_train_batches == 0:
            raise ValueError(
                f"{self.train_path!r} gives {train[0].shape[0]} training rows, fewer than one batch per rank "
                f"(batch_size={self.batch_size} x world_size={self._world_size}). Lower `batch_size` or raise "
                "`max_samples`."
            )
        if self.num_val_batches == 0 and val[0].shape[0] > 0:
            rank_zero_warn(
                f"{val[0].shape[0]} validation rows make no full batch per rank (batch_size={self.batch_size} x "
                f"world_size={self._world_size}); validation is empty."
            )

    def _batches_per_rank(self, split: tuple[torch.Tensor, ...] | None) -> int:
        if split is None:
            raise RuntimeError(f"Call {type(self).__name__}.setup() before asking for batches.")
        return split[0].shape[0] // self.batch_size // self._world_size

    @property
    def num_train_batches(self) -> int:
        """Training batches per rank per epoch (the same on every rank)."""
        return self._batches_per_rank(self._train)

    @property
    def num_val_batches(self) -> int:
        """Validation batches per rank (the same on every rank)."""
        return self._batches_per_rank(self._val)

    def _dataset(self, split: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> _RankBatches:
        num_batches = self._batches_per_rank(split)
        assert split is not None
        labels, dense, ids = split
        return _RankBatches(_RowBatches(labels, dense, ids, self.batch_size), num_batches, self._rank, self._world_size)

    def train_dataset(self) -> _RankBatches:
        """This rank's training batches (an IterableDataset of ready Batches)."""
        return self._dataset(self._train)

    def val_dataset(self) -> _RankBatches:
        """This rank's validation batches (an IterableDataset of ready Batches)."""
        return self._dataset(self._val)


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
    the pages read: about 1.3x the rank's share after an epoch, measured in docs/benchmarks.md).

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
            fmt = np.lib.format
            for (dense, sparse, labels), first, _, multi_hot in self.segments:
                files = []
                for p in (dense, sparse, labels) if multi_hot is None else (dense, labels):
                    with open(p, "rb") as f:
                        v1 = fmt.read_magic(f) == (1, 0)
                        shape, _, dtype = (fmt.read_array_header_1_0 if v1 else fmt.read_array_header_2_0)(f)
                        start = f.tell() + first * shape[1] * dtype.itemsize
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
        return _make_batch(
            torch.from_numpy(np.array(dense, dtype=np.float32)),
            ids,
            self.lengths,
            torch.from_numpy(labels.reshape(-1).astype(np.float32)),
        )


class CriteoBinaryDataModule(_RankShardedDataModule):
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
        from lightning_dlac.preprocess import check_criteo_binary, check_criteo_multi_hot, multi_hot_path

        num_embeddings_per_feature = _resolve_table_sizes(num_embeddings_per_feature, max_rows)
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
            multi_hot_sizes = _check_multi_hot_sizes(multi_hot_sizes)
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

    def _segments(self, stems: list[str], lo: int, hi: int) -> list[_Segment]:
        """Rows ``[lo, hi)`` of the concatenation of ``stems``, as per-file segments."""
        from lightning_dlac.preprocess import binary_paths

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
        """Rows in ``split`` (``train``, ``val`` or ``test``), before cutting into batches."""
        return sum(rows for _, _, rows, _ in self._splits[split])

    @override
    def setup(self, stage: str) -> None:
        self._resolve_rank()
        if self.num_train_batches == 0:
            raise ValueError(
                f"{self.split_rows('train')} training rows in {self.data_dir} ({self.train_stems}) make fewer than"
                f" one batch per rank (batch_size={self.batch_size} x world_size={self._world_size}). Lower"
                " `batch_size`, raise `max_samples`, or add training stems."
            )
        if self.num_val_batches == 0 and self.split_rows("val") > 0:
            rank_zero_warn(
                f"{self.split_rows('val')} validation rows make no full batch per rank (batch_size="
                f"{self.batch_size} x world_size={self._world_size}); validation is empty."
            )

    def _batches_per_rank(self, split: str) -> int:
        return self.split_rows(split) // self.batch_size // self._world_size

    @property
    def num_train_batches(self) -> int:
        """Training batches per rank per epoch (the same on every rank)."""
        return self._batches_per_rank("train")

    @property
    def num_val_batches(self) -> int:
        """Validation batches per rank (the same on every rank)."""
        return self._batches_per_rank("val")

    @property
    def num_test_batches(self) -> int:
        """Test batches per rank (the same on every rank)."""
        return self._batches_per_rank("test")

    def _dataset(self, split: str) -> _RankBatches:
        num_batches = self._batches_per_rank(split)
        order = None
        if split == "train" and self.shuffle:
            total = num_batches * self._world_size
            order = np.random.default_rng(self.seed).permutation(total)
        sizes = self.num_embeddings_per_feature
        fn = _BinaryBatches(self._splits[split], sizes, self.batch_size, order, self.mmap_mode, self.multi_hot_sizes)
        return _RankBatches(fn, num_batches, self._rank, self._world_size)

    def train_dataset(self) -> _RankBatches:
        """This rank's training batches (an IterableDataset of ready Batches)."""
        return self._dataset("train")

    def val_dataset(self) -> _RankBatches:
        """This rank's validation batches (an IterableDataset of ready Batches)."""
        return self._dataset("val")

    def test_dataset(self) -> _RankBatches:
        """This rank's test batches (an IterableDataset of ready Batches)."""
        return self._dataset("test")

    @override
    def test_dataloader(self) -> DataLoader:
        return _dataloader(self.test_dataset(), self.num_workers)
