"""The exchange assembles its results in place (issue 34): the forward decodes straight into the output's column
blocks, the DLAC backward into the gradient's row blocks, the cast backward gathers and casts in one pass and takes
the received rows as they are. Each is checked here, without processes, bit for bit against the concatenations it
replaced, on every layout position of this rank (first, middle, last) and with both codec implementations."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_dlac.codec import CodecError
from lightning_dlac.comm.buffers import ResultBuffers
from lightning_dlac.comm.exchange import InFlight, decode_chunks, encode_chunks, offsets, with_own
from lightning_dlac.comm.pooled import (
    BackwardInFlight,
    Layout,
    decode_from_others,
    finish_backward,
    gather_owner_blocks,
)
from tests.conftest import native_expected

DIMS = ((8, 4), (16,), (4, 4, 8))  # column blocks per rank: unequal counts and widths


def _layout(me: int) -> Layout:
    tables = tuple(tuple(f"r{r}t{i}" for i in range(len(d))) for r, d in enumerate(DIMS))
    return Layout(me, tables, DIMS)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.fixture(params=["ref", "native"])
def impl(request) -> str:
    if request.param == "native" and not native_expected():
        pytest.skip("the native codec is not expected to build here")
    return request.param


@pytest.mark.parametrize("me", [0, 1, 2])
def test_forward_decodes_into_the_output_bit_for_bit_as_the_concatenation(me: int, impl: str) -> None:
    layout, rows = _layout(me), 24
    g = torch.Generator().manual_seed(me)
    # What every other rank sends this one: its column blocks of this rank's rows, encoded as encode_for_others does.
    grids = {s: encode_chunks(torch.randn(rows, layout.dim_sums[s], generator=g), [0, rows],
                              offsets(DIMS[s]), 0.02, impl) for s in layout.other_ranks}
    received = torch.cat([grids[s].payload for s in layout.other_ranks])
    counts = layout.chunk_counts
    recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), sum(counts[:me]), counts[me])
    own = torch.randn(rows, layout.dim_sums[me], generator=g)

    out = decode_from_others(received, recv_sizes, own, layout, impl)

    # The replaced assembly: decode every other rank's columns at once, then concatenate around the own block.
    mine = offsets(counts)
    keep = torch.cat([recv_sizes[: mine[me]], recv_sizes[mine[me + 1] :]])
    cols = offsets([d for s in layout.other_ranks for d in DIMS[s]])
    decoded = decode_chunks(received, keep, [0, rows], cols, impl, own.device)
    first = sum(layout.dim_sums[:me])
    expected = torch.cat([decoded[:, :first], own, decoded[:, first:]], dim=1)
    assert torch.equal(_bits(out), _bits(expected))


@pytest.mark.parametrize("me", [0, 1, 2])
def test_dlac_gradient_decodes_into_the_result_bit_for_bit_as_the_concatenation(me: int, impl: str) -> None:
    layout, batch = _layout(me), [5, 7, 3]
    g = torch.Generator().manual_seed(10 + me)
    d_me, cols = layout.dim_sums[me], layout.local_cols
    # Every other rank sends the gradient of this rank's columns for its batch rows.
    grids = {s: encode_chunks(torch.randn(batch[s], d_me, generator=g) * 1e-3, [0, batch[s]], cols, 0.01, impl)
             for s in layout.other_ranks}
    n = len(DIMS[me])
    received = torch.cat([grids[s].payload for s in layout.other_ranks])
    recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), me * n, n)
    own = torch.randn(batch[me], d_me, generator=g)
    pending = BackwardInFlight(InFlight(received), 0, recv_sizes, own)

    out = finish_backward(pending, batch, layout, impl)

    keep = torch.cat([recv_sizes[: me * n], recv_sizes[(me + 1) * n :]])
    others = [b for r, b in enumerate(batch) if r != me]
    decoded = decode_chunks(received, keep, offsets(others), cols, impl, own.device)
    first = sum(batch[:me])
    expected = torch.cat([decoded[:first], own, decoded[first:]], dim=0)
    assert torch.equal(_bits(out), _bits(expected))


@pytest.mark.parametrize("wire", [torch.float32, torch.bfloat16, torch.float16])
def test_cast_gradient_gathers_and_casts_in_one_pass_and_keeps_the_received_layout(wire: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(9, 44, generator=g) * torch.logspace(-6, 2, 44)  # values that round differently per dtype
    owners = offsets([8, 0, 16, 20])  # an owner without columns too
    expected = torch.cat([grad[:, a:b].reshape(-1) for a, b in itertools.pairwise(owners)]).to(wire)
    scratch, sends = ResultBuffers(), ResultBuffers()
    wide = torch.randn(9, 60, generator=g)
    wide[:, :44] = grad
    # Cast whole through a scratch tensor (twice: the second reuses it), and straight from a strided view.
    held = []
    for source in (grad, grad, wide[:, :44]):
        send = gather_owner_blocks(source, owners, wire, scratch, sends)
        assert send.dtype == wire and torch.equal(send.view(torch.uint8), expected.view(torch.uint8))
        held.append(send)  # a send still held (an exchange in flight) is never reused
    assert len({s.data_ptr() for s in held}) == 3

    me, batch = 1, [5, 7, 3]
    layout = _layout(me)
    received = (torch.randn(sum(batch) * layout.dim_sums[me], generator=g)).to(wire)
    own = torch.zeros(batch[me], layout.dim_sums[me])
    out = finish_backward(BackwardInFlight(InFlight(received), 0, None, own), batch, layout, "ref")
    split = received.split([b * layout.dim_sums[me] for b in batch])
    replaced = torch.cat([blk.view(b, -1) for blk, b in zip(split, batch)], dim=0).float()
    assert out.dtype == torch.float32 and torch.equal(_bits(out), _bits(replaced))


def test_a_corrupt_chunk_on_either_side_of_the_own_block_is_a_codec_error(impl: str) -> None:
    layout, rows = _layout(1), 6
    g = torch.Generator().manual_seed(5)
    grids = {s: encode_chunks(torch.randn(rows, layout.dim_sums[s], generator=g), [0, rows], offsets(DIMS[s]),
                              0.02, impl) for s in layout.other_ranks}
    received = torch.cat([grids[s].payload for s in layout.other_ranks])
    recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), 2, 1)
    own = torch.zeros(rows, layout.dim_sums[1])
    for at in (10, received.numel() - 10):  # in rank 0's chunks, then in rank 2's
        bad = received.clone()
        bad[at] ^= 0x10
        with pytest.raises(Exception) as info:
            decode_from_others(bad, recv_sizes, own, layout, impl)
        assert isinstance(info.value.__cause__, CodecError)


def test_result_buffers_reuse_memory_only_once_nothing_holds_it() -> None:
    cpu = torch.device("cpu")
    buffers = ResultBuffers()
    first = buffers.empty(6, 4, cpu)
    first.fill_(1.0)
    second = buffers.empty(6, 4, cpu)  # the first is alive: fresh memory
    assert second.data_ptr() != first.data_ptr()
    view = second[:, 1:3]
    address = second.data_ptr()
    del second
    third = buffers.empty(6, 4, cpu)  # a view of the second is alive: fresh memory again
    assert third.data_ptr() != address and bool((first == 1.0).all())
    address = third.data_ptr()
    del view, third
    fourth = buffers.empty(6, 4, cpu)  # nothing holds the third's memory: reused, as a tensor of its own
    assert fourth.data_ptr() == address and fourth.grad_fn is None and not fourth.requires_grad
    assert buffers.empty(3, 4, cpu).shape == (3, 4)  # another size: fresh memory of that size


def test_an_output_the_caller_still_holds_is_never_overwritten_by_the_next_call(impl: str) -> None:
    layout, rows = _layout(1), 8
    g = torch.Generator().manual_seed(9)
    buffers = ResultBuffers()
    outs, copies = [], []
    for _ in range(3):
        grids = {s: encode_chunks(torch.randn(rows, layout.dim_sums[s], generator=g), [0, rows], offsets(DIMS[s]),
                                  0.02, impl) for s in layout.other_ranks}
        received = torch.cat([grids[s].payload for s in layout.other_ranks])
        recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), 2, 1)
        out = decode_from_others(received, recv_sizes, torch.randn(rows, layout.dim_sums[1], generator=g), layout,
                                 impl, buffers)
        outs.append(out)
        copies.append(out.clone())
    assert len({o.data_ptr() for o in outs}) == 3
    assert all(torch.equal(o, c) for o, c in zip(outs, copies))


@pytest.mark.parametrize("me", [0, 1, 2])
def test_the_own_columns_are_placed_while_the_payload_travels_and_the_decode_fills_the_rest(me: int, impl: str) -> None:
    from lightning_dlac.comm.pooled import start_output

    layout, rows = _layout(me), 12
    g = torch.Generator().manual_seed(20 + me)
    grids = {s: encode_chunks(torch.randn(rows, layout.dim_sums[s], generator=g), [0, rows], offsets(DIMS[s]),
                              0.02, impl) for s in layout.other_ranks}
    received = torch.cat([grids[s].payload for s in layout.other_ranks])
    counts = layout.chunk_counts
    recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), sum(counts[:me]), counts[me])
    own = torch.randn(rows, layout.dim_sums[me], generator=g)
    col_at = offsets(layout.dim_sums)

    out = start_output(own, layout, ResultBuffers())  # before the payload is waited on
    assert out.shape == (rows, col_at[-1])
    assert torch.equal(_bits(out[:, col_at[me] : col_at[me + 1]]), _bits(own))
    filled = decode_from_others(received, recv_sizes, own, layout, impl, out=out)

    assert filled.data_ptr() == out.data_ptr()  # decoded into that tensor, not a new one
    expected = decode_from_others(received, recv_sizes, own, layout, impl)  # own copied after the wait, as before
    assert torch.equal(_bits(filled), _bits(expected))


@pytest.mark.parametrize("me", [0, 1, 2])
def test_the_own_gradient_rows_are_placed_while_the_payload_travels(me: int, impl: str) -> None:
    from lightning_dlac.comm.pooled import start_gradient

    layout, batch = _layout(me), [5, 7, 3]
    g = torch.Generator().manual_seed(30 + me)
    d_me, cols, n = layout.dim_sums[me], layout.local_cols, len(DIMS[me])
    grids = {s: encode_chunks(torch.randn(batch[s], d_me, generator=g) * 1e-3, [0, batch[s]], cols, 0.01, impl)
             for s in layout.other_ranks}
    received = torch.cat([grids[s].payload for s in layout.other_ranks])
    recv_sizes = with_own(torch.cat([grids[s].sizes for s in layout.other_ranks]), me * n, n)
    own = torch.randn(batch[me], d_me, generator=g)
    row_at = offsets(batch)

    placed = start_gradient(own, batch, me, ResultBuffers())
    assert torch.equal(_bits(placed[row_at[me] : row_at[me + 1]]), _bits(own))
    out = finish_backward(BackwardInFlight(InFlight(received), 0, recv_sizes, own, out=placed), batch, layout, impl)

    assert out.data_ptr() == placed.data_ptr()
    expected = finish_backward(BackwardInFlight(InFlight(received), 0, recv_sizes, own), batch, layout, impl)
    assert torch.equal(_bits(out), _bits(expected))


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_a_mixed_cast_gradient_fills_the_result_whose_own_rows_are_placed(wire: torch.dtype) -> None:
    from lightning_dlac.comm.pooled import start_gradient

    me, batch = 1, [5, 7, 3]
    layout = _layout(me)
    d_me = layout.dim_sums[me]
    g = torch.Generator().manual_seed(40)
    dtypes = (wire, torch.float32, torch.float32)  # rank 0 sends the wire dtype, rank 2 float32, this rank nothing
    sent = {s: torch.randn(batch[s], d_me, generator=g).to(dtypes[s]) for s in (0, 2)}
    received = torch.cat([sent[s].reshape(-1).view(torch.uint8) for s in (0, 2)])
    own = torch.randn(batch[me], d_me, generator=g)

    def pending(out: torch.Tensor | None) -> BackwardInFlight:
        return BackwardInFlight(InFlight(received), 0, None, own, recv_dtypes=dtypes, out=out)

    placed = start_gradient(own, batch, me)
    out = finish_backward(pending(placed), batch, layout, "ref")
    assert out.data_ptr() == placed.data_ptr()
    expected = torch.cat([sent[0].float(), own, sent[2]])
    assert torch.equal(_bits(out), _bits(expected))
    assert torch.equal(_bits(finish_backward(pending(None), batch, layout, "ref")), _bits(expected))
