"""A fair data set for judging table-wise calibration: tables that differ only in how the label depends on them.

Every table has the same number of rows and the same id distribution (a Zipf law over rows, the hot rows scattered
by a per-table permutation), so no statistic of the ids alone tells the tables apart. Each table gets a *role*,
drawn at random per seed:

- ``sensitive``: the label depends on fine differences between the table's rows. Each row ``i`` holds a coefficient
  vector ``a_t[i]`` (``interaction_dim`` coordinates) spread like a heavy-tailed law: in every coordinate the rows
  take the ``rows`` quantiles of Student's t with 3 degrees of freedom (times ``sensitive_scale``) in a random
  order, so most rows have small coefficients that still differ from one another and a few have large ones, the
  same spread for every seed. A model must hold every row's coefficients precisely, and the few large ones stretch
  the value range a range-relative bound is measured against, so a loose bound erases the differences among the
  many small ones.
- ``robust``: the label depends on coarse structure: every coefficient is ``+-robust_scale`` (two levels per
  coordinate), far apart compared with any bound.
- ``irrelevant``: the label does not depend on the table.

The label of a sample is ``Bernoulli(sigmoid(sum_t a_t[id_t] . x / sqrt(interaction_dim)))`` where ``x`` are the
sample's first ``interaction_dim`` dense features (standard normal; the others carry nothing): the DLRM's dot
interaction between its bottom MLP's output and a table's embedding can represent each term exactly.

Batches are a pure function of ``(seed, split, index)``; rank ``r`` of ``W`` reads global batches ``r, r + W, ...``
(:class:`~lightning_dlac.examples.base.RankShardedDataModule`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from lightning_dlac.examples.base import RankShardedDataModule, make_batch, stream_seed
from torchrec.datasets.utils import Batch
from typing_extensions import override

ROLES = ("sensitive", "robust", "irrelevant")
_TRAIN, _VAL, _MODEL = 0, 1, 2


def t3_quantiles(n: int) -> torch.Tensor:
    """The ``n`` quantiles ``(j + 1/2) / n`` of Student's t with 3 degrees of freedom, by bisection on its CDF
    ``1/2 + (t / (sqrt(3) (1 + t**2 / 3)) + atan(t / sqrt(3))) / pi``."""
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    lo, hi = torch.full_like(u, -1e3), torch.full_like(u, 1e3)
    for _ in range(80):
        mid = (lo + hi) / 2
        cdf = 0.5 + (mid / (math.sqrt(3) * (1 + mid**2 / 3)) + torch.atan(mid / math.sqrt(3))) / math.pi
        lo, hi = torch.where(cdf < u, mid, lo), torch.where(cdf < u, hi, mid)
    return ((lo + hi) / 2).float()


def draw_roles(num_tables: int, sensitive: int, robust: int, seed: int) -> list[str]:
    """Roles of ``num_tables`` tables: ``sensitive`` and ``robust`` of them at random positions (a permutation drawn
    from ``seed``), the rest irrelevant."""
    if sensitive < 0 or robust < 0 or sensitive + robust > num_tables:
        raise ValueError(f"{sensitive} sensitive and {robust} robust tables do not fit in {num_tables} tables.")
    order = torch.randperm(num_tables, generator=torch.Generator().manual_seed(stream_seed(seed, _MODEL, 1)))
    roles = ["irrelevant"] * num_tables
    for k, t in enumerate(order.tolist()):
        if k < sensitive:
            roles[t] = "sensitive"
        elif k < sensitive + robust:
            roles[t] = "robust"
    return roles


class FairCalibrationDataModule(RankShardedDataModule):
    """The fair calibration data set (module docstring).

    Args:
        num_tables: Categorical features, one table each.
        rows: Rows of every table.
        sensitive: How many tables are sensitive.
        robust: How many tables are robust (the rest are irrelevant).
        interaction_dim: Coordinates of each row's coefficient vector, and dense features it multiplies.
        num_dense_features: Dense features per sample (at least ``interaction_dim``).
        zipf_alpha: Exponent of the id distribution, the same for every table.
        sensitive_scale: Scale of the sensitive tables' coefficients.
        robust_scale: Magnitude of the robust tables' coefficients.
        batch_size: Samples per batch, per rank.
        num_train_batches: Training batches over all ranks.
        num_val_batches: Validation batches over all ranks.
        seed: Seed of the roles, the hidden coefficients and every batch.
    """

    def __init__(self, num_tables: int = 12, rows: int = 500, sensitive: int = 4, robust: int = 4,
                 interaction_dim: int = 2, num_dense_features: int = 4, zipf_alpha: float = 1.05,
                 sensitive_scale: float = 2.5, robust_scale: float = 1.5, batch_size: int = 256,
                 num_train_batches: int = 2000, num_val_batches: int = 64, seed: int = 0) -> None:
        if num_dense_features < interaction_dim or interaction_dim < 1:
            raise ValueError(f"need 1 <= interaction_dim ({interaction_dim}) <= num_dense_features"
                             f" ({num_dense_features}).")
        names = [f"f{t}" for t in range(num_tables)]
        super().__init__([rows] * num_tables, batch_size, feature_names=names, num_dense_features=num_dense_features)
        self.roles = draw_roles(num_tables, sensitive, robust, seed)
        self.seed, self.zipf_alpha, self.interaction_dim = seed, zipf_alpha, interaction_dim
        self._counts = {"train": num_train_batches, "val": num_val_batches}
        g = torch.Generator().manual_seed(stream_seed(seed, _MODEL, 0))
        coef = torch.zeros(num_tables, rows, interaction_dim)
        for t, role in enumerate(self.roles):
            if role == "sensitive":
                for k in range(interaction_dim):
                    coef[t, :, k] = sensitive_scale * t3_quantiles(rows)[torch.randperm(rows, generator=g)]
            elif role == "robust":
                signs = torch.randint(0, 2, (rows, interaction_dim), generator=g).float() * 2 - 1
                coef[t] = robust_scale * signs
        self.coefficients = coef
        self._hot = torch.stack([torch.randperm(rows, generator=g) for _ in range(num_tables)])  # rank -> id
        self._zipf = (rows + 1) ** (1.0 - zipf_alpha) - 1.0 if abs(zipf_alpha - 1.0) > 1e-9 else None

    @property
    def table_roles(self) -> dict[str, str]:
        """Role of every table, by table name (``t_<feature>``, the example DLRM's names)."""
        return {f"t_{name}": role for name, role in zip(self.feature_names, self.roles)}

    @override
    def num_batches(self, split: str) -> int:
        return self._counts.get(split, 0)

    @override
    def read_batch(self, split: str, index: int) -> Batch:
        g = torch.Generator().manual_seed(stream_seed(self.seed, _TRAIN if split == "train" else _VAL, index))
        n, b = self.num_embeddings_per_feature[0], self.batch_size
        u = torch.rand(len(self.roles), b, generator=g, dtype=torch.float64)
        if self._zipf is None:
            ranks = ((n + 1) ** u).floor().long() - 1
        else:
            ranks = ((u * self._zipf + 1.0) ** (1.0 / (1.0 - self.zipf_alpha))).floor().long() - 1
        ids = torch.gather(self._hot, 1, ranks.clamp(0, n - 1))  # [tables, batch]
        dense = torch.randn(b, self.num_dense_features, generator=g)
        coef = self.coefficients[torch.arange(len(self.roles)).unsqueeze(1), ids]  # [tables, batch, k]
        x = dense[:, : self.interaction_dim]
        logit = (coef * x.unsqueeze(0)).sum(dim=(0, 2)) / math.sqrt(self.interaction_dim)
        labels = (torch.rand(b, generator=g) < torch.sigmoid(logit)).float()
        return make_batch(dense, ids.reshape(-1), labels, feature_names=self.feature_names)


def precision_recall(classes: dict[str, str], roles: dict[str, str]) -> tuple[float, float, float]:
    """Of a calibration's ``classes``: the precision and recall of "sensitive tables are tight or base", and the
    share of the other tables (robust and irrelevant) put loose."""
    flagged = {t for t, c in classes.items() if c in ("tight", "base")}
    sensitive = {t for t, r in roles.items() if r == "sensitive"}
    others = [t for t, r in roles.items() if r != "sensitive"]
    precision = len(flagged & sensitive) / len(flagged) if flagged else 1.0
    recall = len(flagged & sensitive) / len(sensitive) if sensitive else 1.0
    loose = sum(1 for t in others if classes.get(t) == "loose") / len(others) if others else 1.0
    return precision, recall, loose


def role_counts(roles: Sequence[str]) -> dict[str, int]:
    """How many tables have each role."""
    return {r: sum(1 for x in roles if x == r) for r in ROLES}
