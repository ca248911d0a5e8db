"""DLACStrategy(pipeline="sparse_dist"): TorchRec's sparse-dist pipeline under Lightning's loop.

A pipelined run trains exactly as an unpipelined one on 2 gloo ranks, loss for loss (uncompressed; compressed in both
directions with overlapped exchanges, DLACCallback's calibration, probes and decay; an optimizer that evaluates its
closure twice), its hooks see the same batches, validation and metrics run between pipelined steps, and a resumed
pipelined run continues the uninterrupted one. What the pipeline cannot run is refused with the reason. Its loader
reads one batch ahead and keeps a stateful loader's position.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dlac import CompressionOptions, DLACCallback, DLACStrategy, dense_parameters
from lightning_dlac.engine.pipeline import LookaheadLoader, lookahead_loader
from lightning_dlac.testing import run_ranks
from tests.conftest import loss_recorder, memory_logger, small_data, small_dlrm, trainer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"

# --------------------------------------------------------------------------------------------- without processes


def test_pipeline_option_is_off_by_default_and_checked_at_construction() -> None:
    assert DLACStrategy().pipeline is None and DLACStrategy().train_pipeline is None
    assert DLACStrategy(pipeline="sparse_dist").pipeline == "sparse_dist"
    with pytest.raises(ValueError, match=r"pipeline='semi_sync' is not supported; choose one of 'sparse_dist'"):
        DLACStrategy(pipeline="semi_sync")


def test_lookahead_loader_reads_one_batch_ahead_of_what_it_yields() -> None:
    read: list[int] = []
    loader = lookahead_loader(range(4), read.append)
    assert type(loader) is LookaheadLoader and len(loader) == 4
    seen = []
    for batch in loader:
        seen.append((batch, list(read)))
    # When the loop holds batch i, batch i + 1 has been read (the last batch has nothing after it).
    assert seen == [(0, [0, 1]), (1, [0, 1, 2]), (2, [0, 1, 2, 3]), (3, [0, 1, 2, 3])]
    assert list(lookahead_loader([], read.append)) == []
    with pytest.raises(TypeError):
        len(lookahead_loader(iter(range(3)), read.append))  # unsized, as Lightning expects to find out


class _CountingLoader:
    """A stateful loader (Lightning's protocol) whose state is how many batches of the pass it has handed out."""

    def __init__(self, n: int) -> None:
        self.n, self.served, self.resume_at = n, 0, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):  # noqa: ANN204
        self.served, self.resume_at = self.resume_at, 0
        for i in range(self.served, self.n):
            self.served = i + 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["served"]


def test_lookahead_loader_keeps_a_stateful_loaders_position_at_the_batch_the_loop_received() -> None:
    source = _CountingLoader(5)
    loader = lookahead_loader(source, lambda batch: None)
    assert hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")
    states = []
    for batch in loader:
        states.append((batch, loader.state_dict()["served"], source.served))
        if batch == 2:
            break
    # The source has served one batch more than the loop received; the saved position is the loop's.
    assert states == [(0, 1, 2), (1, 2, 3), (2, 3, 4)]
    saved = loader.state_dict()
    resumed_source = _CountingLoader(5)
    resumed = lookahead_loader(resumed_source, lambda batch: None)
    resumed.load_state_dict(saved)
    assert list(resumed) == [3, 4]  # the resumed pass starts after the last batch the loop trained on
    assert list(resumed) == [0, 1, 2, 3, 4]  # and the next pass from the beginning
    assert not hasattr(lookahead_loader(range(3), lambda batch: None), "state_dict")


def test_estimate_models_the_input_dist_and_what_the_pipeline_hides_of_it() -> None:
    from lightning_dlac.commands.estimate import (
        Codec,
        Link,
        Workload,
        input_dist_ms,
        pipeline_gains,
        predict,
        predict_all,
    )

    codec = Codec(forward_ratio=20.0, backward_ratio=5.0, encode_gb_s=1.0, decode_gb_s=2.0)
    link = Link(gbit_s=1.0, latency_us=100.0)
    # 2 features, one id each, batch 1000 per rank, 4 ranks: 3/4 * 1000 * (2 * 4 + 2 * 8) bytes in 3 * 3 messages.
    work = Workload(batch_per_rank=1000, embedding_dims=(8, 8), compute_ms=0.5, ids_per_sample=2)
    ids = input_dist_ms(work, link, 4)
    assert ids == pytest.approx(9 * 0.1 + 8 * (3 / 4 * 1000 * 24) / 1e9 * 1e3)  # 0.9 + 0.144 ms
    plain = predict("dlac_dlac", work, codec, link, 4)
    piped = predict("dlac_dlac", work, codec, link, 4, pipeline="sparse_dist")
    assert plain.input_dist_ms == pytest.approx(ids) and plain.parts["input_dist_ms"] == pytest.approx(ids)
    assert piped.input_dist_ms == pytest.approx(ids - 0.5)  # hidden behind the step's 0.5 ms of compute
    assert plain.step_ms - piped.step_ms == pytest.approx(0.5)
    assert predict("fp32", dataclasses.replace(work, compute_ms=5.0), codec, link, 4, "sparse_dist").input_dist_ms == 0
    # Without ids_per_sample the input dist stays inside compute_ms: the step is what it was before the term existed.
    old = dataclasses.replace(work, ids_per_sample=0.0)
    assert predict("fp32", old, codec, link, 4).step_ms == predict("fp32", old, codec, link, 4, "sparse_dist").step_ms
    assert input_dist_ms(old, link, 4) == 0.0
    piped_all, plain_all = predict_all(work, codec, link, 4, "sparse_dist"), predict_all(work, codec, link, 4)
    lines = pipeline_gains({4: piped_all}, {4: plain_all})
    assert len(lines) == 1 and lines[0].startswith("- 4 ranks: input dist 1.04 ms per step, on the path 0.54 ms")
    with pytest.raises(ValueError, match="pipeline 'semi_sync' is not modelled"):
        predict("fp32", work, codec, link, 4, pipeline="semi_sync")
    with pytest.raises(ValueError, match="ids_per_sample=-1 must be a finite number >= 0"):
        Workload(8, (8,), 1.0, ids_per_sample=-1)


def test_dlac_estimate_prints_what_the_pipeline_buys(caplog: pytest.LogCaptureFixture) -> None:
    from lightning_dlac.commands.cli import main as cli_main

    with caplog.at_level(logging.INFO):
        cli_main(["estimate", "--world-sizes", "8,512", "--gbit", "100", "--latency-us", "5", "--compute-ms", "5",
                  "--encode-gbps", "100", "--decode-gbps", "100", "--cast-gbps", "500", "--ids-per-sample", "26",
                  "--pipeline", "sparse_dist"])
    assert "input dist of 26 ids per sample hidden behind compute where it fits (sparse_dist)" in caplog.text
    gains = re.findall(r"- (\d+) ranks: input dist [\d.]+ ms .* DLAC both directions ([\d.]+)x", caplog.text)
    assert [w for w, _ in gains] == ["8", "512"] and 1.0 < float(gains[0][1]) < float(gains[1][1])


# --------------------------------------------------------------------------------------------- 2 gloo ranks


def _hooks_recorder() -> pl.Callback:
    """Records what Lightning's batch hooks see (batch index, a fingerprint of the batch, the loss) and, at the end
    of training, the pipeline's counters."""

    class Hooks(pl.Callback):
        def __init__(self) -> None:
            self.starts: list[tuple] = []
            self.ends: list[tuple] = []
            self.counters: tuple[int, int] | None = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            self.starts.append((trainer.current_epoch, batch_idx, float(batch.labels.sum()),
                                int(batch.sparse_features.values().sum())))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            self.ends.append((batch_idx, float(outputs["loss"])))

        def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
            pipeline = trainer.strategy.train_pipeline
            self.counters = None if pipeline is None else (pipeline.sent_ahead, pipeline.sent_in_step)

    return Hooks()


def _lbfgs(model: pl.LightningModule) -> None:
    """Train the dense part with LBFGS, whose closure Lightning evaluates twice per step (max_iter=2)."""
    model.configure_optimizers = lambda: torch.optim.LBFGS(dense_parameters(model), lr=0.05, max_iter=2)


CASES: dict[str, dict[str, Any]] = {
    # TorchRec's own exchanges, uncompressed.
    "uncompressed": dict(compression=dict(enabled=False), callback=False, epochs=2),
    # DLAC both directions, exchanges overlapped; DLACCallback calibrates on batches 3-5 (with a sensitivity probe
    # on the first: extra unpipelined forwards between pipelined steps) and decays the bounds; validation mid-epoch.
    "dlac": dict(compression=dict(backward="dlac", overlap=True), callback=True, epochs=2),
    # DLACCallback() with every default: it reads the run's length (from max_epochs) as training starts, after the
    # strategy has wrapped the loader (read in setup(), it set the loader up unwrapped: PipelineError).
    "dlac_default": dict(compression=dict(), callback="default", epochs=2),
    # An optimizer that evaluates its closure twice per step: the second forward of each batch runs unpipelined.
    "closure_twice": dict(compression=dict(), callback=False, epochs=1, optimizer=_lbfgs),
}


def _fit(world_size: int, case: str, pipeline: str | None) -> dict[str, Any]:
    spec = CASES[case]
    torch.manual_seed(0)
    model = small_dlrm()
    if "optimizer" in spec:
        spec["optimizer"](model)
    hooks, losses, logger = _hooks_recorder(), loss_recorder(), memory_logger()
    callbacks: list[pl.Callback] = [losses, hooks]
    dlac = None
    if spec["callback"] == "default":
        dlac = DLACCallback(report=False)
        callbacks.insert(0, dlac)
    elif spec["callback"]:
        dlac = DLACCallback(calibration_start=3, calibration_batches=3, sensitivity_batches=1, schedule="linear",
                            c=2.0, T=12, log_every_n_steps=4, report=False)
        callbacks.insert(0, dlac)
    strategy = DLACStrategy(pipeline=pipeline, compression=CompressionOptions(**spec["compression"]))
    t = trainer(world_size, strategy, max_epochs=spec["epochs"],
                callbacks=callbacks, logger=logger, val_check_interval=5, limit_val_batches=2, log_every_n_steps=4)
    t.fit(model, datamodule=small_data(train_batches=10))
    stats = t.strategy.total_comm_stats()
    return {
        "losses": losses.losses, "starts": hooks.starts, "ends": hooks.ends, "counters": hooks.counters,
        "val": {k: float(v) for k, v in t.callback_metrics.items() if k.startswith("val/")},
        "bytes": (stats.calls, stats.raw_bytes, stats.sent_bytes, stats.backward_raw_bytes, stats.backward_sent_bytes),
        "bounds": None if dlac is None else (dlac.table_bounds, {k: str(v) for k, v in dlac.classes.items()}),
        "logged": sorted({key for _, row in logger.rows for key in row}),
        "own_forward": type(model.embedding_bag_collection.forward).__name__,
        "pipeline_after_fit": t.strategy.train_pipeline,
    }


def _pipelined_and_unpipelined(rank: int, world_size: int, case: str) -> dict[str, dict[str, Any]]:
    return {"unpipelined": _fit(world_size, case, None), "pipelined": _fit(world_size, case, "sparse_dist")}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
def test_pipelined_run_trains_exactly_as_the_unpipelined_run(case: str) -> None:
    epochs, batches = CASES[case]["epochs"], 10  # per rank and epoch
    for rank, result in enumerate(run_ranks(_pipelined_and_unpipelined, 2, case, timeout=540)):
        plain, piped = result["unpipelined"], result["pipelined"]
        assert len(piped["losses"]) == epochs * batches
        # Order changes, semantics do not: the same losses, bit for bit, and the same validation metrics.
        assert piped["losses"] == plain["losses"]
        assert piped["val"] == plain["val"] and piped["val"]
        # Lightning's hooks saw the same steps: same batch indices, same batches, same outputs.
        assert piped["starts"] == plain["starts"] and piped["ends"] == plain["ends"]
        # The pipeline did run: every step but the first of each epoch had its ids sent during the step before.
        assert piped["counters"] == (epochs * (batches - 1), epochs) and plain["counters"] is None
        # The compressed exchange sent the same bytes; the callback chose the same bounds and logged the same keys.
        assert piped["bytes"] == plain["bytes"]
        assert piped["bounds"] == plain["bounds"] and piped["logged"] == plain["logged"]
        if CASES[case]["callback"]:  # calibrated, and its metrics written (by rank 0) between pipelined steps
            assert piped["bounds"][0] and (rank or any(k.startswith("dlac/eps/") for k in piped["logged"]))
        if CASES[case]["compression"].get("enabled", True):
            assert piped["bytes"][0] > 0 and piped["bytes"][2] < piped["bytes"][1]  # compressed, and counted
        # After fit the module has its own forwards back and the strategy holds no pipeline.
        assert piped["own_forward"] == "method" and piped["pipeline_after_fit"] is None


def _resume(rank: int, world_size: int, ckpt_dir: str, compression: dict[str, Any] | None = None,
            nodes: int = 1) -> dict[str, Any]:
    """An uninterrupted unpipelined 2-epoch run, and the same run pipelined, checkpointed after its first epoch and
    resumed (``compression``: CompressionOptions fields for all three; ``nodes``: the ranks launched as that many
    nodes of ``world_size / nodes`` ranks each, as Lightning's multi-node launch numbers them)."""
    passed = []
    per_node = world_size // nodes
    topology: dict[str, Any] = {}
    if nodes > 1:
        os.environ.update(NODE_RANK=str(rank // per_node), LOCAL_RANK=str(rank % per_node))
        topology = {"num_nodes": nodes}

    def run(pipeline: str | None, epochs: int, checkpoint: bool, ckpt_path: str | None) -> tuple[list, DLACCallback]:
        torch.manual_seed(0)
        recorder = loss_recorder()
        # Calibrated from batches 4, 9, 14 and 19: none is due between the first run's end (10) and the resume, where
        # the run that ended would have skipped it (its bounds would apply to no batch of that run).
        dlac = DLACCallback(calibration_start=2, calibration_batches=2, recalibrate_every=3, sensitivity_batches=0,
                            schedule="linear", T=15, log_every_n_steps=5, report=False)
        callbacks: list = [recorder, dlac]
        if checkpoint:
            callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
        strategy = DLACStrategy(pipeline=pipeline, compression=CompressionOptions(**(compression or {})))
        t = trainer(per_node, strategy, max_epochs=epochs,
                    callbacks=callbacks, enable_checkpointing=checkpoint, **topology)
        t.fit(small_dlrm(), datamodule=small_data(train_batches=10), ckpt_path=ckpt_path)
        stats = t.strategy.total_comm_stats()
        passed.append((stats.passed_bytes, stats.same_node_sent_bytes, stats.other_nodes_sent_bytes))
        return recorder.losses, dlac

    uninterrupted, u = run(None, 2, False, None)
    run("sparse_dist", 1, True, None)
    (ckpt,) = list(Path(ckpt_dir).iterdir())
    resumed, r = run("sparse_dist", 2, False, str(ckpt))
    return {"uninterrupted": uninterrupted, "resumed": resumed, "steps": (u.step, r.step),
            "bounds": (u.table_bounds, r.table_bounds), "calibrations": (u.calibrator.calibrations,
                                                                         r.calibrator.calibrations),
            "links": passed}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resumed_pipelined_run_continues_the_uninterrupted_run_exactly(tmp_path: Path) -> None:
    for result in run_ranks(_resume, 2, str(tmp_path), timeout=540):
        assert len(result["resumed"]) == 10
        assert result["resumed"] == result["uninterrupted"][10:]
        assert result["steps"] == (20, 20) and result["bounds"][0] == result["bounds"][1]
        assert result["calibrations"][0] == result["calibrations"][1]
        assert [c["at"] for c in result["calibrations"][0]] == [4, 9, 14, 19]


# --------------------------------------------------------------------------------------------- refused, with reasons


def _refused_case(case: str) -> tuple[pl.LightningModule, Any]:
    from torchrec import KeyedJaggedTensor

    model = small_dlrm()
    data = small_data(train_batches=4)
    base = type(model)
    if case == "untraceable":
        def forward(self, batch):  # noqa: ANN001, ANN202
            if batch.labels.sum() > 0:  # a branch on a traced value: torch.fx cannot follow it
                return base.forward(self, batch)
            return base.forward(self, batch) * 0
        model.__class__ = type("BranchingDLRM", (base,), {"forward": forward})
    elif case == "input_changed_in_forward":
        def forward(self, batch):  # noqa: ANN001, ANN202
            ids = batch.sparse_features
            remapped = KeyedJaggedTensor(keys=ids.keys(), values=ids.values() % 40, lengths=ids.lengths())
            return self.model(batch.dense_features, remapped).squeeze(-1)
        model.__class__ = type("RemappingDLRM", (base,), {"forward": forward})
    elif case == "other_input_in_training_step":
        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN202
            ids = batch.sparse_features
            copied = KeyedJaggedTensor(keys=ids.keys(), values=ids.values().clone(), lengths=ids.lengths())
            logits = self.model(batch.dense_features, copied).squeeze(-1)
            return self.loss_fn(logits, batch.labels)
        model.__class__ = type("CopyingDLRM", (base,), {"training_step": training_step})
    elif case == "dataloader_iter":
        def training_step(self, dataloader_iter):  # noqa: ANN001, ANN202
            batch = next(dataloader_iter)
            return base.training_step(self, batch, 0)
        model.__class__ = type("IterDLRM", (base,), {"training_step": training_step})
    elif case == "on_before_batch_transfer":
        model.__class__ = type("HookedDLRM", (base,), {"on_before_batch_transfer": lambda self, b, i: b})
    return model, data


REFUSED_PRECISION = {"input_converting_precision": "bf16-true"}  # the cases whose Trainer sets a precision


def _refusals(rank: int, world_size: int) -> dict[str, str]:
    out = {}
    for case in ("untraceable", "input_changed_in_forward", "other_input_in_training_step", "dataloader_iter",
                 "on_before_batch_transfer", "input_converting_precision"):
        model, data = _refused_case(case)
        precision = {"precision": REFUSED_PRECISION[case]} if case in REFUSED_PRECISION else {}
        try:
            trainer(world_size, DLACStrategy(pipeline="sparse_dist"), max_steps=2, **precision).fit(model,
                                                                                                   datamodule=data)
        except Exception as err:  # noqa: BLE001 - the test compares type and message
            out[case] = f"{type(err).__name__}: {err}"
        else:
            out[case] = "no error"
    return out


@pytest.mark.slow
def test_what_the_pipeline_cannot_run_is_refused_with_the_reason_and_the_fix() -> None:
    (errors,) = run_ranks(_refusals, 1)
    expected = {
        "untraceable": r"PipelineError: pipeline='sparse_dist' could not trace BranchingDLRM\.forward with torch\.fx"
                       r" \(TraceError: .*\).*must be symbolically traceable.*pipeline=None",
        "input_changed_in_forward": r"PipelineError: .*found no sharded embedding module in RemappingDLRM\.forward"
                                    r" that takes its input straight from the batch.*pipeline=None",
        "other_input_in_training_step": r"PipelineError: .*model\.sparse_arch\.embedding_bag_collection was called in"
                                        r" training_step with another input than batch\.sparse_features",
        "dataloader_iter": r"ValueError: DLACStrategy\(pipeline='sparse_dist'\) cannot train this run:"
                           r" IterDLRM\.training_step takes a dataloader_iter",
        "on_before_batch_transfer": r"ValueError: .*HookedDLRM\.on_before_batch_transfer is overridden",
        "input_converting_precision": r"ValueError: .*the precision plugin HalfPrecision converts every batch.*"
                                      r"16-mixed, bf16-mixed",
    }
    for case, pattern in expected.items():
        assert re.search(pattern, errors[case], flags=re.S), (case, errors[case])


# --------------------------------------------------------------------------------------------- the shipped config


def _short(config: Path, tmp_path: Path) -> Path:
    """A shipped config scaled down to 8 steps, calibrating on batches 1-2 (the probe included), logs in tmp_path."""
    text = config.read_text()
    for old, new in (("calibration_start: 48", "calibration_start: 1"), ("calibration_batches: 8",
                     "calibration_batches: 2"), ("T: 96", "T: 4"), ("log_every_n_steps: 16", "log_every_n_steps: 2"),
                     ("save_dir: logs", f"save_dir: {tmp_path / 'logs'}")):
        assert old in text, (config.name, old)
        text = text.replace(old, new)
    short = tmp_path / config.name
    short.write_text(text)
    return short


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_dlac_fit_of_the_pipelined_config_trains_as_the_demo_config(tmp_path: Path) -> None:
    """`dlac fit --config examples/configs/dlrm_pipelined.yaml` as a user runs it (Lightning launches the second rank),
    against the demo config it pipelines: the same logged losses, bytes and calibrated bounds."""
    from tests.commands.test_cli import SHORT_RUN, _dlac

    runs = {}
    for name in ("dlrm_pipelined", "dlrm_synthetic"):
        work = tmp_path / f"cwd_{name}"
        work.mkdir()
        proc = _dlac(["fit", "--config", str(_short(CONFIGS / f"{name}.yaml", tmp_path)), "--data.batch_size=256",
                      *SHORT_RUN], cwd=work, timeout=420)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        (run_dir,) = list((tmp_path / "logs" / name).glob("version_*"))
        with open(run_dir / "metrics.csv") as f:
            losses = [(row["step"], row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]
        run = json.loads((run_dir / "dlac_run.json").read_text())
        summary = run["summary"]
        runs[name] = {"out": out, "losses": losses, "bytes": (summary["raw_bytes"], summary["sent_bytes"]),
                      "bounds": run["table_bounds"], "final": run["final_metrics"]}
    piped, plain = runs["dlrm_pipelined"], runs["dlrm_synthetic"]
    assert "training through TorchRec's sparse-dist pipeline" in piped["out"]
    assert "sparse-dist pipeline" not in plain["out"]
    assert len(piped["losses"]) == 4 and piped["losses"] == plain["losses"]
    assert piped["bytes"] == plain["bytes"] and piped["bounds"] == plain["bounds"] and piped["bounds"]
    assert piped["final"] == plain["final"]
