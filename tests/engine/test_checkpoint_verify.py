"""Verified checkpoints and random state, without processes (lightning_dlac.engine.checkpoint, engine.rng): the
manifest lists every file DCP's metadata names with its size, CRC32 and writer; a shard missing as rank 0 sees it is
never committed; a bit flip that keeps the size is refused at load (``verify_checkpoints=False`` skips the check);
two saves racing into one directory keep apart; every rank's random state travels in the checkpoint.

The same with real gloo ranks, where rank 0 cannot see a file another rank wrote: tests/engine/test_checkpoint_ranks.py.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dlac.engine import _directory, rng
from lightning_dlac.engine import checkpoint as ckpt
from lightning_dlac.engine.checkpoint import (
    MANIFEST_FILE,
    META_FILE,
    Checkpointer,
    IncompleteCheckpointError,
    check_directory,
    file_checksum,
    load_sharded,
    save_sharded,
)


def _save(path: Path, step: int, verify: bool = True) -> None:
    checkpoint = {"state_dict": {"w": torch.full((4096,), float(step))}, "global_step": step}
    save_sharded(checkpoint, path, {"state": {"m": torch.full((8,), float(step))}}, is_global_zero=True,
                 barrier=lambda name: None, verify=verify)  # fmt: skip


def _load_step(path: Path, verify: bool = True) -> int:
    state, fused = {"w": torch.zeros(4096)}, {"state": {"m": torch.zeros(8)}}
    step = load_sharded(path, state, fused, verify=verify)["global_step"]
    assert torch.equal(state["w"], torch.full((4096,), float(step))), "weights of another save than meta.pt's"
    return step


def _shard(path: Path) -> Path:
    return next(p for p in sorted(path.iterdir()) if p.suffix == ".distcp")


def _flip_a_bit(file: Path) -> None:
    """Flip one bit in the middle of the file (inside a tensor's data, so the damage still loads)."""
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x10
    file.write_bytes(bytes(data))


def test_the_manifest_lists_every_file_dcp_names_with_its_size_checksum_and_writer(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    path = tmp_path / "checkpoints" / "step=1.ckpt"  # its directory made by the first save
    _save(path, 1)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    named = {info.relative_path for info in FileSystemReader(str(path)).read_metadata().storage_data.values()}
    assert manifest["format"] == 2 and manifest["checksum"] == "crc32"
    assert set(manifest["files"]) == named | {".metadata", META_FILE} == {p.name for p in path.iterdir()} - {
        MANIFEST_FILE}  # fmt: skip
    for name, entry in manifest["files"].items():
        assert entry == {"bytes": (path / name).stat().st_size, "crc32": file_checksum(path / name), "rank": 0}
    _save(path, 2, verify=False)  # sizes only
    assert all(set(e) == {"bytes", "rank"} for e in json.loads((path / MANIFEST_FILE).read_text())["files"].values())


def test_a_shard_flipped_in_place_is_refused_at_load_unless_verification_is_off(tmp_path: Path) -> None:
    path = tmp_path / "step=3.ckpt"
    _save(path, 3)
    shard = _shard(path)
    size = shard.stat().st_size
    _flip_a_bit(shard)
    assert shard.stat().st_size == size
    check_directory(path)  # the sizes are right: only the checksum tells
    with pytest.raises(ValueError, match=rf"{shard} does not hold what rank 0 wrote \(CRC32 [0-9a-f]{{8}}, where the"
                                         r" save recorded [0-9a-f]{8}"):  # fmt: skip
        _load_step(path)
    state = {"w": torch.zeros(4096)}
    load_sharded(path, state, {"state": {"m": torch.zeros(8)}}, verify=False)  # skipped: the damage is loaded
    assert not torch.equal(state["w"], torch.full((4096,), 3.0))


def test_a_shard_that_rank_0_cannot_see_is_never_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on node-local disks: the rank that wrote the shard reports it (size and checksum), but it is not in the
    directory as rank 0 sees it. The save fails naming it and the shared-storage rule; the previous checkpoint stays.
    """
    last = tmp_path / "last.ckpt"
    _save(last, 1)
    entry = ckpt._entry

    def reported_then_gone(path: Path, rank: int, verify: bool) -> dict:
        reported = entry(path, rank, verify)
        if path.suffix == ".distcp":
            path.unlink()
        return reported

    monkeypatch.setattr(ckpt, "_entry", reported_then_gone)
    with pytest.raises(IncompleteCheckpointError, match=r"was not saved: __0_0\.distcp \(written by rank 0, \d+ bytes\)"
                                                        " is not there as rank 0 sees the directory"):  # fmt: skip
        _save(last, 2)
    monkeypatch.undo()
    assert _load_step(last) == 1  # nothing committed
    _save(last, 3)  # the next save clears the failed one's staging directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"] and _load_step(last) == 3


def test_two_saves_racing_into_one_directory_keep_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Save A stops after its shards are written; save B of the same name runs from start to end meanwhile (its sweep
    of dead saves must leave A's staging directory alone: A's writer holds its lock); then A finishes. The
    checkpoint is A's, complete, and nothing is left over."""
    last = tmp_path / "last.ckpt"
    a_written, b_done = threading.Event(), threading.Event()
    finish = ckpt._finish

    def paused_finish(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if threading.current_thread().name == "A":
            a_written.set()
            assert b_done.wait(60)
        return finish(*args, **kwargs)

    monkeypatch.setattr(ckpt, "_finish", paused_finish)
    errors: list[BaseException] = []

    def run(step: int) -> None:
        try:
            _save(last, step)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    a = threading.Thread(target=run, args=(1,), name="A")
    a.start()
    assert a_written.wait(60)
    stagings = [p for p in tmp_path.iterdir() if ".partial-" in p.name and p.is_dir()]
    run(2)  # B, in this thread
    assert _load_step(last) == 2
    assert [p for p in stagings if p.is_dir()] == stagings  # A's staging directory survived B's sweep
    b_done.set()
    a.join(60)
    assert not errors, errors
    assert _load_step(last) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_stale_staging_directory_is_removed_and_a_live_one_kept(tmp_path: Path) -> None:
    dead = _directory.staging_path(tmp_path / "last.ckpt", "0" * 16)
    dead.mkdir()
    (dead / "__0_0.distcp").write_bytes(b"x")
    _directory.lock_path(dead).touch()  # its writer died: nobody holds the lock
    failed = _directory.staging_path(tmp_path / "last.ckpt", "2" * 16)  # a save that failed: its lock file is gone
    failed.mkdir()
    (tmp_path / ".last.ckpt.partial").mkdir()  # an older version's fixed name
    (tmp_path / ".epoch=0.ckpt.removing").mkdir()  # a removal that died half-way
    live = _directory.staging_path(tmp_path / "last.ckpt", "1" * 16)
    with _directory.held(_directory.lock_path(live)):
        live.mkdir()
        _directory.sweep(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, _directory.lock_path(live).name])


def test_every_rank_s_random_state_is_saved_and_restored_at_load(tmp_path: Path) -> None:
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    checkpoint = {"state_dict": {"w": torch.zeros(4)}, "global_step": 1}
    Checkpointer().save(checkpoint, tmp_path / "c", None, True, lambda name: None)
    after_save = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    torch.manual_seed(0), np.random.seed(0), random.seed(0)  # a restarted process: seeded afresh
    loaded = Checkpointer().load(tmp_path / "c", {"w": torch.zeros(4)}, None)
    after_load = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(after_save[0], after_load[0]) and np.array_equal(after_save[1], after_load[1])
    assert after_save[2] == after_load[2]
    assert ckpt.RANDOM_STATE_KEY not in loaded  # taken out: Lightning sees the checkpoint it wrote


def test_a_resume_in_the_middle_of_an_epoch_puts_the_state_back_once_more(tmp_path: Path) -> None:
    """Lightning makes the training loader's iterator again after the load (a draw from torch's generator), where
    the interrupted run had made it before the checkpoint: in the middle of an epoch the loaded state goes back
    before the first step; at an epoch's start that draw is the new epoch's, as in the interrupted run."""
    torch.manual_seed(3)
    Checkpointer().save({"state_dict": {"w": torch.zeros(4)}}, tmp_path / "c", None, True, lambda name: None)
    next_step = torch.rand(2)
    for mid_epoch in (True, False):
        checkpointer = Checkpointer()
        checkpointer.load(tmp_path / "c", {"w": torch.zeros(4)}, None)
        torch.empty((), dtype=torch.int64).random_()  # what a DataLoader iterator draws when it is made
        checkpointer.on_train_start(resumed_mid_epoch=mid_epoch)
        assert torch.equal(torch.rand(2), next_step) is mid_epoch


def test_on_another_number_of_ranks_the_extra_ranks_derive_their_state_and_a_warning_says_so() -> None:
    saved = []
    for seed in (1, 2):
        torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)
        saved.append(rng.capture())
    for rank in range(2):
        state, warning = rng.for_rank(saved, rank, 2)
        assert state is saved[rank] and warning is None
    states = [rng.for_rank(saved, rank, 4) for rank in range(4)]
    assert states[0][0] is saved[0] and states[1][0] is saved[1]
    assert "written by 2 rank(s) and resumes on 4" in states[3][1] and "cannot continue exactly" in states[3][1]
    again = rng.for_rank(saved, 3, 4)[0]
    assert torch.equal(again["torch"], states[3][0]["torch"]) and again["python"] == states[3][0]["python"]
    assert not torch.equal(states[2][0]["torch"], states[3][0]["torch"])
    assert not any(torch.equal(s[0]["torch"], saved[0]["torch"]) for s in states[2:])
    assert "resumes on 1" in rng.for_rank(saved, 0, 1)[1]


def test_verify_checkpoints_false_saves_and_loads_without_checksums(tmp_path: Path) -> None:
    """``DLACStrategy(checkpointing=CheckpointOptions(verify=...))``: by default a flipped bit is refused at load;
    ``False`` records sizes only at save and does not read the files back at load."""
    import lightning.pytorch as pl

    from lightning_dlac import CheckpointOptions, DLACStrategy

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 64)

    def strategy(**options: bool) -> DLACStrategy:
        s = DLACStrategy(checkpointing=CheckpointOptions(**options))
        s.connect(Tiny())
        return s

    for verify in (True, False):
        saver = strategy(verify=verify)
        path = tmp_path / f"verify={verify}.ckpt"
        saver.save_checkpoint({"state_dict": saver.lightning_module.state_dict(), "epoch": 0}, path)
        entries = json.loads((path / MANIFEST_FILE).read_text())["files"].values()
        assert all(("crc32" in e) is verify for e in entries)
    path = tmp_path / "verify=True.ckpt"
    _flip_a_bit(_shard(path))
    with pytest.raises(ValueError, match="does not hold what rank 0 wrote"):
        strategy().load_checkpoint(path)
    assert strategy(verify=False).load_checkpoint(path)["epoch"] == 0
