"""Save and resume of a 2-rank sharded run: table shards, fused and dense optimizer state, loops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dlac import DLACStrategy
from tests._launch import run_ranks
from tests.test_strategy import _LossRecorder, small_data, small_dlrm, trainer


def _run(rank: int, world_size: int, ckpt_dir: str, phase: str) -> list[float]:
    torch.manual_seed(0)
    model = small_dlrm()
    recorder = _LossRecorder()
    callbacks: list = [recorder]
    if phase == "first":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
    t = trainer(
        world_size, DLACStrategy(), max_epochs=1 if phase == "first" else 2, callbacks=callbacks,
        enable_checkpointing=phase == "first",
    )
    ckpt_path = str(next(Path(ckpt_dir).iterdir())) if phase == "resume" else None
    t.fit(model, datamodule=small_data(train_batches=10), ckpt_path=ckpt_path)
    return recorder.losses


def test_resumed_run_continues_exactly(tmp_path: Path) -> None:
    uninterrupted = run_ranks(_run, 2, str(tmp_path), "uninterrupted")
    run_ranks(_run, 2, str(tmp_path), "first")
    (ckpt,) = list(tmp_path.iterdir())
    assert ckpt.is_dir() and (ckpt / "meta.pt").is_file() and (ckpt / ".metadata").is_file()
    resumed = run_ranks(_run, 2, str(tmp_path), "resume")
    for rank in range(2):
        assert len(resumed[rank]) == 10
        # Same seed, same data: the second epoch after a resume is the uninterrupted run's second epoch, exactly.
        assert resumed[rank] == uninterrupted[rank][10:]


def test_loading_a_single_file_checkpoint_names_the_problem(tmp_path: Path) -> None:
    strategy = DLACStrategy()
    with pytest.raises(FileNotFoundError, match="not a DLACStrategy checkpoint directory"):
        strategy.load_checkpoint(tmp_path / "model.ckpt")
