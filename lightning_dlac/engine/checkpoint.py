"""Sharded checkpoints of a TorchRec model: a directory per checkpoint, written by every rank (no Lightning here).

Every rank writes its own table shards and fused-optimizer state with ``torch.distributed.checkpoint`` (DCP: the
``.metadata`` + ``*.distcp`` files); rank 0 adds everything else (dense optimizer, loops, callbacks,
hyper-parameters) as ``meta.pt``. Dense weights are in the sharded state dict too. Loading reads into this rank's
current shards, so DCP reshards: a checkpoint written by 2 ranks loads on 1 or 3.

Saves are atomic. Every rank writes into a staging directory beside the checkpoint (``.<name>.partial``); once DCP
has finished on every rank, rank 0 adds ``meta.pt`` and then ``manifest.json`` (every file with its size: the mark
that the checkpoint is complete) and only then moves the directory to its name. A checkpoint of the same name that
was there stays until then, and while the two are swapped the old one waits as ``<stem>.previous<suffix>``
(``last.previous.ckpt``), a name Lightning's ``ckpt_path="last"`` also finds, so a process killed at any moment of
a save leaves a complete checkpoint for ``"last"`` to resume from. Loading checks the manifest first and names a
missing or truncated file.

``meta.pt`` is plain Python data and tensors, so it loads with ``torch.load(weights_only=True)``: a checkpoint
carrying any other object (which unpickling would construct, running its code) is refused unless the caller says it
trusts the file (``weights_only=False``).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["FUSED_OPTIMIZER_KEY", "MANIFEST_FILE", "META_FILE", "check_directory", "load_sharded", "previous_path",
           "remove_checkpoint", "save_sharded"]  # fmt: skip

META_FILE = "meta.pt"
MANIFEST_FILE = "manifest.json"
FUSED_OPTIMIZER_KEY = "fused_optimizer"
DCP_METADATA_FILE = ".metadata"
_MANIFEST_FORMAT = 1


def staging_path(path: str | Path) -> Path:
    """Where a save of ``path`` writes before the checkpoint is complete (hidden; Lightning never picks it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial")


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint ``path`` waits while a save replaces it: ``last.ckpt`` -> ``last.previous.ckpt``, a name
    that ``ckpt_path="last"`` still finds."""
    path = Path(path)
    return path.with_name(f"{path.stem}.previous{path.suffix}")


def _trash_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.removing")


def save_sharded(checkpoint: Mapping[str, Any], path: str | Path, fused_optimizer_state: Mapping[str, Any],
                 is_global_zero: bool, barrier: Callable[[str], None]) -> None:
    """Write ``checkpoint`` as a checkpoint directory at ``path``, atomically (module docstring); every rank must
    call it. A file or directory already at ``path`` is replaced once the new checkpoint is complete."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    staging = staging_path(path)
    if is_global_zero:
        _remove(staging)  # what a save interrupted before left behind
    barrier("dlac_checkpoint_prepare")
    # DCP returns on every rank only after every rank's files are written (and fsynced) and rank 0 wrote .metadata.
    dcp.save({"state_dict": checkpoint["state_dict"], FUSED_OPTIMIZER_KEY: fused_optimizer_state},
             checkpoint_id=str(staging))
    if is_global_zero:
        _write_durably(staging / META_FILE, lambda f: torch.save({k: v for k, v in checkpoint.items()
                                                                   if k != "state_dict"}, f))
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = json.dumps({"format": _MANIFEST_FORMAT, "files": files}, indent=1).encode()
        _write_durably(staging / MANIFEST_FILE, lambda f: f.write(manifest))
        _commit(staging, path)
    barrier("dlac_checkpoint_saved")


def _write_durably(path: Path, write: Callable[[Any], Any]) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit(staging: Path, path: Path) -> None:
    """Put the complete checkpoint ``staging`` at ``path``; whatever stood there goes only after that."""
    previous = previous_path(path)
    if os.path.lexists(path):
        if os.path.lexists(previous):
            _remove(previous)  # left by an earlier interrupted swap; `path` is complete and newer
        os.rename(path, previous)
    # From here until the rename below `path` is missing, and "last" resolves to the previous checkpoint.
    os.rename(staging, path)
    _sync_directory(path.parent)
    if os.path.lexists(previous):
        _remove(previous)


def _remove(path: Path) -> None:
    """Remove a checkpoint (directory, file or link) so that no part of it is ever left under its name."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        trash = _trash_path(path)
        if os.path.lexists(trash):
            shutil.rmtree(trash)
        os.rename(path, trash)  # gone from its name at once; the slow part happens under a name nothing resolves
        shutil.rmtree(trash)
    else:
        path.unlink()


def remove_checkpoint(path: str | Path) -> None:
    """Remove the checkpoint ``path`` (a directory this module wrote, or a file); its name disappears at once."""
    _remove(Path(path))


def check_directory(path: str | Path, owner: str = "DLACStrategy") -> Path:
    """``path`` if it is a complete checkpoint directory this module wrote; otherwise an error naming what is
    missing or damaged.

    Raises:
        FileNotFoundError: ``path`` is not a checkpoint directory, or a file of it is missing.
        ValueError: A file of the checkpoint is truncated or unreadable.
    """
    path = Path(path)
    if not path.is_dir():
        previous = previous_path(path)
        if not path.exists() and previous.is_dir():
            raise FileNotFoundError(
                f"{path} does not exist: a save that was replacing it was interrupted. The checkpoint before it is"
                f" complete at {previous}; resume from that path, or with ckpt_path='last'."
            )
        raise FileNotFoundError(
            f"{path} is not a {owner} checkpoint directory (no {META_FILE} inside). Resume from a checkpoint that"
            f" {owner} saved; single-file checkpoints cannot hold every rank's table shards."
        )
    manifest = path / MANIFEST_FILE
    if manifest.is_file():
        _check_manifest(path, manifest)
    else:
        # Written before manifests existed, or a save that never finished (then meta.pt or .metadata is missing).
        missing = [name for name in (META_FILE, DCP_METADATA_FILE) if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{path} is not a complete {owner} checkpoint: {', '.join(missing)} and {MANIFEST_FILE} are missing"
                f" (a save writes {MANIFEST_FILE} last, so this one did not finish, or this is not a {owner}"
                " checkpoint directory). Resume from a complete checkpoint (ckpt_path='last' finds the last one)."
            )
    _check_shards(path)
    return path


def _check_manifest(path: Path, manifest: Path) -> None:
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{manifest} is damaged ({err}); the checkpoint cannot be checked or trusted.") from None
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"{path} is damaged: {file} is missing ({MANIFEST_FILE} lists it, {size} bytes).")
        actual = file.stat().st_size
        if actual != size:
            raise ValueError(
                f"{path} is damaged: {file} has {actual} bytes where the save wrote {size} (truncated or changed"
                " since). Resume from another checkpoint."
            )


def _check_shards(path: Path) -> None:
    """Every file DCP's ``.metadata`` points into exists and is long enough."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as err:  # noqa: BLE001 - any failure to read it means the same thing
        raise ValueError(
            f"{path / DCP_METADATA_FILE} cannot be read ({_gist(err)}): the checkpoint is damaged."
        ) from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"{path} is damaged: {file} is missing ({DCP_METADATA_FILE} points into it).")
        if file.stat().st_size < size:
            raise ValueError(
                f"{path} is damaged: {file} has {file.stat().st_size} bytes, and {DCP_METADATA_FILE} needs at least"
                f" {size} (truncated)."
            )


def load_sharded(path: str | Path, state_dict: dict[str, Any], fused_optimizer_state: dict[str, Any],
                 weights_only: bool = True, owner: str = "DLACStrategy") -> dict[str, Any]:
    """Load a checkpoint directory in place into ``state_dict`` (this rank's shards) and ``fused_optimizer_state``;
    return the rest of the checkpoint with ``"state_dict"`` set. Every rank must call it.

    Raises:
        FileNotFoundError, ValueError: The checkpoint is incomplete or damaged (:func:`check_directory`).
        RuntimeError: The checkpoint was written for other tables.
        pickle.UnpicklingError: ``meta.pt`` holds arbitrary objects and ``weights_only`` is true.
    """
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
    except (RuntimeError, EOFError, OSError) as err:  # a damaged zip archive, cut short
        raise ValueError(f"{path / META_FILE} cannot be read ({_gist(err)}): the checkpoint is damaged.") from None
    checkpoint["state_dict"] = sharded["state_dict"]
    return checkpoint


def _gist(err: BaseException, last: bool = False, containing: str = "") -> str:
    """The telling line of a long error message: the one ``containing`` a phrase, else the first or ``last``."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    telling = [line for line in lines if containing and containing in line]
    return (telling[0] if telling else lines[-1] if last else lines[0])[:500]
