"""DLACStrategy: sharding, training, Lightning collectives, registry, and start-up errors (2-rank gloo runs)."""

from __future__ import annotations

import copy
import math
import re
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lightning_dlac import CheckpointOptions, CompressionOptions, DLACStrategy, ShardingOptions
from lightning_dlac.testing import run_ranks
from tests.conftest import (
    FEATURES,
    load_global_weights,
    loss_recorder,
    native_expected,
    small_data,
    small_dlrm,
    trainer,
)


def _forward_parity(rank: int, world_size: int, sharding_type: str) -> list[str]:
    model = small_dlrm()
    reference = copy.deepcopy(model)  # unsharded twin with the same weights
    data = small_data()
    t = trainer(world_size, DLACStrategy(sharding=ShardingOptions(sharding_types=[sharding_type]),
                                             compression=CompressionOptions(enabled=False)), limit_val_batches=1)
    t.validate(model, datamodule=data, verbose=False)  # sets the strategy up: the tables are now sharded
    plan = t.strategy.sharding_plan
    types = {spec.sharding_type for module_plan in plan.plan.values() for spec in module_plan.values()}
    assert types == {sharding_type}, types
    load_global_weights(model, reference.state_dict())
    batches = list(data.val_dataloader())
    assert batches
    with torch.no_grad():
        for batch in batches:
            sharded = t.strategy.distributed_model(batch)
            torch.testing.assert_close(sharded, reference(batch), rtol=1e-5, atol=1e-6)
    return sorted(types)


@pytest.mark.slow
@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "table_column_wise"])
def test_sharded_forward_equals_unsharded(sharding_type: str) -> None:
    run_ranks(_forward_parity, 2, sharding_type)


def _sharded_tables(rank: int, world_size: int, sharding_type: str, draw_first: bool) -> None:
    import lightning.pytorch as pl
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from lightning_dlac.engine.sharding import shard_slices

    class DrawsAtSetup(pl.Callback):  # as a callback that sets the training loader up early does
        def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
            torch.rand(1000)

    torch.manual_seed(1234)
    model = small_dlrm()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = DLACStrategy(sharding=ShardingOptions(sharding_types=[sharding_type]))
    t = trainer(world_size, strategy, limit_val_batches=1,
                callbacks=[DrawsAtSetup()] if draw_first else [])
    t.validate(model, datamodule=small_data(), verbose=False)  # sets the strategy up: the tables are now sharded
    checked = 0
    for key, value in model.state_dict().items():
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                assert torch.equal(shard.tensor, reference[key][shard_slices(shard.metadata)]), (key, shard.metadata)
                checked += shard.tensor.numel()
        elif "embedding_bags" in key:  # a data-parallel table: every rank holds all of it
            assert torch.equal(value, reference[key]), key
            checked += value.numel()
    assert checked > 0


@pytest.mark.slow
@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "data_parallel"])
@pytest.mark.parametrize("draw_first", [False, True])
def test_sharded_tables_start_from_the_modules_own_weights(sharding_type: str, draw_first: bool) -> None:
    """The tables a user built, seeded or loaded are the tables that train: TorchRec's sharded tables start from
    their own random initialization, drawn from the global random state at sharding time, so without the copy the
    module's weights were silently replaced and anything that drew a random number before (a callback's setup)
    changed the tables a run started from."""
    run_ranks(_sharded_tables, 2, sharding_type, draw_first)


def _train(rank: int, world_size: int, strategy: str | None) -> dict:
    from lightning_dlac.codec import impl_calls

    torch.manual_seed(0)
    model = small_dlrm()
    recorder = loss_recorder()
    t = trainer(world_size, strategy, max_epochs=3, callbacks=[recorder])
    before = impl_calls()
    t.fit(model, datamodule=small_data())
    after = impl_calls()
    fit_auroc = float(t.callback_metrics["val/auroc"])
    # Validating again with the same Trainer reuses the sharded model and gives the same result.
    (validated,) = t.validate(model, datamodule=small_data(), verbose=False)
    assert abs(validated["val/auroc"] - fit_auroc) < 1e-6, (validated, fit_auroc)
    assert isinstance(t.strategy, DLACStrategy)
    assert t.strategy.distributed_model is not None
    # Lightning's collectives behave as under DDP.
    total = t.strategy.reduce(torch.tensor(float(rank + 1)), reduce_op="sum")
    mean = t.strategy.reduce(torch.tensor(float(rank + 1)))
    picked = t.strategy.broadcast({"from": rank})
    t.strategy.barrier("after-fit")
    owned = {
        key
        for key, value in model.state_dict().items()
        if "embedding_bags" in key and any(s.tensor.numel() for s in getattr(value, "local_shards", list)())
    }
    from lightning_dlac.codec import native_available

    return {
        "native": native_available(),  # loaded already if the fit used the native kernels; never built here
        "encodes": {impl: after[impl]["encode"] - before[impl]["encode"] for impl in after},
        "losses": recorder.losses,
        "auroc": float(t.callback_metrics["val/auroc"]),
        "sum": float(total),
        "mean": float(mean),
        "picked": picked,
        "owned": owned,
    }


@pytest.mark.slow
def test_two_rank_training_loss_falls_and_collectives_work() -> None:
    results = run_ranks(_train, 2, None)
    for r in results:
        losses = r["losses"]
        assert len(losses) == 90
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        assert last < 0.9 * first, (first, last)
        assert r["auroc"] > 0.6
        assert r["sum"] == 3.0 and r["mean"] == 1.5
        assert r["picked"] == {"from": 0}
        assert r["native"] == native_expected()
        # Which codec the fit's exchanges ran (lightning_dlac.codec.impl_calls): the native kernels where they
        # build, and never the reference then.
        used = "native" if r["native"] else "ref"
        assert r["encodes"][used] > 0 and sum(r["encodes"].values()) == r["encodes"][used], r["encodes"]
    # Table-wise: every table lives on exactly one rank.
    owned0, owned1 = results[0]["owned"], results[1]["owned"]
    assert owned0 and owned1 and not owned0 & owned1 and len(owned0 | owned1) == len(FEATURES)


def _single_device(rank: int, world_size: int) -> dict:
    result = _train(rank, world_size, "dlac")
    # The all-to-all of one rank is a local copy: the sharded collection pools exactly what the unsharded one does,
    # and nothing is encoded or counted as sent.
    model = small_dlrm()
    reference = copy.deepcopy(model)
    t = trainer(world_size, "dlac", limit_val_batches=1)
    t.validate(model, datamodule=small_data(), verbose=False)
    load_global_weights(model, reference.state_dict())
    data = small_data()
    data.setup("validate")
    exact = []
    with torch.no_grad():
        for batch in data.val_dataloader():
            sharded = model.embedding_bag_collection(batch.sparse_features).to_dict()
            unsharded = reference.embedding_bag_collection(batch.sparse_features).to_dict()
            exact += [torch.equal(sharded[k], v) for k, v in unsharded.items()]
    stats = t.strategy.total_comm_stats()
    return {**result, "exact": exact, "calls": stats.calls, "raw_bytes": stats.raw_bytes,
            "sent_bytes": stats.sent_bytes, "exchanges": len(t.strategy.exchanges)}


@pytest.mark.slow
def test_single_device_trains_with_string_alias_and_its_all_to_all_is_an_exact_local_copy() -> None:
    (result,) = run_ranks(_single_device, 1)
    assert result["losses"][-1] < result["losses"][0]
    assert len(result["owned"]) == len(FEATURES)
    assert result["exchanges"] == 1 and result["calls"] > 0  # the compressed exchange is installed and called
    assert len(result["exact"]) == 4 * 26 and all(result["exact"])  # 4 batches x 26 keys, bit for bit
    assert result["raw_bytes"] == result["sent_bytes"] == 0


def test_strategy_string_alias_resolves() -> None:
    t = pl.Trainer(strategy="dlac", accelerator="cpu", devices=2, logger=False)
    assert isinstance(t.strategy, DLACStrategy)
    sgd = DLACStrategy(sharding=ShardingOptions(embedding_optimizer="sgd"))
    t = pl.Trainer(strategy=sgd, accelerator="cpu", devices=2, logger=False)
    assert t.strategy.sharding.embedding_optimizer == "sgd"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sharding": {"sharding_types": ["diagonal"]}}, "unknown sharding type 'diagonal'"),
        ({"sharding": {"sharding_types": []}}, "sharding_types is empty"),
        ({"sharding": {"embedding_optimizer": "lamb"}}, "embedding_optimizer='lamb' is not supported"),
        ({"sharding": {"embedding_lr": 0.0}}, "embedding_lr=0.0 must be > 0"),
        ({"sharding": {"memory_budget_bytes": -1}}, "memory_budget_bytes=-1"),
        ({"timeout": -5}, "timeout=-5"),
        ({"compression": {"eps": 0.0}}, "eps=0.0 is out of range"),
        ({"compression": {"backward": "int4"}}, "backward='int4' is not supported"),
        ({"compression": {"enabled": "sometimes"}}, "enabled='sometimes' must be true or false"),
        ({"compression": {"enabled": False, "auto_fallback": True}}, "auto_fallback=True needs enabled=True"),
        ({"compression": {"auto_fallback": True, "fallback_check_every": 0}},
         "fallback_check_every=0 must be a whole number >= 1"),
        ({"sharding": {"table_constraints": {"t_cat_0": {"sharding": ["row_wise"]}}}}, "unknown option"),
        ({"sharding": {"table_constraints": {"t_cat_0": {"sharding_types": ["rowwise"]}}}},
         "unknown sharding type 'rowwise'"),
        ({"checkpointing": {"verify": "yes"}}, "verify='yes' must be true or false"),
        ({"sharding": {"static_graph": "no"}}, "static_graph='no' must be true or false"),
    ],
)
def test_invalid_configuration_is_rejected_at_construction(kwargs: dict, message: str) -> None:
    classes = {"sharding": ShardingOptions, "compression": CompressionOptions, "checkpointing": CheckpointOptions}
    with pytest.raises(ValueError, match=message):
        DLACStrategy(**{k: classes[k](**v) if k in classes else v for k, v in kwargs.items()})


def _pinned(requirements: str, package: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "requirements" / requirements).read_text()
    return re.search(rf"^{re.escape(package)}==(\S+)", text, re.M)[1]


def test_missing_torchrec_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix names the versions requirements/ pins: the message and the pins move together."""
    from lightning_dlac.engine import _torchrec

    torchrec, fbgemm = _pinned("torchrec.txt", "torchrec"), _pinned("cpu.txt", "fbgemm-gpu-cpu")
    assert (_torchrec.TORCHREC_VERSION, _torchrec.FBGEMM_VERSION) == (torchrec, fbgemm)
    assert _pinned("cpu.txt", "torch").startswith(_torchrec.TORCH_VERSION)
    monkeypatch.setitem(sys.modules, "torchrec", None)
    fix = rf"needs `torchrec`.*pip install --no-deps torchrec=={re.escape(torchrec)}"
    with pytest.raises(ModuleNotFoundError, match=fix):
        DLACStrategy()


def _startup_error(rank: int, world_size: int, case: str) -> str:
    from lightning.pytorch.demos.boring_classes import BoringModel

    strategy = DLACStrategy()
    model: pl.LightningModule = small_dlrm()
    if case == "too_large":
        strategy = DLACStrategy(sharding=ShardingOptions(memory_budget_bytes=30_000))
    elif case == "unknown_table":
        unknown = {"t_nope": {"sharding_types": ["row_wise"]}}
        strategy = DLACStrategy(sharding=ShardingOptions(table_constraints=unknown))
    elif case == "unsupported_on_cpu":
        strategy = DLACStrategy(sharding=ShardingOptions(sharding_types=["row_wise"]))
    elif case == "no_tables":
        model = BoringModel()
    elif case == "fused_in_optimizer":
        model.configure_optimizers = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # type: ignore[method-assign]
    try:
        trainer(world_size, strategy, max_steps=1).fit(model, datamodule=small_data(train_batches=2))
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("too_large", r"ValueError: Embedding table 't_cat_10' \(240 rows x 16 dims.*Raise memory_budget_bytes"),
        ("unknown_table", r"ValueError: table_constraints names tables that the model does not have: \['t_nope'\]"),
        (
            "unsupported_on_cpu",
            r"ValueError: Table 't_cat_0' may only use sharding types \['row_wise'\].*supported there",
        ),
        ("no_tables", r"NoEmbeddingTablesError: DLACStrategy found no torchrec EmbeddingBagCollection.* in Boring"),
        ("fused_in_optimizer", r"ValueError: An optimizer .* includes embedding-table parameters"),
    ],
)
def test_wrong_configuration_fails_at_startup_with_a_fix(case: str, message: str) -> None:
    (error,) = run_ranks(_startup_error, 1, case)
    assert re.search(message, error, flags=re.S), error


def test_auto_fallback_configures_the_uncompressed_fallback() -> None:
    auto = DLACStrategy(compression=CompressionOptions(auto_fallback=True, fallback_check_every=16))
    assert auto.compress and auto.compression.auto_fallback and auto.compression.fallback_check_every == 16
    off = DLACStrategy(compression=CompressionOptions(enabled=False))
    assert not DLACStrategy().compression.auto_fallback and not off.compress
    overlapped = DLACStrategy(compression=CompressionOptions(overlap=True))
    assert overlapped.compression.overlap is True and DLACStrategy().compression.overlap is None


def _with_batch_norm() -> pl.LightningModule:
    """The small DLRM with a BatchNorm over its dense features (in the dense part, which DDP trains)."""
    model = small_dlrm()
    dense = model.model.dense_arch
    dense.model = torch.nn.Sequential(torch.nn.BatchNorm1d(13), dense.model)
    return model


def _sync_batchnorm(rank: int, world_size: int, accelerator: str) -> dict:
    seen: dict = {}

    class Seen(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            seen["during"] = type(pl_module.model.dense_arch.model[0]).__name__

    model = _with_batch_norm()
    compression = CompressionOptions(enabled=accelerator == "cpu")
    t = trainer(world_size, DLACStrategy(compression=compression), accelerator=accelerator, max_steps=2,
                sync_batchnorm=True, callbacks=[Seen()], limit_val_batches=0)
    try:
        t.fit(model, datamodule=small_data(train_batches=2))
    except ValueError as err:
        return {"error": str(err)}
    return {"error": None, "during": seen.get("during"), "after": type(model.model.dense_arch.model[0]).__name__}


@pytest.mark.slow
def test_sync_batchnorm_on_cpu_processes_is_refused_with_the_fix() -> None:
    # torch's SyncBatchNorm only synchronises on GPUs: on CPU its first forward would fail, so setup refuses.
    for result in run_ranks(_sync_batchnorm, 2, "cpu"):
        assert result["error"] is not None and re.search(
            r"sync_batchnorm=True.*\(model\.dense_arch\.model\.0\).*only on GPUs.*Remove sync_batchnorm=True",
            result["error"], flags=re.S), result


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sync_batchnorm_turns_the_dense_batch_norms_into_sync_batch_norm_on_gpus() -> None:
    (result,) = run_ranks(_sync_batchnorm, 1, "gpu")
    assert result == {"error": None, "during": "SyncBatchNorm", "after": "_BatchNormXd"}, result


def _lines_without_docstrings(path: Path, name: str) -> int:
    """Lines of class ``name`` in ``path`` (decorators and blank lines included), every docstring in it excluded."""
    import ast

    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    docstrings: set[int] = set()
    for node in ast.walk(cls):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    start = min([d.lineno for d in cls.decorator_list] + [cls.lineno])
    return sum(1 for line in range(start, cls.end_lineno + 1) if line not in docstrings)


def test_the_strategy_class_stays_lightning_hooks_that_delegate() -> None:
    """DLACStrategy holds Lightning's hooks; the work lives in the engine (sharding, checkpoints, the pipeline,
    elastic rendezvous) and in plugin/_checks.py. A class past 300 lines is taking work back."""
    import lightning_dlac.plugin.strategy as module

    assert _lines_without_docstrings(Path(module.__file__), "DLACStrategy") <= 300


def _meta_tables(rank: int, world_size: int) -> dict:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    torch.manual_seed(0)
    model = small_dlrm(table_device="meta")
    assert all(p.device.type == "meta" for p in model.embedding_bag_collection.parameters())
    recorder = loss_recorder()
    t = trainer(world_size, DLACStrategy(), max_epochs=1, callbacks=[recorder])
    t.fit(model, datamodule=small_data(train_batches=8))
    held, rows = 0, 0
    for key, value in model.state_dict().items():
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                assert shard.tensor.device.type == "cpu" and torch.isfinite(shard.tensor).all(), key
                assert shard.tensor.std() > 0, key  # initialized by TorchRec, not left empty or zero
                held += shard.tensor.shape[0]
            rows += value.size(0)
    return {"losses": recorder.losses, "held": held, "rows": rows}


@pytest.mark.slow  # a 2-rank fit
def test_tables_built_on_the_meta_device_are_initialized_where_they_are_sharded_and_train() -> None:
    """``DLRMModule(table_device="meta")`` builds no table memory; each rank initializes only the shards it holds
    (tables that do not fit one process, e.g. MLPerf's 40M-row ones), and the run trains."""
    results = run_ranks(_meta_tables, 2)
    assert sum(r["held"] for r in results) == results[0]["rows"] > max(r["held"] for r in results)
    for r in results:
        assert len(r["losses"]) == 8 and all(math.isfinite(x) for x in r["losses"])
        assert r["losses"][-1] < r["losses"][0]


def test_a_model_of_mlperf_sized_tables_on_the_meta_device_costs_no_memory() -> None:
    from lightning_dlac.examples.dlrm import DLRMModule

    sizes = [40_000_000] * 26  # 133 GB of float32 at dim 128, were it allocated
    model = DLRMModule(num_embeddings_per_feature=sizes, embedding_dim=128, dense_arch_layer_sizes=[128],
                       over_arch_layer_sizes=[8, 1], table_device="meta")  # fmt: skip
    weights = [p for p in model.embedding_bag_collection.parameters()]
    assert len(weights) == 26 and all(w.device.type == "meta" and w.shape == (40_000_000, 128) for w in weights)
    with pytest.raises(ValueError, match=r"table_device='cuda' is not supported; choose one of 'cpu', 'meta'"):
        DLRMModule(table_device="cuda")
