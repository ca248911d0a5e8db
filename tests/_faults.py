"""Faults the fault tests inject into one rank of a fit, at one training batch, as Lightning callbacks (importable by
``class_path`` from a `dlac fit` YAML too): stop the process (SIGSTOP), kill it (SIGKILL), or corrupt the payload it
sends in that batch's forward exchange.

Each writes the process id of the rank it hits to ``pid_<rank>`` in ``workdir`` first (where given), so a test can
kill a stopped process once it has seen what it needed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

FAULTS = ("stop", "kill", "corrupt")


class Fault(Callback):
    """At training batch ``batch`` of rank ``rank`` (as it starts, or ``at="backward"`` as its backward pass starts):
    ``"stop"`` the process (it answers nothing and holds its
    sockets open, as a frozen machine would), ``"kill"`` it, or ``"corrupt"`` one byte of the body of the first
    chunk its forward exchange sends (once; the receiver's CRC check fails).

    Args:
        how: One of :data:`FAULTS`.
        rank: The rank it hits.
        batch: The training batch index (of the fit's first epoch) it hits at.
        workdir: Where to write ``pid_<rank>``; ``None``: nowhere.
        at: ``"batch_start"`` or ``"backward"``.
    """

    def __init__(self, how: str, rank: int = 1, batch: int = 2, workdir: str | None = None,
                 at: str = "batch_start") -> None:
        if how not in FAULTS:
            raise ValueError(f"how must be one of {FAULTS}, got {how!r}")
        if at not in ("batch_start", "backward"):
            raise ValueError(f"at must be 'batch_start' or 'backward', got {at!r}")
        self.how, self.rank, self.batch, self.workdir, self.at = how, rank, batch, workdir, at

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.at == "batch_start" and trainer.global_rank == self.rank and batch_idx == self.batch \
                and not trainer.current_epoch:
            self._hit()

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        # one epoch, one batch per step: the step is the batch
        if self.at == "backward" and trainer.global_rank == self.rank and trainer.global_step == self.batch:
            self._hit()

    def _hit(self) -> None:
        if self.workdir is not None:
            (Path(self.workdir) / f"pid_{self.rank}").write_text(str(os.getpid()))
        if self.how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            _corrupt_next_payload()


def _corrupt_next_payload() -> None:
    """Flip a byte in the body of the first chunk with one that the next encode produces, once."""
    from lightning_dlac.codec.format import HEADER_SIZE
    from lightning_dlac.comm import exchange

    encode_grid = exchange.encode_grid

    def corrupting_encode_grid(*args: Any, **kwargs: Any) -> Any:
        payload, sizes = encode_grid(*args, **kwargs)
        exchange.encode_grid = encode_grid  # once
        at = 0
        for size in sizes.tolist():  # the first chunk with a body (a constant chunk is a header alone)
            if size > HEADER_SIZE:
                payload[at + HEADER_SIZE] ^= 0xFF
                break
            at += size
        return payload, sizes

    exchange.encode_grid = corrupting_encode_grid


def kill_stopped(workdir: str | Path, rank: int = 1) -> None:
    """SIGKILL the process that ``pid_<rank>`` in ``workdir`` names, if there is one (a rank left stopped)."""
    pid_file = Path(workdir) / f"pid_{rank}"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass
