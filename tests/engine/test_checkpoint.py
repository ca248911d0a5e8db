"""Save and resume of a sharded run: table shards, fused and dense optimizer state, loops, DLACCallback, and every
rank's random state (the model's training step draws from torch, NumPy and Python's generators:
tests/engine/_random_dlrm.py), on 2 ranks; on 3, where an all-reduce's order of addition can differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dlac import DLACCallback, DLACStrategy
from lightning_dlac.testing import run_ranks
from tests.conftest import FEATURES, ROWS, bounds_recorder, loss_recorder, small_data, small_dlrm, trainer
from tests.engine._random_dlrm import RandomDLRM

# Two ways the checkpoint (after batch 9 of 20; the linear schedule, T=15, runs across it) meets calibration:
CASES = {
    # calibrated on batches 0-2 (bounds from 3), recalibrated every 2 batches after that: 5-7 (from 8), 10-12 (from
    # 13), 15-17 (from 18); the checkpoint falls between two measurements, the next one due at batch 10.
    "between_calibrations": (dict(calibration_start=0, calibration_batches=3, recalibrate_every=2), [3, 8, 13, 18]),
    # calibration_start=8: batches 8-11 measured (bounds from 12), the checkpoint in the middle of it; then 15-18
    # (from 19).
    "during_calibration": (dict(calibration_start=8, calibration_batches=4, recalibrate_every=3), [12, 19]),
}


def _run(rank: int, world_size: int, ckpt_dir: str, phase: str, case: str) -> dict:
    from lightning.fabric.utilities.seed import seed_everything

    seed_everything(0, verbose=False)  # every generator the model draws from, alike in every run
    model = RandomDLRM(num_embeddings_per_feature=ROWS, feature_names=FEATURES, embedding_dim=16,
                       dense_arch_layer_sizes=[32, 16], over_arch_layer_sizes=[32, 1])  # fmt: skip
    recorder = loss_recorder()
    dlac = DLACCallback(**CASES[case][0], sensitivity_batches=1, schedule="linear", T=15, log_every_n_steps=5)
    bounds = bounds_recorder(dlac)
    callbacks: list = [recorder, dlac, bounds]
    if phase == "first":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
    t = trainer(
        world_size, DLACStrategy(), max_epochs=1 if phase == "first" else 2, callbacks=callbacks,
        enable_checkpointing=phase == "first",
    )
    ckpt_path = str(next(Path(ckpt_dir).iterdir())) if phase == "resume" else None
    t.fit(model, datamodule=small_data(train_batches=10), ckpt_path=ckpt_path)
    return {"losses": recorder.losses, "multipliers": bounds.multipliers, "effective": bounds.effective,
            "table_bounds": dlac.table_bounds, "step": dlac.step, "calibrations": dlac.state_dict()["calibrations"],
            "end": dlac.calibrator.end,
            "stats": {k: v.as_dict() for k, v in dlac.table_stats.items()}}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "between_calibrations",
        "during_calibration",  # each rank's part of the measurement travels in the checkpoint
    ],
)
def test_resumed_run_continues_exactly(tmp_path: Path, case: str) -> None:
    uninterrupted = run_ranks(_run, 2, str(tmp_path), "uninterrupted", case)
    run_ranks(_run, 2, str(tmp_path), "first", case)
    (ckpt,) = list(tmp_path.iterdir())
    assert ckpt.is_dir() and (ckpt / "meta.pt").is_file() and (ckpt / ".metadata").is_file()
    (state,) = [v for k, v in torch.load(ckpt / "meta.pt", weights_only=True)["callbacks"].items()
                if k.startswith("DLACCallback")]
    if case == "during_calibration":
        # The checkpoint holds each rank's partial statistics: batches 8-9 of the 4 measured (the gradient mode's
        # loss gradients and losses included), not yet reduced over ranks.
        assert len(state["measurements"]) == 2 and {m["seen"] for m in state["measurements"]} == {2}
        for part in state["measurements"]:
            assert part["tables"] and all(t["grad_rows"] > 0 and t["loss_batches"] == 2
                                          for t in part["tables"].values())
    else:  # calibrated; the next measurement, due at batch 10, could not take effect within the first run's 10
        # batches, so that run did not schedule it: the resumed run schedules it against its own end
        assert state["calibrated"] and state["measurements"] is None and state["measure_from"] == 10
    resumed = run_ranks(_run, 2, str(tmp_path), "resume", case)
    calibrated_at = CASES[case][1]
    for rank in range(2):
        u, r = uninterrupted[rank], resumed[rank]
        # When calibration_start says: the strategy's eps (0.01 x m(t)) until the first calibration takes effect.
        assert [c["at"] for c in u["calibrations"]] == calibrated_at
        first = calibrated_at[0]
        assert all(set(e.values()) == {0.01 * m} for e, m in zip(u["effective"][:first], u["multipliers"]))
        last = u["effective"][calibrated_at[-1]:], u["multipliers"][calibrated_at[-1]:]
        assert all(e == {t: b * m for t, b in u["table_bounds"].items()} for e, m in zip(*last))
        assert len(r["losses"]) == 10
        # Same seed, same data, the random state carried: the second epoch after a resume is the uninterrupted run's
        # second epoch, exactly (dropout and sampled negatives included).
        assert r["losses"] == u["losses"][10:]
        # The callback continued its schedule and its calibrations at iteration 10, not from scratch.
        assert r["step"] == u["step"] == 20
        assert r["end"] == u["end"] == 20  # the resumed Trainer counted the checkpoint's 10 batches as run
        assert r["calibrations"] == u["calibrations"]
        assert r["stats"] == u["stats"]  # the last calibration measured the same batches
        assert r["table_bounds"] == u["table_bounds"]
        assert r["multipliers"] == u["multipliers"][10:]
        assert r["effective"] == u["effective"][10:]
        assert u["multipliers"][10] > 1.0  # the resume happened inside the early stage


def _fit_and_resume(rank: int, world_size: int, ckpt_dir: str) -> dict:
    """Two epochs of 3 batches uninterrupted, then one saved at its end and the second resumed from it, in one launch;
    the losses and this rank's weights (dense, and its table shards) at the end of each two-epoch run."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    def fit(epochs: int, save: bool = False, ckpt_path: str | None = None) -> tuple[list[float], dict]:
        torch.manual_seed(0)
        model, recorder = small_dlrm(), loss_recorder()
        callbacks: list = [recorder]
        if save:
            callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
        t = trainer(world_size, DLACStrategy(), max_epochs=epochs, callbacks=callbacks, enable_checkpointing=save)
        t.fit(model, datamodule=small_data(train_batches=3), ckpt_path=ckpt_path)
        # As bytes: equal means bit for bit (and no tensor has to outlive the rank that sends it back). A rank holds
        # none, one or several shards of a table.
        weights = {}
        for key, value in model.state_dict().items():
            tensors = [s.tensor for s in value.local_shards()] if isinstance(value, ShardedTensor) else [value]
            weights[key] = [t.numpy().tobytes() for t in tensors]
        return recorder.losses, weights

    uninterrupted = fit(2)
    fit(1, save=True)
    resumed = fit(2, ckpt_path=str(next(Path(ckpt_dir).iterdir())))
    return {"uninterrupted": uninterrupted, "resumed": resumed}


@pytest.mark.slow
def test_resumed_run_on_3_ranks_continues_exactly(tmp_path: Path) -> None:
    # Over 3 ranks an all-reduce sums three addends per gradient element, in an order that depends on where the
    # element lies in DDP's gradient bucket (over 2, a + b == b + a whatever the order): the resumed run's DDP must
    # reduce its first step with the bucket layout the uninterrupted run had reached by then.
    for rank, run in enumerate(run_ranks(_fit_and_resume, 3, str(tmp_path))):
        (losses, weights), (resumed_losses, resumed_weights) = run["uninterrupted"], run["resumed"]
        differ = sorted(k for k in weights if weights[k] != resumed_weights[k])
        assert not differ, f"rank {rank}: these weights differ from the uninterrupted run's at the end: {differ}"
        assert resumed_losses == losses[3:]


def test_loading_a_single_file_checkpoint_names_the_problem(tmp_path: Path) -> None:
    strategy = DLACStrategy()
    with pytest.raises(FileNotFoundError, match="not a DLACStrategy checkpoint directory"):
        strategy.load_checkpoint(tmp_path / "model.ckpt")
