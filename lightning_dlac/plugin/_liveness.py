"""What the strategy adds to a peer that stops answering (:mod:`lightning_dlac.comm.liveness`): the steps' own
progress marks and watches (TorchRec's input all-to-all, DDP's all-reduce: the collectives outside the compressed
exchanges, which mark and watch themselves), and, when the run ends on the fault, the step and the checkpoint it can
resume from."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import torch.distributed as dist

from lightning_dlac.comm.liveness import PeerTimeoutError, peer_timeout, phase_name, progress_of


@contextlib.contextmanager
def watch_step(trainer: pl.Trainer | None, phase: str) -> Iterator[None]:
    """Mark the start of the current step's ``phase`` (``"forward"``, ``"backward"``) in the process group's store
    and turn a collective of it that times out into a :class:`~lightning_dlac.comm.liveness.PeerTimeoutError`
    naming the silent rank. Nothing on one rank, or without a process group."""
    if trainer is None or trainer.world_size < 2 or not dist.is_initialized():
        yield
        return
    stage = trainer.state.stage
    label = f"{stage.value if stage else 'step'} step {trainer.global_step}, {phase_name(phase)}"
    try:
        with progress_of(dist.group.WORLD).watch(phase=phase, mark=label):
            yield
    except PeerTimeoutError as error:
        if error.exchange is None and error.collective == "a collective":
            error.collective = _collective_of(error.__cause__, phase)
        raise


def _collective_of(error: BaseException | None, phase: str) -> str:
    """What timed out in a step's ``phase``, from the frames ``error`` passed through: TorchRec's input all-to-all
    (the ids, in the forward pass), else in the backward pass DDP's all-reduce of the dense gradients."""
    frames = traceback.extract_tb(error.__traceback__) if error is not None else []
    if any("torchrec/distributed/dist_data" in frame.filename for frame in frames):
        return "TorchRec's input all-to-all"
    return "DDP's gradient all-reduce" if phase == "backward" else "a collective"


def complete_timeout(exception: BaseException, module: pl.LightningModule | None) -> None:
    """Put the step (and the stage where it is not training) and the last checkpoint's directory into the
    :class:`~lightning_dlac.comm.liveness.PeerTimeoutError` behind ``exception``, if there is one."""
    timeout = peer_timeout(exception)
    if timeout is None or module is None or module._trainer is None:
        return
    trainer = module.trainer
    timeout.step = trainer.global_step
    stage = trainer.state.stage
    timeout.stage = None if stage is None else str(stage.value)
    for callback in trainer.checkpoint_callbacks:
        dirpath = getattr(callback, "dirpath", None)
        name = getattr(callback, "CHECKPOINT_NAME_LAST", None) or "last"
        if dirpath and Path(dirpath).is_dir() and any(Path(dirpath).glob(f"{name}*")):
            timeout.resume = f"ckpt_path='last' (its last checkpoint is in {dirpath})"
            return
