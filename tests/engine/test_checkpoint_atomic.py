"""Atomic checkpoint saves without processes (lightning_dlac.engine.checkpoint): a save interrupted at any point
leaves a
complete checkpoint that Lightning's ``ckpt_path="last"`` resolves to (the previous one until the new one is
complete), leftovers of interrupted saves are cleared, and an incomplete or damaged checkpoint given explicitly
fails with an error naming the missing or damaged file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from lightning_dlac.engine import checkpoint as ckpt
from lightning_dlac.engine.checkpoint import MANIFEST_FILE, META_FILE, check_directory, load_sharded, save_sharded


class _Killed(Exception):
    """Stands for the process dying at that point: nothing after it runs."""


def _save(path: Path, step: int) -> None:
    checkpoint = {"state_dict": {"w": torch.full((64,), float(step))}, "global_step": step}
    save_sharded(checkpoint, path, {"state": {"m": torch.full((8,), float(step))}}, is_global_zero=True,
                 barrier=lambda name: None)  # fmt: skip


def _load_step(path: Path) -> int:
    state, fused = {"w": torch.zeros(64)}, {"state": {"m": torch.zeros(8)}}
    loaded = load_sharded(path, state, fused)
    step = loaded["global_step"]
    assert torch.equal(state["w"], torch.full((64,), float(step)))  # the weights of the same save as meta.pt
    assert torch.equal(fused["state"]["m"], torch.full((8,), float(step)))
    return step


def _last(directory: Path) -> str | None:
    """What ``trainer.fit(ckpt_path="last")`` would load, resolved by Lightning itself."""
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      callbacks=[ModelCheckpoint(dirpath=directory, save_last=True)])  # fmt: skip
    with pytest.warns(UserWarning, match="no last checkpoint") if not any(directory.glob("last*")) else _nothing():
        return trainer._checkpoint_connector._parse_ckpt_path(TrainerFn.FITTING, "last", True, True)


class _nothing:  # noqa: N801 - a context manager that expects nothing
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _interrupt(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Make the next save die at ``where``."""
    import torch.distributed.checkpoint as dcp

    if where == "while_ranks_write_shards":
        real = dcp.save

        def save(state_dict, **kwargs):  # noqa: ANN001, ANN003, ANN202
            real({"state_dict": state_dict["state_dict"]}, **kwargs)  # shards written, no more
            raise _Killed

        monkeypatch.setattr(dcp, "save", save)
    elif where in ("before_the_manifest", "before_the_switch"):
        real_write = ckpt._write_durably
        calls = []

        def write(path, write):  # noqa: ANN001, ANN202
            calls.append(path)
            if where == "before_the_manifest" and path.name == MANIFEST_FILE:
                raise _Killed
            real_write(path, write)

        monkeypatch.setattr(ckpt, "_write_durably", write)
        if where == "before_the_switch":
            monkeypatch.setattr(ckpt._directory, "commit", lambda staging, path: (_ for _ in ()).throw(_Killed()))
    elif where in ("between_the_renames", "while_removing_the_previous"):
        real_rename, real_remove = os.rename, ckpt._directory.remove

        def rename(src, dst):  # noqa: ANN001, ANN202
            real_rename(src, dst)
            if where == "between_the_renames" and Path(dst).name == "last.previous.ckpt":
                raise _Killed

        def remove(path):  # noqa: ANN001, ANN202
            if where == "while_removing_the_previous" and path.name == "last.previous.ckpt":
                raise _Killed
            real_remove(path)

        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(ckpt._directory, "remove", remove)
    else:
        raise AssertionError(where)


@pytest.mark.parametrize(
    ("where", "last_step"),
    [
        ("while_ranks_write_shards", 1),
        ("before_the_manifest", 1),
        ("before_the_switch", 1),
        ("between_the_renames", 1),  # the new one is complete but not at its name yet: the previous one is "last"
        ("while_removing_the_previous", 2),  # both complete; "last" picks the newer
    ],
)
def test_a_save_killed_at_any_point_leaves_a_complete_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, last_step: int
) -> None:
    last = tmp_path / "last.ckpt"
    _save(last, 1)
    with monkeypatch.context() as patches:
        _interrupt(patches, where)
        with pytest.raises(_Killed):
            _save(last, 2)
    resolved = _last(tmp_path)
    assert resolved is not None and _load_step(Path(resolved)) == last_step
    # The next save (the restarted run's) clears what the interrupted one left and becomes "last".
    _save(last, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert _load_step(Path(_last(tmp_path))) == 3


def test_the_first_save_killed_leaves_nothing_that_last_would_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as patches:
        _interrupt(patches, "before_the_switch")
        with pytest.raises(_Killed):
            _save(tmp_path / "last.ckpt", 1)
    assert _last(tmp_path) is None  # the run starts from the beginning
    (left,) = tmp_path.iterdir()  # the staging directory (its writer's lock is gone with it: the next save clears it)
    assert re.fullmatch(r"\.last\.ckpt\.partial-[0-9a-f]{16}", left.name), left.name


def test_a_save_replaces_a_file_of_the_same_name_and_removal_leaves_no_part_behind(tmp_path: Path) -> None:
    path = tmp_path / "epoch=0-step=4.ckpt"
    path.write_bytes(b"a single-file checkpoint")
    _save(path, 4)
    assert path.is_dir() and _load_step(path) == 4 and len(list(tmp_path.iterdir())) == 1
    ckpt.remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == []


def _damage(path: Path, how: str) -> str:
    """Damage a complete checkpoint; return the file the error must name."""
    shard = next(p for p in sorted(path.iterdir()) if p.suffix == ".distcp")
    if how == "shard_missing":
        shard.unlink()
        return f"{shard} is missing"
    if how == "shard_truncated":
        shard.write_bytes(shard.read_bytes()[:-10])
        return f"{shard} has"
    if how == "meta_truncated":
        (path / META_FILE).write_bytes((path / META_FILE).read_bytes()[:100])
        return f"{path / META_FILE} has 100 bytes where the save wrote"
    if how == "dcp_metadata_missing":
        (path / ".metadata").unlink()
        return f"{path / '.metadata'} is missing"
    if how == "unfinished_save":  # what a save killed before its last step leaves, given explicitly
        (path / MANIFEST_FILE).unlink()
        (path / META_FILE).unlink()
        return f"{META_FILE} and {MANIFEST_FILE} are missing"
    if how == "manifest_damaged":
        (path / MANIFEST_FILE).write_text("{not json")
        return f"{path / MANIFEST_FILE} is damaged"
    if how == "shard_truncated_without_manifest":  # a directory written before manifests, damaged
        (path / MANIFEST_FILE).unlink()
        shard.write_bytes(shard.read_bytes()[:-10])
        return f"{shard} has .* needs at least"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["shard_missing", "shard_truncated", "meta_truncated", "dcp_metadata_missing",
                                 "unfinished_save", "manifest_damaged", "shard_truncated_without_manifest"])
def test_an_incomplete_or_damaged_checkpoint_names_the_file(tmp_path: Path, how: str) -> None:
    path = tmp_path / "step=7.ckpt"
    _save(path, 7)
    message = _damage(path, how)
    with pytest.raises((FileNotFoundError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        check_directory(path)
    with pytest.raises((FileNotFoundError, ValueError)):
        _load_step(path)


def test_a_checkpoint_without_a_manifest_still_loads(tmp_path: Path) -> None:
    """Directories written before manifests existed: complete by DCP's own .metadata, and meta.pt loads."""
    path = tmp_path / "old.ckpt"
    _save(path, 5)
    (path / MANIFEST_FILE).unlink()
    assert _load_step(path) == 5


def test_a_checkpoint_missing_in_the_middle_of_a_swap_points_to_the_previous(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    last = tmp_path / "last.ckpt"
    _save(last, 1)
    with monkeypatch.context() as patches:
        _interrupt(patches, "between_the_renames")
        with pytest.raises(_Killed):
            _save(last, 2)
    with pytest.raises(FileNotFoundError, match="a save that was replacing it was interrupted.*last.previous.ckpt"):
        check_directory(last)
