"""Every option of DLACStrategy (its own and the fields of its config objects ShardingOptions, CompressionOptions and
CheckpointOptions) and of DLACCallback (docs/configuration.md, whose "tested by" column names the test of each)
changes what a run does: each test compares a run with the option set against a control run that differs in
that option alone, and fails if the option were ignored.

- Options that act inside a distributed fit run as *arms*: short fits of the small DLRM on 2 gloo ranks, every arm
  in one launch (process start-up dominates the cost), every arm's options written out in full (``STRATEGY`` and
  ``CALLBACK`` plus the one option it changes; a later change of a default cannot change the comparison). A
  strategy option is named by its path, ``"compression.eps"`` for ``compression=CompressionOptions(eps=...)``. Each arm
  records what a fit shows from outside: the sharding plan, the fused optimizer's state and first update, the DDP
  wrapper, the exchange counters per batch, the gradients that reached the exchange's input, the pooled embeddings
  against an unsharded twin, which codec implementation ran, the bounds in force at every batch, what the loggers
  and the progress bar received, the files written.
- Calibration options (classes, thresholds, index, candidates, sensitivity, when calibration runs) are decided by
  the callback's :class:`~lightning_dlac.adaptive.Calibrator` from the chunks it observes: those run in process,
  through ``DLACCallback(...).calibrator``, on hand-made chunks whose homogenization index is known.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_dlac.testing import run_ranks
from tests.conftest import TABLES, bounds_recorder, load_global_weights, memory_logger, small_data, small_dlrm, trainer

# Every option of the control runs, written out, by its path: "sharding.<field>" is a field of
# sharding=ShardingOptions(...), and so on. compression.fallback_check_every is set where it does not act (no
# auto_fallback) so that the auto_fallback arm is also the control of the fallback_check_every arm.
STRATEGY: dict[str, Any] = {
    "process_group_backend": "gloo", "timeout": 120.0, "start_method": "popen", "pipeline": None,
    "sharding.sharding_types": ["table_wise"], "sharding.table_constraints": {},
    "sharding.embedding_optimizer": "adagrad", "sharding.embedding_lr": 0.05, "sharding.adagrad_epsilon": 1e-8,
    "sharding.memory_budget_bytes": None, "sharding.find_unused_parameters": False, "sharding.static_graph": False,
    "sharding.bucket_cap_mb": 25, "sharding.qcomm_codecs_registry": None,
    "compression.enabled": True, "compression.auto_fallback": False, "compression.eps": 0.01,
    "compression.backward": "bf16", "compression.backward_eps": 0.01, "compression.impl": "auto",
    "compression.error_every": 10, "compression.fallback_check_every": 4, "compression.overlap": False,
    "compression.compress_peers": "auto", "compression.pieces": 1,
    "checkpointing.verify": True,
}  # fmt: skip
CONFIG_PARAMETERS = ("sharding", "compression", "checkpointing")


def strategy(**changes: Any) -> Any:
    """A DLACStrategy with the control's options (``STRATEGY``) but ``changes``, given by path as keywords
    (``strategy(**{"compression.eps": 0.05})``). ``sharding.qcomm_codecs_registry="fp16"`` stands for TorchRec's
    qcomm codecs sending FP16 both ways (live objects, made here)."""
    from lightning_dlac import CheckpointOptions, CompressionOptions, DLACStrategy, ShardingOptions

    options = {**STRATEGY, **changes}
    if options["sharding.qcomm_codecs_registry"] == "fp16":
        from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

        options["sharding.qcomm_codecs_registry"] = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.FP16), device=torch.device("cpu"))
    classes = {"sharding": ShardingOptions, "compression": CompressionOptions, "checkpointing": CheckpointOptions}
    configs = {group: cls(**{k.split(".", 1)[1]: v for k, v in options.items() if k.startswith(group + ".")})
               for group, cls in classes.items()}  # fmt: skip
    return DLACStrategy(**{k: v for k, v in options.items() if "." not in k}, **configs)


CALLBACK: dict[str, Any] = dict(
    mode="homogenization", tight_eps=0.01, base_eps=0.03, loose_eps=0.05, tight_below=0.9, loose_from=0.99,
    index_eps=0.03, index="vector", candidates=[0.01, 0.03, 0.05], sensitivity_tolerance=1e-3, gradient_tolerance=0.1,
    calibration_batches=2,
    calibration_start=0, sensitivity_batches=0, recalibrate_every=0, calibration_dataloader=None, schedule="step",
    c=2.0, T=4, stages=2, log_every_n_steps=2, per_table_metrics=True, prog_bar=True, report=False,
)  # fmt: skip
STEPS = 8  # training batches of every arm (one forward exchange each; no validation)

# The strategy arms: name -> the options that differ from STRATEGY, by path (and the name of their control arm).
def from_rank_0_only(src: int, dst: int) -> bool:
    """A ``compress_peers`` policy (named by its import path, as in YAML): rank 0 compresses, the others do not."""
    return src == 0


STRATEGY_ARMS: dict[str, tuple[dict[str, Any], str]] = {
    "control": ({}, "control"),
    "sharding_types": ({"sharding.sharding_types": ["column_wise"]}, "control"),
    "table_constraints": ({"sharding.table_constraints": {"t_cat_0": {"sharding_types": ["data_parallel"]}}},
                          "control"),
    "optimizer_sgd": ({"sharding.embedding_optimizer": "sgd"}, "control"),
    "optimizer_rowwise": ({"sharding.embedding_optimizer": "rowwise_adagrad"}, "control"),
    "embedding_lr": ({"sharding.embedding_lr": 0.005}, "control"),
    "adagrad_epsilon": ({"sharding.adagrad_epsilon": 10.0}, "control"),
    "memory_budget_bytes": ({"sharding.memory_budget_bytes": 30_000}, "control"),
    "compress_false": ({"compression.enabled": False}, "control"),
    "qcomm": ({"compression.enabled": False, "sharding.qcomm_codecs_registry": "fp16"}, "compress_false"),
    "compress_auto": ({"compression.auto_fallback": True}, "control"),
    "fallback_check_every": ({"compression.auto_fallback": True, "compression.fallback_check_every": 2},
                             "compress_auto"),
    "eps": ({"compression.eps": 0.05}, "control"),
    "backward_fp32": ({"compression.backward": "fp32"}, "control"),
    "backward_fp16": ({"compression.backward": "fp16"}, "control"),
    "backward_dlac": ({"compression.backward": "dlac"}, "control"),
    "backward_eps": ({"compression.backward": "dlac", "compression.backward_eps": 0.05}, "backward_dlac"),
    "pieces": ({"compression.backward": "dlac", "compression.pieces": 2}, "backward_dlac"),
    "codec_impl": ({"compression.impl": "ref"}, "control"),
    "error_every_0": ({"compression.error_every": 0}, "control"),
    "error_every_1": ({"compression.error_every": 1}, "control"),
    "overlap": ({"compression.overlap": True}, "control"),
    "compress_peers": ({"compression.compress_peers": "tests.plugin.test_options.from_rank_0_only"}, "control"),
    "find_unused_parameters": ({"sharding.find_unused_parameters": True}, "control"),
    "static_graph": ({"sharding.static_graph": True}, "control"),
    "bucket_cap_mb": ({"sharding.bucket_cap_mb": 1}, "control"),
}
# Arms that also compare their pooled embeddings with an unsharded twin, or record the gradients they received.
TWIN_ARMS = {"control", "eps", "compress_false", "qcomm"}
GRADIENT_ARMS = {"control", "backward_fp32", "backward_fp16", "backward_dlac", "backward_eps"}

# The callback arms (STRATEGY, CALLBACK and the options that differ from CALLBACK; "loader" stands for a DataLoader
# of other synthetic batches, built in the rank).
CALLBACK_ARMS: dict[str, dict[str, Any]] = {
    "control": {},
    "calibration_dataloader": {"calibration_dataloader": "loader"},
    "schedule": {"schedule": "linear"},
    "c": {"c": 3.0},
    "T": {"T": 6},
    "stages": {"stages": 4},
    "log_every_n_steps": {"log_every_n_steps": 3},
    "per_table_metrics": {"per_table_metrics": False},
    "prog_bar": {"prog_bar": False},
    "report": {"report": True},
}

FIXTURE_BUDGET_S = 900  # every arm, on a loaded 2-core machine; the tests that use the fixture get it plus margin
pytestmark = pytest.mark.timeout(FIXTURE_BUDGET_S + 120)


# ---------------------------------------------------------------------------------------------- what a fit records


def _fused_state_shapes(strategy: Any) -> list[list[int]]:
    """Shapes of the fused embedding optimizer's state: none for SGD, [rows, dim] for Adagrad, [rows] row-wise."""
    state = strategy.distributed_model.fused_optimizer.state_dict()["state"]
    return sorted({tuple(v.shape) for per_table in state.values() for v in per_table.values() if hasattr(v, "shape")})


def _ddp_options(strategy: Any) -> list[tuple[bool, bool, int]]:
    """(find_unused_parameters, static_graph, bucket bytes) of the DDP that TorchRec wraps the dense part in."""
    from torch.nn.parallel import DistributedDataParallel

    return [(m.find_unused_parameters, m.static_graph, m.bucket_bytes_cap)
            for m in strategy.distributed_model.modules() if isinstance(m, DistributedDataParallel)]


def _plan(strategy: Any) -> dict[str, str]:
    """Sharding type of every table in the plan the strategy used."""
    plan = strategy.sharding_plan.plan
    return {table: str(spec.sharding_type) for module_plan in plan.values() for table, spec in module_plan.items()}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _observer(gradients: bool, expected_bytes: bool) -> Any:
    """A callback recording, per training batch, the exchange counters, and optionally the gradient each exchange
    delivered to its input (first batch) and the bytes the test itself computes the exchange must send."""
    import lightning.pytorch as pl
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from lightning_dlac.codec import encode_grid

    class Observer(pl.Callback):
        def __init__(self) -> None:
            self.uncompressed: list[int] = []  # cumulative uncompressed calls after each batch
            self.calls: list[int] = []
            self.first_update = 0.0
            self.gradients: list[dict[str, Any]] = []
            self.expected = {"raw": 0, "sent": 0}
            self._before: dict[str, torch.Tensor] = {}
            self._hooks: list[Any] = []
            self._bounds: Any = None

        def _shards(self, pl_module: Any) -> dict[str, torch.Tensor]:
            out = {}
            for key, value in pl_module.embedding_bag_collection.state_dict().items():
                if isinstance(value, ShardedTensor):
                    for i, shard in enumerate(value.local_shards()):
                        out[f"{key}/{i}"] = shard.tensor.detach().clone()
            return out

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._bounds = trainer.strategy.error_bounds
            for a2a in trainer.strategy.exchanges:
                self._hooks.append(a2a.register_forward_pre_hook(self._on_exchange))

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            for hook in self._hooks:
                hook.remove()

        def _on_exchange(self, a2a: Any, args: tuple) -> None:
            x, batch_size_per_rank = args[0], (args[1] if len(args) > 1 else None)
            world, me = torch.distributed.get_world_size(), torch.distributed.get_rank()
            splits = list(batch_size_per_rank or [x.size(0) // world] * world)
            rows = [0, *torch.tensor(splits).cumsum(0).tolist()]
            if gradients and not self.gradients and x.requires_grad:
                x.register_hook(lambda g: self.gradients.append(_received(g, rows, me, world)))
            if expected_bytes and x.size(1):
                # What the exchange must send: this rank's chunk of every local table for every other rank, encoded
                # at the bound in force now, plus one int64 size per (other rank, local table).
                bounds = self._bounds
                tables = a2a.local_tables
                eps = torch.tensor([bounds.effective(t) for t in tables], dtype=torch.float32)
                cols = [0, *torch.tensor([x.size(1) // len(tables)] * len(tables)).cumsum(0).tolist()]
                assert cols[-1] == x.size(1), "the small DLRM's tables all have one width"
                _, sizes = encode_grid(x.detach(), rows, cols, eps=eps)
                sizes = sizes.view(world, len(tables))
                others = [r for r in range(world) if r != me]
                self.expected["sent"] += int(sizes[others].sum()) + (world - 1) * len(tables) * 8
                self.expected["raw"] += (rows[-1] - splits[me]) * x.size(1) * 4

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == 0:
                self._before = self._shards(pl_module)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            stats = trainer.strategy.total_comm_stats()
            self.uncompressed.append(stats.uncompressed_calls)
            self.calls.append(stats.calls)
            if batch_idx == 0:
                after = self._shards(pl_module)
                self.first_update = max(float((after[k] - v).abs().max()) for k, v in self._before.items() if v.numel())

    return Observer()


def _received(grad: torch.Tensor, rows: list[int], me: int, world: int) -> dict[str, Any]:
    """What a gradient exchange delivered for the rows of the other ranks' batches (the gradient of this rank's
    pooled embeddings, divided by the world size as TorchRec does): whether every value is exactly a bf16 / fp16
    number, and the most distinct values in one column of one source rank's block (a DLAC chunk at bound eps has at
    most about 1 / (2 eps) + 1 quantization levels)."""
    blocks = [grad[rows[r] : rows[r + 1]] * world for r in range(world) if r != me]
    values = torch.cat(blocks) if blocks else grad[:0]
    levels = max((int(torch.unique(b[:, c]).numel()) for b in blocks for c in range(b.size(1))), default=0)
    return {"bf16": bool(torch.equal(values, values.bfloat16().float())),
            "fp16": bool(torch.equal(values, values.half().float())),
            "levels": levels, "numel": values.numel()}


def _twin_error(model: Any, reference: Any, rank: int) -> float:
    """The largest |sharded - unsharded| / (key's value range) over the pooled embeddings of two validation batches,
    the sharded collection holding the unsharded twin's weights (the relative error the exchange let through)."""
    load_global_weights(model, reference.state_dict())
    data = small_data(seed=11 + rank)
    data.setup("validate")
    worst = 0.0
    with torch.no_grad():
        for batch in list(data.val_dataloader())[:2]:
            sharded = model.embedding_bag_collection(batch.sparse_features).to_dict()
            unsharded = reference.embedding_bag_collection(batch.sparse_features).to_dict()
            for key, exact in unsharded.items():
                span = float(exact.max() - exact.min())
                if span > 0:
                    worst = max(worst, float((sharded[key] - exact).abs().max()) / span)
    return worst


def _read_outs(strategy: Any) -> dict[str, Any]:
    """The read-outs removed without deprecation in 3963681 and restored as deprecated properties, each beside its
    replacement, and the deprecation warnings reading them gave (rank 0 only: Lightning's rank_zero_deprecation)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = {"compressed_tables": strategy.compressed_tables, "sharding_types": strategy.sharding_types,
               "embedding_optimizer": strategy.embedding_optimizer}
    group = strategy.exchange_group
    new = {"compressed_tables": group.compressed_tables if group is not None else None,
           "sharding_types": list(strategy.sharding.sharding_types),
           "embedding_optimizer": strategy.sharding.embedding_optimizer}
    return {"old": old, "new": new, "types": {k: type(v).__name__ for k, v in old.items()},
            "warnings": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]}


def _strategy_arm(world_size: int, name: str) -> dict[str, Any]:
    from lightning_dlac.codec import impl_calls

    overrides, _ = STRATEGY_ARMS[name]
    torch.manual_seed(0)
    model = small_dlrm()
    reference = copy.deepcopy(model) if name in TWIN_ARMS else None
    observer = _observer(gradients=name in GRADIENT_ARMS, expected_bytes=False)
    handler = _Records()
    logging.getLogger("lightning_dlac").addHandler(handler)
    before = impl_calls()
    try:
        t = trainer(world_size, strategy(**overrides), max_steps=STEPS, callbacks=[observer],
                    limit_val_batches=0)
        t.fit(model, datamodule=small_data(train_batches=STEPS))
    except ValueError as err:
        if name != "memory_budget_bytes":
            raise
        return {"error": str(err)}  # refused at start-up, the same on every rank, before any collective
    finally:
        logging.getLogger("lightning_dlac").removeHandler(handler)
    after = impl_calls()
    stats = t.strategy.total_comm_stats()
    return {
        "error": None,
        "read_outs": _read_outs(t.strategy),
        "plan": _plan(t.strategy),
        "state_shapes": _fused_state_shapes(t.strategy),
        "first_update": observer.first_update,
        "ddp": _ddp_options(t.strategy),
        "exchanges": len(t.strategy.exchanges),
        "overlapped": [a2a.overlapped for a2a in t.strategy.exchanges],
        "pieces": [len(a2a._pieces()) for a2a in t.strategy.exchanges],
        "compress_to": [a2a.layout.compress_to for a2a in t.strategy.exchanges],
        "calls": observer.calls,
        "uncompressed": observer.uncompressed,
        "stats": {"raw": stats.raw_bytes, "sent": stats.sent_bytes, "backward_raw": stats.backward_raw_bytes,
                  "backward_sent": stats.backward_sent_bytes, "backward_calls": stats.backward_calls,
                  "passed": stats.passed_bytes,
                  "max_error_ratio": dict(stats.table_max_error_ratio)},
        "codec": {impl: {op: after[impl][op] - before[impl][op] for op in ops} for impl, ops in after.items()},
        "gradients": observer.gradients,
        "twin_error": None if reference is None else _twin_error(model, reference, torch.distributed.get_rank()),
        "messages": handler.messages,
    }


def _callback_arm(world_size: int, name: str, workdir: Path) -> dict[str, Any]:
    from lightning.pytorch.loggers import CSVLogger

    from lightning_dlac import DLACCallback

    options = {**CALLBACK, **CALLBACK_ARMS[name]}
    if options["calibration_dataloader"] == "loader":
        other = small_data(seed=7, train_batches=4)
        other.setup("fit")
        options["calibration_dataloader"] = other.train_dataloader()
    torch.manual_seed(0)
    dlac = DLACCallback(**options)
    recorder, memory = bounds_recorder(dlac), memory_logger()
    observer = _observer(gradients=False, expected_bytes=name == "report")
    csv = CSVLogger(str(workdir / name), name="run", version=0)
    t = trainer(world_size, strategy(), max_steps=STEPS, callbacks=[dlac, recorder, observer],
                logger=[csv, memory], limit_val_batches=0, default_root_dir=str(workdir / name))
    t.fit(small_dlrm(), datamodule=small_data(train_batches=STEPS))
    return {
        "multipliers": recorder.multipliers,
        "table_bounds": recorder.table_bounds,
        "calibrated_at_first_batch": recorder.calibrated_at_first_batch,
        "writes": [(step, sorted(k for k in m if k.startswith("dlac/"))) for step, m in memory.rows
                   if any(k.startswith("dlac/") for k in m)],
        "prog_bar": sorted(t.progress_bar_metrics),
        "log_dir": str(Path(csv.log_dir)),
        "expected_bytes": observer.expected,
    }


def _checkpoint_and_predict(world_size: int, ckpt_dir: str) -> dict[str, Any]:
    """A fit that checkpoints every step keeping one, then Trainer.validate / test / predict on the fitted model."""
    from lightning.pytorch.callbacks import ModelCheckpoint


    torch.manual_seed(0)
    model, data = small_dlrm(), small_data(train_batches=3)
    t = trainer(world_size, strategy(), max_steps=3,
                callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=1)],
                enable_checkpointing=True)
    t.fit(model, datamodule=data)
    val_loader = data.val_dataloader()
    (validated,) = t.validate(model, dataloaders=val_loader, verbose=False)
    (tested,) = t.test(model, dataloaders=val_loader, verbose=False)
    calls = t.strategy.total_comm_stats().calls
    predictions = t.predict(model, dataloaders=val_loader)
    return {"validated": validated, "tested": tested,
            "predictions": [(tuple(p.shape), bool(torch.isfinite(p).all())) for p in predictions],
            "predict_calls": t.strategy.total_comm_stats().calls - calls}


def _all_arms(rank: int, world_size: int, workdir: str) -> dict[str, Any]:
    import torch.distributed as dist

    out: dict[str, Any] = {"strategy": {}, "callback": {}}
    for name in STRATEGY_ARMS:
        try:
            out["strategy"][name] = _strategy_arm(world_size, name)
        except BaseException as err:  # name the arm in the traceback the test reports
            err.add_note(f"in the strategy arm {name!r}: {STRATEGY_ARMS[name][0]}")
            raise
    for name in CALLBACK_ARMS:
        try:
            out["callback"][name] = _callback_arm(world_size, name, Path(workdir))
        except BaseException as err:
            err.add_note(f"in the callback arm {name!r}: {CALLBACK_ARMS[name]}")
            raise
    out["checkpoint"] = _checkpoint_and_predict(world_size, str(Path(workdir) / "ckpt"))
    out["variable_batch"] = _variable_batch(world_size)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def arms(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    """Every arm on 2 ranks, once for the module: (results by rank, the work directory)."""
    workdir = tmp_path_factory.mktemp("arms")
    return run_ranks(_all_arms, 2, str(workdir), timeout=FIXTURE_BUDGET_S), workdir


def _pair(arms: tuple[list[dict], Path], name: str) -> list[tuple[dict, dict]]:
    """(arm, its control) of strategy arm ``name``, per rank."""
    control = STRATEGY_ARMS[name][1]
    return [(r["strategy"][name], r["strategy"][control]) for r in arms[0]]


def _callback_pair(arms: tuple[list[dict], Path], name: str) -> list[tuple[dict, dict]]:
    return [(r["callback"][name], r["callback"]["control"]) for r in arms[0]]


# ----------------------------------------------------------------------------------------------- strategy options


def test_process_group_backend_reaches_init_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the backend Lightning asks torch.distributed for, captured where the process group would be
    made (no process group is made, no port is bound)."""
    import torch.distributed as dist


    class Captured(Exception):
        pass

    asked = []

    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        asked.append(backend)
        raise Captured

    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)  # whatever Lightning sets while launching is undone after the test
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    for backend in ("gloo", "nccl"):
        t = trainer(1, strategy(process_group_backend=backend), max_steps=1)
        with pytest.raises(Captured):
            t.fit(small_dlrm(), datamodule=small_data(train_batches=1))
    assert asked == ["gloo", "nccl"]


def test_start_method_picks_lightning_s_launcher() -> None:
    import lightning.pytorch as pl

    launchers = {}
    for start_method in ("popen", "spawn"):
        t = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy(start_method=start_method), logger=False,
                       enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        launchers[start_method] = (type(t.strategy.launcher).__name__, getattr(t.strategy.launcher, "_start_method",
                                                                               None))
    assert launchers == {"popen": ("_SubprocessScriptLauncher", None), "spawn": ("_MultiProcessingLauncher", "spawn")}


@pytest.mark.slow
def test_sharding_types_choose_the_plan(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "sharding_types"):
        assert set(control["plan"].values()) == {"table_wise"} and len(control["plan"]) == 26, control["plan"]
        assert set(arm["plan"].values()) == {"column_wise"} and len(arm["plan"]) == 26, arm["plan"]


@pytest.mark.slow
def test_table_constraints_override_one_table_and_the_log_says_it_stays_uncompressed(
        arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "table_constraints"):
        assert control["plan"]["t_cat_0"] == "table_wise" and arm["plan"]["t_cat_0"] == "data_parallel"
        assert {k: v for k, v in arm["plan"].items() if k != "t_cat_0"} == {
            k: v for k, v in control["plan"].items() if k != "t_cat_0"}
        said = [m for m in arm["messages"] if "data_parallel" in m and "uncompressed" in m]
        assert said and not [m for m in control["messages"] if "data_parallel" in m], arm["messages"]


@pytest.mark.slow
def test_embedding_optimizer_picks_the_fused_optimizer(arms: tuple[list[dict], Path]) -> None:
    for rank, r in enumerate(arms[0]):
        control, sgd, rowwise = (r["strategy"][n]["state_shapes"] for n in ("control", "optimizer_sgd",
                                                                              "optimizer_rowwise"))
        assert control and all(len(s) == 2 and s[1] == 16 for s in control), control  # Adagrad: [rows, dim]
        assert sgd == [], sgd  # SGD keeps no state
        assert rowwise and all(len(s) == 1 for s in rowwise), rowwise  # row-wise Adagrad: [rows]
        assert {s[0] for s in rowwise} == {s[0] for s in control}, rank


@pytest.mark.slow
def test_embedding_lr_scales_the_first_update(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "embedding_lr"):
        # Adagrad's first step moves an element by lr * g / (|g| + 1e-8), about lr: 0.05 in the control.
        assert 0.04 < control["first_update"] <= 0.05 + 1e-6, control["first_update"]
        assert arm["first_update"] == pytest.approx(control["first_update"] / 10, rel=1e-3)


@pytest.mark.slow
def test_adagrad_epsilon_damps_the_first_update(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "adagrad_epsilon"):
        # lr * g / (|g| + 10): the pooled gradients are far below 1, so the update is far below lr.
        assert arm["first_update"] < control["first_update"] / 100, (arm["first_update"], control["first_update"])


@pytest.mark.slow
def test_memory_budget_bytes_is_checked_against_every_table(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "memory_budget_bytes"):
        assert control["error"] is None
        assert re.search(r"Embedding table 't_cat_\d+' \(\d+ rows x 16 dims.*memory_budget_bytes=30000.*Raise"
                         r" memory_budget_bytes", arm["error"] or "", flags=re.S), arm["error"]


@pytest.mark.slow
def test_enabled_false_keeps_torchrec_s_exchange(arms: tuple[list[dict], Path]) -> None:
    for control, off in ((r["strategy"]["control"], r["strategy"]["compress_false"]) for r in arms[0]):
        assert control["exchanges"] == 1 and control["calls"] == list(range(1, STEPS + 1)), control["calls"]
        assert 0 < control["stats"]["sent"] < control["stats"]["raw"] and control["uncompressed"] == [0] * STEPS
        assert off["exchanges"] == 0 and off["stats"]["raw"] == 0 and off["calls"] == [0] * STEPS, off
        assert off["codec"]["native"]["encode"] == off["codec"]["ref"]["encode"] == 0, off["codec"]
        # TorchRec's own float32 exchange: the pooled embeddings are the unsharded twin's (up to its kernel's
        # rounding), where the compressed control's carry the codec's error.
        assert off["twin_error"] < 1e-5 < control["twin_error"], (off["twin_error"], control["twin_error"])


@pytest.mark.slow
def test_auto_fallback_adds_the_uncompressed_fallback(arms: tuple[list[dict], Path]) -> None:
    for rank, (auto, control) in enumerate(_pair(arms, "compress_auto")):
        assert control["uncompressed"] == [0] * STEPS and auto["exchanges"] == 1
        # The fallback measures the codec on calls 0 and 1 and the uncompressed exchange on call 2, whatever the
        # times turn out to be: call 2 (the third batch) went uncompressed.
        went = [b - a for a, b in zip([0, *auto["uncompressed"]], auto["uncompressed"])]
        assert went[:3] == [0, 0, 1], (rank, went)


@pytest.mark.slow
def test_qcomm_codecs_registry_gives_torchrec_s_exchanges_its_codecs(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "qcomm"):
        # Both uncompressed by DLAC (enabled=False): TorchRec sends the pooled embeddings itself, in float32 in the
        # control and through the FP16 qcomm codec in the arm, whose rounding (a 2^-11 relative step) the twin sees.
        assert arm["exchanges"] == control["exchanges"] == 0
        assert control["twin_error"] < 1e-5 < arm["twin_error"] < 1e-2, (arm["twin_error"], control["twin_error"])


@pytest.mark.slow
def test_deprecated_read_outs_warn_and_return_what_their_replacements_do(arms: tuple[list[dict], Path]) -> None:
    """``strategy.compressed_tables``, ``.sharding_types`` and ``.embedding_optimizer`` (removed without deprecation
    in 3963681, restored): after a real 2-rank fit each gives what its replacement gives, with the types it had,
    and warns naming the replacement."""
    mine = []
    for rank, r in enumerate(arms[0]):
        control, off, sgd = (r["strategy"][n]["read_outs"] for n in ("control", "compress_false", "optimizer_sgd"))
        for read in (control, off, sgd):
            assert {k: v for k, v in read["old"].items() if k != "compressed_tables"} == {
                k: v for k, v in read["new"].items() if k != "compressed_tables"}, read
            assert read["types"] == {"compressed_tables": "list", "sharding_types": "list",
                                     "embedding_optimizer": "EmbeddingOptimizer"}, read["types"]
            assert len(read["warnings"]) == (3 if rank == 0 else 0), read["warnings"]
        assert control["old"]["compressed_tables"] == control["new"]["compressed_tables"] != []
        assert off["old"]["compressed_tables"] == [] and off["new"]["compressed_tables"] is None  # no exchange
        assert control["old"]["sharding_types"] == ["table_wise"] and sgd["old"]["embedding_optimizer"] == "sgd"
        mine.append(set(control["old"]["compressed_tables"]))
    # Table-wise on 2 ranks: each rank compresses the tables it holds, every table on one rank.
    assert not mine[0] & mine[1] and mine[0] | mine[1] == set(TABLES), mine
    warned = arms[0][0]["strategy"]["control"]["read_outs"]["warnings"]
    for old, new in (("compressed_tables", "strategy.exchange_group.compressed_tables"),
                     ("sharding_types", "strategy.sharding.sharding_types"),
                     ("embedding_optimizer", "strategy.sharding.embedding_optimizer")):
        assert any(f"DLACStrategy.{old} is deprecated; use {new}" in w for w in warned), (old, warned)


@pytest.mark.slow
def test_fallback_check_every_spaces_the_checks_of_the_way_not_taken(arms: tuple[list[dict], Path]) -> None:
    for rank, (arm, control) in enumerate(_pair(arms, "fallback_check_every")):
        # After call 2 the fallback takes the faster way (which one depends on the times) and tries the other one
        # once, fallback_check_every calls later: call 2 + 2 here, call 2 + 4 in the control. So the way changes at
        # call 4 in the arm and not in the control, and at call 6 in the control. What the arm does at call 5 depends
        # on the times again (back, or on the way it tried if that one was faster this time), so it is not asserted.
        arm_way, control_way = (
            [b - a for a, b in zip([0, *r["uncompressed"]], r["uncompressed"])] for r in (arm, control))
        assert arm_way[4] != arm_way[3], (rank, arm_way)
        assert control_way[4] == control_way[3] == control_way[5] and control_way[6] != control_way[5], (
            rank, control_way)


@pytest.mark.slow
def test_eps_is_the_bound_of_every_table(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "eps"):
        # Pooled embeddings against an unsharded twin: within eps of each key's range (the twin pools in another
        # kernel: 0.1% slack for rounding), and, since the quantization error comes close to its bound on so many
        # values, beyond the control's 0.01 with eps=0.05.
        assert 0 < control["twin_error"] <= 0.01 * (1 + 1e-3), control["twin_error"]
        assert 0.01 * (1 + 1e-3) < arm["twin_error"] <= 0.05 * (1 + 1e-3), arm["twin_error"]
        assert arm["stats"]["sent"] < control["stats"]["sent"]


@pytest.mark.slow
def test_backward_compression_picks_the_gradient_encoding(arms: tuple[list[dict], Path]) -> None:
    for r in arms[0]:
        s = {n: r["strategy"][n] for n in ("control", "backward_fp32", "backward_fp16", "backward_dlac")}
        grads = {n: a["gradients"][0] for n, a in s.items()}
        assert all(g["numel"] > 0 for g in grads.values()), grads
        raw = {n: a["stats"]["backward_raw"] for n, a in s.items()}
        sent = {n: a["stats"]["backward_sent"] for n, a in s.items()}
        assert len(set(raw.values())) == 1 and raw["control"] > 0, raw
        # bf16 (the control): half the bytes, every value a bf16 number.
        assert sent["control"] * 2 == raw["control"] and grads["control"]["bf16"], grads["control"]
        # fp32: every byte, and values no 16-bit type holds.
        assert sent["backward_fp32"] == raw["control"] and not grads["backward_fp32"]["bf16"], grads
        # fp16: half the bytes, fp16 numbers that bf16 cannot hold.
        assert sent["backward_fp16"] * 2 == raw["control"], sent
        assert grads["backward_fp16"]["fp16"] and not grads["backward_fp16"]["bf16"], grads["backward_fp16"]
        # DLAC: error-bounded codes, sized by the data, neither a cast's bytes nor its values.
        assert 0 < sent["backward_dlac"] < raw["control"] // 2, sent
        assert not grads["backward_dlac"]["bf16"] and not grads["backward_dlac"]["fp16"], grads["backward_dlac"]


@pytest.mark.slow
def test_backward_eps_is_the_bound_of_the_gradient_exchange(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "backward_eps"):
        # Quantized at step 2 * eps * range, a chunk's column takes at most 1 / (2 eps) + 1 values (+1 where float32
        # rounding shrinks the step): 11 (12) at eps 0.05; at 0.01 up to 51, and 64 diverse gradients use more.
        assert arm["gradients"][0]["levels"] <= 12, arm["gradients"]
        assert control["gradients"][0]["levels"] > 12, control["gradients"]
        assert arm["stats"]["backward_sent"] < control["stats"]["backward_sent"]


@pytest.mark.slow
def test_codec_impl_picks_the_implementation_that_encodes(arms: tuple[list[dict], Path]) -> None:
    from tests.conftest import native_expected

    for arm, control in _pair(arms, "codec_impl"):
        # "auto" in the control: the native kernels (the suite sets DLAC_CODEC_IMPL=native where they build).
        want = "native" if native_expected() else "ref"
        assert control["codec"][want]["encode"] >= STEPS and control["codec"][want]["decode"] >= STEPS, control
        if want == "native":
            assert control["codec"]["ref"] == {"encode": 0, "decode": 0}, control["codec"]
        assert arm["codec"]["ref"]["encode"] >= STEPS and arm["codec"]["ref"]["decode"] >= STEPS, arm["codec"]
        assert arm["codec"]["native"] == {"encode": 0, "decode": 0}, arm["codec"]


@pytest.mark.slow
def test_error_every_sets_how_often_the_error_is_measured(arms: tuple[list[dict], Path]) -> None:
    for r in arms[0]:
        never, every, control = (r["strategy"][n] for n in ("error_every_0", "error_every_1", "control"))
        # A measurement decodes this rank's own payload once more (one grid on 2 ranks): count the extra decodes.
        extra = {n: a["codec"]["native"]["decode"] + a["codec"]["ref"]["decode"]
                 - (never["codec"]["native"]["decode"] + never["codec"]["ref"]["decode"])
                 for n, a in (("every", every), ("control", control))}
        assert extra == {"every": STEPS, "control": len(range(0, STEPS, 10))}, extra  # calls 0, 10, 20, ...
        assert not any(never["stats"]["max_error_ratio"].values()), never["stats"]["max_error_ratio"]
        assert 0 < max(every["stats"]["max_error_ratio"].values()) <= 1 + 1e-4


@pytest.mark.slow
def test_overlap_launches_the_exchange_and_waits_when_needed(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "overlap"):
        assert arm["overlapped"] == [True] and control["overlapped"] == [False]
        assert arm["stats"]["sent"] == control["stats"]["sent"]  # the same payloads, launched earlier


@pytest.mark.slow
def test_pieces_sends_the_exchange_in_pieces_with_the_whole_exchanges_result(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "pieces"):
        assert arm["pieces"] == [2] and control["pieces"] == [1]
        # The same chunks, encoded as in the whole exchange: the same bytes per table, errors and first update.
        assert arm["stats"] == control["stats"] and arm["first_update"] == control["first_update"]


@pytest.mark.slow
def test_compress_peers_decides_whose_payloads_are_compressed(arms: tuple[list[dict], Path]) -> None:
    for rank, (arm, control) in enumerate(_pair(arms, "compress_peers")):
        assert control["compress_to"] == [tuple(d != rank for d in range(2))] and control["stats"]["passed"] == 0
        assert arm["compress_to"] == [tuple(rank == 0 and d != rank for d in range(2))]
        # Rank 0 encodes its rows for rank 1 and rank 1 sends its own as float32; each gradient goes back as its
        # embeddings came: bf16 from rank 1 to rank 0, float32 from rank 0 to rank 1.
        st = arm["stats"]
        if rank == 0:
            assert st["sent"] < st["raw"] / 2 and st["passed"] == st["backward_sent"] == st["backward_raw"], st
        else:
            assert st["raw"] <= st["sent"] <= st["raw"] * 1.01 and st["passed"] == st["raw"], st  # + size records
            assert st["backward_sent"] * 2 == st["backward_raw"], st


@pytest.mark.slow
def test_find_unused_parameters_reaches_the_dense_ddp(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "find_unused_parameters"):
        assert control["ddp"] == [(False, False, 25 * 2**20)] and arm["ddp"] == [(True, False, 25 * 2**20)]


@pytest.mark.slow
def test_static_graph_reaches_the_dense_ddp(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "static_graph"):
        assert control["ddp"] == [(False, False, 25 * 2**20)] and arm["ddp"] == [(False, True, 25 * 2**20)]


@pytest.mark.slow
def test_bucket_cap_mb_reaches_the_dense_ddp(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _pair(arms, "bucket_cap_mb"):
        assert control["ddp"] == [(False, False, 25 * 2**20)] and arm["ddp"] == [(False, False, 1 * 2**20)]


def test_the_options_renamed_before_0_1_are_gone() -> None:
    from lightning_dlac import DLACCallback

    for old in ("embedding_eps", "probe_every"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            strategy(**{old: 1e-3})
    with pytest.raises(TypeError, match="unexpected keyword argument 'probe_eps'"):
        DLACCallback(probe_eps=0.3)


# ----------------------------------------------------------------------------------------------- callback options


@pytest.mark.slow
def test_calibration_dataloader_calibrates_before_the_first_batch(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _callback_pair(arms, "calibration_dataloader"):
        assert arm["calibrated_at_first_batch"] and sorted(arm["table_bounds"][0]) == sorted(TABLES)
        # The control measures its first 2 training batches: its bounds arrive at the third.
        assert not control["calibrated_at_first_batch"] and control["table_bounds"][:2] == [{}, {}]
        assert sorted(control["table_bounds"][2]) == sorted(TABLES)


# m(t) for t = 0..7 from docs/adaptive.md's formulas: step c - (c - 1) * floor(stages * t / T) / stages, linear
# c - (c - 1) * t / T, both 1 from T on. The control: step, c = 2, T = 4, stages = 2.
CONTROL_MULTIPLIERS = [2.0, 2.0, 1.5, 1.5, 1.0, 1.0, 1.0, 1.0]


def _multipliers(arms: tuple[list[dict], Path], option: str, expected: list[float]) -> None:
    for arm, control in _callback_pair(arms, option):
        assert control["multipliers"] == pytest.approx(CONTROL_MULTIPLIERS)
        assert arm["multipliers"] == pytest.approx(expected), option


@pytest.mark.slow
def test_schedule_is_the_shape_of_the_decay(arms: tuple[list[dict], Path]) -> None:
    _multipliers(arms, "schedule", [2.0, 1.75, 1.5, 1.25, 1.0, 1.0, 1.0, 1.0])  # linear


@pytest.mark.slow
def test_c_is_the_initial_multiplier(arms: tuple[list[dict], Path]) -> None:
    _multipliers(arms, "c", [3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0])


@pytest.mark.slow
def test_T_is_the_length_of_the_early_stage(arms: tuple[list[dict], Path]) -> None:  # noqa: N802 - the option's name
    _multipliers(arms, "T", [2.0, 2.0, 2.0, 1.5, 1.5, 1.5, 1.0, 1.0])


@pytest.mark.slow
def test_stages_are_the_plateaus_of_the_step_schedule(arms: tuple[list[dict], Path]) -> None:
    _multipliers(arms, "stages", [2.0, 1.75, 1.5, 1.25, 1.0, 1.0, 1.0, 1.0])


@pytest.mark.slow
def test_log_every_n_steps_is_the_metrics_period(arms: tuple[list[dict], Path]) -> None:
    arm, control = _callback_pair(arms, "log_every_n_steps")[0]  # rank 0 writes
    assert [step for step, _ in control["writes"]] == [2, 4, 6, 8]
    assert [step for step, _ in arm["writes"]] == [3, 6, 8]  # 8: what the last two batches sent, at the end
    assert not _callback_pair(arms, "log_every_n_steps")[1][0]["writes"]  # rank 1 writes nothing


@pytest.mark.slow
def test_per_table_metrics_adds_every_table_s_figures(arms: tuple[list[dict], Path]) -> None:
    arm, control = _callback_pair(arms, "per_table_metrics")[0]
    per_table = [{k for k in keys if k.count("/") == 2} for _, keys in control["writes"]]
    assert per_table and all({f"dlac/ratio/{t}" for t in TABLES} <= keys for keys in per_table)
    assert all({f"dlac/eps/{t}" for t in TABLES} <= keys for keys in per_table)
    assert arm["writes"] and not [k for _, keys in arm["writes"] for k in keys if k.count("/") == 2], arm["writes"]
    assert [k for k in arm["writes"][0][1]] == [k for k in control["writes"][0][1] if k.count("/") == 1]


@pytest.mark.slow
def test_prog_bar_shows_the_ratio(arms: tuple[list[dict], Path]) -> None:
    for arm, control in _callback_pair(arms, "prog_bar"):
        assert "dlac/ratio" in control["prog_bar"] and "dlac/ratio" not in arm["prog_bar"]


@pytest.mark.slow
def test_report_writes_the_run_files_with_the_bytes_the_exchange_sent(arms: tuple[list[dict], Path]) -> None:
    import json

    (arm, control), (arm1, _) = _callback_pair(arms, "report")
    written = sorted(p.name for p in Path(arm["log_dir"]).iterdir())
    assert {"dlac_run.json", "dlac_report.md", "dlac_ratio_per_table.png"} <= set(written), written
    assert not [p for p in Path(control["log_dir"]).iterdir() if p.name.startswith("dlac_")]
    # The figures: every call's chunks, encoded by this test at the bounds in force, summed over both ranks.
    raw = arm["expected_bytes"]["raw"] + arm1["expected_bytes"]["raw"]
    sent = arm["expected_bytes"]["sent"] + arm1["expected_bytes"]["sent"]
    assert 0 < sent < raw
    summary = json.loads((Path(arm["log_dir"]) / "dlac_run.json").read_text())["summary"]
    assert (summary["raw_bytes"], summary["sent_bytes"]) == (raw, sent)
    report = (Path(arm["log_dir"]) / "dlac_report.md").read_text()
    shown = re.search(r"forward all-to-all: ([\d.]+) MiB sent instead of ([\d.]+) MiB \(([\d.]+)x smaller", report)
    assert shown, report
    assert [float(v) for v in shown.groups()] == [round(sent / 2**20, 1), round(raw / 2**20, 1),
                                                  round(raw / sent, 1)]


# Hand-made chunks with known homogenization indexes (index bound 0.03: quantization bins 0.06 of the range wide).
def _chunks(rows: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # crowded: two far rows set the range, the rest within one bin of each other: index about 0.05 (tight).
    crowded = torch.cat([torch.full((1, 8), -4.0), torch.full((1, 8), 4.0),
                         1e-4 * torch.randn(rows - 2, 8, generator=g)])
    # middle: 16 levels 1/15 of the range apart and a 17th row within a bin of the first: 16 / 17 = 0.94 (base).
    levels = torch.linspace(0.0, 1.0, 16)[:, None].expand(16, 8)
    middle = torch.cat([levels, levels[:1] + 1e-4])[torch.arange(rows) % 17]
    # apart: 4 rows a third of the range apart in every column: index 1.0 (loose); at an index bound of 0.3 (bins
    # 0.6 wide) two of them merge.
    apart = torch.arange(4.0)[:, None].expand(4, 8)[torch.arange(rows) % 4]
    # spike: each row has one coordinate on a level of its own (every vector distinct: vector index 1.0), the rest
    # within one bin per column (per-value index about 0.14).
    spike = 1e-4 * torch.randn(rows, 8, generator=g)
    spike[torch.arange(rows), torch.arange(rows) % 8] += 1.0 + torch.arange(rows).div(8, rounding_mode="floor")
    return {"apart": apart, "crowded": crowded, "middle": middle, "spike": spike}


def _fragile_loss(bounds: Any) -> float:
    """A training loss that only "apart"'s error moves (by 10x its bound, relative): sensitive where the index says
    loose."""
    eps = bounds.effective_many(sorted(_chunks())).tolist()
    return 1.0 + 10.0 * eps[0]


# Loss-gradient energy each chunk's table reports per batch (4 samples, loss 1.0): its gradient sensitivity is
# eps x k with k = sqrt(4 x energy / 3), i.e. k = 10, 1, 3 and 1, so at a tolerance of 0.1 "apart" takes 0.01, "middle"
# 0.03 and the others 0.05.
_ENERGY = {"apart": 75.0, "crowded": 0.75, "middle": 6.75, "spike": 0.75}


def _calibrate(steps: int = 10, loss_swing: float = 0.0, **options: Any) -> dict[str, Any]:
    """Drive ``DLACCallback(**CALIBRATION, **options).calibrator`` through the protocol the callback follows each
    training batch, on the same chunks every batch (the training loss 1 +- ``loss_swing``, alternating); return what
    it decided and when."""
    from lightning_dlac import DLACCallback

    cal = DLACCallback(**{**CALIBRATION, **options}).calibrator
    names, measured, probed, finished = sorted(_chunks()), [], [], []
    cal.begin()
    for step in range(steps):
        if not cal.measuring(step):
            continue
        measured.append(step)
        if cal.wants_probe:
            probed.append(step)
            cal.probe(names, _fragile_loss)
        for name, chunk in _chunks().items():
            cal.observe(name, chunk)
            cal.observe_gradient(name, _ENERGY[name], 4)  # what the exchange's backward shows
        cal.observe_loss(1.0 + loss_swing * (-1) ** step)
        cal.batch_measured()
        if cal.complete:
            finished.append(cal.finish(step + 1, names).at)
    return {"classes": {k: str(v) for k, v in cal.classes.items()}, "bounds": cal.table_bounds,
            "report": {row["table"]: row for row in cal.report()}, "measured": measured, "probed": probed,
            "finished": finished, "calibrated": cal.calibrated}


CALIBRATION = {**CALLBACK, "sensitivity_batches": 1}  # in process, probing is cheap: the control probes once
CONTROL_CLASSES = {"apart": "loose", "crowded": "tight", "middle": "base", "spike": "loose"}
CONTROL_BOUNDS = {"apart": 0.05, "crowded": 0.01, "middle": 0.03, "spike": 0.05}


def test_calibration_control_classifies_the_hand_made_chunks_by_their_index() -> None:
    control = _calibrate()
    assert control["classes"] == CONTROL_CLASSES and control["bounds"] == CONTROL_BOUNDS
    index = {name: round(row["vector_homogenization_index"], 3) for name, row in control["report"].items()}
    assert index == {"apart": 1.0, "crowded": 0.047, "middle": 0.941, "spike": 1.0}
    assert control["measured"] == [0, 1] and control["probed"] == [0] and control["finished"] == [2]


def test_mode_picks_the_rule_that_sets_the_bounds() -> None:
    control, sensitivity, off = _calibrate(), _calibrate(mode="sensitivity"), _calibrate(mode="off")
    gradient = _calibrate(mode="gradient")
    assert control["bounds"] == CONTROL_BOUNDS
    # Gradient: the largest candidate whose expected per-sample loss change (eps x k) is within 0.1.
    assert gradient["bounds"] == {"apart": 0.01, "crowded": 0.05, "middle": 0.03, "spike": 0.05}
    assert gradient["classes"] == {"apart": "tight", "crowded": "loose", "middle": "base", "spike": "loose"}
    # Sensitivity: the largest candidate that moves the loss by at most 1e-3: "apart" moves it at any bound (the
    # smallest candidate, 0.01), the others never (0.05), whatever their index.
    assert sensitivity["bounds"] == {"apart": 0.01, "crowded": 0.05, "middle": 0.05, "spike": 0.05}
    assert off["calibrated"] and off["bounds"] == {} and off["measured"] == []  # the strategy's eps everywhere


def _class_bound(option: str, value: float) -> None:
    """The tables of the option's class get ``value``; the classes and every other bound stay the control's."""
    arm = _calibrate(**{option: value})
    cls = option.removesuffix("_eps")
    assert arm["classes"] == CONTROL_CLASSES
    assert arm["bounds"] == {t: value if c == cls else CONTROL_BOUNDS[t] for t, c in CONTROL_CLASSES.items()}
    assert arm["bounds"] != CONTROL_BOUNDS


def test_tight_eps_is_the_bound_of_tight_tables() -> None:
    _class_bound("tight_eps", 0.005)


def test_base_eps_is_the_bound_of_base_tables() -> None:
    _class_bound("base_eps", 0.04)


def test_loose_eps_is_the_bound_of_loose_tables() -> None:
    _class_bound("loose_eps", 0.06)


def test_tight_below_moves_a_table_under_it_to_tight() -> None:
    arm = _calibrate(tight_below=0.95)  # "middle" (0.941) is now below it
    assert arm["classes"] == {**CONTROL_CLASSES, "middle": "tight"} and arm["bounds"]["middle"] == 0.01


def test_loose_from_moves_a_table_over_it_to_loose() -> None:
    arm = _calibrate(loose_from=0.94)  # "middle" (0.941) is now at or above it
    assert arm["classes"] == {**CONTROL_CLASSES, "middle": "loose"} and arm["bounds"]["middle"] == 0.05


def test_index_eps_is_the_bound_the_index_is_measured_at() -> None:
    arm = _calibrate(index_eps=0.3)  # bins 0.6 of the range wide: two of "apart"'s levels share one
    assert arm["report"]["apart"]["vector_homogenization_index"] == 0.75
    assert arm["classes"]["apart"] == "tight" and arm["bounds"]["apart"] == 0.01


def test_index_picks_the_homogenization_index_that_classifies() -> None:
    arm = _calibrate(index="value")
    # "spike": every vector distinct (vector index 1.0: loose), every column crowded (value index 0.14: tight).
    assert arm["report"]["spike"]["homogenization_index"] < 0.2
    assert arm["classes"]["spike"] == "tight" and CONTROL_CLASSES["spike"] == "loose"


def test_candidates_are_the_bounds_calibration_measures() -> None:
    control, arm = _calibrate(), _calibrate(candidates=[0.02, 0.04])
    for name in _chunks():
        assert sorted(control["report"][name]["ratio"]) == ["0.01", "0.03", "0.05"]
        assert sorted(arm["report"][name]["ratio"]) == ["0.02", "0.04"]
        assert sorted(arm["report"][name]["loss_change"]) == ["0.02", "0.04"]


def test_sensitivity_tolerance_is_the_loss_change_a_bound_may_cause() -> None:
    control, arm = _calibrate(mode="sensitivity"), _calibrate(mode="sensitivity", sensitivity_tolerance=1.0)
    # "apart" moves the loss by 10 x its bound: 0.5 at 0.05, within a tolerance of 1.
    assert control["bounds"]["apart"] == 0.01 and arm["bounds"]["apart"] == 0.05


def test_gradient_tolerance_is_the_loss_change_a_sample_may_see() -> None:
    control, arm = _calibrate(mode="gradient"), _calibrate(mode="gradient", gradient_tolerance=0.5)
    # "apart" changes a sample's loss by 10 x its bound: 0.5 at 0.05, within a tolerance of 0.5; "middle" 0.15.
    assert (control["bounds"]["apart"], control["bounds"]["middle"]) == (0.01, 0.03)
    assert (arm["bounds"]["apart"], arm["bounds"]["middle"]) == (0.05, 0.05)
    assert arm["report"]["apart"]["gradient_loss_change"]["0.05"] == pytest.approx(0.5)


def test_noise_budget_is_the_share_of_the_minibatch_noise_all_tables_may_add() -> None:
    # Losses 1.5 and 0.5: minibatch variance 0.5. A table's share at eps is eps**2 x energy x 4 / 3 / 4 / 0.5
    # ("apart": 0.005, 0.045, 0.125 at the three candidates; the others at most 0.011 at 0.05).
    control, tight, loose = (_calibrate(mode="noise", loss_swing=0.5, noise_budget=b) for b in (0.1, 0.01, 0.2))
    assert control["report"]["apart"]["noise_share"]["0.05"] == pytest.approx(0.125)
    for arm, budget in ((control, 0.1), (tight, 0.01), (loose, 0.2)):
        used = sum(arm["report"][n]["noise_share"][str(e)] for n, e in arm["bounds"].items())
        assert used <= budget, (arm["bounds"], budget)
    assert (tight["bounds"]["apart"], control["bounds"]["apart"], loose["bounds"]["apart"]) == (0.01, 0.03, 0.05)
    assert tight["bounds"]["middle"] < loose["bounds"]["middle"] == 0.05


def test_noise_fraction_is_the_share_of_all_loose_noise_the_bounds_may_add() -> None:
    # The same tables as above: the bounds add at most the fraction of what every table at 0.05 would (and more only
    # where even the tightest candidates add more; not here).
    arms = {f: _calibrate(mode="noise", loss_swing=0.5, noise_fraction=f) for f in (0.1, 0.5, 1.0)}
    for fraction, arm in arms.items():
        loosest = sum(arm["report"][n]["noise_share"]["0.05"] for n in arm["bounds"])
        used = sum(arm["report"][n]["noise_share"][str(e)] for n, e in arm["bounds"].items())
        assert used <= fraction * loosest, (arm["bounds"], fraction)
    assert (arms[0.1]["bounds"]["apart"], arms[0.5]["bounds"]["apart"], arms[1.0]["bounds"]["apart"]) == \
        (0.01, 0.03, 0.05)


def test_calibration_batches_is_how_many_batches_are_measured() -> None:
    control, arm = _calibrate(), _calibrate(calibration_batches=3)
    assert (control["measured"], control["finished"]) == ([0, 1], [2])
    assert (arm["measured"], arm["finished"]) == ([0, 1, 2], [3])
    assert arm["report"]["apart"]["ratio"] and control["classes"] == arm["classes"]


def test_calibration_start_is_the_first_batch_measured() -> None:
    arm = _calibrate(calibration_start=3)
    assert (arm["measured"], arm["probed"], arm["finished"]) == ([3, 4], [3], [5])


def test_sensitivity_batches_is_how_many_batches_are_probed() -> None:
    control, none, both = _calibrate(), _calibrate(sensitivity_batches=0), _calibrate(sensitivity_batches=2)
    assert (control["probed"], none["probed"], both["probed"]) == ([0], [], [0, 1])
    assert none["report"]["apart"]["loss_change"] is None and control["report"]["apart"]["loss_change"]


def test_recalibrate_every_measures_again_after_that_many_batches() -> None:
    control, arm = _calibrate(), _calibrate(recalibrate_every=3)
    assert control["finished"] == [2]
    # Effective from batch 2; measured again 3 batches later (5, 6: effective from 7), and again from 10 on.
    assert arm["measured"] == [0, 1, 5, 6] and arm["finished"] == [2, 7]


# ----------------------------------------------------------------------------------- sharded model in other loops


@pytest.mark.slow
def test_validate_test_and_predict_run_on_the_sharded_model(arms: tuple[list[dict], Path]) -> None:
    for r in arms[0]:
        a = r["checkpoint"]
        assert a["tested"] == a["validated"] and 0 < a["validated"]["val/auroc"] < 1, (a["tested"], a["validated"])
        assert a["predictions"] == [((64,), True)] * 4, a["predictions"]  # 4 validation batches per rank
        assert a["predict_calls"] == 4, a["predict_calls"]  # each through the compressed all-to-all


@pytest.mark.slow
def test_remove_checkpoint_deletes_the_replaced_checkpoint_directory(arms: tuple[list[dict], Path]) -> None:
    (kept,) = list((arms[1] / "ckpt").iterdir())  # steps 1 and 2 were saved, then removed; step 3 is kept
    assert kept.is_dir() and "step=3" in kept.name and (kept / "meta.pt").is_file(), kept


def _variable_batch_kjt(rank: int, rows: int = 10) -> Any:
    """A variable-batch (VBE) KeyedJaggedTensor: feature k has its own batch of 4-8 distinct rows, expanded to
    ``rows`` rows by its inverse indices."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from tests.conftest import FEATURES, ROWS

    g = torch.Generator().manual_seed(rank)
    strides = [4 + (k + rank) % 5 for k in range(len(FEATURES))]
    lengths = [torch.randint(1, 3, (b,), generator=g, dtype=torch.int32) for b in strides]
    values = [torch.randint(0, ROWS[k], (int(n.sum()),), generator=g) for k, n in enumerate(lengths)]
    inverse = torch.stack([torch.randint(0, b, (rows,), generator=g) for b in strides])
    return KeyedJaggedTensor(keys=FEATURES, values=torch.cat(values), lengths=torch.cat(lengths),
                             stride_per_key_per_rank=[[b] for b in strides], inverse_indices=(FEATURES, inverse))


def _variable_batch(world_size: int) -> dict:
    """Validate on variable-batch input (TorchRec's VBE, which FBGEMM allows with SGD or row-wise Adagrad tables),
    then compare the sharded collection with its unsharded twin on such input."""
    from torch.utils.data import DataLoader
    from torchrec.datasets.utils import Batch


    rank = int(torch.distributed.get_rank())
    model = small_dlrm()
    reference = copy.deepcopy(model)
    kjt = _variable_batch_kjt(rank)
    batch = Batch(dense_features=torch.rand(10, 13), sparse_features=kjt, labels=torch.randint(0, 2, (10,)).float())
    t = trainer(world_size, strategy(**{"sharding.embedding_optimizer": "rowwise_adagrad"}), limit_val_batches=1)
    (metrics,) = t.validate(model, dataloaders=DataLoader([batch], batch_size=None), verbose=False)
    load_global_weights(model, reference.state_dict())
    with torch.no_grad():
        sharded = model.embedding_bag_collection(kjt).to_dict()
        unsharded = reference.embedding_bag_collection(kjt).to_dict()
    return {"loss": metrics["val/loss"], "shapes": sorted({tuple(v.shape) for v in sharded.values()}),
            "exact": all(torch.equal(sharded[k], v) for k, v in unsharded.items()), "keys": len(unsharded)}


@pytest.mark.slow
def test_variable_batch_input_takes_torchrec_s_uncompressed_path_exactly(arms: tuple[list[dict], Path]) -> None:
    for r in arms[0]:
        d = r["variable_batch"]
        assert math.isfinite(d["loss"]) and d["keys"] == 26 and d["shapes"] == [(10, 16)], d
        assert d["exact"], d  # variable batch per feature is not compressed: TorchRec's own all-to-all


# ------------------------------------------------------------------------------------- codec_impl without a compiler


def _without_a_compiler(rank: int, world_size: int, missing_cxx: str) -> dict:
    import os

    from lightning_dlac.codec import impl_calls, native_available
    from lightning_dlac.codec._loader import NativeUnavailable

    os.environ.pop("DLAC_CODEC_IMPL", None)  # the suite's "native" would turn codec_impl="auto" into "native"
    os.environ["CXX"] = missing_cxx
    out: dict[str, Any] = {"native_available": native_available()}
    for impl in ("ref", "auto", "native"):
        before = impl_calls()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = trainer(world_size, strategy(**{"compression.impl": impl}), max_steps=2,
                        limit_val_batches=0)
            try:
                t.fit(small_dlrm(), datamodule=small_data(train_batches=2))
                stats = t.strategy.total_comm_stats()
                error = None
            except NativeUnavailable as err:
                stats, error = None, str(err)
        out[impl] = {
            "error": error,
            "compressed": stats is not None and 0 < stats.sent_bytes < stats.raw_bytes,
            "ref_encodes": impl_calls()["ref"]["encode"] - before["ref"]["encode"],
            "fallback_warnings": [str(w.message) for w in caught if "native codec unavailable" in str(w.message)],
        }
    return out


@pytest.mark.slow
def test_codec_impl_without_a_compiler_falls_back_in_auto_and_fails_in_native(tmp_path: Path) -> None:
    from lightning_dlac.codec import native_available
    from tests.conftest import native_expected

    if native_expected():
        assert native_available()
    for r in run_ranks(_without_a_compiler, 2, str(tmp_path / "no-such-c++")):
        assert r["native_available"] is False
        assert r["ref"]["error"] is None and r["ref"]["compressed"] and r["ref"]["fallback_warnings"] == []
        assert r["auto"]["error"] is None and r["auto"]["compressed"] and r["auto"]["ref_encodes"] >= 2, r["auto"]
        assert len(r["auto"]["fallback_warnings"]) == 1 and "no C++ compiler" in r["auto"]["fallback_warnings"][0]
        assert "no C++ compiler found" in (r["native"]["error"] or ""), r["native"]


# ------------------------------------------------------------------------------- several EmbeddingBagCollections


def _two_collections_module() -> Any:
    import lightning.pytorch as pl
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    from lightning_dlac import dense_parameters

    def ebc(prefix: str, sizes: list[int]) -> EmbeddingBagCollection:
        return EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t_{prefix}_{i}", embedding_dim=8, num_embeddings=n,
                                       feature_names=[f"{prefix}_{i}"]) for i, n in enumerate(sizes)],
            device=torch.device("cpu"),
        )

    class TwoTowers(pl.LightningModule):
        """Users and items in separate EmbeddingBagCollections, as two-tower models keep them."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.users = ebc("user", [60, 80, 100])
            self.items = ebc("item", [70, 90])
            self.head = torch.nn.Linear(5 * 8, 1)

        def forward(self, batch: tuple) -> torch.Tensor:
            users, items, _ = batch
            u, i = self.users(users), self.items(items)
            pooled = [u[k] for k in users.keys()] + [i[k] for k in items.keys()]
            return self.head(torch.cat(pooled, dim=1)).squeeze(1)

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.binary_cross_entropy_with_logits(self(batch), batch[2])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(dense_parameters(self), lr=0.1)

    return TwoTowers()


def _two_tower_batches(rank: int, n: int, rows: int = 32) -> list[tuple]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 + rank)

    def kjt(prefix: str, sizes: list[int]) -> KeyedJaggedTensor:
        lengths = torch.randint(0, 3, (len(sizes) * rows,), generator=g, dtype=torch.int32)  # bags of 0-2 ids
        values = torch.cat([torch.randint(0, size, (int(lengths[k * rows:(k + 1) * rows].sum()),), generator=g)
                            for k, size in enumerate(sizes)])
        return KeyedJaggedTensor.from_lengths_sync([f"{prefix}_{k}" for k in range(len(sizes))], values, lengths)

    return [(kjt("user", [60, 80, 100]), kjt("item", [70, 90]), torch.randint(0, 2, (rows,), generator=g).float())
            for _ in range(n)]


def _fit_two_collections(rank: int, world_size: int) -> dict:
    from torch.utils.data import DataLoader

    from lightning_dlac import CompressionOptions, DLACStrategy
    from tests.conftest import loss_recorder

    model = _two_collections_module()
    reference = copy.deepcopy(model)
    losses = loss_recorder()
    t = trainer(world_size, DLACStrategy(compression=CompressionOptions(eps=0.02)), max_steps=4, callbacks=[losses])
    t.fit(model, train_dataloaders=DataLoader(_two_tower_batches(rank, 4), batch_size=None))
    stats = t.strategy.total_comm_stats()
    load_global_weights(model, reference.state_dict())
    worst = 0.0
    with torch.no_grad():
        for users, items, _ in _two_tower_batches(rank, 2):
            for name, kjt in (("users", users), ("items", items)):
                got, want = getattr(model, name)(kjt).to_dict(), getattr(reference, name)(kjt).to_dict()
                for key, exact in want.items():
                    bound = 0.02 * float(exact.max() - exact.min()) + 1e-7
                    worst = max(worst, float((got[key] - exact).abs().max()) / bound)
    return {"exchanges": len(t.strategy.exchanges), "plan": sorted(_plan(t.strategy)),
            "raw": stats.raw_bytes, "sent": stats.sent_bytes, "losses": losses.losses, "worst": worst}


@pytest.mark.slow
def test_several_embedding_bag_collections_are_each_sharded_and_compressed() -> None:
    for r in run_ranks(_fit_two_collections, 2):
        assert r["exchanges"] == 2, r  # one compressed all-to-all per collection
        assert r["plan"] == sorted([f"t_user_{i}" for i in range(3)] + [f"t_item_{i}" for i in range(2)]), r
        assert 0 < r["sent"] < r["raw"], r
        assert len(r["losses"]) == 4 and all(math.isfinite(v) for v in r["losses"]), r
        assert 0 < r["worst"] <= 1 + 1e-4, r  # within each table's bound of the unsharded collection, not exact


# ------------------------------------------------------------------------------------------------ codec functions


def test_max_error_measures_finite_elements_and_flags_changed_non_finite_ones() -> None:
    from lightning_dlac.codec import max_error

    x = torch.tensor([[1.0, -2.0, float("nan")], [float("inf"), 0.5, 3.0]])
    y = x.clone()
    y[0, 0], y[1, 2] = 1.25, 2.5
    assert max_error(x, y) == 0.5
    assert max_error(x, x) == 0.0 and max_error(torch.zeros(0, 3), torch.zeros(0, 3)) == 0.0
    z = x.clone()
    z[0, 2] = 0.0  # a NaN that did not come back
    assert max_error(x, z) == math.inf
    z = x.clone()
    z[1, 0] = -math.inf
    assert max_error(x, z) == math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        max_error(x, x[:1])
