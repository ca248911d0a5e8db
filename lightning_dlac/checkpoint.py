"""Sharded checkpoints of a TorchRec model: a directory per checkpoint, written by every rank (no Lightning here).

Every rank writes its own table shards and fused-optimizer state with ``torch.distributed.checkpoint`` (DCP: the
``.metadata`` + ``*.distcp`` files); rank 0 adds everything else (dense optimizer, loops, callbacks,
hyper-parameters) as ``meta.pt``. Dense weights are in the sharded state dict too. Loading reads into this rank's
current shards, so DCP reshards: a checkpoint written by 2 ranks loads on 1 or 3.

``meta.pt`` is plain Python data and tensors, so it loads with ``torch.load(weights_only=True)``: a checkpoint
carrying any other object (which unpickling would construct, running its code) is refused unless the caller says it
trusts the file (``weights_only=False``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

META_FILE = "meta.pt"
FUSED_OPTIMIZER_KEY = "fused_optimizer"


def save_sharded(checkpoint: Mapping[str, Any], path: str | Path, fused_optimizer_state: Mapping[str, Any],
                 is_global_zero: bool, barrier: Callable[[str], None]) -> None:
    """Write ``checkpoint`` as a checkpoint directory; every rank must call it."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if is_global_zero and path.is_file():
        path.unlink()  # a single-file checkpoint of the same name is replaced by the directory
    barrier("dlac_checkpoint_prepare")
    dcp.save({"state_dict": checkpoint["state_dict"], FUSED_OPTIMIZER_KEY: fused_optimizer_state},
             checkpoint_id=str(path))
    if is_global_zero:
        torch.save({k: v for k, v in checkpoint.items() if k != "state_dict"}, path / META_FILE)
    barrier("dlac_checkpoint_saved")


def check_directory(path: str | Path, owner: str = "DLACStrategy") -> Path:
    """``path`` if it is a checkpoint directory this module wrote; otherwise an error saying what it is not."""
    path = Path(path)
    if not (path / META_FILE).is_file():
        raise FileNotFoundError(
            f"{path} is not a {owner} checkpoint directory (no {META_FILE} inside). Resume from a checkpoint that"
            f" {owner} saved; single-file checkpoints cannot hold every rank's table shards."
        )
    return path


def load_sharded(path: str | Path, state_dict: dict[str, Any], fused_optimizer_state: dict[str, Any],
                 weights_only: bool = True, owner: str = "DLACStrategy") -> dict[str, Any]:
    """Load a checkpoint directory in place into ``state_dict`` (this rank's shards) and ``fused_optimizer_state``;
    return the rest of the checkpoint with ``"state_dict"`` set. Every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = check_directory(path, owner)
    sharded = {"state_dict": state_dict, FUSED_OPTIMIZER_KEY: fused_optimizer_state}
    try:
        dcp.load(sharded, checkpoint_id=str(path))
    except (CheckpointException, RuntimeError, ValueError, KeyError) as err:  # DCP's is a BaseException
        raise RuntimeError(
            f"{path} does not fit this model: {_gist(err, last=True)}. The checkpoint was written for other tables"
            " (names, rows or dims differ); resume with the model configuration that wrote it."
        ) from err
    try:
        checkpoint = torch.load(path / META_FILE, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(
            f"{path / META_FILE} holds objects other than plain data and tensors, which loading would construct (and"
            f" so run their code): {_gist(err, containing='Unsupported global')}. If you trust this checkpoint, load"
            " it with weights_only=False (e.g. trainer.fit(..., ckpt_path=..., weights_only=False))."
        ) from None
    checkpoint["state_dict"] = sharded["state_dict"]
    return checkpoint


def _gist(err: BaseException, last: bool = False, containing: str = "") -> str:
    """The telling line of a long error message: the one ``containing`` a phrase, else the first or ``last``."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    telling = [line for line in lines if containing and containing in line]
    return (telling[0] if telling else lines[-1] if last else lines[0])[:500]
