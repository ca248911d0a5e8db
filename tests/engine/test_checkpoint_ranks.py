"""Verified checkpoints on 2 real gloo ranks (lightning_dlac.engine.checkpoint, no Lightning): a shard that rank 0
cannot see (node-local disks) is reported by the rank that wrote it and the save fails on both ranks, naming it,
with nothing committed; a bit flip in one rank's shard is found by the rank whose share of the verification it is,
and both ranks refuse the load; each rank's own random state comes back at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dlac.testing import run_ranks


def _ranks(rank: int, world_size: int, root: str) -> dict:
    import torch
    import torch.distributed as dist

    from lightning_dlac.engine import checkpoint as ckpt

    dist.init_process_group("gloo")
    last = Path(root) / "last.ckpt"

    def save(step: int) -> None:
        # A key of its own per rank: each rank writes its own shard file (__<rank>_0.distcp).
        state = {"state_dict": {f"w{rank}": torch.full((4096,), float(10 * step + rank))}, "global_step": step}
        ckpt.save_sharded(state, last, {}, rank == 0, lambda name: dist.barrier())

    def load() -> int:
        state = {f"w{rank}": torch.zeros(4096)}
        checkpoint = ckpt.load_sharded(last, state, {})
        ckpt.restore_random_state(checkpoint)  # this rank's own, of the two that rank 0 wrote into meta.pt
        step = checkpoint["global_step"]
        assert torch.equal(state[f"w{rank}"], torch.full((4096,), float(10 * step + rank)))
        return step

    def error_of(call: object) -> str | None:
        try:
            call()
        except (ckpt.IncompleteCheckpointError, ValueError) as err:
            return f"{type(err).__name__}: {err}"
        return None

    out: dict = {}
    torch.manual_seed(100 + rank)
    save(1)
    out["after_save"] = torch.rand(4).tolist()

    # Rank 1's shard is written and reported, then gone from the directory rank 0 sees (a disk of rank 1's own).
    entry = ckpt._entry

    def reported_then_gone(path: Path, writer: int, verify: bool) -> dict:
        reported = entry(path, writer, verify)
        if rank == 1 and path.suffix == ".distcp":
            path.unlink()
        return reported

    ckpt._entry = reported_then_gone
    out["unseen"] = error_of(lambda: save(2))
    ckpt._entry = entry

    torch.manual_seed(0)  # as a restarted process would be
    out["step"] = load()  # the first checkpoint, untouched
    out["after_load"] = torch.rand(4).tolist()

    dist.barrier()
    if rank == 0:  # one bit of rank 1's shard; rank 0 verifies that file (files shared out: sorted, i mod 2)
        shard = last / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    dist.barrier()
    out["flipped"] = error_of(load)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_shard_rank_0_cannot_see_is_never_committed_and_a_flipped_one_never_loaded(tmp_path: Path) -> None:
    results = run_ranks(_ranks, 2, str(tmp_path), timeout=240)
    for rank, out in enumerate(results):
        assert out["unseen"] is not None and out["unseen"].startswith("IncompleteCheckpointError: The checkpoint"), out
        assert "__1_0.distcp (written by rank 1, " in out["unseen"] and "not there as rank 0 sees" in out["unseen"]
        assert "Rank 0 cannot see the files of rank(s) [1]" in out["unseen"] and "shared" in out["unseen"]
        assert out["step"] == 1  # nothing of the failed save was committed
        assert out["after_load"] == out["after_save"], rank  # this rank's own random state, back at load
        assert out["flipped"] is not None and "__1_0.distcp does not hold what rank 1 wrote" in out["flipped"], out
    assert results[0]["after_save"] != results[1]["after_save"]
    # What stays besides the checkpoint is the failed save's hidden staging directory, for the next save's sweep.
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".last.ckpt.partial-")] == ["last.ckpt"]
