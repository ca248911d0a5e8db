"""Synthetic Criteo-like click data with a planted, learnable signal: the embedded default dataset.

:class:`SyntheticCriteoDataModule` serves batches drawn from a hidden model (:class:`SyntheticCriteoGenerator`): Zipf
ids per table scattered by a fixed permutation, a hidden effect per id on about a third of the tables, a linear
effect of the dense features, labels ``Bernoulli(sigmoid(logit))``. Every batch is a pure function of
``(seed, split, index)``, so any rank or worker draws any batch without coordination; rank sharding and loaders are
:class:`~lightning_dlac.examples.base.RankShardedDataModule`'s.

Its shape is Criteo's by default (26 tables, one id each), or any other: a list of table sizes of any length, or a
:class:`TableShapes` that draws a production-like shape (hundreds of features, power-law table sizes, MLPerf-like
pooling factors) from a seed, which a YAML config can name (``examples/configs/dlrm_many_tables.yaml``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from typing_extensions import override

from lightning_dlac.criteo.format import (
    DENSE_COLUMNS,
    FEATURE_NAMES,
    MLPERF_MULTI_HOT_SIZES,
    check_multi_hot_sizes,
)
from lightning_dlac.criteo.multi_hot import multi_hot_from_one_hot

from .base import _MAX_TABLE_ROWS, DEFAULT_MAX_ROWS, RankShardedDataModule, make_batch, stream_seed, table_sizes

__all__ = [
    "MULTI_HOT_DISTRIBUTIONS",
    "POOLINGS",
    "SyntheticCriteoDataModule",
    "SyntheticCriteoGenerator",
    "TableShapes",
]

# Seed streams: the splits' batches, the bias calibration, the hidden model.
_TRAIN, _VAL, _CALIBRATION, _MODEL = 0, 1, 2, 3
_SPLIT_STREAMS = {"train": _TRAIN, "val": _VAL}
_HASH_MASK = (1 << 62) - 1
MULTI_HOT_DISTRIBUTIONS = ("per_id", "independent")
POOLINGS = ("one_hot", "mlperf")


@dataclass(frozen=True)
class TableShapes:
    """A production-like model shape drawn from a seed: many features, power-law table sizes, MLPerf-like pooling.

    Table sizes follow a bounded power law on ``[min_rows, max_rows]``: the density of a size ``n`` is proportional
    to ``n ** -(1 + size_exponent)``. At ``size_exponent=0`` the sizes are log-uniform, spread evenly over the orders
    of magnitude as Criteo's 26 cardinalities are (3 to 10 million); above 0, small tables are more common. Pooling
    factors are one id per feature (``"one_hot"``, Criteo's) or drawn, feature by feature, from MLPerf DLRM v2's 26
    (``"mlperf"``: most features one id, a few 5-27, one 100). The shape is a pure function of its fields.

    Args:
        num_tables: Categorical features, one table each.
        min_rows: Smallest table size.
        max_rows: Largest table size.
        size_exponent: Tail exponent of the table sizes (0: log-uniform; larger: more small tables).
        pooling: ``"one_hot"`` or ``"mlperf"`` (above).
        seed: Seed of the draw.

    Raises:
        ValueError: If ``num_tables`` or ``min_rows`` is below 1, ``max_rows`` below ``min_rows`` or above
            ``2**31 - 1``, ``size_exponent`` negative, or ``pooling`` not one of its choices.
    """

    num_tables: int
    min_rows: int = 4
    max_rows: int = 100_000
    size_exponent: float = 0.0
    pooling: str = "one_hot"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_tables < 1:
            raise ValueError(f"TableShapes.num_tables must be at least 1, got {self.num_tables}.")
        if not 1 <= self.min_rows <= self.max_rows <= _MAX_TABLE_ROWS:
            raise ValueError(
                f"TableShapes needs 1 <= min_rows <= max_rows <= {_MAX_TABLE_ROWS}, got min_rows={self.min_rows},"
                f" max_rows={self.max_rows}."
            )
        if self.size_exponent < 0:
            raise ValueError(
                f"TableShapes.size_exponent must be >= 0 (0 is log-uniform), got {self.size_exponent}."
            )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"TableShapes.pooling={self.pooling!r} is not supported; choose one of"
                f" {', '.join(map(repr, POOLINGS))}."
            )

    def table_sizes(self) -> list[int]:
        """Rows of each table, drawn by inverting the bounded power law's CDF.

        Returns:
            ``num_tables`` sizes in ``[min_rows, max_rows]``.
        """
        rng = random.Random(stream_seed(self.seed, _MODEL, 10))
        lo, hi, a = float(self.min_rows), float(self.max_rows) + 1.0, self.size_exponent
        sizes = []
        for _ in range(self.num_tables):
            u = rng.random()
            if a == 0:
                n = lo * (hi / lo) ** u
            else:  # CDF of n ** -(1 + a) on [lo, hi): (lo ** -a - n ** -a) / (lo ** -a - hi ** -a)
                n = (lo**-a - u * (lo**-a - hi**-a)) ** (-1.0 / a)
            sizes.append(min(max(int(n), self.min_rows), self.max_rows))
        return sizes

    def pooling_factors(self) -> list[int] | None:
        """Ids per sample of each feature.

        Returns:
            One pooling factor per table for ``"mlperf"``; ``None`` (one id each) for ``"one_hot"``.
        """
        if self.pooling == "one_hot":
            return None
        rng = random.Random(stream_seed(self.seed, _MODEL, 11))
        return [rng.choice(MLPERF_MULTI_HOT_SIZES) for _ in range(self.num_tables)]


class SyntheticCriteoGenerator:
    """The hidden model behind the synthetic data, and the sampler that draws batches from it.

    Every table's ids follow a truncated Zipf law over ranks (rank 0 hottest), mapped to ids by a fixed
    affine permutation ``id = (a * rank + b) mod n`` with ``gcd(a, n) = 1``: a bijection that needs no
    ``n``-sized permutation table, so full Criteo sizes cost nothing. Ranks are drawn by inverting the CDF of the
    continuous power law on ``[1, n + 1)`` and flooring, which is close to discrete Zipf and fully vectorized.

    The label logit is ``bias + sum over informative tables of effect[table][rank] (mean over pooled ids)
    + w . (dense - mean)``; ``bias`` is calibrated so that about ``positive_rate`` of labels are 1.

    Args:
        table_sizes: Rows of each table.
        zipf_alpha: Zipf exponent of the id distribution (0 is uniform; larger is more skewed).
        ids_per_feature: Ids per feature per sample, the same for every feature (each its own Zipf draw).
        seed: Seed of the hidden model and of every batch.
        positive_rate: Share of positive labels the bias is calibrated for.
        multi_hot_sizes: Ids per sample of each table; ``None``: ``ids_per_feature`` for all.
        multi_hot_distribution: How bags are drawn with ``multi_hot_sizes``: ``"per_id"`` or ``"independent"``
            (:class:`SyntheticCriteoDataModule` says how they differ).
        feature_names: The KeyedJaggedTensor keys, one per table; ``None``: ``cat_0``, ``cat_1``, ...

    Raises:
        ValueError: If ``feature_names`` or ``multi_hot_sizes`` are not one per table.
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
        feature_names: Sequence[str] | None = None,
    ) -> None:
        num_tables = len(table_sizes)
        self.feature_names = list(feature_names) if feature_names is not None else _default_names(num_tables)
        pooled = len(multi_hot_sizes) if multi_hot_sizes is not None else num_tables
        if len(self.feature_names) != num_tables or pooled != num_tables:
            raise ValueError(
                f"{num_tables} tables need one feature name and one pooling factor each; got {len(self.feature_names)}"
                f" feature names and {'no' if multi_hot_sizes is None else len(multi_hot_sizes)} pooling factors."
            )
        self.ids_per_feature = ids_per_feature
        self.seed = seed
        self.multi_hot_sizes = list(multi_hot_sizes) if multi_hot_sizes is not None else None
        self.multi_hot_distribution = multi_hot_distribution
        # Salt of the per-id multi-hot hash: a pure function of the seed, so every rank expands ids alike.
        self._multi_hot_salt = stream_seed(seed, _MODEL, 2) & _HASH_MASK
        rng = random.Random(stream_seed(seed, _MODEL, 0))
        gen = torch.Generator().manual_seed(stream_seed(seed, _MODEL, 1))

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
        # The informative tables' effects together have the variance Criteo's shape gives them (9 of 26 tables), so
        # the labels stay as predictable with hundreds of tables as with 26.
        scale = self.effect_scale * math.sqrt(round(self.informative_fraction * len(FEATURE_NAMES)) / num_informative)
        effects = torch.randn(sum(rows), generator=gen) * scale
        keep = torch.cat([torch.full((r,), float(t in informative)) for t, r in enumerate(rows)])
        self._effects = effects * keep

        # Dense features look like Criteo's after log(1 + x): non-negative counts with a heavy tail and many zeros.
        self._dense_mu = torch.rand(DENSE_COLUMNS, generator=gen) * 4.0 - 0.5
        self._dense_sigma = torch.rand(DENSE_COLUMNS, generator=gen) * 1.0 + 0.75
        self._dense_w = torch.randn(DENSE_COLUMNS, generator=gen) * self.dense_weight_scale
        self._dense_center = torch.zeros(DENSE_COLUMNS)
        self._bias = 0.0
        self._calibrate(positive_rate)

    def _calibrate(self, positive_rate: float, num_samples: int = 16_384) -> None:
        gen = torch.Generator().manual_seed(stream_seed(self.seed, _CALIBRATION, 0))
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
        z = torch.randn(batch_size, DENSE_COLUMNS, generator=gen)
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
        """Draw one batch, a pure function of (seed, split, index).

        Args:
            index: The batch's index in its split.
            split: The split's stream number.
            batch_size: Samples in the batch.

        Returns:
            The batch, labels drawn from the hidden model's probabilities.
        """
        gen = torch.Generator().manual_seed(stream_seed(self.seed, split, index))
        dense, ids, lengths, effect = self._draw(batch_size, gen)
        logit = self._bias + effect + (dense - self._dense_center) @ self._dense_w
        labels = (torch.rand(batch_size, generator=gen) < torch.sigmoid(logit)).float()
        return make_batch(dense, ids, labels, lengths, feature_names=self.feature_names)

    def logits(self, batch: Batch) -> torch.Tensor:
        """The true logit of each sample in a batch drawn from this model (for tests and oracle AUC).

        Args:
            batch: A batch :meth:`batch` drew.

        Returns:
            The logits ``[B]``.
        """
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


def _default_names(num_tables: int) -> list[str]:
    """Criteo's 26 keys for 26 tables, ``cat_0``, ``cat_1``, ... (the example DLRM's names) for any count."""
    return list(FEATURE_NAMES) if num_tables == len(FEATURE_NAMES) else [f"cat_{k}" for k in range(num_tables)]


def _shape_of(
    num_embeddings_per_feature: Sequence[int] | None,
    max_rows: int,
    shape: TableShapes | None,
    multi_hot_sizes: Sequence[int] | None,
) -> tuple[list[int], list[int] | None]:
    """The table sizes and pooling factors a :class:`SyntheticCriteoDataModule` was given, checked."""
    if shape is not None:
        if num_embeddings_per_feature is not None or multi_hot_sizes is not None:
            raise ValueError(
                "shape draws the table sizes and pooling factors; give either shape or"
                " num_embeddings_per_feature / multi_hot_sizes, not both."
            )
        return shape.table_sizes(), shape.pooling_factors()
    sizes = table_sizes(num_embeddings_per_feature, max_rows, any_count=True)
    if multi_hot_sizes is not None:
        multi_hot_sizes = check_multi_hot_sizes(multi_hot_sizes, count=len(sizes))
    return sizes, multi_hot_sizes


class SyntheticCriteoDataModule(RankShardedDataModule):
    """Synthetic Criteo-like click data with a planted, learnable signal: the embedded default dataset.

    Ids are Zipf-distributed per table (a few hot ids take most lookups, as in Criteo), the hot ids scattered
    over the table by a fixed per-table permutation. About a third of the tables carry a hidden random effect per
    id, the 13 dense features a linear effect, and labels are ``Bernoulli(sigmoid(logit))`` with about 25% positives,
    so AUC is meaningful and well above 0.5 once the model learns.

    The data is a pure function of ``seed``: global batch ``i`` of a split is drawn from a generator seeded by
    ``(seed, split, i)``, and rank ``r`` of ``W`` reads batches ``i = r, r + W, r + 2W, ...``. Every epoch
    replays the same ``num_train_batches`` training batches; validation is a separate, fixed stream.

    The model has Criteo's shape (26 tables, 13 dense features) unless ``num_embeddings_per_feature`` lists another
    number of tables or ``shape`` draws one (:class:`TableShapes`: e.g. 200 features with power-law sizes and
    MLPerf-like pooling factors); the features are then named ``cat_0``, ``cat_1``, ..., and the CLI sizes the model
    from them.

    Args:
        num_embeddings_per_feature: Rows of each table, any number of tables; ``None`` uses the Criteo Kaggle sizes
            capped at ``max_rows`` (or those ``shape`` draws).
        max_rows: Cap on table sizes when neither ``num_embeddings_per_feature`` nor ``shape`` is given.
        batch_size: Samples per batch, per rank.
        num_train_batches: Training batches per rank per epoch.
        num_val_batches: Validation batches per rank.
        zipf_alpha: Zipf exponent of the id distribution (0 is uniform; larger is more skewed).
        ids_per_feature: Ids per feature per sample, the same for every feature; above 1 every id of a bag is its
            own Zipf draw. For per-feature pooling factors use ``multi_hot_sizes``.
        seed: Seed of the hidden model and of every batch.
        num_workers: DataLoader worker processes.
        multi_hot_sizes: Ids per sample of each feature (multi-hot features, KeyedJaggedTensor lengths above 1),
            e.g. :data:`MLPERF_MULTI_HOT_SIZES` for MLPerf DLRM v2; ``None``: ``ids_per_feature`` for all.
        multi_hot_distribution: How bags are drawn with ``multi_hot_sizes``: ``"per_id"`` (MLPerf's
            materialisation: one Zipf id per sample expanded into a bag that is a fixed function of that id, see
            :func:`multi_hot_from_one_hot`; the planted effect is the id's, so the signal stays learnable) or
            ``"independent"`` (every id of a bag its own Zipf draw, the effect the bag's mean: bags repeat far
            less within a batch, a harder case for the codec's dedup).
        shape: A drawn model shape (table sizes and pooling factors), instead of ``num_embeddings_per_feature`` and
            ``multi_hot_sizes``.

    Raises:
        ValueError: If ``ids_per_feature`` is below 1 or given with ``multi_hot_sizes`` (or a ``shape`` with MLPerf-like
            pooling), ``multi_hot_distribution`` is not one of its choices, a batch count is negative, ``zipf_alpha``
            is negative, ``shape`` is given with table sizes or pooling factors, or a table size or multi-hot size is
            invalid.
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
        shape: TableShapes | None = None,
    ) -> None:
        num_embeddings_per_feature, multi_hot_sizes = _shape_of(num_embeddings_per_feature, max_rows, shape,
                                                                 multi_hot_sizes)  # fmt: skip
        num_tables = len(num_embeddings_per_feature)
        super().__init__(num_embeddings_per_feature, batch_size, num_workers, feature_names=_default_names(num_tables))
        self._save_hyperparameters()
        if ids_per_feature < 1:
            raise ValueError(f"ids_per_feature must be at least 1, got {ids_per_feature}.")
        if multi_hot_sizes is not None:
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
        self._generator: SyntheticCriteoGenerator | None = None

    @property
    def generator(self) -> SyntheticCriteoGenerator:
        """The hidden model the data is drawn from (built on first use)."""
        if self._generator is None:
            self._generator = SyntheticCriteoGenerator(
                self.num_embeddings_per_feature, self.zipf_alpha, self.ids_per_feature, self.seed,
                multi_hot_sizes=self.multi_hot_sizes, multi_hot_distribution=self.multi_hot_distribution,
                feature_names=self.feature_names,
            )
        return self._generator

    @override
    def setup(self, stage: str) -> None:
        self.generator  # noqa: B018 - build the hidden model once, before workers fork

    def num_batches(self, split: str) -> int:
        """Global batches of a split: ``num_train_batches`` / ``num_val_batches`` for every rank.

        Args:
            split: The split.

        Returns:
            Its global batches (0 for a split other than ``"train"`` and ``"val"``).
        """
        per_rank = {"train": self.num_train_batches, "val": self.num_val_batches}.get(split, 0)
        return per_rank * self.world_size

    def read_batch(self, split: str, index: int) -> Batch:
        """Draw one global batch of a split from the hidden model.

        Args:
            split: ``"train"`` or ``"val"``.
            index: The global batch index.

        Returns:
            The batch.
        """
        return self.generator.batch(index, _SPLIT_STREAMS[split], self.batch_size)
