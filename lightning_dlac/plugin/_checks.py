"""Refusals DLACStrategy makes at set-up, before any work: settings it cannot honour, named with the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import nn

from lightning_dlac.engine.sharding import fused_parameters

if TYPE_CHECKING:
    import lightning.pytorch as pl

_SYNC_BATCH_NORM_DEVICES = ("cuda", "xpu", "hpu")


def refuse_sync_batchnorm_on_cpu(module: nn.Module, device: torch.device, world_size: int) -> None:
    """torch's SyncBatchNorm synchronises only on accelerators (CUDA, XPU, HPU): on CPU processes its first training
    forward would fail, so ``Trainer(sync_batchnorm=True)`` is refused there.

    Raises:
        ValueError: The model has BatchNorm layers, several processes train it, and they run on the CPU.
    """
    devices = (*_SYNC_BATCH_NORM_DEVICES, torch._C._get_privateuse1_backend_name())
    batch_norms = [name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batch_norms and world_size > 1 and device.type not in devices:
        raise ValueError(
            f"Trainer(sync_batchnorm=True) would turn the BatchNorm layers of the model ({', '.join(batch_norms)})"
            " into torch.nn.SyncBatchNorm, which synchronises batch statistics only on GPUs (CUDA, XPU, HPU);"
            f" this run trains on {device.type} with {world_size} processes. Remove sync_batchnorm=True (each rank"
            " then normalises over its own batch), or train on GPUs."
        )


def refuse_optimizers_on_fused_parameters(optimizers: Sequence[torch.optim.Optimizer], module: nn.Module,
                                          owner: str, fused_optimizer: str) -> None:
    """Embedding weights are updated by the fused optimizer inside backward; a second optimizer on them would
    silently fight it (weight decay, momentum on stale state).

    Raises:
        ValueError: An optimizer holds a parameter the fused optimizer trains.
    """
    fused = {id(p) for p in fused_parameters(module)}
    for opt in optimizers:
        for group in opt.param_groups:
            if any(id(p) in fused for p in group["params"]):
                raise ValueError(
                    f"An optimizer from configure_optimizers() includes embedding-table parameters, which {owner}"
                    f" already trains with its fused {fused_optimizer} optimizer. Pass only the dense parameters:"
                    " `torch.optim.Adam(lightning_dlac.dense_parameters(self))`."
                )


def refuse_unpipelinable_run(owner: str, pipeline: str, trainer: pl.Trainer, module: pl.LightningModule,
                             precision_plugin: Precision) -> None:
    """Refuse, before any work, a run whose batches the train pipeline cannot hand to ``training_step``.

    Raises:
        ValueError: ``training_step`` reads a ``dataloader_iter``, ``on_before_batch_transfer`` is overridden, or the
            precision plugin converts every batch before it is moved.
    """
    reason = None
    if is_param_in_hook_signature(module.training_step, "dataloader_iter", explicit=True):
        reason = (f"{type(module).__name__}.training_step takes a dataloader_iter: with the pipeline, the strategy"
                  " reads the batches and hands training_step one at a time, so write training_step(self, batch,"
                  " batch_idx)")
    hooks = [f"{type(hooked).__name__}.on_before_batch_transfer" for hooked in (module, trainer.datamodule)
             if hooked is not None and is_overridden("on_before_batch_transfer", hooked)]
    if hooks:
        reason = (f"{hooks[0]} is overridden: the pipeline moves each batch to the device (with"
                  " transfer_batch_to_device and on_after_batch_transfer) one step before Lightning would call"
                  " on_before_batch_transfer on it; do that work in the dataloader or in on_after_batch_transfer")
    if type(precision_plugin).convert_input is not Precision.convert_input:
        reason = (f"the precision plugin {type(precision_plugin).__name__} converts every batch before it is moved,"
                  " one step after the pipeline has sent its ids; use 32-bit or mixed precision (16-mixed,"
                  " bf16-mixed), which leave the batch as it is")
    if reason is not None:
        raise ValueError(f"{owner}(pipeline={pipeline!r}) cannot train this run: {reason}; or train without the"
                         " pipeline (pipeline=None).")
