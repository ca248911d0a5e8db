"""DLACStrategy: TorchRec model parallelism for the embedding tables of a LightningModule, data parallelism for the
rest, registered as ``Trainer(strategy="dlac")``."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.strategies.ddp import _DDPForwardRedirection
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn
from typing_extensions import override

from lightning_dlac._torchrec import require_torchrec
from lightning_dlac.comm.config import (
    BackwardCompression,
    CommStats,
    CompressionConfig,
    ErrorBounds,
    check_relative_bound,
)

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import Accelerator
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll

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
_META_FILE = "meta.pt"
_FUSED_OPTIMIZER_KEY = "fused_optimizer"

# Sharding types that split one table over several ranks, so a table larger than one rank's budget can still fit.
_SPLITTING_SHARDING_TYPES = frozenset(SHARDING_TYPES) - {"table_wise", "data_parallel"}


class EmbeddingOptimizer(str, Enum):
    """Fused (in-backward) optimizers for the sharded embedding tables, as FBGEMM implements them."""

    SGD = "sgd"
    ADAGRAD = "adagrad"
    ROWWISE_ADAGRAD = "rowwise_adagrad"

    def __str__(self) -> str:
        return self.value

    def to_fbgemm(self) -> Any:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        return {
            EmbeddingOptimizer.SGD: EmbOptimType.EXACT_SGD,
            EmbeddingOptimizer.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
            EmbeddingOptimizer.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }[self]


def _parse_enum(enum_cls: type[Enum], value: Any, option: str) -> Any:
    try:
        return enum_cls(value)
    except ValueError:
        accepted = ", ".join(repr(m.value) for m in enum_cls)  # type: ignore[attr-defined]
        raise ValueError(f"{option}={value!r} is not supported; choose one of {accepted}.") from None


def _validate_sharding_types(types: Sequence[str], option: str) -> list[str]:
    if isinstance(types, str):
        types = [types]
    types = list(types)
    if not types:
        raise ValueError(f"{option} is empty; give at least one of {', '.join(SHARDING_TYPES)}.")
    for t in types:
        if t not in SHARDING_TYPES:
            raise ValueError(
                f"{option} contains unknown sharding type {t!r}; accepted: {', '.join(SHARDING_TYPES)}"
                " (TorchRec's ShardingType values)."
            )
    return types


class _DMPForwardRedirection(_DDPForwardRedirection):
    """Lightning's DDP redirection looks for a DDP wrapper; under DMP it sits one level down."""

    @staticmethod
    def _inner(wrapper_module: nn.Module) -> nn.Module:
        return getattr(wrapper_module, "_dmp_wrapped_module", wrapper_module)

    @override
    def on_after_inner_forward(self, wrapper_module: nn.Module, original_module: pl.LightningModule) -> None:
        super().on_after_inner_forward(self._inner(wrapper_module), original_module)

    @override
    def on_after_outer_forward(self, wrapper_module: nn.Module, original_module: pl.LightningModule) -> None:
        super().on_after_outer_forward(self._inner(wrapper_module), original_module)


class DLACStrategy(DDPStrategy):
    """Shard every TorchRec ``EmbeddingBagCollection`` of the LightningModule across the ranks; train the rest
    data-parallel.

    After the process group exists, the strategy plans a sharding of every ``EmbeddingBagCollection`` found in the
    LightningModule with TorchRec's planner (table-wise by default), wraps the module in TorchRec's
    ``DistributedModelParallel`` (which keeps the dense parameters data-parallel with DDP) and trains the embedding
    tables with a fused FBGEMM optimizer in the backward pass. The user's ``training_step`` and
    ``configure_optimizers`` stay ordinary Lightning code; ``configure_optimizers`` should cover the dense parameters
    only (see :func:`dense_parameters`). The backend is gloo on CPU and NCCL on GPU unless
    ``process_group_backend`` says otherwise.

    Args:
        accelerator: Set by the Trainer.
        parallel_devices: Set by the Trainer.
        cluster_environment: Set by the Trainer.
        checkpoint_io: Checkpoint plugin.
        precision_plugin: Precision plugin.
        process_group_backend: ``"gloo"`` or ``"nccl"``; default: gloo on CPU, NCCL on GPU.
        timeout: Collective timeout (a ``timedelta`` or seconds). A rank that stops answering makes the others
            fail after this long instead of hanging.
        start_method: How Lightning launches the processes (``"popen"`` re-runs the script, ``"spawn"``...).
        sharding_types: Sharding types the planner may choose from, for every table (TorchRec names:
            ``"table_wise"``, ``"column_wise"``, ``"row_wise"``, ``"table_row_wise"``, ...).
        table_constraints: Per-table overrides, ``{table_name: {field: value}}`` with the fields of TorchRec's
            ``ParameterConstraints`` (``sharding_types``, ``compute_kernels``, ``min_partition``, ...).
        embedding_optimizer: Fused optimizer of the embedding tables: ``"sgd"``, ``"adagrad"`` or
            ``"rowwise_adagrad"``.
        embedding_lr: Learning rate of the fused embedding optimizer.
        embedding_eps: Epsilon of the (row-wise) Adagrad embedding optimizer.
        memory_budget_bytes: Memory each rank may use for embedding tables and their optimizer state (device memory
            on GPU, host memory on CPU). ``None`` uses the planner's default for the device.
        compress: Compress the pooled-embedding all-to-all. ``False`` keeps TorchRec's uncompressed path exactly
            (for A/B runs). ``"auto"`` compresses, but times both ways and sends uncompressed while that is faster
            (a fast interconnect, a slow codec), re-checking every ``probe_every`` exchanges.
        eps: Relative error bound of every table until a policy (``DLACCallback``) sets per-table bounds.
        backward_compression: Gradient all-to-all: ``"fp32"`` (uncompressed), ``"bf16"``, ``"fp16"`` (fixed-size
            casts, as TorchRec's qcomm codecs) or ``"dlac"`` (error-bounded, ``backward_eps``).
        backward_eps: Relative error bound of the gradient exchange with ``backward_compression="dlac"``.
        codec_impl: ``"auto"`` (native kernels, falling back to the reference), ``"native"`` or ``"ref"``.
        error_every: Measure the observed max error / bound every this many exchanges (0 = never).
        probe_every: With ``compress="auto"``, exchanges between re-checks of the way not taken.
        find_unused_parameters: Of the ``DistributedDataParallel`` that TorchRec wraps the dense parameters in.
        static_graph: Of that ``DistributedDataParallel``.
        bucket_cap_mb: Of that ``DistributedDataParallel``.
    """

    strategy_name = "dlac"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        sharding_types: Sequence[str] = ("table_wise",),
        table_constraints: Mapping[str, Mapping[str, Any]] | None = None,
        embedding_optimizer: str = "adagrad",
        embedding_lr: float = 0.05,
        embedding_eps: float = 1e-8,
        memory_budget_bytes: int | None = None,
        compress: bool | str = True,
        eps: float = 0.01,
        backward_compression: str = "bf16",
        backward_eps: float = 0.01,
        codec_impl: str = "auto",
        error_every: int = 10,
        probe_every: int = 64,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        bucket_cap_mb: int = 25,
    ) -> None:
        require_torchrec()
        if isinstance(timeout, (int, float)):
            if timeout <= 0:
                raise ValueError(f"timeout={timeout} must be a positive number of seconds.")
            timeout = timedelta(seconds=timeout)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
        )
        self._forward_redirection = _DMPForwardRedirection()
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb} must be > 0.")
        self._ddp_options = {
            "find_unused_parameters": bool(find_unused_parameters),
            "static_graph": bool(static_graph),
            "bucket_cap_mb": int(bucket_cap_mb),
        }
        self._sharding_types = _validate_sharding_types(sharding_types, "sharding_types")
        self._table_constraints = self._validate_table_constraints(table_constraints or {})
        self._embedding_optimizer = _parse_enum(EmbeddingOptimizer, embedding_optimizer, "embedding_optimizer")
        if not embedding_lr > 0:
            raise ValueError(f"embedding_lr={embedding_lr} must be > 0.")
        if not embedding_eps > 0:
            raise ValueError(f"embedding_eps={embedding_eps} must be > 0.")
        self._embedding_lr = float(embedding_lr)
        self._embedding_eps = float(embedding_eps)
        if memory_budget_bytes is not None and memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes={memory_budget_bytes} must be a positive number of bytes or None.")
        self._memory_budget_bytes = memory_budget_bytes
        if compress not in (True, False, "auto"):
            raise ValueError(f"compress={compress!r} is not supported; choose true, false or 'auto'.")
        self._compress = compress is not False
        self._compression = CompressionConfig(
            backward=_parse_enum(BackwardCompression, backward_compression, "backward_compression"),
            backward_eps=backward_eps,
            error_every=error_every,
            impl=codec_impl,
            skip_when_slower=compress == "auto",
            probe_every=probe_every,
        )
        self._error_bounds = ErrorBounds(default_eps=check_relative_bound(eps, "eps"))
        self._exchanges: list[CompressedPooledEmbeddingsAllToAll] = []
        self._comm_stats_before_reset = CommStats()
        self._dmp: DistributedModelParallel | None = None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        if cls.strategy_name in strategy_registry:
            return
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="TorchRec-sharded embeddings with DLAC-compressed all-to-all",
        )

    # ------------------------------------------------------------------ properties

    @property
    def sharding_types(self) -> list[str]:
        """Sharding types the planner may choose from."""
        return list(self._sharding_types)

    @property
    def embedding_optimizer(self) -> EmbeddingOptimizer:
        """The fused optimizer that trains the embedding tables."""
        return self._embedding_optimizer

    @property
    def compress(self) -> bool:
        """Whether the pooled-embedding all-to-all is compressed (also with ``compress="auto"``, which may send
        some exchanges uncompressed)."""
        return self._compress

    @property
    def compression(self) -> CompressionConfig:
        """Compression settings of the all-to-all."""
        return self._compression

    @property
    def error_bounds(self) -> ErrorBounds:
        """The per-table bounds the compressed all-to-all reads at every call; the policy writes them."""
        return self._error_bounds

    @property
    def exchanges(self) -> list[CompressedPooledEmbeddingsAllToAll]:
        """The installed compressed all-to-all modules (empty before setup or with ``compress=False``)."""
        return list(self._exchanges)

    @property
    def compressed_tables(self) -> list[str]:
        """Tables whose pooled embeddings this rank sends compressed."""
        return sorted({t for a2a in self._exchanges for t in a2a.local_tables})

    @property
    def all_compressed_tables(self) -> list[str]:
        """Every table whose pooled embeddings some rank sends compressed; the same sorted list on every rank."""
        return sorted({t for a2a in self._exchanges for tables in a2a.tables_per_rank for t in tables})

    def set_chunk_observer(self, observer: Callable[[str, torch.Tensor], None] | None) -> None:
        """Call ``observer(table, chunk)`` with every chunk this rank encodes in the forward exchange (``None``
        stops it). The calibration of ``DLACCallback`` measures the tables this way."""
        for a2a in self._exchanges:
            a2a.observer = observer

    def comm_stats(self, reset: bool = False) -> CommStats:
        """This rank's compression counters summed over every compressed exchange since the last reset, optionally
        resetting them (``DLACCallback`` resets them at every metrics write; :meth:`total_comm_stats` keeps all)."""
        current = CommStats()
        for a2a in self._exchanges:
            current.merge(a2a.stats)
            if reset:
                a2a.stats.reset()
        if reset:
            self._comm_stats_before_reset.merge(current)
        return current

    def total_comm_stats(self) -> CommStats:
        """This rank's compression counters since setup, whoever reset :meth:`comm_stats` in between."""
        total = CommStats()
        total.merge(self._comm_stats_before_reset)
        total.merge(self.comm_stats())
        return total

    @property
    def distributed_model(self) -> DistributedModelParallel | None:
        """TorchRec's ``DistributedModelParallel`` wrapping the LightningModule (``None`` before setup)."""
        return self._dmp

    @property
    def sharding_plan(self) -> Any:
        """TorchRec's ``ShardingPlan`` chosen at setup (``None`` before setup)."""
        return None if self._dmp is None else self._dmp.plan

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        assert self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        # Shard first, then move: the unsharded tables never have to fit on one device.
        self.model = self._shard(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._check_optimizers_skip_fused_parameters()
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        # DMP places the sharded tables itself; this moves the dense parameters (a no-op on CPU).
        self.model.to(self.root_device)

    def _shard(self, module: nn.Module) -> nn.Module:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
        from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
        from torchrec.distributed.planner.types import PlannerError
        from torchrec.distributed.types import ShardingEnv
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        from lightning_dlac.comm import install_compressed_all_to_all

        if self._dmp is not None and self._dmp.module is module:
            return self._dmp  # fit, then validate/test with the same Trainer: already sharded, same plan
        ebcs = [(n, m) for n, m in module.named_modules() if isinstance(m, EmbeddingBagCollection)]
        already_sharded = any(isinstance(m, ShardedEmbeddingBagCollection) for m in module.modules())
        if not ebcs and not already_sharded:
            raise TypeError(
                f"{type(self).__name__} found no torchrec EmbeddingBagCollection in {type(module).__name__}."
                " Build the embedding tables of your LightningModule with"
                " `torchrec.EmbeddingBagCollection(tables=[EmbeddingBagConfig(...)])` (see lightning_dlac.examples), or"
                " use Lightning's DDPStrategy for a model without embedding tables."
            )
        pg = dist.group.WORLD
        if pg is None:
            raise RuntimeError(f"{type(self).__name__}.setup() ran before the process group was initialized.")
        env = ShardingEnv.from_process_group(pg)
        device = self.root_device
        sharder = EmbeddingBagCollectionSharder(
            fused_params={
                "optimizer": self._embedding_optimizer.to_fbgemm(),
                "learning_rate": self._embedding_lr,
                "eps": self._embedding_eps,
            }
        )
        tables = [table for _, ebc in ebcs for table in ebc.embedding_bag_configs()]
        self._check_tables(tables, supported=sharder.sharding_types(device.type), device_type=device.type)
        topology = Topology(
            world_size=env.world_size,
            local_world_size=self.num_processes,
            compute_device=device.type,
            hbm_cap=self._memory_budget_bytes if device.type == "cuda" else None,
            ddr_cap=self._memory_budget_bytes if device.type != "cuda" else None,
        )
        planner = EmbeddingShardingPlanner(topology=topology, constraints=self._constraints(tables), debug=False)
        try:
            plan = planner.collective_plan(module, [sharder], pg)
        except PlannerError as err:
            raise ValueError(
                f"TorchRec's planner found no sharding of the {len(tables)} embedding tables on {env.world_size}"
                f" rank(s) with sharding_types={self._sharding_types} and memory_budget_bytes="
                f"{self._memory_budget_bytes}. Raise memory_budget_bytes, allow more sharding types (e.g."
                f" 'column_wise' or 'row_wise'), or shrink the tables. Planner said: {str(err).strip()[:2000]}"
            ) from err
        log.debug(f"{type(self).__name__}: sharding plan\n{plan}")
        self._dmp = DistributedModelParallel(
            module,
            env=env,
            device=device,
            plan=plan,
            sharders=[sharder],
            data_parallel_wrapper=DefaultDataParallelWrapper(**self._ddp_options),
        )
        if self._compress:
            self._exchanges = install_compressed_all_to_all(self._dmp, self._compression, self._error_bounds)
        if self.global_rank == 0:
            placement = _summarize_plan(plan)
            rank_zero_info(
                f"{type(self).__name__}: sharded {len(tables)} embedding tables over {env.world_size} rank(s):"
                f" {placement}"
            )
        return self._dmp

    def _check_tables(self, tables: list[Any], supported: list[str], device_type: str) -> None:
        names = {t.name for t in tables}
        unknown = sorted(set(self._table_constraints) - names)
        if unknown:
            raise ValueError(
                f"table_constraints names tables that the model does not have: {unknown}. Tables in the model:"
                f" {sorted(names)}."
            )
        splitting = sorted(_SPLITTING_SHARDING_TYPES & set(supported))
        for t in tables:
            allowed = self._allowed_sharding_types(t.name)
            if not set(allowed) & set(supported):
                raise ValueError(
                    f"Table {t.name!r} may only use sharding types {allowed}, none of which TorchRec supports on"
                    f" {device_type!r} devices (supported there: {supported}). Change sharding_types (or that table's"
                    " table_constraints)."
                )
            if self._memory_budget_bytes is None or set(allowed) & _SPLITTING_SHARDING_TYPES:
                continue
            # Weights plus the optimizer state, which Adagrad keeps per element and row-wise Adagrad per row.
            state = {
                EmbeddingOptimizer.SGD: 0,
                EmbeddingOptimizer.ADAGRAD: t.num_embeddings * t.embedding_dim * 4,
                EmbeddingOptimizer.ROWWISE_ADAGRAD: t.num_embeddings * 4,
            }[self._embedding_optimizer]
            need = t.num_embeddings * t.embedding_dim * 4 + state
            if need > self._memory_budget_bytes:
                raise ValueError(
                    f"Embedding table {t.name!r} ({t.num_embeddings} rows x {t.embedding_dim} dims, {need} bytes with"
                    f" {self._embedding_optimizer} state) does not fit in"
                    f" memory_budget_bytes={self._memory_budget_bytes}"
                    f" of one rank, and sharding types {allowed} keep a table whole. Raise memory_budget_bytes,"
                    f" or let it be split: table_constraints={{{t.name!r}: {{'sharding_types': [{splitting[0]!r}]}}}}"
                    f" (splitting types on {device_type!r}: {splitting})."
                )

    def _constraints(self, tables: list[Any]) -> dict[str, Any]:
        from torchrec.distributed.planner.types import ParameterConstraints

        constraints = {}
        for t in tables:
            options = dict(self._table_constraints.get(t.name, {}))
            options["sharding_types"] = self._allowed_sharding_types(t.name)
            constraints[t.name] = ParameterConstraints(**options)
        return constraints

    def _allowed_sharding_types(self, table: str) -> list[str]:
        """The sharding types the planner may use for ``table``: its own constraint, else the strategy-wide one."""
        return list(self._table_constraints.get(table, {}).get("sharding_types", self._sharding_types))

    @staticmethod
    def _validate_table_constraints(table_constraints: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
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
                options["sharding_types"] = _validate_sharding_types(
                    options["sharding_types"], f"table_constraints[{table!r}]['sharding_types']"
                )
            out[table] = options
        return out

    def _check_optimizers_skip_fused_parameters(self) -> None:
        """Embedding weights are updated by the fused optimizer inside backward; a second optimizer on them would
        silently fight it (weight decay, momentum on stale state), so refuse that early."""
        fused = {id(p) for p in _fused_parameters(self.lightning_module)}
        for opt in self.optimizers:
            for group in opt.param_groups:
                if any(id(p) in fused for p in group["params"]):
                    raise ValueError(
                        f"An optimizer from configure_optimizers() includes embedding-table parameters, which"
                        f" {type(self).__name__} already trains with its fused {self._embedding_optimizer} optimizer."
                        " Pass only the dense parameters: `torch.optim.Adam(lightning_dlac.dense_parameters(self))`."
                    )

    # ------------------------------------------------------------------ checkpoints

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        # Sharded tables exist only after setup; a checkpoint is loaded into them, shard by shard.
        return True

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any | None = None
    ) -> None:
        """Save a checkpoint directory: every rank writes its own table shards and fused-optimizer state with
        ``torch.distributed.checkpoint``; rank 0 adds everything else (dense weights, optimizer and loop state,
        callbacks) as ``meta.pt``. All ranks must call this (Lightning's ModelCheckpoint does)."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}.")
        import torch.distributed.checkpoint as dcp

        path = Path(filepath)
        if self.is_global_zero and path.is_file():
            path.unlink()  # a single-file checkpoint of the same name is replaced by the directory
        self.barrier("dlac_checkpoint_prepare")
        sharded = {"state_dict": checkpoint["state_dict"], _FUSED_OPTIMIZER_KEY: self._fused_optimizer_state()}
        dcp.save(sharded, checkpoint_id=str(path))
        if self.is_global_zero:
            meta = {k: v for k, v in checkpoint.items() if k != "state_dict"}
            torch.save(meta, path / _META_FILE)
        self.barrier("dlac_checkpoint_saved")

    @override
    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp

        path = Path(checkpoint_path)
        if not (path / _META_FILE).is_file():
            raise FileNotFoundError(
                f"{path} is not a {type(self).__name__} checkpoint directory (no {_META_FILE} inside). Resume from a"
                " checkpoint that DLACStrategy saved; single-file checkpoints cannot hold every rank's table shards."
            )
        # Load in place into this rank's shards (and their optimizer state), then into the modules.
        sharded = {
            "state_dict": self.lightning_module.state_dict(),
            _FUSED_OPTIMIZER_KEY: self._fused_optimizer_state(),
        }
        dcp.load(sharded, checkpoint_id=str(path))
        if self._dmp is not None:
            self._dmp.fused_optimizer.load_state_dict(sharded[_FUSED_OPTIMIZER_KEY])
        # meta.pt holds loop and callback state (plain Python objects) written by this strategy on rank 0.
        checkpoint = torch.load(path / _META_FILE, map_location="cpu", weights_only=bool(weights_only))
        checkpoint["state_dict"] = sharded["state_dict"]
        return checkpoint

    @override
    def remove_checkpoint(self, filepath: str | Path) -> None:
        if self.is_global_zero:
            path = Path(filepath)
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

    def _fused_optimizer_state(self) -> dict[str, Any]:
        return {} if self._dmp is None else self._dmp.fused_optimizer.state_dict()

    # ------------------------------------------------------------------ teardown

    @override
    def teardown(self) -> None:
        # DLACStrategy never wraps the LightningModule in a bare DDP, so DDPStrategy's static-graph hint (which
        # inspects self.model) does not apply; unwrap DMP ourselves. The module keeps its sharded tables.
        if self._dmp is not None and self.lightning_module is not None:
            self.model = self.lightning_module
        super().teardown()


def _fused_parameters(module: nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if hasattr(p, "_in_backward_optimizers")]


def dense_parameters(module: nn.Module) -> list[torch.nn.Parameter]:
    """The parameters of ``module`` that a regular optimizer should train.

    Under :class:`DLACStrategy` (``configure_optimizers`` runs after sharding) that is everything but the sharded
    embedding tables, which a fused optimizer trains inside the backward pass. Without sharding (a plain Trainer)
    it is every parameter, embedding tables included.
    """
    return [p for p in module.parameters() if not hasattr(p, "_in_backward_optimizers")]


def _summarize_plan(plan: Any) -> str:
    parts = []
    for module_plan in plan.plan.values():
        for table, spec in module_plan.items():
            ranks = sorted(spec.ranks) if spec.ranks else []
            parts.append(f"{table}->{spec.sharding_type}{ranks}")
    return ", ".join(parts) if len(parts) <= 8 else ", ".join(parts[:8]) + f", ... ({len(parts)} tables)"


DLACStrategy.register_strategies(StrategyRegistry)

__all__ = ["DLACStrategy", "EmbeddingOptimizer", "SHARDING_TYPES", "dense_parameters"]
