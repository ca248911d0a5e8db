"""Sharded checkpoints of a TorchRec model: a directory per checkpoint, written by every rank (no Lightning here).

Every rank writes its own table shards and fused-optimizer state with ``torch.distributed.checkpoint`` (DCP: the
``.metadata`` + ``*.distcp`` files); rank 0 adds everything else (dense optimizer, loops, callbacks,
hyper-parameters, and every rank's random number state, :mod:`lightning_dlac.engine.rng`) as ``meta.pt``. Dense
weights are in the sharded state dict too. Loading reads into this rank's current shards, so DCP reshards: a
checkpoint written by 2 ranks loads on 1 or 3.

Saves are atomic and verified. Every rank writes into a staging directory beside the checkpoint whose name is new
for every save (``.<name>.partial-<token>``, the token drawn by rank 0 and broadcast), so neither a second job
saving into the same directory nor a process left over from a dead attempt can write into or delete another save's
files. Once DCP has finished on every rank, each rank reports the files it wrote, with their sizes and CRC32
checksums (read back by the rank that wrote them: on node-local disks rank 0 could not see them), and rank 0 checks
that every file DCP's ``.metadata`` names was reported and that it sees every reported file at the size its writer
saw; only then does it write ``manifest.json`` (every file, its size, checksum and writer: the mark that the
checkpoint is complete) and move the directory to its name. A save that finds a file missing or short commits
nothing and fails on every rank, naming the files. A checkpoint of the same name that was there stays until then,
and while the two are swapped the old one waits as ``<stem>.previous<suffix>`` (``last.previous.ckpt``), a name
Lightning's ``ckpt_path="last"`` also finds, so a process killed at any moment of a save leaves a complete
checkpoint for ``"last"`` to resume from. Swaps in one directory take turns (an ``flock`` on the directory, where
the filesystem supports one).

Rank 0 holds an ``flock`` on ``<staging>.lock`` for as long as its save runs; the kernel releases it when the
process dies. Each save first removes the staging directories in its directory whose writer holds no lock (dead
attempts, failed saves) and never one whose writer does. Where the filesystem has no working ``flock``, staging
directories of dead saves are left in place (hidden, never loaded).

Loading checks the manifest first and names a missing or truncated file, then (``verify=True``) every file's
checksum, the files shared out over the ranks, so a bit flip that keeps the size is found before anything is read.
``verify=False`` skips the checksums at save and at load (sizes are still checked), for checkpoints too large to
read back.

``meta.pt`` is plain Python data and tensors, so it loads with ``torch.load(weights_only=True)``: a checkpoint
carrying any other object (which unpickling would construct, running its code) is refused unless the caller says it
trusts the file (``weights_only=False``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from lightning_dlac.engine import _directory, rng
from lightning_dlac.engine._directory import previous_path, staging_path

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

__all__ = ["FUSED_OPTIMIZER_KEY", "MANIFEST_FILE", "META_FILE", "RANDOM_STATE_KEY", "CheckpointOptions", "Checkpointer",
           "IncompleteCheckpointError", "check_directory", "file_checksum", "load_sharded", "previous_path",
           "remove_checkpoint", "restore_random_state", "save_sharded"]  # fmt: skip

META_FILE = "meta.pt"
MANIFEST_FILE = "manifest.json"
FUSED_OPTIMIZER_KEY = "fused_optimizer"
RANDOM_STATE_KEY = "dlac_random_state"  # in meta.pt: every rank's random number state, in rank order
DCP_METADATA_FILE = ".metadata"
_MANIFEST_FORMAT = 2
_CHUNK = 8 << 20


class IncompleteCheckpointError(RuntimeError):
    """A save found a file of the new checkpoint missing or short, and committed nothing (raised on every rank)."""


# ------------------------------------------------------------------------------ collectives (a single process alone)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if _rank_and_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(obj: Any) -> list[Any] | None:
    """Every rank's ``obj``, in rank order, on rank 0; ``None`` on the others."""
    rank, world = _rank_and_world()
    if world == 1:
        return [obj]
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    world = _rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


# ----------------------------------------------------------------------------------------------------- saving


def file_checksum(path: str | Path) -> str:
    """The CRC32 of a file's content, read in 8 MiB pieces, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while piece := f.read(_CHUNK):
            crc = zlib.crc32(piece, crc)
    return f"{crc:08x}"


def _entry(path: Path, rank: int, verify: bool) -> dict[str, Any]:
    """A manifest entry of a file this rank wrote: size, checksum (``verify``) and writer; ``"error"`` where the
    writer cannot read it back (reported to rank 0 like the rest, which then fails the save on every rank)."""
    entry: dict[str, Any] = {"bytes": -1, "rank": rank}
    try:
        entry["bytes"] = path.stat().st_size
        if verify:
            entry["crc32"] = file_checksum(path)
    except OSError as err:
        entry["error"] = f"{type(err).__name__}: {err}"
    return entry


def _recording_writer(path: Path) -> Any:
    """DCP's file-system writer, remembering the files this rank wrote (the results of its own write plan)."""
    from torch.distributed.checkpoint import FileSystemWriter

    class RecordingWriter(FileSystemWriter):
        written: list[str] = []

        def write_data(self, plan: Any, planner: Any) -> Any:
            future = super().write_data(plan, planner)
            self.written = sorted({result.storage_data.relative_path for result in future.wait()})
            return future

    return RecordingWriter(str(path))


def save_sharded(checkpoint: Mapping[str, Any], path: str | Path, fused_optimizer_state: Mapping[str, Any],
                 is_global_zero: bool, barrier: Callable[[str], None], verify: bool = True) -> None:
    """Write a checkpoint directory at ``path``, atomically and verified (module docstring); every rank must call it.

    A file or directory already at ``path`` is replaced once the new checkpoint is complete.

    Args:
        checkpoint: Lightning's checkpoint dict; its ``"state_dict"`` holds this rank's shards.
        path: The checkpoint directory to write.
        fused_optimizer_state: This rank's fused-optimizer state.
        is_global_zero: Whether this is rank 0 (which writes ``meta.pt`` and the manifest, and commits).
        barrier: Waits for every rank (named, for debugging).
        verify: Record every file's CRC32 in the manifest (read back by the rank that wrote it).

    Raises:
        IncompleteCheckpointError: On every rank, when rank 0 did not find every file complete; nothing committed.
        RuntimeError: On the other ranks, when rank 0 failed to save for another reason (which rank 0 raises).
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    rank = _rank_and_world()[0]
    staging = staging_path(path, _broadcast(_directory.token() if is_global_zero else None))
    if is_global_zero:
        path.parent.mkdir(parents=True, exist_ok=True)
    with _directory.held(_directory.lock_path(staging)) if is_global_zero else contextlib.nullcontext():
        if is_global_zero:
            _directory.sweep(path.parent)  # what dead or failed saves left; never a live save's (it holds its lock)
            staging.mkdir(parents=True)
        barrier("dlac_checkpoint_prepare")
        # DCP returns on every rank only after every rank's files are written (and fsynced) and rank 0 wrote .metadata.
        writer = _recording_writer(staging)
        metadata = dcp.save({"state_dict": checkpoint["state_dict"], FUSED_OPTIMIZER_KEY: fused_optimizer_state},
                            storage_writer=writer)  # fmt: skip
        files = {name: _entry(staging / name, rank, verify) for name in writer.written}
        if is_global_zero:
            files[DCP_METADATA_FILE] = _entry(staging / DCP_METADATA_FILE, rank, verify)  # DCP's coordinator: rank 0
        reports = _gather((files, rng.capture()))
        failure: BaseException | None = None
        if is_global_zero:
            try:
                _finish(checkpoint, path, staging, metadata, reports, verify)
            except BaseException as err:  # noqa: BLE001 - the other ranks must hear of any failure, then it is raised
                failure = err
        # The other ranks wait here for rank 0's verdict, and fail with it (else they would train on, and wait for
        # rank 0 in their next collective until the timeout).
        verdict = _broadcast(None if failure is None else (type(failure).__name__, str(failure)))
        if failure is not None:
            raise failure
        if verdict is not None:
            kind, message = verdict
            if kind == IncompleteCheckpointError.__name__:
                raise IncompleteCheckpointError(message)
            raise RuntimeError(f"Rank 0 failed to save the checkpoint {path} ({kind}: {message}).")


def _finish(checkpoint: Mapping[str, Any], path: Path, staging: Path, metadata: Any,
            reports: list[tuple[dict[str, Any], dict[str, Any]]], verify: bool) -> None:
    """Rank 0: ``meta.pt`` (with every rank's random state), the checks, the manifest, the switch."""
    meta = {k: v for k, v in checkpoint.items() if k != "state_dict"}
    meta[RANDOM_STATE_KEY] = [state for _, state in reports]
    _write_durably(staging / META_FILE, lambda f: torch.save(meta, f))
    files = {name: entry for written, _ in reports for name, entry in written.items()}
    files[META_FILE] = _entry(staging / META_FILE, 0, verify)
    _check_complete(path, staging, metadata, files)
    manifest = {"format": _MANIFEST_FORMAT, "checksum": "crc32" if verify else None,
                "files": dict(sorted(files.items()))}
    _write_durably(staging / MANIFEST_FILE, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    _directory.commit(staging, path)


def _needed_bytes(metadata: Any) -> dict[str, int]:
    """{file: the least size it must have} for every file DCP's metadata points into."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def _check_complete(path: Path, staging: Path, metadata: Any, files: dict[str, dict[str, Any]]) -> None:
    """Every file DCP's metadata names was reported by the rank that wrote it, long enough, and rank 0 sees every
    reported file at the size its writer saw."""
    problems = []
    needed = _needed_bytes(metadata)
    for name in sorted(needed.keys() - files.keys()):
        problems.append(f"{name} is named by {DCP_METADATA_FILE} but no rank wrote it")
    for name, entry in sorted(files.items()):
        if "error" in entry:
            problems.append(f"{name}: rank {entry['rank']}, which wrote it, cannot read it back ({entry['error']})")
            continue
        if entry["bytes"] < needed.get(name, 0):
            problems.append(f"{name} has {entry['bytes']} bytes on rank {entry['rank']}, where"
                            f" {DCP_METADATA_FILE} needs {needed[name]}")  # fmt: skip
        file = staging / name
        if not file.is_file():
            problems.append(f"{name} (written by rank {entry['rank']}, {entry['bytes']} bytes) is not there as rank 0"
                            " sees the directory")  # fmt: skip
        elif file.stat().st_size != entry["bytes"]:
            problems.append(f"{name} has {file.stat().st_size} bytes as rank 0 sees it and {entry['bytes']} as rank"
                            f" {entry['rank']} wrote it")  # fmt: skip
    if problems:
        unseen = sorted({e["rank"] for n, e in files.items() if not (staging / n).is_file()} - {0})
        hint = (f" Rank 0 cannot see the files of rank(s) {unseen}: the ranks do not share the checkpoint directory"
                " (node-local disks?). Save checkpoints to storage every node mounts at the same path"
                " (docs/multinode.md, 'Checkpoints on shared storage')." if unseen else "")  # fmt: skip
        raise IncompleteCheckpointError(
            f"The checkpoint {path} was not saved: {'; '.join(problems)}.{hint} Nothing was committed; the"
            f" checkpoint that was at {path.name}, if any, is still there."
        )


def _write_durably(path: Path, write: Callable[[Any], Any]) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def remove_checkpoint(path: str | Path) -> None:
    """Remove a checkpoint; its name disappears at once.

    Args:
        path: The checkpoint: a directory this module wrote, or a file.
    """
    _directory.remove(Path(path))


# ---------------------------------------------------------------------------------------------------- loading


def check_directory(path: str | Path, owner: str = "DLACStrategy") -> Path:
    """Check that ``path`` is a complete checkpoint directory this module wrote: every file there, at its size.

    Checksums are :func:`load_sharded`'s.

    Args:
        path: The checkpoint directory.
        owner: The name errors give the saver.

    Returns:
        ``path``, as a ``Path``.

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
        for name, entry in _manifest_files(manifest).items():
            _check_size(path, name, entry)
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


def _manifest_files(manifest: Path) -> dict[str, dict[str, Any]]:
    """{file: {"bytes", and "crc32" and "rank" where recorded}} of a manifest (format 1 held sizes only)."""
    try:
        files = json.loads(manifest.read_text())["files"]
        return {name: entry if isinstance(entry, dict) else {"bytes": int(entry)} for name, entry in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{manifest} is damaged ({err}); the checkpoint cannot be checked or trusted.") from None


def _check_size(path: Path, name: str, entry: dict[str, Any]) -> None:
    file, size = path / name, entry["bytes"]
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
    for name, size in sorted(_needed_bytes(metadata).items()):
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"{path} is damaged: {file} is missing ({DCP_METADATA_FILE} points into it).")
        if file.stat().st_size < size:
            raise ValueError(
                f"{path} is damaged: {file} has {file.stat().st_size} bytes, and {DCP_METADATA_FILE} needs at least"
                f" {size} (truncated)."
            )


def _verify_checksums(path: Path) -> None:
    """Every file's content against the checksum its writer recorded, the files shared out over the ranks (file
    ``i`` by rank ``i mod world``); every rank raises the first mismatch any rank found."""
    manifest = path / MANIFEST_FILE
    if not manifest.is_file():
        return  # written before manifests: sizes and .metadata only
    rank, world = _rank_and_world()
    files = sorted(_manifest_files(manifest).items())
    found = []
    for name, entry in files[rank::world]:
        if "crc32" in entry and (actual := file_checksum(path / name)) != entry["crc32"]:
            found.append(
                f"{path} is damaged: {path / name} does not hold what rank {entry.get('rank', '?')} wrote (CRC32"
                f" {actual}, where the save recorded {entry['crc32']}; the size is unchanged, so its content changed"
                " in place). Resume from another checkpoint."
            )
    problems = [p for ranks in _all_gather(found) for p in ranks]
    if problems:
        raise ValueError(problems[0] + (f" ({len(problems) - 1} more file(s) damaged.)" if len(problems) > 1 else ""))


def load_sharded(path: str | Path, state_dict: dict[str, Any], fused_optimizer_state: dict[str, Any],
                 weights_only: bool = True, owner: str = "DLACStrategy", verify: bool = True) -> dict[str, Any]:
    """Load a checkpoint directory in place into this rank's shards and fused-optimizer state; every rank must call it.

    Args:
        path: The checkpoint directory.
        state_dict: This rank's (sharded) state dict, loaded in place.
        fused_optimizer_state: This rank's fused-optimizer state, loaded in place.
        weights_only: Refuse a ``meta.pt`` holding objects other than plain data and tensors.
        owner: The name errors give the saver.
        verify: Check every file's checksum first (the files shared out over the ranks).

    Returns:
        The rest of the checkpoint with ``"state_dict"`` set (and, for checkpoints that carry it, every saving rank's
        random state under :data:`RANDOM_STATE_KEY`: :func:`restore_random_state`).

    Raises:
        FileNotFoundError: The checkpoint is incomplete (:func:`check_directory`).
        ValueError: The checkpoint is damaged (:func:`check_directory`, checksums, an unreadable ``meta.pt``).
        RuntimeError: The checkpoint was written for other tables.
        pickle.UnpicklingError: ``meta.pt`` holds arbitrary objects and ``weights_only`` is true.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = check_directory(path, owner)
    if verify:
        _verify_checksums(path)
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


def restore_random_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """Take every saving rank's random state out of a loaded ``checkpoint`` and restore this rank's (by the rule of
    :func:`lightning_dlac.engine.rng.for_rank`, which rank 0 warns about when the number of ranks changed); return
    the state restored, or ``None`` for a checkpoint without one (saved before they were kept)."""
    saved = checkpoint.pop(RANDOM_STATE_KEY, None)
    if not saved:
        return None
    rank, world = _rank_and_world()
    state, warning = rng.for_rank(saved, rank, world)
    if warning is not None and rank == 0:
        warnings.warn(warning, stacklevel=2)
    rng.restore(state)
    return state


@dataclass
class CheckpointOptions:
    """How checkpoints are written and read (``DLACStrategy(checkpointing=...)``; YAML ``init_args.checkpointing``).

    Args:
        verify: Checksum (CRC32) every file of a checkpoint when it is saved, by the rank that wrote it, and verify
            the checksums when it is loaded, shared out over the ranks. ``False``: sizes only, for checkpoints too
            large to read back (see the module docstring).

    Raises:
        ValueError: If ``verify`` is not a bool.
    """

    verify: bool = True  # CRC32 of every file at save, checked at load; False: sizes only

    def __post_init__(self) -> None:
        if not isinstance(self.verify, bool):
            raise ValueError(f"verify={self.verify!r} must be true or false.")


class Checkpointer:
    """Saves and loads a TorchRec-sharded model's checkpoints, carrying every rank's random state across a restart.

    What a trainer does with this module's checkpoints: save and load them (shards, fused-optimizer state, the rest)
    and carry every rank's random state across a restart.

    The random state is restored at load. A run resumed in the middle of an epoch makes its training loader's
    iterator again afterwards, which draws from torch's generator, where the interrupted run had made it before the
    checkpoint: :meth:`on_train_start` then puts the loaded state back once more, before the first resumed step.

    Args:
        verify: Checksums at save and at load (see the module docstring); ``False``: sizes only.
        owner: The name errors give the saver (``"DLACStrategy"``).
    """

    def __init__(self, verify: bool = True, owner: str = "DLACStrategy") -> None:
        self.verify = bool(verify)
        self.owner = owner
        self._loaded_random_state: dict[str, Any] | None = None

    def save(self, checkpoint: Mapping[str, Any], path: str | Path, model: DistributedModelParallel | None,
             is_global_zero: bool, barrier: Callable[[str], None]) -> None:
        """:func:`save_sharded` of ``checkpoint`` and ``model``'s fused-optimizer state; every rank must call it.

        Args:
            checkpoint: Lightning's checkpoint dict; its ``"state_dict"`` holds this rank's shards.
            path: The checkpoint directory to write.
            model: The sharded model whose fused-optimizer state is saved (``None``: none).
            is_global_zero: Whether this is rank 0.
            barrier: Waits for every rank (named, for debugging).

        Raises:
            IncompleteCheckpointError: As :func:`save_sharded`.
        """
        save_sharded(checkpoint, path, _fused_state(model), is_global_zero, barrier, verify=self.verify)

    def load(self, path: str | Path, state_dict: dict[str, Any], model: DistributedModelParallel | None,
             weights_only: bool = True) -> dict[str, Any]:
        """:func:`load_sharded` into ``state_dict`` and ``model``'s fused optimizer, restoring this rank's random state.

        The random state is restored with :func:`restore_random_state`. Every rank must call it.

        Args:
            path: The checkpoint directory.
            state_dict: This rank's (sharded) state dict, loaded in place.
            model: The sharded model whose fused optimizer is loaded (``None``: none).
            weights_only: Refuse a ``meta.pt`` holding objects other than plain data and tensors.

        Returns:
            The checkpoint, as :func:`load_sharded` returns it (the random state taken out).

        Raises:
            FileNotFoundError: As :func:`load_sharded`.
            ValueError: As :func:`load_sharded`.
            RuntimeError: As :func:`load_sharded`.
        """
        fused = _fused_state(model)  # loaded in place, shard by shard
        checkpoint = load_sharded(path, state_dict, fused, weights_only=weights_only, owner=self.owner,
                                  verify=self.verify)  # fmt: skip
        if model is not None:
            model.fused_optimizer.load_state_dict(fused)
        self._loaded_random_state = restore_random_state(checkpoint)
        return checkpoint

    def on_train_start(self, resumed_mid_epoch: bool) -> None:
        """Training begins: after a resume in the middle of an epoch, restore the loaded random state again.

        Args:
            resumed_mid_epoch: Whether the run resumed in the middle of an epoch (see the class docstring).
        """
        if self._loaded_random_state is not None and resumed_mid_epoch:
            rng.restore(self._loaded_random_state)
        self._loaded_random_state = None


def _fused_state(model: DistributedModelParallel | None) -> dict[str, Any]:
    return {} if model is None else model.fused_optimizer.state_dict()


def _gist(err: BaseException, last: bool = False, containing: str = "") -> str:
    """The telling line of a long error message: the one ``containing`` a phrase, else the first or ``last``."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    telling = [line for line in lines if containing and containing in line]
    return (telling[0] if telling else lines[-1] if last else lines[0])[:500]
