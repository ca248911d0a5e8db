"""A reusable DLRM LightningModule around TorchRec's ``DLRM``, ``DLRM_DCN`` (MLPerf's DLRM v2) and
``DLRM_Projection``: tables from config, BCE loss, AUROC and accuracy.

Features may be one-hot or multi-hot (a KeyedJaggedTensor with lengths above 1): each table pools its ids with
``pooling`` (MLPerf DLRM v2 sums them), so the model is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics.classification import BinaryAccuracy, BinaryAUROC
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection
from torchrec.modules.embedding_configs import PoolingType

from lightning_dlac import dense_parameters

INTERACTIONS = ("dot", "dcn", "projection")
POOLINGS = ("sum", "mean")
TABLE_DEVICES = ("cpu", "meta")
# MLPerf DLRM v2's cross network (torchrec_dlrm --interaction_type=dcn).
DCN_NUM_LAYERS = 3
DCN_LOW_RANK_DIM = 512


def table_name(feature: str) -> str:
    """Name of the embedding table that serves a feature (one table per categorical feature).

    Args:
        feature: The categorical feature (``"cat_0"``).

    Returns:
        The table's name (``"t_cat_0"``).
    """
    return f"t_{feature}"


def _check_interaction(
    interaction: str,
    embedding_dim: int,
    dcn_num_layers: int | None,
    dcn_low_rank_dim: int | None,
    branch1: Sequence[int] | None,
    branch2: Sequence[int] | None,
) -> None:
    """Refuse an interaction with options that belong to another one, or with options it cannot be built from."""
    if interaction not in INTERACTIONS:
        raise ValueError(
            f"interaction={interaction!r} is not supported; choose one of {', '.join(map(repr, INTERACTIONS))}."
        )
    dcn = {"dcn_num_layers": dcn_num_layers, "dcn_low_rank_dim": dcn_low_rank_dim}
    projection = {"interaction_branch1_layer_sizes": branch1, "interaction_branch2_layer_sizes": branch2}
    foreign = {"dot": {**dcn, **projection}, "dcn": projection, "projection": dcn}[interaction]
    given = [name for name, value in foreign.items() if value is not None]
    if given:
        owner = {**dict.fromkeys(dcn, "'dcn'"), **dict.fromkeys(projection, "'projection'")}
        raise ValueError(
            f"{given[0]} only applies to interaction={owner[given[0]]}, but interaction={interaction!r}; remove"
            f" {', '.join(given)} or change interaction."
        )
    if interaction == "dcn":
        for name, value in dcn.items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if interaction == "projection":
        for name, sizes in projection.items():
            if sizes is None:
                continue
            if not sizes or any(int(n) < 1 for n in sizes) or sizes[-1] % embedding_dim:
                raise ValueError(
                    f"{name}={list(sizes)} must be positive sizes ending in a multiple of embedding_dim="
                    f"{embedding_dim} (its output is read as [n, embedding_dim])."
                )


class DLRMModule(pl.LightningModule):
    """TorchRec's DLRM trained with binary cross-entropy, as a LightningModule.

    The model is a dense MLP, one embedding table per categorical feature, an interaction and an over MLP.
    ``interaction`` picks the model: ``"dot"`` is TorchRec's ``DLRM`` (pairwise dot products, the original DLRM),
    ``"dcn"`` is ``DLRM_DCN`` (low-rank DCN v2 cross layers over the concatenated embeddings: MLPerf's DLRM v2,
    with ``embedding_dim=128``, ``dcn_num_layers=3``, ``dcn_low_rank_dim=512``, dense ``[512, 256, 128]`` and over
    ``[1024, 1024, 512, 256, 1]``), ``"projection"`` is ``DLRM_Projection`` (two MLP branches whose outputs are
    multiplied as matrices).

    Under :class:`~lightning_dlac.DLACStrategy` the embedding tables are sharded across ranks and trained by the
    strategy's fused optimizer; ``configure_optimizers`` here trains the dense parameters only.

    Options of another interaction (``dcn_low_rank_dim`` with ``interaction="dot"``, ...) are refused at
    construction rather than silently ignored.

    Args:
        num_embeddings_per_feature: Rows of each table, one per categorical feature.
        embedding_dim: Width of every embedding table; also the output width of the dense MLP.
        feature_names: Categorical feature names (the KeyedJaggedTensor keys); default ``cat_0`` ... ``cat_25``.
        num_dense_features: Number of dense (continuous) input features.
        dense_arch_layer_sizes: Dense MLP layer sizes; the last must equal ``embedding_dim``.
        over_arch_layer_sizes: Over MLP layer sizes; the last must be 1 (the logit).
        learning_rate: Learning rate of the dense optimizer.
        optimizer: Dense optimizer: ``"adagrad"``, ``"adam"`` or ``"sgd"``.
        seed: Seed for the initial weights, so that runs (and ranks) start from the same dense weights.
        interaction: ``"dot"``, ``"dcn"`` or ``"projection"`` (see above).
        dcn_num_layers: Cross layers of the DCN interaction (``interaction="dcn"`` only; ``None``: 3, as MLPerf).
        dcn_low_rank_dim: Rank of each cross layer's low-rank weight (``interaction="dcn"`` only; ``None``: 512, as
            MLPerf).
        interaction_branch1_layer_sizes: First projection branch's MLP (``interaction="projection"`` only); its last
            size must be a multiple of ``embedding_dim``. ``None``: ``[256, 8 * embedding_dim]``.
        interaction_branch2_layer_sizes: Second projection branch's MLP (``interaction="projection"`` only); as
            above.
        pooling: How a table pools the ids of one multi-hot feature: ``"sum"`` (MLPerf) or ``"mean"``.
        table_device: Where the tables are built before sharding: ``"cpu"`` (every rank holds every table until
            :class:`~lightning_dlac.DLACStrategy` shards them, and the shards start from these seeded weights, the
            same on any number of ranks) or ``"meta"`` (no memory: each rank initializes only the shards it holds, as
            TorchRec does; needed where the tables do not fit one process, e.g. MLPerf's 40M-row tables).

    Raises:
        ValueError: If the table sizes and feature names differ in number, a table size is not positive, the layer
            sizes do not end as required, or an option is not one of its choices or belongs to another interaction.
    """

    def __init__(
        self,
        num_embeddings_per_feature: Sequence[int] = (1000,) * 26,
        embedding_dim: int = 64,
        feature_names: Sequence[str] | None = None,
        num_dense_features: int = 13,
        dense_arch_layer_sizes: Sequence[int] = (256, 64),
        over_arch_layer_sizes: Sequence[int] = (256, 128, 1),
        learning_rate: float = 0.05,
        optimizer: str = "adagrad",
        seed: int = 0,
        interaction: str = "dot",
        dcn_num_layers: int | None = None,
        dcn_low_rank_dim: int | None = None,
        interaction_branch1_layer_sizes: Sequence[int] | None = None,
        interaction_branch2_layer_sizes: Sequence[int] | None = None,
        pooling: str = "sum",
        table_device: str = "cpu",
    ) -> None:
        super().__init__()
        feature_names = list(feature_names) if feature_names is not None else list(DEFAULT_CAT_NAMES)
        num_embeddings_per_feature = list(num_embeddings_per_feature)
        if len(feature_names) != len(num_embeddings_per_feature):
            raise ValueError(
                f"num_embeddings_per_feature has {len(num_embeddings_per_feature)} entries but there are"
                f" {len(feature_names)} feature_names; give one table size per categorical feature."
            )
        if any(n <= 0 for n in num_embeddings_per_feature):
            raise ValueError(f"num_embeddings_per_feature must be positive, got {num_embeddings_per_feature}.")
        if not dense_arch_layer_sizes or dense_arch_layer_sizes[-1] != embedding_dim:
            raise ValueError(
                f"dense_arch_layer_sizes must end with embedding_dim={embedding_dim} (DLRM interacts the dense"
                f" output with the embeddings), got {list(dense_arch_layer_sizes)}."
            )
        if not over_arch_layer_sizes or over_arch_layer_sizes[-1] != 1:
            raise ValueError(f"over_arch_layer_sizes must end with 1 (the logit), got {list(over_arch_layer_sizes)}.")
        if optimizer not in ("adagrad", "adam", "sgd"):
            raise ValueError(f"optimizer={optimizer!r} is not supported; choose 'adagrad', 'adam' or 'sgd'.")
        _check_interaction(interaction, embedding_dim, dcn_num_layers, dcn_low_rank_dim,
                           interaction_branch1_layer_sizes, interaction_branch2_layer_sizes)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not supported; choose one of {', '.join(map(repr, POOLINGS))}.")
        if table_device not in TABLE_DEVICES:
            raise ValueError(
                f"table_device={table_device!r} is not supported; choose one of {', '.join(map(repr, TABLE_DEVICES))}."
            )
        self.save_hyperparameters()

        tables = [
            EmbeddingBagConfig(
                name=table_name(feature),
                embedding_dim=embedding_dim,
                num_embeddings=rows,
                feature_names=[feature],
                pooling=PoolingType.SUM if pooling == "sum" else PoolingType.MEAN,
            )
            for feature, rows in zip(feature_names, num_embeddings_per_feature)
        ]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            common = {
                "embedding_bag_collection": EmbeddingBagCollection(tables=tables, device=torch.device(table_device)),
                "dense_in_features": num_dense_features,
                "dense_arch_layer_sizes": list(dense_arch_layer_sizes),
                "over_arch_layer_sizes": list(over_arch_layer_sizes),
            }
            if interaction == "dcn":
                self.model = DLRM_DCN(
                    **common,
                    dcn_num_layers=dcn_num_layers if dcn_num_layers is not None else DCN_NUM_LAYERS,
                    dcn_low_rank_dim=dcn_low_rank_dim if dcn_low_rank_dim is not None else DCN_LOW_RANK_DIM,
                )
            elif interaction == "projection":
                default_branch = [256, 8 * embedding_dim]
                self.model = DLRM_Projection(
                    **common,
                    interaction_branch1_layer_sizes=list(interaction_branch1_layer_sizes or default_branch),
                    interaction_branch2_layer_sizes=list(interaction_branch2_layer_sizes or default_branch),
                )
            else:
                self.model = DLRM(**common)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.val_auroc = BinaryAUROC()
        self.val_accuracy = BinaryAccuracy()

    @property
    def embedding_bag_collection(self) -> nn.Module:
        """The (possibly sharded) embedding tables."""
        return self.model.sparse_arch.embedding_bag_collection

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits, shape ``[batch_size]``."""
        return self.model(batch.dense_features, batch.sparse_features).squeeze(-1)

    def _shared_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch)
        return self.loss_fn(logits, batch.labels.float()), logits

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, _ = self._shared_step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.labels.numel())
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss, logits = self._shared_step(batch)
        probs = torch.sigmoid(logits.detach())
        labels = batch.labels.int()
        self.val_auroc.update(probs, labels)
        self.val_accuracy.update(probs, labels)
        n = batch.labels.numel()
        self.log("val/loss", loss, sync_dist=True, batch_size=n)
        self.log("val/auroc", self.val_auroc, prog_bar=True, batch_size=n)
        self.log("val/accuracy", self.val_accuracy, batch_size=n)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> Any:
        params = dense_parameters(self)
        lr = self.hparams.learning_rate
        if self.hparams.optimizer == "adagrad":
            return torch.optim.Adagrad(params, lr=lr)
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr)
        return torch.optim.SGD(params, lr=lr)
