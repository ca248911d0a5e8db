"""DLACStrategy: TorchRec model parallelism for the embedding tables of a LightningModule, data parallelism for the
rest, registered as ``Trainer(strategy="dlac")``."""

from __future__ import annotations

import atexit
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import _destroy_dist_connection
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.overrides.distributed import prepare_for_backward
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.ddp import _DDPForwardRedirection
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_dlac.adaptive.bounds import ErrorBounds
from lightning_dlac.checks import parse_enum
from lightning_dlac.comm.config import CompressionOptions
from lightning_dlac.comm.stats import CommStats
from lightning_dlac.engine import elastic as _elastic
from lightning_dlac.engine._torchrec import require_torchrec
from lightning_dlac.engine.checkpoint import Checkpointer, CheckpointOptions, check_directory, remove_checkpoint
from lightning_dlac.engine.sharding import (
    EmbeddingOptimizer,
    NoEmbeddingTablesError,
    ShardingOptions,
    plan_summary,
    shard_model,
    table_count,
)
from lightning_dlac.plugin import _deprecated
from lightning_dlac.plugin._checks import (
    refuse_optimizers_on_fused_parameters,
    refuse_sync_batchnorm_on_cpu,
    refuse_unpipelinable_run,
)
from lightning_dlac.plugin._deprecated import flat_options
from lightning_dlac.plugin._liveness import complete_timeout, watch_step
from lightning_dlac.plugin._names import DESCRIPTION, STRATEGY_NAME

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.accelerators import Accelerator
    from torchrec.distributed.model_parallel import DistributedModelParallel

    from lightning_dlac.comm import ExchangeGroup
    from lightning_dlac.comm.group import Exchange
    from lightning_dlac.engine.pipeline import Pipeline, SparseDistPipeline


# The defaults of the config parameters: shared, never changed (the strategy copies the object it is given).
_DEFAULT_SHARDING = ShardingOptions()
_DEFAULT_COMPRESSION = CompressionOptions()
_DEFAULT_CHECKPOINTING = CheckpointOptions()
_CONFIG_TYPES = {"sharding": ShardingOptions, "compression": CompressionOptions, "checkpointing": CheckpointOptions}


def _check_config(owner: str, param: str, value: Any) -> None:
    """Refuse a config parameter that is not its config object, naming the class to use."""
    cls = _CONFIG_TYPES[param]
    if not isinstance(value, cls):
        raise TypeError(
            f"{owner}({param}=...) takes a lightning_dlac.{cls.__name__}, got {type(value).__name__}: write"
            f" {owner}({param}={cls.__name__}(...)), or in YAML give its fields under init_args.{param}."
        )


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

    def __call__(self, wrapper_module: nn.Module, original_module: pl.LightningModule, method_name: str, *args: Any,
                 **kwargs: Any) -> Any:
        # Every step's forward (training, validation, test, predict) passes here: its collectives are watched.
        with watch_step(original_module._trainer, "forward"):
            return super().__call__(wrapper_module, original_module, method_name, *args, **kwargs)


class DLACStrategy(DDPStrategy):
    """A Lightning strategy for TorchRec models: sharded embedding tables, the rest data-parallel, compressed exchanges.

    It shards every TorchRec ``EmbeddingBagCollection`` and ``EmbeddingCollection`` of the LightningModule across the
    ranks, trains the rest data-parallel and compresses the pooled- and sequence-embedding all-to-alls.

    After the process group exists, the strategy shards the module with
    :func:`~lightning_dlac.engine.sharding.shard_model`
    (TorchRec's planner, table-wise by default, inside ``DistributedModelParallel``, which keeps the dense
    parameters in a DDP and trains the tables with a fused FBGEMM optimizer in the backward pass) and installs the
    compressed all-to-all (:func:`~lightning_dlac.comm.install_compressed_all_to_all`). ``training_step`` and
    ``configure_optimizers`` stay ordinary Lightning code; ``configure_optimizers`` should cover the dense parameters
    only (see :func:`dense_parameters`). The backend is gloo on CPU and NCCL on GPU unless ``process_group_backend``
    says otherwise. ``Trainer(sync_batchnorm=True)`` turns the dense part's BatchNorm layers into ``SyncBatchNorm``
    as under DDP (GPUs only: torch's SyncBatchNorm does not run on CPU processes, so there it is refused at setup).

    Why ``DDPStrategy`` as the base: the dense parameters *are* trained by a DDP (the one inside DMP), so its
    launcher, process-group set-up, collectives and error hints all apply unchanged. The hooks that act on a DDP
    found at ``self.model`` (the forward redirection, the backward preparation of manual optimization, the
    first-iteration static-graph flush) are pointed at the DDP inside DMP. DDPStrategy's own wrapping, communication
    hooks and model averaging are not offered: the constructor does not take them, so none is silently ignored.

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
        sharding: How the embedding tables are sharded and trained (planner choices, per-table constraints, the
            fused embedding optimizer, the memory budget, the dense part's DDP):
            :class:`~lightning_dlac.engine.sharding.ShardingOptions`.
        compression: Whether and how the embedding all-to-alls are compressed (the starting bound ``eps``, the
            gradient exchange, the codec, the uncompressed fallback, per-peer compression, pieces):
            :class:`~lightning_dlac.comm.config.CompressionOptions`.
        checkpointing: How checkpoints are verified: :class:`~lightning_dlac.engine.checkpoint.CheckpointOptions`.
        pipeline: Train through a TorchRec train pipeline: ``"sparse_dist"`` (``TrainPipelineSparseDist``: each
            batch's ids are sent to the ranks that own their tables during the step before, off the critical path;
            same results; the model's forward must be traceable, see docs/strategy.md). ``None``: one batch at a
            time, as Lightning calls ``training_step``.
        **deprecated: The flat options of lightning-dlac 0.1 (``eps=``, ``embedding_lr=``, ``compress=``, ...),
            each now a field of one of the three config objects (docs/api.md has the table). They keep working for
            one release, with a deprecation warning that names the new spelling; a setting given both ways is
            refused.

    Raises:
        ValueError: A setting out of range, or given both as a flat option and in its config object.
        TypeError: A config parameter of another type, or an unknown keyword.
    """

    strategy_name = STRATEGY_NAME

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
        sharding: ShardingOptions = _DEFAULT_SHARDING,
        compression: CompressionOptions = _DEFAULT_COMPRESSION,
        checkpointing: CheckpointOptions = _DEFAULT_CHECKPOINTING,
        pipeline: str | None = None,
        **deprecated: Any,
    ) -> None:
        require_torchrec()
        name = type(self).__name__
        _deprecated.check_names(name, deprecated)
        configs = {"sharding": sharding, "compression": compression, "checkpointing": checkpointing}
        for param, value in configs.items():
            _check_config(name, param, value)
        if isinstance(timeout, (int, float)):
            if timeout <= 0:
                raise ValueError(f"timeout={timeout} must be a positive number of seconds.")
            timeout = timedelta(seconds=timeout)
        # Each config object is copied (and validated again): the defaults above are shared, and a caller's object
        # changed after this call must not change the strategy.
        configs = {param: replace(value) for param, value in configs.items()}
        given = flat_options(**deprecated)
        configs, message = _deprecated.regroup(name, given, configs)
        if message is not None:
            _deprecated.warn(message)
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method)
        self._forward_redirection = _DMPForwardRedirection()
        self._sharding: ShardingOptions = configs["sharding"]
        self._compression: CompressionOptions = configs["compression"]
        self._checkpointing: CheckpointOptions = configs["checkpointing"]
        self._error_bounds = ErrorBounds(default_eps=self._compression.eps)
        self._group: ExchangeGroup | None = None
        self._dmp: DistributedModelParallel | None = None
        self._static_graph_flushed = False
        self._pipeline_kind = _parse_pipeline(pipeline)
        self._pipeline: SparseDistPipeline | None = None
        self._checkpoints = Checkpointer(verify=self._checkpointing.verify, owner=name)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        # "dlac" only, not DDPStrategy's names; left alone where lightning_dlac's import registered it already
        if cls.strategy_name not in strategy_registry:
            strategy_registry.register(cls.strategy_name, cls, description=DESCRIPTION)

    # ------------------------------------------------------------------ read-outs

    @property
    def sharding(self) -> ShardingOptions:
        """Sharding and embedding-optimizer options."""
        return self._sharding

    @property
    def compress(self) -> bool:
        """Whether the pooled-embedding all-to-all is compressed (``compression.enabled``; also with the fallback)."""
        return self._compression.enabled

    @property
    def compression(self) -> CompressionOptions:
        """Compression settings of the all-to-all."""
        return self._compression

    @property
    def checkpointing(self) -> CheckpointOptions:
        """How checkpoints are verified."""
        return self._checkpointing

    @property
    def error_bounds(self) -> ErrorBounds:
        """The per-table bounds the compressed all-to-all reads at every call; the policy writes them."""
        return self._error_bounds

    @property
    def exchange_group(self) -> ExchangeGroup | None:
        """The installed compressed exchanges (``None`` before setup or with ``compression.enabled=False``)."""
        return self._group

    @property
    def exchanges(self) -> list[Exchange]:
        """The installed compressed all-to-all modules (empty before setup or with ``compression.enabled=False``)."""
        return list(self._group or [])

    @property
    def all_compressed_tables(self) -> list[str]:
        """Every table whose pooled embeddings some rank sends compressed; the same sorted list on every rank."""
        return self._group.all_compressed_tables if self._group else []

    @property
    def compressed_tables(self) -> list[str]:
        """Deprecated: ``strategy.exchange_group.compressed_tables`` (this rank's compressed tables)."""
        _deprecated.moved(f"{type(self).__name__}.compressed_tables", "strategy.exchange_group.compressed_tables",
                          " (exchange_group is None before setup and with compression disabled, where this read [])")
        return self._group.compressed_tables if self._group else []

    @property
    def sharding_types(self) -> list[str]:
        """Deprecated: ``strategy.sharding.sharding_types``."""
        _deprecated.moved(f"{type(self).__name__}.sharding_types", "strategy.sharding.sharding_types")
        return list(self._sharding.sharding_types)

    @property
    def embedding_optimizer(self) -> EmbeddingOptimizer:
        """Deprecated: ``strategy.sharding.embedding_optimizer``."""
        _deprecated.moved(f"{type(self).__name__}.embedding_optimizer", "strategy.sharding.embedding_optimizer")
        return self._sharding.embedding_optimizer

    def total_comm_stats(self) -> CommStats:
        """This rank's compression counters since setup.

        Returns:
            A snapshot (the counters only grow: subtract two for an interval); zeros before setup and with
            compression off.
        """
        return self._group.stats() if self._group else CommStats()

    @property
    def distributed_model(self) -> DistributedModelParallel | None:
        """TorchRec's ``DistributedModelParallel`` wrapping the LightningModule (``None`` before setup)."""
        return self._dmp

    @property
    def sharding_plan(self) -> Any:
        """TorchRec's ``ShardingPlan`` chosen at setup (``None`` before setup)."""
        return None if self._dmp is None else self._dmp.plan

    @property
    def pipeline(self) -> Pipeline | None:
        """The train pipeline option (``None``: unpipelined)."""
        return self._pipeline_kind

    @property
    def train_pipeline(self) -> SparseDistPipeline | None:
        """The pipeline training runs through (``None`` unpipelined, and outside ``fit``)."""
        return self._pipeline

    # ------------------------------------------------------------------ process group

    @override
    def setup_distributed(self) -> None:
        """Lightning's process-group set-up, with one change under torchrun's restarts (``--max-restarts``).

        A restarted group on one node keeps its rendezvous keys apart from the previous attempt's, which torchrun
        leaves in the store the attempts share (:mod:`lightning_dlac.engine.elastic`; without it a restart can die in
        ``Gloo connectFullMesh ... Connection refused``). On several nodes it warns where that remains possible.
        """
        self.set_world_ranks()
        backend, device = self._get_process_group_backend(), self.root_device
        if _elastic.init_restarted_process_group(backend, self.global_rank, self.world_size, self._timeout,
                                                 device if device.type != "cpu" else None):
            if backend == "nccl":
                atexit.register(_destroy_dist_connection)  # as Lightning's own set-up does
            rank_zero_info(f"{type(self).__name__}: torchrun restart {_elastic.attempt()}, process group on"
                           f" {self.world_size} ranks under a fresh rendezvous prefix")  # fmt: skip
        super().setup_distributed()  # seeds, ranks, backend; the process group now exists, so it is kept
        warning = _elastic.shared_store_warning()
        if warning is not None:
            rank_zero_warn(warning)

    # ------------------------------------------------------------------ setup and the DDP inside DMP

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        pipelined = trainer.state.fn == TrainerFn.FITTING and self._pipeline_kind is not None
        if pipelined:
            refuse_unpipelinable_run(type(self).__name__, str(self._pipeline_kind), trainer, self.lightning_module,
                                     self.precision_plugin)
        self.accelerator.setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING and self._layer_sync:
            # Trainer(sync_batchnorm=True): the dense part's BatchNorm layers become SyncBatchNorm, as under DDP
            # (reverted at teardown by DDPStrategy's); the embedding tables have none.
            refuse_sync_batchnorm_on_cpu(self.model, self.root_device, self.world_size)
            self.model = self._layer_sync.apply(self.model)
        self.precision_plugin.convert_module(self.model)
        self.model = self._shard(self.model)  # shard first, then move: whole tables never have to fit on a device
        self.model_to_device()
        if pipelined:
            self._setup_pipeline()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            refuse_optimizers_on_fused_parameters(self.optimizers, self.lightning_module, type(self).__name__,
                                                  str(self._sharding.embedding_optimizer))
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _shard(self, module: nn.Module) -> nn.Module:
        from lightning_dlac.codec._loader import resolve_impl
        from lightning_dlac.comm import install_compressed_all_to_all

        if self._dmp is not None and self._dmp.module is module:
            return self._dmp  # fit, then validate/test with the same Trainer: already sharded, same plan
        if dist.group.WORLD is None:
            raise RuntimeError(f"{type(self).__name__}.setup() ran before the process group was initialized.")
        try:
            self._dmp = shard_model(module, self._sharding, self.root_device, local_world_size=self.num_processes)
        except NoEmbeddingTablesError as err:
            raise NoEmbeddingTablesError(f"{type(self).__name__} {err}") from None
        if self._compression.enabled:
            self._group = install_compressed_all_to_all(self._dmp, self._compression, self._error_bounds,
                                                        node=self.node_rank)
            # Build (or load) the native codec now: a first run's JIT build belongs to set-up, not to the first
            # step's encode time in the report; "native" that cannot build fails here, before any step.
            resolve_impl(self._compression.impl)
        plan = self._dmp.plan
        rank_zero_info(f"{type(self).__name__}: sharded {table_count(plan)} embedding tables over"
                       f" {self.world_size} rank(s): {plan_summary(plan)}")
        return self._dmp

    @override
    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        ddp = _dense_ddp(self._dmp)
        if ddp is not None and not self.lightning_module.automatic_optimization:
            prepare_for_backward(ddp, closure_loss)

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        # DDP's first-iteration static-graph flush, which manual optimization must trigger itself.
        ddp = _dense_ddp(self._dmp)
        if ddp is None or self.lightning_module.automatic_optimization or self._static_graph_flushed:
            return
        if getattr(ddp, "static_graph", False):
            ddp.reducer._delay_all_reduce()
            self._static_graph_flushed = True

    @override
    def teardown(self) -> None:
        if self._pipeline is not None:
            self._pipeline.restore()  # the module's sharded modules get their own forwards back
            self._pipeline = None
        if self._dmp is not None and self.lightning_module is not None:
            self.model = self.lightning_module  # unwrap DMP; the module keeps its sharded tables
        super().teardown()

    # ------------------------------------------------------------------ the train pipeline (pipeline="sparse_dist")

    def _setup_pipeline(self) -> None:
        """Trace the sharded model into TorchRec's pipeline (a model it cannot trace is refused here); the pipeline
        moves each training batch with Lightning's own move (the module's transfer hooks), once per batch."""
        from lightning_dlac.engine.pipeline import SparseDistPipeline

        self._pipeline = SparseDistPipeline(self._dmp, self.root_device, super().batch_to_device)
        rank_zero_info(f"{type(self).__name__}: training through TorchRec's sparse-dist pipeline; ids sent one step"
                       f" ahead for {', '.join(self._pipeline.pipelined_modules)}")

    @override
    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)
        if self._pipeline is not None and self.lightning_module.trainer.training:
            return self._pipeline.loader(dataloader)  # read one batch ahead: the next batch's ids travel this step
        return dataloader

    @override
    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        moved = self._pipeline.to_device(batch) if self._pipeline is not None else None
        return moved if moved is not None else super().batch_to_device(batch, device, dataloader_idx)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._pipeline is None:
            return super().training_step(*args, **kwargs)
        batch = args[0] if args else kwargs.get("batch")
        last = self.lightning_module.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        with self._pipeline.step(batch, last=last):
            return super().training_step(*args, **kwargs)

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        with watch_step(self.lightning_module.trainer, "backward"):  # the forward's watch: _DMPForwardRedirection
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        if self._pipeline is not None:
            self._pipeline.drain()  # the ids read ahead for a step that will not come

    # ------------------------------------------------------------------ checkpoints

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # sharded tables exist only after setup; a checkpoint is loaded into them, shard by shard

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any | None = None
                        ) -> None:  # fmt: skip
        """Save a checkpoint directory (:class:`lightning_dlac.engine.checkpoint.Checkpointer`).

        Every rank writes its own table shards and fused-optimizer state and reports them, rank 0 the rest (with
        every rank's random state), checks that every file is there, and commits. All ranks must call this
        (ModelCheckpoint does).

        Args:
            checkpoint: Lightning's checkpoint dict.
            filepath: The checkpoint directory to write.
            storage_options: Not supported; must be ``None``.

        Raises:
            TypeError: If ``storage_options`` is given.
            IncompleteCheckpointError: If rank 0 did not find every file complete (raised on every rank; nothing
                committed).
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}.")
        self._checkpoints.save(checkpoint, filepath, self._dmp, self.is_global_zero, self.barrier)

    @override
    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a checkpoint directory into this rank's shards and restore this rank's random state.

        See :class:`lightning_dlac.engine.checkpoint.Checkpointer`.

        Args:
            checkpoint_path: The checkpoint directory.
            weights_only: ``None`` (Lightning's default) or ``True`` loads safely: plain data and tensors only;
                ``False`` also loads other objects from a checkpoint you trust.

        Returns:
            The checkpoint, its ``"state_dict"`` holding this rank's shards.

        Raises:
            FileNotFoundError: If the checkpoint directory is incomplete or not one this strategy wrote.
            ValueError: If the checkpoint is damaged.
            RuntimeError: If it was written for other tables.
        """
        check_directory(checkpoint_path, type(self).__name__)  # before asking the module for its state
        return self._checkpoints.load(checkpoint_path, self.lightning_module.state_dict(), self._dmp,
                                      weights_only=weights_only is not False)  # fmt: skip

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._checkpoints.on_train_start(resumed_mid_epoch=_resumed_mid_epoch(self.lightning_module.trainer))

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Complete a :class:`~lightning_dlac.comm.liveness.PeerTimeoutError` with the step it stopped at and where
        the run can resume from (the message then names both).

        Args:
            exception: What ended the run.
        """
        super().on_exception(exception)
        complete_timeout(exception, self.lightning_module)

    @override
    def remove_checkpoint(self, filepath: str | Path) -> None:
        """Remove a checkpoint (rank 0): its name disappears at once, so no part of it is ever loaded."""
        if self.is_global_zero:
            remove_checkpoint(filepath)


def _dense_ddp(dmp: nn.Module | None) -> DistributedDataParallel | None:
    """The DDP that DMP keeps the dense parameters in, ``None`` before sharding."""
    inner = getattr(dmp, "_dmp_wrapped_module", None)
    return inner if isinstance(inner, DistributedDataParallel) else None


def _parse_pipeline(pipeline: str | None) -> Pipeline | None:
    """The ``pipeline`` option as a :class:`~lightning_dlac.engine.pipeline.Pipeline` (validated), ``None`` for none.
    A function of the option alone, so it lives beside the class, not in it."""
    if pipeline is None:
        return None
    from lightning_dlac.engine.pipeline import Pipeline

    return parse_enum(Pipeline, pipeline, "pipeline")


def _resumed_mid_epoch(trainer: pl.Trainer) -> bool:
    """Whether this fit resumed in the middle of an epoch: Lightning then made the training loader's iterator again
    (which draws from torch's generator) where the interrupted run had made it before the checkpoint. From the last
    batch of an epoch it resumes into the next epoch, whose iterator the interrupted run made after the checkpoint."""
    loop = trainer.fit_loop
    return loop.restarted_mid_epoch and not loop.epoch_loop.batch_progress.is_last_batch


__all__ = ["DLACStrategy"]
