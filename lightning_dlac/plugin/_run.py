"""What DLACCallback reads from the Trainer about the run it drives: its length (for the defaults that follow it and
for a calibration that cannot fit in it), the loss scale of mixed precision, and what it says when calibration never
ran."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_dlac.plugin.report import never_calibrated_reason

PAPER_T = 1000  # the paper's early stage, in iterations: the default T's cap, and T where the run length is unknown
DEFAULT_RUN_SHARE = 0.1  # the default calibration_start and T, as a share of the run's training batches


def _known(count: Any) -> bool:
    """Whether a count the Trainer reports is one: a positive finite number (not ``inf`` for "unknown")."""
    return isinstance(count, (int, float)) and math.isfinite(count) and count > 0


def run_training_batches(trainer: pl.Trainer) -> int | None:
    """Training batches the run will take, or ``None`` if the Trainer cannot tell (no ``max_steps`` and an epoch of
    unknown length, or no limit).

    Lightning counts the run in optimizer steps (``estimated_stepping_batches``), and under gradient accumulation
    an epoch's last step takes the batches left over (``ceil(batches / accumulate)`` steps an epoch): steps times
    ``accumulate_grad_batches`` would count batches an epoch never has. Where the epoch's length is known, whole
    epochs count their batches and the last one's steps ``accumulate_grad_batches`` batches each."""
    try:
        steps = trainer.estimated_stepping_batches  # sets the training loader up if it must
    except Exception:  # noqa: BLE001 - e.g. a dataloader without __len__: the length is unknown, nothing more
        return None
    if not _known(steps):
        return None
    accumulate = max(1, int(trainer.accumulate_grad_batches))
    epoch = getattr(trainer, "num_training_batches", math.inf)
    if not _known(epoch):
        return int(steps) * accumulate  # max_steps over a loader of unknown length: every step takes a full count
    epochs, steps_left = divmod(int(steps), math.ceil(epoch / accumulate))
    return epochs * int(epoch) + steps_left * accumulate


def batches_run(trainer: pl.Trainer) -> int:
    """Training batches this Trainer has completed: 0 as a run starts, the checkpoint's count as it resumes."""
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.completed)


def loss_scale(trainer: pl.Trainer) -> float:
    """The factor the loss of the coming backward pass is multiplied by: the GradScaler's current scale under
    ``precision="16-mixed"`` (the gradients the exchange carries back are that many times the loss's), else 1. The
    scale is read before the batch; the scaler only changes it in the optimizer step, after the backward pass."""
    scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
    if scaler is None or not getattr(scaler, "is_enabled", lambda: True)():
        return 1.0
    scale = scaler.get_scale()
    return float(scale) if isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0 else 1.0


def warn_if_past_the_end(start: int, batches: int, run_batches: int | None) -> None:
    """Warn as training starts when the first calibration (``batches`` training batches from ``start``) cannot
    complete within the run's known length: the run would never calibrate."""
    if run_batches is not None and start + batches > run_batches:
        rank_zero_warn(
            f"DLACCallback: calibration measures training batches {start} to {start + batches - 1}"
            f" (calibration_start={start}, calibration_batches={batches}), but the run takes {run_batches}: it will"
            " never calibrate, and every table keeps the strategy's eps. Set calibration_start earlier (or leave it"
            " unset: a tenth of the run)."
        )


def warn_never_calibrated(status: dict[str, Any], default_eps: float | None) -> None:
    """At the end of training, warn when the table-wise level never calibrated (``status`` from
    :meth:`~lightning_dlac.adaptive.Calibrator.status`)."""
    if status["state"] == "never_calibrated":
        rank_zero_warn(f"DLACCallback: {never_calibrated_reason(status, default_eps)}.")
