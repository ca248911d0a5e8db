"""The size exchange sends only the records a receiver cannot know (issue 34): a payload sent as is has a size its
receiver computes, and a rank's own block has none. Checked on 3 real gloo ranks with an asymmetric plan against the
exchange of every record."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from lightning_dlac.testing import run_ranks

# compressed[src][dst]: rank 0 compresses for 1 only, rank 1 for 0 and 2, rank 2 for nobody; own entries False.
PLAN = ((False, True, False), (True, False, True), (False, False, False))
COUNTS = (2, 1, 3)  # records each rank sends every destination (its local tables)


def _record(src: int, dst: int, k: int) -> int:
    return 1000 * src + 100 * dst + k  # a compressed chunk's size: only the sender knows it


def _known(src: int, dst: int, k: int) -> int:
    return 0 if src == dst else 7 * (src + 1) * (k + 1)  # a raw chunk's size: rows x dims x 4, known to both


def _sizes(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from lightning_dlac.comm.exchange import exchange_sizes, exchange_unknown_sizes

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        n = COUNTS[rank]
        truth = [(_record(rank, d, k) if PLAN[rank][d] else _known(rank, d, k)) for d in range(world_size)
                 for k in range(n)]
        # Where this rank's receiver knows the records, garbage goes in: it must never arrive.
        sizes = torch.tensor([(v if PLAN[rank][d] else -1) for d in range(world_size)
                              for v in truth[d * n : (d + 1) * n]], dtype=torch.int64)
        known = [None if PLAN[s][rank] else torch.tensor([_known(s, rank, k) for k in range(COUNTS[s])])
                 for s in range(world_size)]
        got = exchange_unknown_sizes(sizes, [n] * world_size, list(COUNTS), PLAN[rank], known, dist.group.WORLD)
        every = exchange_sizes(torch.tensor(truth, dtype=torch.int64), [n] * world_size, list(COUNTS),
                               dist.group.WORLD)
        dist.barrier()
        return {"got": got.tolist(), "every": every.tolist()}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_only_the_sizes_a_receiver_cannot_know_travel_and_it_computes_the_rest() -> None:
    for rank, r in enumerate(run_ranks(_sizes, 3)):
        expected = [(_record(s, rank, k) if PLAN[s][rank] else _known(s, rank, k)) for s in range(3)
                    for k in range(COUNTS[s])]
        assert r["got"] == r["every"] == expected, rank
        assert -1 not in r["got"]
