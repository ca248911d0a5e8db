"""Sharding of a model's embedding tables with TorchRec: options, their validation, planning and the plan summary.

TorchRec only (no Lightning): ``DLACStrategy`` calls :func:`shard_model`, and so can a plain training loop
(benchmarks/e2e_bandwidth.py is one, end to end)::

    dmp = shard_model(model, ShardingOptions(sharding_types=["table_wise"]), device=torch.device("cpu"))
    group = install_compressed_all_to_all(dmp, CompressionConfig(), ErrorBounds(0.01))
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from lightning_dlac.checks import parse_enum  # plugin/strategy.py still imports it from here
from lightning_dlac.engine.ids import install_id_checks

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

log = logging.getLogger(__name__)

# TorchRec's sharding type names (torchrec.distributed.types.ShardingType values), spelled as in its planner.
SHARDING_TYPES = (
    "table_wise",
    "column_wise",
    "row_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
    "grid_shard",
)
# Sharding types that split one table over several ranks, so a table larger than one rank's budget can still fit.
_SPLITTING_SHARDING_TYPES = frozenset(SHARDING_TYPES) - {"table_wise", "data_parallel"}


class NoEmbeddingTablesError(TypeError):
    """The model has no TorchRec ``EmbeddingBagCollection`` or ``EmbeddingCollection`` to shard."""


class EmbeddingOptimizer(str, Enum):
    """Fused (in-backward) optimizers for the sharded embedding tables, as FBGEMM implements them."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"

    def __str__(self) -> str:
        return self.value

    def to_fbgemm(self) -> Any:
        """The FBGEMM optimizer type this optimizer maps to.

        Returns:
            The ``fbgemm_gpu`` ``EmbOptimType`` (its exact variant).
        """
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        return {
            EmbeddingOptimizer.SGD: EmbOptimType.EXACT_SGD,
            EmbeddingOptimizer.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
            EmbeddingOptimizer.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }[self]

    def state_bytes(self, rows: int, dim: int) -> int:
        """The optimizer state of one table, in bytes.

        Adagrad keeps one float per element, row-wise Adagrad one per row, SGD none.

        Args:
            rows: The table's rows.
            dim: Its embedding dimension.

        Returns:
            The state's size in bytes.
        """
        return {EmbeddingOptimizer.SGD: 0, EmbeddingOptimizer.ADAGRAD: rows * dim * 4,
                EmbeddingOptimizer.ROWWISE_ADAGRAD: rows * 4}[self]


def _sharding_types(types: Sequence[str] | str, option: str) -> list[str]:
    types = [types] if isinstance(types, str) else list(types)
    if not types:
        raise ValueError(f"{option} is empty; give at least one of {', '.join(SHARDING_TYPES)}.")
    for t in types:
        if t not in SHARDING_TYPES:
            raise ValueError(
                f"{option} contains unknown sharding type {t!r}; accepted: {', '.join(SHARDING_TYPES)}"
                " (TorchRec's ShardingType values)."
            )
    return types


def _table_constraints(table_constraints: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    from torchrec.distributed.planner.types import ParameterConstraints

    accepted = {f.name for f in fields(ParameterConstraints)}
    out: dict[str, dict[str, Any]] = {}
    for table, options in table_constraints.items():
        if not isinstance(options, Mapping):
            raise TypeError(
                f"table_constraints[{table!r}] must be a mapping of ParameterConstraints fields, got"
                f" {type(options).__name__}."
            )
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(
                f"table_constraints[{table!r}] has unknown option(s) {unknown}; accepted: {sorted(accepted)}."
            )
        options = dict(options)
        if "sharding_types" in options:
            options["sharding_types"] = _sharding_types(
                options["sharding_types"], f"table_constraints[{table!r}]['sharding_types']"
            )
        out[table] = options
    return out


@dataclass
class ShardingOptions:
    """How the embedding tables are sharded and trained (``DLACStrategy(sharding=...)``, :func:`shard_model`).

    :func:`shard_model`'s options, and ``DLACStrategy(sharding=ShardingOptions(...))``'s (YAML
    ``init_args.sharding``).

    Args:
        sharding_types: Sharding types the planner may choose from, for every table (TorchRec names:
            ``"table_wise"``, ``"column_wise"``, ``"row_wise"``, ``"table_row_wise"``, ...).
        table_constraints: Per-table overrides, ``{table_name: {field: value}}`` with the fields of TorchRec's
            ``ParameterConstraints`` (``sharding_types``, ``compute_kernels``, ``min_partition``, ...).
        embedding_optimizer: Fused optimizer of the embedding tables: ``"sgd"``, ``"adagrad"`` or
            ``"rowwise_adagrad"``.
        embedding_lr: Learning rate of the fused embedding optimizer.
        adagrad_epsilon: Epsilon of the (row-wise) Adagrad embedding optimizer (not an error bound).
        memory_budget_bytes: Memory each rank may use for embedding tables and their optimizer state (device memory
            on GPU, host memory on CPU). ``None`` uses the planner's default for the device.
        find_unused_parameters: Of the ``DistributedDataParallel`` that TorchRec wraps the dense parameters in.
        static_graph: Of that ``DistributedDataParallel``.
        bucket_cap_mb: Of that ``DistributedDataParallel``.
        qcomm_codecs_registry: TorchRec's quantized-communication codecs by ``CommOp`` name (what
            ``torchrec.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry`` returns), given to both sharders,
            for the exchanges TorchRec sends itself: all of them with the compressed exchange off (TorchRec's qcomm
            baselines), the rest with it on. Live codec objects: Python only, not YAML. ``None``: float32.

    Raises:
        ValueError: If a sharding type is unknown, a table constraint names an unknown ``ParameterConstraints``
            field, or a number is out of range.
        TypeError: If a table constraint or ``qcomm_codecs_registry`` is not a mapping.
    """

    sharding_types: Sequence[str] = ("table_wise",)  # the planner's choices for every table (TorchRec names)
    table_constraints: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per table: ParameterConstraints
    embedding_optimizer: EmbeddingOptimizer | str = EmbeddingOptimizer.ADAGRAD  # fused optimizer of the tables
    embedding_lr: float = 0.05  # its learning rate
    adagrad_epsilon: float = 1e-8  # its epsilon (Adagrad and row-wise Adagrad)
    memory_budget_bytes: int | None = None  # per rank, for tables + optimizer state; None: the planner's default
    find_unused_parameters: bool = False  # of the DDP that DMP wraps the dense parameters in
    static_graph: bool = False  # of that DDP
    bucket_cap_mb: int = 25  # of that DDP
    qcomm_codecs_registry: Mapping[str, Any] | None = None  # TorchRec's qcomm codecs by CommOp name; None: float32

    def __post_init__(self) -> None:
        self.sharding_types = _sharding_types(self.sharding_types, "sharding_types")
        self.table_constraints = _table_constraints(self.table_constraints or {})
        self.embedding_optimizer = parse_enum(EmbeddingOptimizer, self.embedding_optimizer, "embedding_optimizer")
        if not self.embedding_lr > 0:
            raise ValueError(f"embedding_lr={self.embedding_lr} must be > 0.")
        if not self.adagrad_epsilon > 0:
            raise ValueError(f"adagrad_epsilon={self.adagrad_epsilon} must be > 0.")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ValueError(
                f"memory_budget_bytes={self.memory_budget_bytes} must be a positive number of bytes or None."
            )
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb} must be > 0.")
        for option in ("find_unused_parameters", "static_graph"):
            if not isinstance(getattr(self, option), bool):
                raise ValueError(f"{option}={getattr(self, option)!r} must be true or false (of the dense part's DDP).")
        if self.qcomm_codecs_registry is not None and not isinstance(self.qcomm_codecs_registry, Mapping):
            raise TypeError(
                "qcomm_codecs_registry must map CommOp names to TorchRec QuantizedCommCodecs (what"
                " torchrec.distributed.fbgemm_qcomm_codec.get_qcomm_codecs_registry returns), got"
                f" {type(self.qcomm_codecs_registry).__name__}."
            )

    def allowed_sharding_types(self, table: str) -> list[str]:
        """The sharding types the planner may use for a table.

        Args:
            table: The table's name.

        Returns:
            Its own constraint's sharding types, else the global ``sharding_types``.
        """
        return list(self.table_constraints.get(table, {}).get("sharding_types", self.sharding_types))

    def check_tables(self, tables: Sequence[Any], supported: Sequence[str], device_type: str,
                     known: Sequence[str] = ()) -> None:
        """Refuse constraints on unknown tables, sharding types the device lacks, and whole tables over budget.

        Args:
            tables: The tables' configs (TorchRec's ``EmbeddingBagConfig`` / ``EmbeddingConfig``).
            supported: The sharding types TorchRec supports for them on this device.
            device_type: The device type, for the message.
            known: Names of the model's other tables (checked in another call), which constraints may name.

        Raises:
            ValueError: If a constraint names a table the model does not have, a table may use no sharding type the
                device supports, or a table kept whole does not fit ``memory_budget_bytes`` (the message says how
                to fix each).
        """
        names = {t.name for t in tables} | set(known)
        unknown = sorted(set(self.table_constraints) - names)
        if unknown:
            raise ValueError(
                f"table_constraints names tables that the model does not have: {unknown}. Tables in the model:"
                f" {sorted(names)}."
            )
        splitting = sorted(_SPLITTING_SHARDING_TYPES & set(supported))
        for t in tables:
            allowed = self.allowed_sharding_types(t.name)
            if not set(allowed) & set(supported):
                raise ValueError(
                    f"Table {t.name!r} may only use sharding types {allowed}, none of which TorchRec supports on"
                    f" {device_type!r} devices (supported there: {list(supported)}). Change sharding_types (or that"
                    " table's table_constraints)."
                )
            if self.memory_budget_bytes is None or set(allowed) & _SPLITTING_SHARDING_TYPES:
                continue
            optimizer = self.embedding_optimizer
            need = t.num_embeddings * t.embedding_dim * 4 + optimizer.state_bytes(t.num_embeddings, t.embedding_dim)
            if need > self.memory_budget_bytes:
                raise ValueError(
                    f"Embedding table {t.name!r} ({t.num_embeddings} rows x {t.embedding_dim} dims, {need} bytes with"
                    f" {optimizer} state) does not fit in memory_budget_bytes={self.memory_budget_bytes} of one"
                    f" rank, and sharding types {allowed} keep a table whole. Raise memory_budget_bytes, or let it be"
                    f" split: table_constraints={{{t.name!r}: {{'sharding_types': [{splitting[0]!r}]}}}} (splitting"
                    f" types on {device_type!r}: {splitting})."
                )


def shard_model(
    module: nn.Module,
    options: ShardingOptions,
    device: torch.device,
    pg: dist.ProcessGroup | None = None,
    local_world_size: int | None = None,
) -> DistributedModelParallel:
    """Shard a model's embedding tables with TorchRec and wrap the model in ``DistributedModelParallel``.

    Every ``EmbeddingBagCollection`` and ``EmbeddingCollection`` (sequence features) in ``module`` is planned and
    sharded: tables sharded and trained by the fused optimizer, dense parameters in DDP, the ids checked against
    their tables (:mod:`lightning_dlac.engine.ids`). The sharded tables start from the module's own weights.

    Args:
        module: The model (not yet sharded).
        options: Sharding and embedding-optimizer options.
        device: This rank's device.
        pg: Process group (default: the world group, which must exist).
        local_world_size: Ranks per node, as the planner's topology needs it (default: the world size).

    Returns:
        The sharded model.

    Raises:
        NoEmbeddingTablesError: If ``module`` has no embedding collection to shard.
        RuntimeError: If no process group is given and none is initialized.
        ValueError: If the options do not fit the model's tables (:meth:`ShardingOptions.check_tables`), or the
            planner finds no sharding within the memory budget.
    """
    from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import (
        KernelConfig,
        ParameterConstraints,
        PlannerError,
        TopologyFactory,
        TrainerConfig,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    ebcs = [m for m in module.modules() if isinstance(m, EmbeddingBagCollection)]
    ecs = [m for m in module.modules() if isinstance(m, EmbeddingCollection)]
    sharded = (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)
    if not ebcs and not ecs and not any(isinstance(m, sharded) for m in module.modules()):
        raise NoEmbeddingTablesError(
            f"found no torchrec EmbeddingBagCollection or EmbeddingCollection in {type(module).__name__}. Build the"
            " embedding tables with"
            " `torchrec.EmbeddingBagCollection(tables=[EmbeddingBagConfig(...)])` (see lightning_dlac.examples), or"
            " use Lightning's DDPStrategy for a model without embedding tables."
        )
    pg = pg if pg is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("shard_model() needs an initialized process group (torch.distributed.init_process_group).")
    env = ShardingEnv.from_process_group(pg)
    fused_params = {
        "optimizer": options.embedding_optimizer.to_fbgemm(),
        "learning_rate": options.embedding_lr,
        "eps": options.adagrad_epsilon,
    }
    registry = options.qcomm_codecs_registry  # passed only when set: a sharder subclass may bring its own default
    codecs = {} if registry is None else {"qcomm_codecs_registry": dict(registry)}
    sharder = EmbeddingBagCollectionSharder(fused_params=dict(fused_params), **codecs)
    # EmbeddingCollections (sequence features: one embedding per id, unpooled) are sharded too: left to DMP they
    # would stay a replicated dense module, every rank holding every table.
    sequence_sharder = EmbeddingCollectionSharder(fused_params=dict(fused_params), **codecs)
    bag_tables = [table for ebc in ebcs for table in ebc.embedding_bag_configs()]
    sequence_tables = [table for ec in ecs for table in ec.embedding_configs()]
    options.check_tables(bag_tables, supported=sharder.sharding_types(device.type), device_type=device.type,
                         known=[t.name for t in sequence_tables])
    options.check_tables(sequence_tables, supported=sequence_sharder.sharding_types(device.type),
                         device_type=device.type, known=[t.name for t in bag_tables])
    tables = bag_tables + sequence_tables
    budget = options.memory_budget_bytes
    topology = TopologyFactory.create_topology(
        TrainerConfig(
            world_size=env.world_size,
            local_world_size=local_world_size or env.world_size,
            hbm_cap_bytes=budget if device.type == "cuda" else None,
            ddr_cap_bytes=budget if device.type != "cuda" else None,
        ),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    constraints = {
        t.name: ParameterConstraints(
            **{**options.table_constraints.get(t.name, {}), "sharding_types": options.allowed_sharding_types(t.name)}
        )
        for t in tables
    }
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints, debug=False,
                                       storage_reservation=_storage_reservation(module, [*ebcs, *ecs]))
    try:
        plan = planner.collective_plan(module, [sharder, sequence_sharder], pg)
    except PlannerError as err:
        raise ValueError(
            f"TorchRec's planner found no sharding of the {len(tables)} embedding tables on {env.world_size}"
            f" rank(s) with sharding_types={options.sharding_types} and memory_budget_bytes={budget}. Raise"
            " memory_budget_bytes, allow more sharding types (e.g. 'column_wise' or 'row_wise'), or shrink the"
            f" tables. Planner said: {str(err).strip()[:2000]}"
        ) from err
    log.debug(f"sharding plan\n{plan}")
    ddp = {"find_unused_parameters": options.find_unused_parameters, "static_graph": options.static_graph,
           "bucket_cap_mb": options.bucket_cap_mb}
    weights = _table_weights(module, [*ebcs, *ecs])
    dmp = DistributedModelParallel(module, env=env, device=device, plan=plan, sharders=[sharder, sequence_sharder],
                                   data_parallel_wrapper=_dense_data_parallel(**ddp))
    # TorchRec's sharded tables start from their own random initialization, drawn from the global random state at
    # sharding time (so it moved with whatever had drawn from it before, such as a callback setting up the training
    # loader): without this copy a module's tables were silently replaced, and two runs from the same seeded module
    # trained from different tables.
    load_unsharded_state(module, weights)
    install_id_checks(dmp, device)  # an id outside its table fails at its batch, naming the feature
    return dmp


def _table_weights(module: nn.Module, embedding_modules: Sequence[nn.Module]) -> dict[str, torch.Tensor]:
    """The embedding tables' weights as ``module`` holds them before sharding, by state-dict key: the ones a user
    initialized, seeded or loaded. Tables on the meta device have none and are left to TorchRec's initialization."""
    names = {id(m): name for name, m in module.named_modules()}
    weights = {}
    for m in embedding_modules:
        prefix = names[id(m)]
        for key, value in m.state_dict(prefix=f"{prefix}." if prefix else "").items():
            if value.device.type != "meta":
                weights[key] = value.detach()
    return weights


def shard_slices(metadata: Any) -> tuple[slice, ...]:
    """Where a shard (its ``ShardMetadata``) sits in the unsharded tensor: one slice per dimension."""
    return tuple(slice(o, o + n) for o, n in zip(metadata.shard_offsets, metadata.shard_sizes))


def load_unsharded_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy unsharded tensors into a sharded ``module``: every entry of its state dict that ``state`` holds, each
    rank the rows and columns of the shards it owns (a replicated tensor, such as a data-parallel table, whole)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for key, value in module.state_dict().items():
            source = state.get(key)
            if source is None:
                continue
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    shard.tensor.copy_(source[shard_slices(shard.metadata)])
            elif isinstance(value, torch.Tensor):
                value.copy_(source)


# TorchRec's default share of every device kept free for what the planner does not model (its
# heuristical_storage_reservation_percentage), and its weight on the dense parameters' size: parameter, optimizer
# state (~2x), DDP buckets (~3x).
_RESERVED_SHARE = 0.15
_DENSE_MULTIPLIER = 6.0


def _storage_reservation(module: nn.Module, embedding_modules: Sequence[nn.Module]) -> Any:
    """TorchRec's default reservation (15% of each device plus the dense part's footprint), given the dense size
    measured on the materialised model. TorchRec warns at construction that its own estimate over-counts in a dry
    run, where tensors are not materialised; this one is measured on real tensors, so the warning is not ours."""
    import warnings

    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    def size(m: nn.Module) -> float:
        params = sum(p.numel() * p.element_size() for p in m.parameters())
        return _DENSE_MULTIPLIER * params + sum(b.numel() * b.element_size() for b in m.buffers())

    dense = round(size(module) - sum(size(m) for m in embedding_modules))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "HeuristicalStorageReservation is known to cause issues", FutureWarning)
        return HeuristicalStorageReservation(_RESERVED_SHARE, _DENSE_MULTIPLIER, dense_tensor_estimate=max(dense, 1))


def _dense_data_parallel(find_unused_parameters: bool, static_graph: bool, bucket_cap_mb: int) -> Any:
    """TorchRec's wrapper of the dense parameters in a DDP, with torch's current buffer option
    (``forward_sync_buffers=False``) where TorchRec 1.8 passes the deprecated ``broadcast_buffers=False``, and its
    gradient buckets laid out once for the whole run (:func:`_fix_bucket_layout`)."""
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

    class DenseDataParallel(DefaultDataParallelWrapper):
        def _ddp_wrap(self, dmp: Any, env: Any, device: torch.device, ddp_ignore_param_names: set[str]) -> None:
            from torch.nn.parallel import DistributedDataParallel

            if env.process_group is None:
                raise RuntimeError("Can only init DDP for ProcessGroup-based ShardingEnv")
            if not set(dict(dmp.named_parameters())) - ddp_ignore_param_names:
                return  # nothing dense to train data-parallel
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                module=dmp._dmp_wrapped_module, params_and_buffers_to_ignore=ddp_ignore_param_names
            )
            dmp._dmp_wrapped_module = DistributedDataParallel(
                module=dmp._dmp_wrapped_module.to(device), device_ids=None if device.type == "cpu" else [device],
                process_group=env.process_group, gradient_as_bucket_view=True, forward_sync_buffers=False,
                static_graph=self._static_graph, find_unused_parameters=self._find_unused_parameters,
                bucket_cap_mb=self._bucket_cap_mb,
            )  # fmt: skip
            _fix_bucket_layout(dmp._dmp_wrapped_module)

    return DenseDataParallel(bucket_cap_mb=bucket_cap_mb, static_graph=static_graph,
                             find_unused_parameters=find_unused_parameters)


def _fix_bucket_layout(ddp: Any) -> None:
    """Give a new DDP the gradient-bucket layout it keeps for the whole run, the same in a fresh and a resumed run.

    An all-reduce sums each gradient element over the ranks in an order that depends on where the element lies in
    its bucket's flat buffer (gloo's and NCCL's ring algorithms reduce each chunk of the buffer in another rank
    order). DDP reduces its first step with every parameter in one bucket in definition order, then rebuilds its
    buckets once, in the order that step's backward made the gradients ready. A run resumed from a checkpoint builds
    a new DDP, so its first step reduced with the first-step layout where the run it continues used the rebuilt one:
    on 3 or more ranks some elements summed their addends in another order, the dense weights differed in the last
    bit after the first resumed step, and the losses a few steps later (with 2 ranks ``a + b == b + a`` hid it).
    Rebuilding now, in definition order (the order DDP's own join hook pushes), fixes the layout before any step;
    where DDP never rebuilds (``find_unused_parameters=True`` without ``static_graph``) both calls do nothing.

    The cost: with more than one bucket (dense parameters beyond ``bucket_cap_mb``) the buckets follow definition
    order rather than the backward's, so their all-reduces start when the backward reaches the first layers instead
    of overlapping the rest of it.
    """
    ddp.reducer._push_all_rebuilt_params()
    ddp.reducer._rebuild_buckets()  # a broadcast of the layout from rank 0: every rank builds its DDP here


def plan_summary(plan: Any) -> str:
    """Describe a TorchRec ``ShardingPlan`` in one line.

    Args:
        plan: The plan.

    Returns:
        ``table->sharding_type[ranks]`` for up to eight of its tables, comma-separated (and how many there are
        when more).
    """
    parts = []
    for module_plan in plan.plan.values():
        for table, spec in module_plan.items():
            ranks = sorted(spec.ranks) if spec.ranks else []
            parts.append(f"{table}->{spec.sharding_type}{ranks}")
    return ", ".join(parts) if len(parts) <= 8 else ", ".join(parts[:8]) + f", ... ({len(parts)} tables)"


def table_count(plan: Any) -> int:
    """Number of tables a ``ShardingPlan`` places."""
    return sum(len(module_plan) for module_plan in plan.plan.values())


def fused_parameters(module: nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of a module that a fused optimizer trains inside the backward pass.

    Args:
        module: The module (sharded or not).

    Returns:
        Those parameters: the sharded embedding tables' (none before sharding).
    """
    return [p for p in module.parameters() if hasattr(p, "_in_backward_optimizers")]


def dense_parameters(module: nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``module`` that a regular optimizer should train.

    Under :class:`~lightning_dlac.DLACStrategy` (``configure_optimizers`` runs after sharding) that is everything but
    the sharded embedding tables, which a fused optimizer trains inside the backward pass. Without sharding (a plain
    Trainer) it is every parameter, embedding tables included.

    Args:
        module: The module (the LightningModule in ``configure_optimizers``).

    Returns:
        The parameters to give the optimizer.
    """
    return [p for p in module.parameters() if not hasattr(p, "_in_backward_optimizers")]
