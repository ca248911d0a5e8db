"""The pooled exchange sent in pieces (lightning_dlac/comm/pieces.py, issue 34): how a layout is cut, how many pieces
an exchange gets, and, on three real gloo ranks, that every piece count gives the whole exchange's output, gradient
and statistics bit for bit (every peer compressed, and a plan that sends some peers their rows as they are)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from lightning_dlac.comm import CompressionConfig
from lightning_dlac.comm.peers import PeerPlan
from lightning_dlac.comm.pieces import merge_piece_sizes, piece_bounds, piece_count, split_layout
from lightning_dlac.comm.pooled import Layout
from lightning_dlac.testing import run_ranks
from tests.conftest import native_expected

DIMS = ((8, 4, 16), (16,), (4, 4, 8, 8))  # unequal table counts and widths; rank 1 has fewer tables than pieces
BATCH = [5, 7, 3]
NATIVE = "native" if native_expected() else "auto"


def _layout(me: int, dims=DIMS, peers: PeerPlan | None = None) -> Layout:
    return Layout(me, tuple(tuple(f"t{r}_{c}" for c in range(len(d))) for r, d in enumerate(dims)), dims, peers=peers)


def test_tables_are_cut_into_contiguous_groups_of_about_equal_width() -> None:
    assert piece_bounds([8, 8, 8, 8], 2) == [0, 2, 4]
    assert piece_bounds([8, 8, 8, 8], 4) == [0, 1, 2, 3, 4]
    assert piece_bounds([4, 4, 4, 12], 2) == [0, 3, 4]  # 12 of 24 columns on either side
    assert piece_bounds([4, 4, 8, 8], 2) == [0, 2, 4]  # 8 or 16 of 24 columns: as near, the earlier boundary
    assert piece_bounds([4, 4, 4, 4, 8], 2) == [0, 3, 5]  # 12 of 24
    assert piece_bounds([64], 3) == [0, 0, 1, 1]  # one table: one piece holds it, the others are empty
    assert piece_bounds([], 2) == [0, 0, 0]
    assert piece_bounds([8, 8, 8], 1) == [0, 3]
    with pytest.raises(ValueError, match="at least one piece"):
        piece_bounds([8], 0)


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_table_of_every_rank_is_in_exactly_one_piece_at_its_columns(count: int) -> None:
    layout = _layout(2)
    pieces = split_layout(layout, count)
    assert len(pieces) == count
    for r in range(layout.world):
        assert [t for p in pieces for t in p.layout.tables_per_rank[r]] == list(layout.tables_per_rank[r])
        assert [d for p in pieces for d in p.layout.dims_per_rank[r]] == list(layout.dims_per_rank[r])
        ends = [p.cols[r] for p in pieces]  # side by side, from the block's first column to its last
        assert ends[0][0] == 0 and ends[-1][1] == layout.dim_sums[r]
        assert all(a[1] == b[0] for a, b in zip(ends, ends[1:]))
        assert all(b - a == p.layout.dim_sums[r] for (a, b), p in zip(ends, pieces))
    assert all(p.layout.rank == 2 and p.layout.plan == layout.plan for p in pieces)
    out_cols = [p.out_cols for p in pieces]  # rank 1's block starts after rank 0's 28 columns
    assert out_cols[0][1][0] == 28 and out_cols[-1][2][1] == sum(layout.dim_sums)


def test_the_piece_count_is_the_configured_one_within_what_the_layout_can_cut() -> None:
    assert CompressionConfig().pieces == 1  # the exchange whole unless asked for
    assert piece_count(_layout(0), 3) == 3
    assert piece_count(_layout(0), 9) == 4  # no more than a rank's tables (rank 2 has 4)
    assert piece_count(_layout(0, dims=((64,) * 4,)), 4) == 1  # one rank: nothing to overlap
    with pytest.raises(ValueError, match="pieces=0 must be a whole number >= 1"):
        CompressionConfig(pieces=0)


def test_piece_sizes_merge_into_the_whole_exchanges_order() -> None:
    layout = _layout(2)
    pieces = split_layout(layout, 2)
    # Forward: this rank's (destination, table) chunks, destination-major: size = 100 * destination + table.
    whole = torch.tensor([100 * d + t for d in range(3) for t in range(4)])
    per_piece = [torch.tensor([100 * d + t for d in range(3) for t in range(*p.tables[2])]) for p in pieces]
    assert torch.equal(merge_piece_sizes(per_piece, [[len(p.layout.local_tables)] * 3 for p in pieces]), whole)
    # Backward: the (owner, owner's table) chunks, owner-major.
    whole = torch.tensor([100 * r + t for r in range(3) for t in range(len(DIMS[r]))])
    per_piece = [torch.tensor([100 * r + t for r in range(3) for t in range(*p.tables[r])]) for p in pieces]
    assert torch.equal(merge_piece_sizes(per_piece, [p.layout.chunk_counts for p in pieces]), whole)


# ------------------------------------------------------------------------------------------------ 3 gloo ranks


def _exchange(rank: int, backward: str, pieces: int, plan: PeerPlan | None) -> dict:
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll

    tables = [[f"t{r}_{c}" for c in range(len(d))] for r, d in enumerate(DIMS)]
    bounds = ErrorBounds(default_eps=0.01)
    bounds.set_table_bounds({"t0_1": 0.05, "t2_3": 0.002})
    config = CompressionConfig(backward=backward, backward_eps=0.02, error_every=1, impl=NATIVE, overlap=False,
                               pieces=pieces)
    a2a = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, [list(d) for d in DIMS], tables, config, bounds,
                                             peers=plan)
    x = torch.randn(sum(BATCH), sum(DIMS[rank]), generator=torch.Generator().manual_seed(rank)) * 3 + 1
    x.requires_grad_()
    out = a2a(x, BATCH).wait()
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(10 + rank)))
    s = a2a.stats
    return {"out": out.detach(), "grad": x.grad, "pieces": len(a2a._pieces()),
            "stats": (s.sent_bytes, dict(s.table_sent_bytes), dict(s.table_max_error_ratio), s.backward_sent_bytes,
                      s.same_node_sent_bytes, s.other_nodes_sent_bytes, s.passed_bytes, dict(s.table_passed_bytes))}


def _pieces_against_whole(rank: int, world: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        # Rank 1 compresses for nobody and gets its rows from rank 2 as they are: runs of both kinds on every rank.
        mixed = PeerPlan.from_policy(lambda s, d: s != 1 and (s, d) != (2, 1), (0, 0, 0))
        results = {}
        for plan_name, plan in (("everyone", None), ("mixed", mixed)):
            for backward in ("dlac", "bf16"):
                whole = _exchange(rank, backward, 1, plan)
                for count in (2, 3, 4):
                    cut = _exchange(rank, backward, count, plan)
                    results[(plan_name, backward, count)] = {
                        "pieces": cut["pieces"], "same_out": torch.equal(cut["out"], whole["out"]),
                        "same_grad": torch.equal(cut["grad"], whole["grad"]),
                        "same_stats": cut["stats"] == whole["stats"], "sent": cut["stats"][0]}
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_exchange_in_pieces_is_the_whole_exchange_bit_for_bit_on_three_ranks() -> None:
    for rank, results in enumerate(run_ranks(_pieces_against_whole, 3, timeout=240)):
        assert len(results) == 2 * 2 * 3
        for key, r in results.items():
            assert r["pieces"] == key[2], (rank, key)  # rank 2 has 4 tables: every count up to 4 is kept
            assert r["same_out"] and r["same_grad"] and r["same_stats"], (rank, key, r)
            assert r["sent"] > 0, (rank, key)
