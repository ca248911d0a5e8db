"""Every public option of DLACStrategy and DLACCallback (docs/configuration.md) changes what a fit does: each check
below fails if its option were ignored. Independent options share one 2-rank run (process start-up dominates)."""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._launch import run_ranks
from tests.conftest import (
    TABLES,
    bounds_recorder,
    load_global_weights,
    loss_recorder,
    memory_logger,
    small_data,
    small_dlrm,
    trainer,
)


def _ddp_options(strategy: Any) -> list[tuple[bool, bool, int]]:
    """(find_unused_parameters, static_graph, bucket bytes) of the DDP that TorchRec wraps the dense part in."""
    from torch.nn.parallel import DistributedDataParallel

    return [(m.find_unused_parameters, m.static_graph, m.bucket_bytes_cap)
            for m in strategy.distributed_model.modules() if isinstance(m, DistributedDataParallel)]


def _momentum_shapes(strategy: Any) -> set[tuple[int, ...]]:
    """Shapes of the fused embedding optimizer's state: none for SGD, [rows, dim] for Adagrad, [rows] row-wise."""
    state = strategy.distributed_model.fused_optimizer.state_dict()["state"]
    return {tuple(v.shape) for per_table in state.values() for v in per_table.values() if hasattr(v, "shape")}


def _first_step_update() -> Any:
    """A callback measuring the largest change of any sharded table element over the first training batch."""
    import lightning.pytorch as pl
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    class FirstStepUpdate(pl.Callback):
        def __init__(self) -> None:
            self.before: dict[str, torch.Tensor] = {}
            self.update = 0.0

        def _shards(self, pl_module: Any) -> dict[str, torch.Tensor]:
            out = {}
            for key, value in pl_module.embedding_bag_collection.state_dict().items():
                if isinstance(value, ShardedTensor):
                    for i, shard in enumerate(value.local_shards()):
                        out[f"{key}/{i}"] = shard.tensor.detach().clone()
            return out

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx == 0:
                self.before = self._shards(pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            if batch_idx == 0:
                after = self._shards(pl_module)
                self.update = max(float((after[k] - v).abs().max()) for k, v in self.before.items() if v.numel())

    return FirstStepUpdate()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _option_fits(rank: int, world_size: int, ckpt_dir: str) -> dict:
    import torch.distributed as dist
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_dlac import DLACCallback, DLACStrategy

    out: dict[str, Any] = {}

    # --- A: SGD tables, compress="auto", the DDP options, a late calibration with custom candidates and probe bound,
    # no per-table metrics, no progress-bar entry; then Trainer.validate / test / predict on the fitted model.
    torch.manual_seed(0)
    strategy = DLACStrategy(eps=0.02, embedding_optimizer="sgd", compress="auto", fallback_check_every=2,
                            process_group_backend="gloo", find_unused_parameters=True, static_graph=True,
                            bucket_cap_mb=1, overlap=True)
    dlac = DLACCallback(calibration_start=3, calibration_batches=2, sensitivity_batches=1, candidates=[0.02, 0.04],
                        index_eps=0.99, per_table_metrics=False, prog_bar=False, c=1.0, log_every_n_steps=2)
    recorder, losses, memory = bounds_recorder(dlac), loss_recorder(), memory_logger()
    model, data = small_dlrm(), small_data(train_batches=8)
    # The memory logger has no directory, so the report goes to default_root_dir: keep it out of the checkout.
    t = trainer(world_size, strategy, max_epochs=1, callbacks=[dlac, recorder, losses], logger=[memory],
                limit_val_batches=0, default_root_dir=str(Path(ckpt_dir).parent / "run"))
    t.fit(model, datamodule=data)
    out["A"] = {
        "overlapped": [a2a.overlapped for a2a in t.strategy.exchanges],
        "backend": dist.get_backend(),
        "ddp": _ddp_options(t.strategy),
        "momentum": _momentum_shapes(t.strategy),
        "losses": losses.losses,
        "effective": recorder.effective,
        "table_bounds": recorder.table_bounds,
        "classes": {k: str(v) for k, v in dlac.classes.items()},
        "stats": {k: v.as_dict() for k, v in dlac.table_stats.items()},
        "report": dlac.calibration_report(),
        "logged": [sorted(m) for _, m in memory.rows],
        "uncompressed_share": [m["dlac/uncompressed_share"] for _, m in memory.rows if "dlac/uncompressed_share" in m],
        "prog_bar": sorted(t.progress_bar_metrics),
    }

    # --- B: row-wise Adagrad with a huge epsilon (updates ~lr * g / eps), one data-parallel table (its all-to-all
    # is TorchRec's, and the log says so), a progress-bar ratio.
    handler = _Records()
    logging.getLogger("lightning_dlac").addHandler(handler)
    torch.manual_seed(0)
    update = _first_step_update()
    dlac = DLACCallback(calibration_batches=1, sensitivity_batches=0, log_every_n_steps=1, report=False)
    strategy = DLACStrategy(embedding_optimizer="rowwise_adagrad", adagrad_epsilon=10.0,
                            table_constraints={"t_cat_0": {"sharding_types": ["data_parallel"]}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = trainer(world_size, strategy, max_steps=2, callbacks=[update, dlac], limit_val_batches=0)
        t.fit(small_dlrm(), datamodule=small_data(train_batches=2))
    logging.getLogger("lightning_dlac").removeHandler(handler)
    out["B"] = {"update": update.update, "momentum": _momentum_shapes(t.strategy), "ddp": _ddp_options(t.strategy),
                "compressed": t.strategy.all_compressed_tables, "prog_bar": sorted(t.progress_bar_metrics),
                "messages": handler.messages + [str(w.message) for w in caught]}

    # --- C: the same with the default epsilon, checkpointing every step and keeping one; then Trainer.validate /
    # test / predict on the fitted model.
    torch.manual_seed(0)
    update = _first_step_update()
    model, data = small_dlrm(), small_data(train_batches=3)
    t = trainer(world_size, DLACStrategy(embedding_optimizer="rowwise_adagrad"), max_steps=3,
                callbacks=[update, ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=1)],
                enable_checkpointing=True)
    t.fit(model, datamodule=data)
    out["C"] = {"update": update.update, "momentum": _momentum_shapes(t.strategy)}
    val_loader = data.val_dataloader()
    (validated,) = t.validate(model, dataloaders=val_loader, verbose=False)
    (tested,) = t.test(model, dataloaders=val_loader, verbose=False)
    calls = t.strategy.total_comm_stats().calls
    predictions = t.predict(model, dataloaders=val_loader)
    out["C"].update(validated=validated, tested=tested,
                    predictions=[(tuple(p.shape), bool(torch.isfinite(p).all())) for p in predictions],
                    predict_calls=t.strategy.total_comm_stats().calls - calls)
    out["D"] = _variable_batch(world_size)

    # --- E: C's first step with a tenth of the embedding learning rate.
    torch.manual_seed(0)
    update = _first_step_update()
    t = trainer(world_size, DLACStrategy(embedding_optimizer="rowwise_adagrad", embedding_lr=0.005), max_steps=1,
                callbacks=[update], limit_val_batches=0)
    t.fit(small_dlrm(), datamodule=small_data(train_batches=1))
    out["E"] = {"update": update.update}
    dist.barrier()
    return out


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
    import copy

    from torch.utils.data import DataLoader
    from torchrec.datasets.utils import Batch

    from lightning_dlac import DLACStrategy

    rank = int(torch.distributed.get_rank())
    model = small_dlrm()
    reference = copy.deepcopy(model)
    kjt = _variable_batch_kjt(rank)
    batch = Batch(dense_features=torch.rand(10, 13), sparse_features=kjt, labels=torch.randint(0, 2, (10,)).float())
    t = trainer(world_size, DLACStrategy(embedding_optimizer="rowwise_adagrad"), limit_val_batches=1)
    (metrics,) = t.validate(model, dataloaders=DataLoader([batch], batch_size=None), verbose=False)
    load_global_weights(model, reference.state_dict())
    with torch.no_grad():
        sharded = model.embedding_bag_collection(kjt).to_dict()
        unsharded = reference.embedding_bag_collection(kjt).to_dict()
    return {"loss": metrics["val/loss"], "shapes": sorted({tuple(v.shape) for v in sharded.values()}),
            "exact": all(torch.equal(sharded[k], v) for k, v in unsharded.items()), "keys": len(unsharded)}


@pytest.fixture(scope="module")
def option_fits(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    ckpt_dir = tmp_path_factory.mktemp("ckpt")
    return run_ranks(_option_fits, 2, str(ckpt_dir)), ckpt_dir


@pytest.mark.slow
def test_embedding_optimizer_epsilon_and_lr_reach_the_fused_optimizer(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        assert r["A"]["momentum"] == set()  # sgd keeps no state
        rows = {shape[0] for shape in r["C"]["momentum"]}
        assert rows and all(len(shape) == 1 for shape in r["C"]["momentum"]), r["C"]  # rowwise: one per row
        assert r["B"]["momentum"] and all(len(shape) == 1 for shape in r["B"]["momentum"])
        # Row-wise Adagrad moves an element by about lr (0.05) in its first step; with eps=10 by lr * |g| / 10.
        assert r["C"]["update"] > 0.01, r["C"]
        assert r["B"]["update"] < r["C"]["update"] / 100, (r["B"]["update"], r["C"]["update"])
        # Same initial tables, same first batch: Adagrad's first step scales with embedding_lr (0.05 vs 0.005).
        assert r["E"]["update"] == pytest.approx(r["C"]["update"] / 10, rel=0.05), (r["E"], r["C"]["update"])


@pytest.mark.slow
def test_ddp_options_process_group_backend_and_overlap_are_applied(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        assert r["A"]["backend"] == "gloo"
        assert r["A"]["overlapped"] and all(r["A"]["overlapped"])  # overlap=True over gloo, in a whole fit
        assert r["A"]["ddp"] == [(True, True, 1 * 2**20)], r["A"]["ddp"]
        assert r["B"]["ddp"] == [(False, False, 25 * 2**20)], r["B"]["ddp"]  # the defaults
    from lightning_dlac import DLACStrategy

    assert DLACStrategy(process_group_backend="nccl").process_group_backend == "nccl"


@pytest.mark.slow
def test_compress_auto_inside_a_fit_reports_its_uncompressed_share(option_fits: tuple[list[dict], Path]) -> None:
    r0, r1 = option_fits[0]
    assert len(r0["A"]["losses"]) == 8 and all(math.isfinite(v) for v in r0["A"]["losses"])
    shares = r0["A"]["uncompressed_share"]
    assert len(shares) >= 4 and all(0.0 <= s <= 1.0 for s in shares), shares  # every 2 of 8 batches, rank 0 writes
    assert not r1["A"]["uncompressed_share"]


@pytest.mark.slow
def test_calibration_start_candidates_and_index_eps_shape_the_calibration(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        a = r["A"]
        # Measured on batches 3 and 4 (calibration_start=3, 2 batches): the strategy's eps until batch 5, the
        # calibrated bounds from then on.
        for t, (effective, bounds) in enumerate(zip(a["effective"], a["table_bounds"])):
            if t < 5:
                assert bounds == {} and effective == dict.fromkeys(TABLES, 0.02), t
            else:
                assert bounds and effective == bounds, t
        for name, s in a["stats"].items():
            assert s["chunks"] == 2 * 2, name  # 2 calibration batches x 2 destination ranks
            assert len(s["encoded_bytes"]) == 2, name  # one size per custom candidate
        for row in a["report"]:
            assert sorted(row["ratio"]) == ["0.02", "0.04"] and sorted(row["loss_change"]) == ["0.02", "0.04"], row
            # At index_eps=0.99 a code is 1 only within 1% of the chunk maximum: nearly every row quantizes to zeros,
            # so every table looks homogeneous (the default probe, base_eps, sees them diverse).
            assert row["homogenization_index"] < 0.5, row
        assert set(a["classes"].values()) == {"tight"}, a["classes"]


@pytest.mark.slow
def test_per_table_metrics_and_prog_bar(option_fits: tuple[list[dict], Path]) -> None:
    r0 = option_fits[0][0]
    logged = [keys for keys in r0["A"]["logged"] if "dlac/ratio" in keys]
    assert logged and not [k for keys in logged for k in keys if k.startswith(("dlac/eps/", "dlac/ratio/"))]
    assert "dlac/ratio" not in r0["A"]["prog_bar"]
    assert "dlac/ratio" in r0["B"]["prog_bar"]  # prog_bar=True, the default


@pytest.mark.slow
def test_validate_test_and_predict_run_on_the_sharded_model(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        a = r["C"]
        assert a["tested"] == a["validated"] and 0 < a["validated"]["val/auroc"] < 1, (a["tested"], a["validated"])
        assert a["predictions"] == [((64,), True)] * 4, a["predictions"]  # 4 validation batches per rank
        assert a["predict_calls"] == 4, a["predict_calls"]  # each through the compressed all-to-all


@pytest.mark.slow
def test_variable_batch_input_takes_torchrec_s_uncompressed_path_exactly(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        d = r["D"]
        assert math.isfinite(d["loss"]) and d["keys"] == 26 and d["shapes"] == [(10, 16)], d
        assert d["exact"], d  # variable batch per feature is not compressed: TorchRec's own all-to-all


@pytest.mark.slow
def test_a_data_parallel_table_stays_uncompressed_and_the_log_says_so(option_fits: tuple[list[dict], Path]) -> None:
    for r in option_fits[0]:
        assert r["B"]["compressed"] == sorted(t for t in TABLES if t != "t_cat_0")
        assert any("data_parallel" in m and "uncompressed" in m for m in r["B"]["messages"]), r["B"]["messages"]


@pytest.mark.slow
def test_remove_checkpoint_deletes_the_replaced_checkpoint_directory(option_fits: tuple[list[dict], Path]) -> None:
    (kept,) = list(option_fits[1].iterdir())  # steps 1 and 2 were saved, then removed; step 3 is kept
    assert kept.is_dir() and "step=3" in kept.name and (kept / "meta.pt").is_file(), kept


# ------------------------------------------------------------------------------------- codec_impl without a compiler


def _without_a_compiler(rank: int, world_size: int, missing_cxx: str) -> dict:
    import os

    from lightning_dlac import DLACStrategy
    from lightning_dlac.codec import native_available
    from lightning_dlac.codec._loader import NativeUnavailable

    os.environ.pop("DLAC_CODEC_IMPL", None)  # the suite's "native" would turn codec_impl="auto" into "native"
    os.environ["CXX"] = missing_cxx
    out: dict[str, Any] = {"native_available": native_available()}
    for impl in ("ref", "auto", "native"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = trainer(world_size, DLACStrategy(codec_impl=impl), max_steps=2, limit_val_batches=0)
            try:
                t.fit(small_dlrm(), datamodule=small_data(train_batches=2))
                stats = t.strategy.total_comm_stats()
                error = None
            except NativeUnavailable as err:
                stats, error = None, str(err)
        out[impl] = {
            "error": error,
            "compressed": stats is not None and 0 < stats.sent_bytes < stats.raw_bytes,
            "fallback_warnings": [str(w.message) for w in caught if "native codec unavailable" in str(w.message)],
        }
    return out


@pytest.mark.slow
def test_codec_impl_selects_the_codec_and_native_available_says_whether_it_loads(tmp_path: Path) -> None:
    from lightning_dlac.codec import native_available
    from tests.conftest import native_expected

    if native_expected():
        assert native_available()
    for r in run_ranks(_without_a_compiler, 2, str(tmp_path / "no-such-c++")):
        assert r["native_available"] is False
        assert r["ref"] == {"error": None, "compressed": True, "fallback_warnings": []}  # never asks for the build
        assert r["auto"]["error"] is None and r["auto"]["compressed"], r["auto"]
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
    import copy

    from torch.utils.data import DataLoader

    from lightning_dlac import DLACStrategy

    model = _two_collections_module()
    reference = copy.deepcopy(model)
    losses = loss_recorder()
    t = trainer(world_size, DLACStrategy(eps=0.02), max_steps=4, callbacks=[losses])
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
    return {"exchanges": len(t.strategy.exchanges), "tables": t.strategy.all_compressed_tables,
            "raw": stats.raw_bytes, "sent": stats.sent_bytes, "losses": losses.losses, "worst": worst}


@pytest.mark.slow
def test_several_embedding_bag_collections_are_each_sharded_and_compressed() -> None:
    for r in run_ranks(_fit_two_collections, 2):
        assert r["exchanges"] == 2, r  # one compressed all-to-all per collection
        assert r["tables"] == sorted([f"t_user_{i}" for i in range(3)] + [f"t_item_{i}" for i in range(2)]), r
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


def test_class_thresholds_reach_the_classification() -> None:
    from lightning_dlac import DLACCallback
    from lightning_dlac.adaptive import TableClass

    # The same chunks, three threshold settings: each moves the table into the class the thresholds say.
    g = torch.Generator().manual_seed(0)
    crowd = torch.cat([torch.full((1, 8), -4.0), torch.full((1, 8), 4.0), 1e-4 * torch.randn(62, 8, generator=g)])
    classes = []
    for tight_below, loose_from in ((0.9, 0.99), (0.0, 0.0), (1.0, 1.0)):
        cal = DLACCallback(tight_below=tight_below, loose_from=loose_from, calibration_batches=1,
                           sensitivity_batches=0).calibrator
        cal.begin()
        cal.observe("crowded", crowd)  # distinct values within one bin of each other: index well below 0.9
        levels = torch.arange(4.0)[:, None].expand(4, 8)  # 4 rows whose values are far apart in every column
        cal.observe("apart", levels[torch.arange(64) % 4])  # the bound keeps every value apart: index 1.0
        cal.batch_measured()
        cal.finish(1, ["apart", "crowded"])
        classes.append(cal.classes)
    assert classes[0] == {"crowded": TableClass.TIGHT, "apart": TableClass.LOOSE}
    assert classes[1] == {"crowded": TableClass.LOOSE, "apart": TableClass.LOOSE}  # every index >= 0: loose
    assert classes[2] == {"crowded": TableClass.TIGHT, "apart": TableClass.LOOSE}  # only index 1.0 is not tight


@pytest.mark.parametrize(("start_method", "launcher"), [("popen", "_SubprocessScriptLauncher"),
                                                       ("spawn", "_MultiProcessingLauncher")])
def test_start_method_picks_lightning_s_launcher(start_method: str, launcher: str) -> None:
    import lightning.pytorch as pl

    from lightning_dlac import DLACStrategy

    t = pl.Trainer(accelerator="cpu", devices=2, strategy=DLACStrategy(start_method=start_method), logger=False,
                   enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    assert type(t.strategy.launcher).__name__ == launcher
    if start_method == "spawn":
        assert t.strategy.launcher._start_method == "spawn"
