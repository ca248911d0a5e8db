"""The small collectives the policy needs besides the exchanges: combining statistics over ranks and gathering each
rank's state. Plain ``torch.distributed`` (no Lightning), so a plain training loop passes them as ``DLACCallback``
does: ``Calibrator(settings, all_reduce, all_gather_object)``, ``CompressionMonitor(per_table, all_reduce)``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def _running(group: dist.ProcessGroup | None) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def all_reduce(tensor: torch.Tensor, op: str, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``tensor`` combined over the ranks of ``group`` (default: the world) with ``op`` (``"sum"``, ``"min"`` or
    ``"max"``), as a new CPU tensor; ``tensor`` itself without a process group or with one rank. Every rank must call
    it with a tensor of the same shape. On NCCL the reduction runs on this rank's current CUDA device."""
    if op not in _OPS:
        raise ValueError(f"op={op!r} is not supported; choose 'sum', 'min' or 'max'.")
    if not _running(group):
        return tensor
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    out = tensor.detach().to(device, copy=True)
    dist.all_reduce(out, op=_OPS[op], group=group)
    return out.cpu()


def all_gather_object(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj`` (picklable), by rank; ``[obj]`` without a process group or with one rank."""
    if not _running(group):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def rank_and_world(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size; ``(0, 1)`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)
