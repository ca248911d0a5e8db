"""Save and resume of a 2-rank sharded run: table shards, fused and dense optimizer state, loops, DLACCallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dlac import DLACCallback, DLACStrategy
from tests._launch import run_ranks
from tests.conftest import bounds_recorder, loss_recorder, small_data, small_dlrm, trainer


def _run(rank: int, world_size: int, ckpt_dir: str, phase: str) -> dict:
    torch.manual_seed(0)
    model = small_dlrm()
    recorder = loss_recorder()
    # Calibration ends in the first epoch and the schedule (T=15) runs across the checkpoint: the resumed run must
    # continue both, or its losses differ from the uninterrupted run's.
    dlac = DLACCallback(calibration_batches=3, sensitivity_batches=1, schedule="linear", T=15, log_every_n_steps=5)
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
            "table_bounds": dlac.table_bounds, "step": dlac.step}


def test_resumed_run_continues_exactly(tmp_path: Path) -> None:
    uninterrupted = run_ranks(_run, 2, str(tmp_path), "uninterrupted")
    run_ranks(_run, 2, str(tmp_path), "first")
    (ckpt,) = list(tmp_path.iterdir())
    assert ckpt.is_dir() and (ckpt / "meta.pt").is_file() and (ckpt / ".metadata").is_file()
    resumed = run_ranks(_run, 2, str(tmp_path), "resume")
    for rank in range(2):
        assert len(resumed[rank]["losses"]) == 10
        # Same seed, same data: the second epoch after a resume is the uninterrupted run's second epoch, exactly.
        assert resumed[rank]["losses"] == uninterrupted[rank]["losses"][10:]
        # The callback continued its schedule at iteration 10 with the calibrated bounds, not from scratch.
        assert resumed[rank]["step"] == uninterrupted[rank]["step"] == 20
        assert resumed[rank]["table_bounds"] == uninterrupted[rank]["table_bounds"]
        assert resumed[rank]["multipliers"] == uninterrupted[rank]["multipliers"][10:]
        assert resumed[rank]["effective"] == uninterrupted[rank]["effective"][10:]
        assert uninterrupted[rank]["multipliers"][10] > 1.0  # the resume happened inside the early stage


def test_loading_a_single_file_checkpoint_names_the_problem(tmp_path: Path) -> None:
    strategy = DLACStrategy()
    with pytest.raises(FileNotFoundError, match="not a DLACStrategy checkpoint directory"):
        strategy.load_checkpoint(tmp_path / "model.ckpt")
