"""Install the compressed all-to-all into TorchRec's sharded EmbeddingBagCollections and EmbeddingCollections.

This touches TorchRec internals (pinned to torchrec 1.8): ``ShardedEmbeddingBagCollection._embedding_shardings`` and
``._output_dists`` are parallel lists, one per sharding type; the table-wise and column-wise shardings use a
``TwPooledEmbeddingDist`` whose ``_dist`` is the pooled-embedding all-to-all. tests/comm/test_comm.py pins the
behaviour.
``ShardedEmbeddingCollection._sharding_type_to_sharding`` and ``._output_dists`` are the same for sequence
(unpooled) embeddings, with a ``TwSequenceEmbeddingDist`` whose ``_dist`` is the sequence-embedding all-to-all
(lightning_dlac/comm/sequence.py; tests/comm/test_sequence.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from lightning_dlac.adaptive.bounds import ErrorBounds
from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll
from lightning_dlac.comm.config import CompressionConfig
from lightning_dlac.comm.group import ExchangeGroup
from lightning_dlac.comm.peers import PeerPlan, backend_of, discover_nodes

log = logging.getLogger(__name__)


def install_compressed_all_to_all(module: nn.Module, config: CompressionConfig, bounds: ErrorBounds,
                                  node: int | str | None = None) -> ExchangeGroup:
    """Install the compressed all-to-all in a sharded model, in place of TorchRec's pooled-embedding all-to-alls.

    The pooled-embedding all-to-all of every table-wise / column-wise sharded EmbeddingBagCollection in ``module``
    becomes a :class:`CompressedPooledEmbeddingsAllToAll`. Shardings that combine results with reduce-scatter (row-wise,
    table-row-wise, ...) keep TorchRec's path, and this says so once in the log. The sequence-embedding all-to-all of
    every table-wise / column-wise sharded EmbeddingCollection is replaced too
    (:class:`~lightning_dlac.comm.sequence.CompressedSequenceEmbeddingsAllToAll`, same bounds and codec); its other
    sharding types keep TorchRec's exchange, logged with their tables.

    Which peers each exchange compresses for is ``config.compress_peers``'s plan (:mod:`lightning_dlac.comm.peers`)
    on the ranks' nodes: ``node`` (this rank's node, e.g. Lightning's ``node_rank``) where given, else what the
    launcher's environment says (``GROUP_RANK``, ``NODE_RANK``, ``SLURM_NODEID``, the host name). The nodes are
    gathered once per process group, so every rank must call this at the same point, as it shards.

    Args:
        module: The sharded model (TorchRec's ``DistributedModelParallel`` or a module holding sharded collections).
        config: The exchange's settings.
        bounds: The per-table bounds every installed exchange reads at each call.
        node: This rank's node; ``None``: what the launcher's environment says.

    Returns:
        The installed exchanges, as one group.
    """
    plans: dict[int, PeerPlan] = {}

    def plan(pg) -> PeerPlan:  # noqa: ANN001 - a ProcessGroup
        if id(pg) not in plans:
            plans[id(pg)] = PeerPlan.from_policy(config.compress_peers, discover_nodes(pg, node), backend_of(pg))
            rank = pg.rank() if hasattr(pg, "rank") else 0
            log.info(f"lightning-dlac: {plans[id(pg)].describe(rank)}")
        return plans[id(pg)]

    from torchrec.distributed.dist_data import VariableBatchPooledEmbeddingsAllToAll
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingDist

    installed: list[nn.Module] = []
    skipped: set[str] = set()
    for path, sebc in module.named_modules():
        if not isinstance(sebc, ShardedEmbeddingBagCollection):
            continue
        feature_to_table = {f: cfg.name for cfg in sebc._embedding_bag_configs for f in cfg.feature_names}
        for sharding_type, sharding, dist_module in zip(
            sebc._sharding_types, sebc._embedding_shardings, sebc._output_dists
        ):
            if type(dist_module) is not TwPooledEmbeddingDist:
                skipped.add(str(sharding_type))
                continue
            names_per_rank = sharding.embedding_names_per_rank()
            dims_per_rank = dist_module._emb_dim_per_rank_per_feature
            if [len(n) for n in names_per_rank] != [len(d) for d in dims_per_rank]:
                log.warning(f"{path}: {sharding_type} layout not understood; its all-to-all stays uncompressed.")
                skipped.add(str(sharding_type))
                continue
            a2a = CompressedPooledEmbeddingsAllToAll(
                pg=dist_module._pg,
                dims_per_rank=dims_per_rank,
                tables_per_rank=[[feature_to_table.get(n, n) for n in names] for names in names_per_rank],
                config=config,
                bounds=bounds,
                callbacks=dist_module._callbacks,
                peers=plan(dist_module._pg),
            )
            # Variable batch per feature keeps TorchRec's (uncompressed) path; it is created lazily only when
            # _dist is None, which it no longer is.
            dist_module._variable_dist = VariableBatchPooledEmbeddingsAllToAll(
                pg=dist_module._pg,
                emb_dim_per_rank_per_feature=dims_per_rank,
                device=dist_module._device,
                codecs=dist_module._codecs,
            )
            dist_module._dist = a2a
            installed.append(a2a)
    if skipped:
        log.warning(
            f"lightning-dlac: sharding type(s) {sorted(skipped)} combine results with reduce-scatter and stay"
            " uncompressed (only table-wise and column-wise all-to-alls are compressed)."
        )
    installed += _install_sequence(module, config, bounds, plan)
    return ExchangeGroup(installed, bounds)


def _install_sequence(module: nn.Module, config: CompressionConfig, bounds: ErrorBounds,
                      plan: Callable[[object], PeerPlan]) -> list[nn.Module]:
    """Replace the sequence-embedding all-to-all of every table-wise / column-wise sharded EmbeddingCollection by
    :class:`~lightning_dlac.comm.sequence.CompressedSequenceEmbeddingsAllToAll`; log the tables that stay on
    TorchRec's exchange and why."""
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.sharding.tw_sequence_sharding import TwSequenceEmbeddingDist

    from lightning_dlac.comm.sequence import CompressedSequenceEmbeddingsAllToAll

    installed = []
    for path, sec in module.named_modules():
        if not isinstance(sec, ShardedEmbeddingCollection):
            continue
        feature_to_table = {f: cfg.name for cfg in sec._embedding_configs for f in cfg.feature_names}
        for (sharding_type, sharding), dist_module in zip(sec._sharding_type_to_sharding.items(), sec._output_dists):
            tables = sorted({feature_to_table.get(f, f) for f in sharding.feature_names()})
            if type(dist_module) is not TwSequenceEmbeddingDist:
                why = "data-parallel tables are not exchanged" if str(sharding_type) == "data_parallel" else \
                    f"its output dist ({type(dist_module).__name__}) is not the table-wise sequence all-to-all"
                log.warning(f"lightning-dlac: {path}: sequence tables {tables} ({sharding_type}) keep TorchRec's"
                            f" uncompressed exchange: {why}.")
                continue
            names_per_rank = sharding.feature_names_per_rank()
            if len(names_per_rank) != dist_module._dist._pg.size():
                log.warning(f"lightning-dlac: {path}: {sharding_type} sequence layout not understood; tables {tables}"
                            " keep TorchRec's uncompressed exchange.")
                continue
            a2a = CompressedSequenceEmbeddingsAllToAll(
                pg=dist_module._dist._pg,
                tables_per_rank=[[feature_to_table.get(n, n) for n in names] for names in names_per_rank],
                config=config,
                bounds=bounds,
                uncompressed=dist_module._dist,
                peers=plan(dist_module._dist._pg),
            )
            dist_module._dist = a2a
            installed.append(a2a)
    return installed
