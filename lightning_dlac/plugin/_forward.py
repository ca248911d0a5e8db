"""Forward passes that calibration runs through a LightningModule outside the training loop (the sensitivity probe,
calibration before training): the loss they return, the random state they replay and the logging they mute."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch


def loss_or_none(output: Any) -> float | None:
    """The loss in a training step's output (a scalar tensor, or a dict with ``"loss"``), or ``None`` if it holds
    none (e.g. manual optimization returning nothing)."""
    if isinstance(output, dict):
        output = output.get("loss")
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return float(output.detach())
    return None


def loss_of(output: Any) -> float:
    """The loss that ``training_step`` returned, as a float."""
    loss = loss_or_none(output)
    if loss is None:
        if isinstance(output, dict):
            output = output.get("loss")
        raise TypeError(
            "DLACCallback's calibration calls training_step and needs it to return the loss (a scalar tensor or a"
            f" dict with 'loss'), got {type(output).__name__}. Return the loss, or use mode='homogenization' with"
            " sensitivity_batches=0 and no calibration_dataloader."
        )
    return loss


@contextlib.contextmanager
def random_state_kept() -> Iterator[Callable[[], None]]:
    """Yield ``replay()``, which resets the CPU and CUDA random state to what it was on entry; on exit the state is
    reset too, so probes neither see different dropout masks nor shift what training draws next."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def replay() -> None:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    try:
        yield replay
    finally:
        replay()


@contextlib.contextmanager
def logging_muted(module: pl.LightningModule) -> Iterator[None]:
    """Make ``module.log`` / ``module.log_dict`` no-ops within the block (calibration forwards are not steps)."""
    saved = {name: module.__dict__[name] for name in ("log", "log_dict") if name in module.__dict__}

    def _noop(*args: Any, **kwargs: Any) -> None:
        return None

    module.__dict__["log"] = _noop
    module.__dict__["log_dict"] = _noop
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            module.__dict__.pop(name, None)
        module.__dict__.update(saved)


@contextlib.contextmanager
def side_forward(module: pl.LightningModule) -> Iterator[Callable[[], None]]:
    """No gradients, the random state kept (``replay()`` resets it) and logging muted: a forward that is not a
    training step."""
    with torch.no_grad(), random_state_kept() as replay, logging_muted(module):
        yield replay
