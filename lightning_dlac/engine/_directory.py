"""How a checkpoint directory appears under its name, whole or not at all (no Lightning, no torch here).

A save writes into a hidden staging directory of its own (:func:`staging_path`: ``.<name>.partial-<token>``) while
its writer holds an ``flock`` on ``<staging>.lock`` (:func:`held`; the kernel releases it when the process dies), and
:func:`commit` moves the complete directory to its name, the checkpoint that stood there waiting as
``<stem>.previous<suffix>`` (:func:`previous_path`) until the new one is in place; swaps in one directory take turns
(:func:`turn`). :func:`sweep` removes what dead or failed saves left, never a live save's directory. :func:`remove`
takes a checkpoint's name away at once and deletes its files under a hidden name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["commit", "discard", "held", "lock_path", "previous_path", "remove", "staging_path", "sweep", "token"]

# Hidden names a save or a removal works under (a token: 16 hex digits); legacy names without one are matched too.
_STAGING = re.compile(r"^\..+\.partial(-[0-9a-f]{16})?$")
_STAGING_LOCK = re.compile(r"^\..+\.partial-[0-9a-f]{16}\.lock$")
_TRASH = re.compile(r"^\..+\.removing(-[0-9a-f]{16})?$")


def staging_path(path: str | Path, token: str) -> Path:
    """Where the save ``token`` of ``path`` writes before the checkpoint is complete (hidden; Lightning never picks
    it)."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial-{token}")


def lock_path(staging: Path) -> Path:
    """The lock file whose ``flock`` marks the save writing ``staging`` as live."""
    return staging.with_name(f"{staging.name}.lock")


def previous_path(path: str | Path) -> Path:
    """Where the checkpoint ``path`` waits while a save replaces it: ``last.ckpt`` -> ``last.previous.ckpt``, a name
    that ``ckpt_path="last"`` still finds."""
    path = Path(path)
    return path.with_name(f"{path.stem}.previous{path.suffix}")


def trash_path(path: Path) -> Path:
    """A hidden name, new every time, under which ``path`` is deleted."""
    return path.with_name(f".{path.name}.removing-{token()}")


def token() -> str:
    """16 hex digits, new for every save."""
    return uuid.uuid4().hex[:16]


def sync_directory(path: Path) -> None:
    """Make the renames in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(lock: Path) -> Iterator[None]:
    """Hold an ``flock`` on the file ``lock`` (created, and removed at the end) while the block runs: the mark of a
    live save, which the kernel takes away when the process dies. Where the filesystem cannot lock, the block runs
    unmarked (and :func:`sweep` never removes such a save's directory)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh name: nobody else can hold it
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)


@contextlib.contextmanager
def turn(directory: Path) -> Iterator[None]:
    """Take the directory's turn for a swap (an ``flock`` on the directory itself; without one where the filesystem
    cannot lock a directory, e.g. NFS, where two saves of one name at the same instant can make one fail)."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def writer_gone(lock: Path) -> int | None:
    """An open descriptor holding ``lock`` when no live save holds it (the caller closes it), ``-1`` when there is
    no lock file at all (no live save is without one), ``None`` when a live save holds it or locks do not work
    here."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep(directory: Path) -> None:
    """Remove what dead or failed saves and removals left in ``directory``: staging directories whose writer holds
    no lock, lock files nobody holds, half-removed checkpoints. A live save's staging directory stays: its writer
    holds its lock from before the directory exists until after it is renamed."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if _TRASH.match(name):
            shutil.rmtree(entry, ignore_errors=True)
        elif _STAGING.match(name) or _STAGING_LOCK.match(name):
            staging = entry.with_name(name[: -len(".lock")]) if _STAGING_LOCK.match(name) else entry
            fd = writer_gone(lock_path(staging))
            if fd is None:
                continue
            try:
                discard(staging)
                if fd >= 0:
                    with contextlib.suppress(FileNotFoundError):
                        lock_path(staging).unlink()
            finally:
                if fd >= 0:
                    os.close(fd)


def commit(staging: Path, path: Path) -> None:
    """Put the complete checkpoint ``staging`` at ``path``; whatever stood there goes only after that."""
    previous = previous_path(path)
    with turn(path.parent):
        if os.path.lexists(path):
            if os.path.lexists(previous):
                remove(previous)  # left by an earlier interrupted swap; `path` is complete and newer
            os.rename(path, previous)
        # From here until the rename below `path` is missing, and "last" resolves to the previous checkpoint.
        os.rename(staging, path)
        sync_directory(path.parent)
        if os.path.lexists(previous):
            remove(previous)


def remove(path: Path) -> None:
    """Remove a checkpoint (directory, file or link) so that no part of it is ever left under its name."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        trash = trash_path(path)
        os.rename(path, trash)  # gone from its name at once; the slow part happens under a name nothing resolves
        shutil.rmtree(trash)
    else:
        path.unlink()


def discard(path: Path) -> None:
    """Remove a directory a dead save left, whatever happens to it meanwhile (a leftover process still writing
    into it, another save's sweep removing it too)."""
    with contextlib.suppress(FileNotFoundError):
        trash = trash_path(path)
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
