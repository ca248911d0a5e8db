"""Every shipped DataModule resumes mid-epoch exactly: a loader restored from a saved position serves the batches
the interrupted one had left, on every rank and with DataLoader workers, and the epochs after it from the start;
through a Trainer, a run resumed from a mid-epoch checkpoint trains on the uninterrupted run's batches."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning_dlac.examples.base import RankShardedDataModule, ResumableDataLoader
from lightning_dlac.examples.binary import CriteoBinaryDataModule
from lightning_dlac.examples.planted import PlantedSensitivityDataModule
from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule
from lightning_dlac.examples.tsv import CriteoTSVDataModule
from torchrec.datasets.utils import Batch

from lightning_dlac.criteo import preprocess_criteo
from tests.conftest import write_criteo_tsv

WORLD = 2


def _fingerprint(batch: Batch) -> tuple:
    """Everything a batch holds, as plain data: two batches are the same batch when their fingerprints are equal."""
    kjt = batch.sparse_features
    return (batch.dense_features.tolist(), batch.labels.tolist(), kjt.values().tolist(), kjt.lengths().tolist())


def _tsv_file(tmp_path: Path) -> Path:
    return write_criteo_tsv(tmp_path / "train.tsv", rows=1_200, positives=260)


def _synthetic(tmp_path: Path, **kwargs) -> SyntheticCriteoDataModule:  # noqa: ANN003
    return SyntheticCriteoDataModule(max_rows=100, batch_size=16, num_train_batches=7, num_val_batches=2, **kwargs)


def _tsv(tmp_path: Path) -> CriteoTSVDataModule:
    return CriteoTSVDataModule(str(_tsv_file(tmp_path)), batch_size=64, max_rows=200)


def _binary(tmp_path: Path) -> CriteoBinaryDataModule:
    npy = tmp_path / "npy"
    if not npy.is_dir():
        preprocess_criteo([_tsv_file(tmp_path)], npy, progress=False)
    return CriteoBinaryDataModule(str(npy), train_stems=["train"], val_stems=[], batch_size=64, max_rows=200,
                                  shuffle=True)  # fmt: skip


def _planted(tmp_path: Path) -> PlantedSensitivityDataModule:
    return PlantedSensitivityDataModule(rows=50, batch_size=16, num_train_batches=7, num_val_batches=2)


SOURCES: dict[str, Callable[[Path], RankShardedDataModule]] = {
    "synthetic": _synthetic,
    "synthetic_workers": lambda tmp_path: _synthetic(tmp_path, num_workers=2),
    "tsv": _tsv,
    "binary": _binary,
    "planted": _planted,
}


def _on_rank(make: Callable[[Path], RankShardedDataModule], tmp_path: Path, rank: int) -> RankShardedDataModule:
    dm = make(tmp_path)
    dm.set_rank(rank, WORLD)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize(
    "source", [pytest.param(s, marks=pytest.mark.slow) if s.endswith("_workers") else s for s in SOURCES]
)  # DataLoader workers are processes: slow
def test_every_shipped_datamodule_resumes_mid_epoch_on_every_rank(tmp_path: Path, source: str) -> None:
    make = SOURCES[source]
    for rank in range(WORLD):
        epoch = [_fingerprint(b) for b in _on_rank(make, tmp_path, rank).train_dataloader()]
        assert len(epoch) >= 5 and len({repr(b) for b in epoch}) == len(epoch)  # distinct batches, or proving nothing
        for stop in (1, len(epoch) // 2, len(epoch) - 1):
            # The interrupted process: the training loop took `stop` batches, then the checkpoint saved the position.
            loader = _on_rank(make, tmp_path, rank).train_dataloader()
            batches = iter(loader)
            taken = [_fingerprint(next(batches)) for _ in range(stop)]
            state = loader.state_dict()
            assert state["served"] == stop and state["batches"] == len(epoch) and state["world_size"] == WORLD
            # A new process: a fresh datamodule, the position loaded before the loader is iterated (as Lightning).
            resumed = _on_rank(make, tmp_path, rank).train_dataloader()
            resumed.load_state_dict(state)
            rest = [_fingerprint(b) for b in resumed]
            assert taken + rest == epoch, f"rank {rank}, stopped after {stop}"
            assert resumed.state_dict()["served"] == len(epoch)
            assert [_fingerprint(b) for b in resumed] == epoch  # the next epoch starts from its first batch


def test_a_finished_epoch_resumes_at_the_next_epochs_start_and_a_foreign_state_is_refused(tmp_path: Path) -> None:
    dm = _on_rank(_synthetic, tmp_path, 0)
    epoch = [_fingerprint(b) for b in dm.train_dataloader()]
    loader = dm.train_dataloader()
    assert loader.state_dict()["served"] == 0  # not iterated yet
    list(loader)
    finished = loader.state_dict()
    assert finished["served"] == len(epoch)
    resumed = dm.train_dataloader()
    resumed.load_state_dict(finished)
    assert [_fingerprint(b) for b in resumed] == epoch
    with pytest.raises(ValueError, match="was not written by this version of ResumableDataLoader"):
        resumed.load_state_dict({"served": 3})


def test_a_resume_on_another_world_size_says_it_is_not_exact(tmp_path: Path) -> None:
    two = _on_rank(_synthetic, tmp_path, 0).train_dataloader()
    batches = iter(two)
    for _ in range(3):
        next(batches)
    one = _synthetic(tmp_path)
    one.set_rank(0, 1)
    one.setup("fit")
    loader = one.train_dataloader()
    with pytest.warns(UserWarning, match=r"2 rank\(s\) with 7 batches per rank on 1: each rank starts at its batch 3"):
        loader.load_state_dict(two.state_dict())
    assert len(list(loader)) == 7 - 3  # Lightning's loop expects the epoch's remaining steps


# ------------------------------------------------------------------------------------------- through a Trainer


class _Clicks(LightningModule):
    """Logistic regression on the dense features that records a fingerprint of every training batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(13, 1)
        self.seen: list[tuple] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.seen.append(_fingerprint(batch))
        logits = self.linear(batch.dense_features).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Killed(RuntimeError):
    pass


class _Interrupt(Callback):
    """Fails the run at the end of training step ``step`` (after ModelCheckpoint saved there), as a killed rank."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_step == self.step:
            raise _Killed(f"interrupted at step {self.step}")


def _trainer(tmp_path: Path, callbacks: list) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=callbacks, default_root_dir=tmp_path)  # fmt: skip


def _fit(tmp_path: Path, callbacks: list, ckpt_path: str | None = None) -> _Clicks:
    model = _Clicks()
    _trainer(tmp_path, callbacks).fit(model, datamodule=_synthetic(tmp_path), ckpt_path=ckpt_path)
    return model


def test_a_trainer_resumed_mid_epoch_trains_on_the_batches_the_interrupted_run_had_left(tmp_path: Path) -> None:
    uninterrupted = _fit(tmp_path, [])
    assert len(uninterrupted.seen) == 14 and uninterrupted.seen[:7] == uninterrupted.seen[7:]  # 2 epochs of 7
    every = 3
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=every, save_top_k=0, save_last=True)
    interrupted = _Clicks()
    with pytest.raises(_Killed):
        _trainer(tmp_path, [saves, _Interrupt(5)]).fit(interrupted, datamodule=_synthetic(tmp_path))
    assert len(interrupted.seen) == 5
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*your dataloader is not resumable.*")
        resumed = _fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)],
                       ckpt_path="last")  # fmt: skip
    # The last checkpoint was at step 3: steps 4 to 14 again, on the same batches, the second epoch from its start.
    assert resumed.seen == uninterrupted.seen[every:]
    torch.testing.assert_close(resumed.linear.weight, uninterrupted.linear.weight, rtol=0, atol=0)


def test_the_loader_is_a_stateful_dataloader_that_lightning_can_rebuild() -> None:
    from lightning.fabric.utilities.types import _Stateful
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    dm = SyntheticCriteoDataModule(max_rows=100, batch_size=8, num_train_batches=2)
    dm.set_rank(1, 2)
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        assert isinstance(loader, ResumableDataLoader) and isinstance(loader, _Stateful)
    # Lightning rebuilds every prediction loader from its constructor arguments (to track batch indices).
    loader = dm.train_dataloader()
    rebuilt = _update_dataloader(loader, None, RunningStage.PREDICTING)
    assert isinstance(rebuilt, ResumableDataLoader) and rebuilt.world_size == 2
    assert [_fingerprint(b) for b in rebuilt] == [_fingerprint(b) for b in loader]
