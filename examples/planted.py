"""Synthetic click data whose tables differ in how much compression error they tolerate (planted sensitivity).

The Criteo-like generator of :mod:`lightning_dlac.examples.synthetic` gives every informative table the same kind of
signal, so a calibration has nothing to tell apart. Here every table has a *role*:

- ``sensitive``: ``rows`` ids drawn uniformly; many ids with small effects (``small_effect``) plus two rare
  *anchor* ids with a large effect (``+-anchor_effect``). It tolerates little: the anchors stretch the value range,
  and a bound relative to that range erases the small differences that carry most of the signal.
- ``noise``: ``rows`` ids, Zipf-like; no effect. It tolerates any error: the labels do not depend on it.
- ``repeated``: ``repeated_rows`` ids, a few vectors well apart in every coordinate, with small, evenly spread
  effects. It tolerates much: the differences that matter are large compared with the bound.

The hidden model is a logistic model over *planted embeddings*: table ``t`` maps id ``i`` to a known vector
``E_t[i]`` (``dim`` coordinates) and the label logit is ``bias + sum_t E_t[id_t] . w_t``; labels are
``Bernoulli(sigmoid(logit))``. The planted embeddings put a table's effect in coordinate 0 (its readout ``w_t`` is
the unit vector there; noise tables read out nothing). They are what a perfectly trained one-layer model would
hold, so the generator doubles as an *oracle model*: :meth:`PlantedSensitivityGenerator.pooled` gives the pooled
embeddings of a batch (one ``[B, dim]`` chunk per table, what the forward all-to-all would carry) and
:meth:`PlantedSensitivityGenerator.loss` the loss of given chunks, which lets a test drive a
:class:`~lightning_dlac.adaptive.Calibrator` in process, with the real codec's error, and check that it finds the
planted tables. :class:`PlantedSensitivityDataModule` serves the same data (ids and labels) to a DLRM that learns
its own embeddings.

Batches are a pure function of ``(seed, split, index)``, rank ``r`` of ``W`` reads global batches
``r, r + W, ...`` (:class:`~lightning_dlac.examples.base.RankShardedDataModule`, as every example datamodule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torchrec.datasets.utils import Batch

from lightning_dlac.criteo.format import DENSE_COLUMNS, FEATURE_NAMES

from .base import RankShardedDataModule, make_batch, stream_seed

__all__ = ["ROLES", "PlantedSensitivityDataModule", "PlantedSensitivityGenerator", "default_roles"]

ROLES = ("sensitive", "noise", "repeated")
_TRAIN, _VAL, _MODEL, _CALIBRATION = 0, 1, 3, 2
_SPLIT_STREAMS = {"train": _TRAIN, "val": _VAL}


def default_roles(num_tables: int = len(FEATURE_NAMES)) -> list[str]:
    """The default mix of table roles.

    Every sixth table from 1 is sensitive (5 of 26), every third from 0 repeated (9 of 26), the rest noise (12 of
    26).

    Args:
        num_tables: How many tables.

    Returns:
        One role per table.
    """
    roles = []
    for t in range(num_tables):
        roles.append("sensitive" if t % 6 == 1 else "repeated" if t % 3 == 0 else "noise")
    return roles


class PlantedSensitivityGenerator:
    """The hidden model and sampler (see the module docstring).

    Args:
        roles: Role of each table (``"sensitive"``, ``"noise"`` or ``"repeated"``).
        rows: Ids of the sensitive and noise tables.
        repeated_rows: Ids of the repeated tables.
        dim: Coordinates of the planted embeddings.
        seed: Seed of the hidden model and of every batch.
        small_effect: Standard deviation of the sensitive tables' per-id effects.
        anchor_effect: Effect of a sensitive table's two anchor ids (``+anchor_effect`` and ``-anchor_effect``).
        anchor_rate: Probability that a sample draws each anchor id of a sensitive table.
        repeated_effect: Largest effect of a repeated table (its ids' effects are spread evenly over
            ``[-repeated_effect, repeated_effect]``).
        positive_rate: Share of positive labels the bias is set for.

    Raises:
        ValueError: If a role is unknown, ``rows < 3``, ``repeated_rows < 2``, ``dim < 1``, or ``anchor_rate`` is
            outside [0, 0.5).
    """

    def __init__(
        self,
        roles: Sequence[str],
        rows: int = 2000,
        repeated_rows: int = 4,
        dim: int = 16,
        seed: int = 0,
        small_effect: float = 0.5,
        anchor_effect: float = 6.0,
        anchor_rate: float = 0.02,
        repeated_effect: float = 0.3,
        positive_rate: float = 0.25,
    ) -> None:
        unknown = sorted(set(roles) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown table role(s) {unknown}; every role must be one of {list(ROLES)}.")
        if rows < 3 or repeated_rows < 2:
            raise ValueError(f"need rows >= 3 (two anchors and one more id) and repeated_rows >= 2, got rows={rows},"
                             f" repeated_rows={repeated_rows}.")
        if dim < 1:
            raise ValueError(f"dim must be at least 1, got {dim}.")
        if not 0 <= anchor_rate < 0.5:
            raise ValueError(f"anchor_rate={anchor_rate} must be in [0, 0.5): each of the two anchors is drawn with"
                             " that probability.")
        self.roles = list(roles)
        self.dim = dim
        self.seed = seed
        self.anchor_rate = anchor_rate
        self.table_rows = [repeated_rows if r == "repeated" else rows for r in self.roles]
        gen = torch.Generator().manual_seed(stream_seed(seed, _MODEL, 0))
        self.embeddings: list[torch.Tensor] = []
        self.readouts: list[torch.Tensor] = []
        unit = torch.zeros(dim)
        unit[0] = 1.0
        for role, n in zip(self.roles, self.table_rows):
            # Coordinates 1.. hold a small per-id jitter that keeps every id's vector distinct without carrying signal.
            e = 0.05 * torch.randn(n, dim, generator=gen)
            if role == "sensitive":
                e[:, 0] = small_effect * torch.randn(n, generator=gen)
                e[0, 0], e[1, 0] = anchor_effect, -anchor_effect
                w = unit
            elif role == "repeated":
                # A few vectors far apart in every coordinate: the bound keeps them apart, and the small effect
                # makes the error matter little.
                levels = torch.linspace(-repeated_effect, repeated_effect, n)
                e = torch.stack([levels[torch.randperm(n, generator=gen)] for _ in range(dim)], dim=1)
                e[:, 0] = levels
                w = unit
            else:
                e = torch.randn(n, dim, generator=gen)
                w = torch.zeros(dim)
            self.embeddings.append(e)
            self.readouts.append(w)
        self._dense_w = torch.zeros(DENSE_COLUMNS)  # dense features are noise: the signal is in the tables
        self.bias = 0.0
        self.bias = self._fit_bias(positive_rate)

    @property
    def sensitive_tables(self) -> list[int]:
        """Indices of the sensitive tables."""
        return [t for t, r in enumerate(self.roles) if r == "sensitive"]

    def _fit_bias(self, positive_rate: float) -> float:
        gen = torch.Generator().manual_seed(stream_seed(self.seed, _CALIBRATION, 0))
        logit = self.logits_of(self.pooled_ids(self._ids(8192, gen)))
        lo, hi = -20.0, 20.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if torch.sigmoid(logit + mid).mean().item() < positive_rate else (lo, mid)
        return (lo + hi) / 2

    def _ids(self, batch_size: int, gen: torch.Generator) -> list[torch.Tensor]:
        ids = []
        for role, n in zip(self.roles, self.table_rows):
            if role == "noise":  # Zipf-like (rank ~ n^u): hot ids repeat as in real tables
                rank = (torch.exp(torch.rand(batch_size, generator=gen) * torch.log(torch.tensor(n + 1.0))) - 1)
                ids.append(rank.long().clamp_(0, n - 1))
                continue
            i = torch.randint(0, n, (batch_size,), generator=gen)
            if role == "sensitive":
                u = torch.rand(batch_size, generator=gen)
                i = torch.where(u < self.anchor_rate, 0, torch.where(u < 2 * self.anchor_rate, 1, i.clamp(min=2)))
            ids.append(i)
        return ids

    def pooled_ids(self, ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The planted pooled embeddings of one id per sample and table.

        Args:
            ids: Per table, one id per sample, ``[B]``.

        Returns:
            Per table, the pooled embeddings ``[B, dim]``.
        """
        return [e[i] for e, i in zip(self.embeddings, ids)]

    def logits_of(self, pooled: Sequence[torch.Tensor]) -> torch.Tensor:
        """The oracle's logit of each sample from the pooled embeddings of every table.

        Args:
            pooled: Per table, the pooled embeddings ``[B, dim]``, in table order.

        Returns:
            The logits ``[B]``, the fitted bias included (0 while the bias is being fitted).
        """
        return sum(x @ w for x, w in zip(pooled, self.readouts)) + self.bias

    def batch(self, index: int, split: int = _TRAIN, batch_size: int = 512) -> Batch:
        """Draw one batch, a pure function of ``(seed, split, index)``.

        Args:
            index: The batch's index in its split.
            split: The split's stream number.
            batch_size: Samples in the batch.

        Returns:
            The batch, labels drawn from the oracle's probabilities.
        """
        gen = torch.Generator().manual_seed(stream_seed(self.seed, 10 + split, index))
        ids = self._ids(batch_size, gen)
        logit = self.logits_of(self.pooled_ids(ids))
        dense = torch.log1p(torch.rand(batch_size, DENSE_COLUMNS, generator=gen) * 10)
        labels = (torch.rand(batch_size, generator=gen) < torch.sigmoid(logit)).float()
        lengths = torch.ones(len(ids) * batch_size, dtype=torch.int32)
        return make_batch(dense, torch.cat(ids), labels, lengths, feature_names=FEATURE_NAMES)

    def pooled(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The oracle's pooled embeddings of a batch drawn from this generator.

        Args:
            batch: A batch :meth:`batch` drew.

        Returns:
            One ``[B, dim]`` chunk per table, keyed ``t_<feature>`` (the names DLRMModule gives its tables).
        """
        b = batch.labels.numel()
        ids = batch.sparse_features.values().view(len(self.roles), b)
        return {f"t_{FEATURE_NAMES[t]}": self.embeddings[t][ids[t]] for t in range(len(self.roles))}

    def loss(self, pooled: Mapping[str, torch.Tensor], labels: torch.Tensor) -> float:
        """Mean binary cross-entropy of the oracle on the given pooled embeddings.

        Args:
            pooled: Per table, its pooled embeddings, keyed as :meth:`pooled` returns them.
            labels: The batch's labels ``[B]``.

        Returns:
            The loss.
        """
        chunks = [pooled[f"t_{FEATURE_NAMES[t]}"] for t in range(len(self.roles))]
        return float(F.binary_cross_entropy_with_logits(self.logits_of(chunks), labels))


class PlantedSensitivityDataModule(RankShardedDataModule):
    """The planted-sensitivity data (see the module docstring) for a DLRM with 26 tables.

    Args:
        roles: Role of each of the 26 tables; ``None`` is :func:`default_roles`.
        rows: Ids of the sensitive and noise tables.
        repeated_rows: Ids of the repeated tables.
        batch_size: Samples per batch, per rank.
        num_train_batches: Training batches per rank per epoch.
        num_val_batches: Validation batches per rank.
        seed: Seed of the hidden model and of every batch.
        num_workers: DataLoader worker processes.

    Raises:
        ValueError: If there is not one role per categorical feature, a batch count is negative, or the generator
            refuses its options.
    """

    def __init__(
        self,
        roles: list[str] | None = None,
        rows: int = 2000,
        repeated_rows: int = 4,
        batch_size: int = 512,
        num_train_batches: int = 64,
        num_val_batches: int = 8,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        roles = list(roles) if roles is not None else default_roles()
        if len(roles) != len(FEATURE_NAMES):
            raise ValueError(f"roles needs one role per categorical feature ({len(FEATURE_NAMES)}), got {len(roles)}.")
        self.generator = PlantedSensitivityGenerator(roles, rows=rows, repeated_rows=repeated_rows, seed=seed)
        super().__init__(list(self.generator.table_rows), batch_size, num_workers)
        self._save_hyperparameters()
        for name, value in (("num_train_batches", num_train_batches), ("num_val_batches", num_val_batches)):
            if value < 0:
                raise ValueError(f"{name} must be non-negative, got {value}.")
        self.num_train_batches, self.num_val_batches = num_train_batches, num_val_batches

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
        """Draw one global batch of a split from the planted model.

        Args:
            split: ``"train"`` or ``"val"``.
            index: The global batch index.

        Returns:
            The batch.
        """
        return self.generator.batch(index, _SPLIT_STREAMS[split], self.batch_size)
