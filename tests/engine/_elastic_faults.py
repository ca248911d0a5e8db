"""Faults the elastic tests inject into a `dlac fit` worker under torchrun, and the loss curve they compare (both
named in the run's YAML config).

:class:`Faults` kills its own process with SIGKILL, as ``kill -9`` would, where a plan says: per torchrun attempt
(``TORCHELASTIC_RESTART_COUNT``), which rank dies and when: at the end of a training step, or during the attempt's
first checkpoint save, once every rank's table shards are written and before rank 0 marks the checkpoint complete
(the widest window a kill can hit in a save). :class:`LossCurve` writes every training step's loss, exactly.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from lightning_dlac.engine import checkpoint

KILL_MARK = "elastic test fault: SIGKILL of"


def _die(rank: int, where: str) -> None:
    """SIGKILL this process, after saying so on stdout (the tests count these lines: torchrun's own report names only
    the first failure it records, which can be the peer's error exit after the kill)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"{KILL_MARK} attempt {attempt} rank {rank} {where}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class Faults(Callback):
    """Kill this worker where ``plan`` says.

    Args:
        plan: ``{attempt: {"rank": r, "step": s}}`` (SIGKILL of rank ``r`` at the end of training step ``s``) or
            ``{attempt: {"rank": 0, "during_save": 1}}`` (SIGKILL of rank 0 in the attempt's first save, after the
            shards and before ``meta.pt``); attempts are torchrun's restart counts, as strings.
    """

    def __init__(self, plan: dict[str, dict[str, int]]) -> None:
        self.fault = plan.get(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def _mine(self, trainer: Any) -> bool:
        return self.fault is not None and self.fault["rank"] == trainer.global_rank

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._mine(trainer) and self.fault.get("during_save"):
            write = checkpoint._write_durably

            def write_or_die(path: Any, content: Any) -> None:
                if path.name == checkpoint.META_FILE:
                    _die(trainer.global_rank, "during a save")
                write(path, content)

            checkpoint._write_durably = write_or_die

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if self._mine(trainer) and trainer.global_step == self.fault.get("step"):
            _die(trainer.global_rank, f"after step {trainer.global_step}")


class LossCurve(Callback):
    """Append every training step's loss on this rank, exactly (``float.hex``), to ``<directory>/loss_rank<r>.txt``:
    one line ``<global step> <loss>`` per step trained, the steps an attempt replays after a restart included. Listed
    before :class:`Faults`, so a step a kill ends is written first.

    Args:
        directory: Where the files go (the run's directory).
    """

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        with open(self.directory / f"loss_rank{trainer.global_rank}.txt", "a") as f:
            f.write(f"{trainer.global_step} {float(loss).hex()}\n")


def loss_curve(directory: Path, rank: int) -> dict[int, list[str]]:
    """{global step: every loss :class:`LossCurve` wrote for it on ``rank``, in order} (a step trained again after a
    restart has several)."""
    curve: dict[int, list[str]] = {}
    for line in (directory / f"loss_rank{rank}.txt").read_text().splitlines():
        step, loss = line.split()
        curve.setdefault(int(step), []).append(loss)
    return curve
