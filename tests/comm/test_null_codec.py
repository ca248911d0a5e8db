"""The null codec (lightning_dlac/comm/null_codec.py), the benchmarks' like-for-like ceiling: inside the real pooled
exchange it sends exactly the bytes a DLAC exchange sent, per table and per direction, and encodes and decodes
nothing. Checked on 2 gloo ranks by recording what every payload all-to-all put on the wire."""

from __future__ import annotations

import pytest
import torch

from lightning_dlac.testing import run_ranks

DIMS = [[8, 4, 4], [8, 8]]  # rank 0 owns three tables, rank 1 two
TABLES = [["a", "b", "c"], ["d", "e"]]
ROWS = [6, 6]  # batch per rank


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s pooled embeddings [sum of batches, local dims]: a few distinct rows, so DLAC compresses."""
    g = torch.Generator().manual_seed(rank)
    pool = torch.randn(3, sum(DIMS[rank]), generator=g)
    return pool[torch.arange(sum(ROWS)) % 3].contiguous()


def _upstream(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(ROWS[rank], sum(sum(d) for d in DIMS), generator=g)


def _payload_splits(calls: list) -> list[tuple[list[int], list[int]]]:
    """(bytes out per rank, bytes in per rank) of the recorded uint8 all-to-alls that carried payloads (the size
    exchange is int64)."""
    return [(list(inp_splits), list(out_splits)) for dtype, inp_splits, out_splits in calls if dtype == torch.uint8]


def _exchange_twice(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig
    from lightning_dlac.comm import exchange as wire
    from lightning_dlac.comm.null_codec import bytes_per_call, install_null_codec

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    calls: list = []
    real = wire._all_to_all

    def recording(out, inp, out_splits, in_splits, pg, async_op=False):  # noqa: ANN001, ANN202
        calls.append((inp.dtype, list(in_splits), list(out_splits)))
        return real(out, inp, out_splits, in_splits, pg, async_op=async_op)

    wire._all_to_all = recording
    try:
        results = {}
        for name, config in (("dlac", CompressionConfig(backward="dlac")),
                             ("null", CompressionConfig(backward="dlac", error_every=0))):
            a2a = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, DIMS, TABLES, config, ErrorBounds(0.01))
            if name == "null":
                install_null_codec([a2a], **results["dlac"]["per_call"])
            calls.clear()
            outputs, grads = [], []
            for _ in range(3):  # the same payload each call: DLAC's sizes are the same every call
                x = _inputs(rank).requires_grad_()
                out = a2a(x, ROWS).wait()
                out.backward(_upstream(rank))
                outputs.append(out.detach())
                grads.append(x.grad)
            stats = a2a.stats
            results[name] = dict(
                # Tensors travel back as lists: the result queue cannot share tensor storage with a rank that exits.
                per_call=bytes_per_call(stats), wire=_payload_splits(calls), out=outputs[-1].tolist(),
                grad=grads[-1].tolist(),
                table_sent=dict(stats.table_sent_bytes), table_backward_sent=dict(stats.table_backward_sent_bytes),
                sent=stats.sent_bytes, backward_sent=stats.backward_sent_bytes, calls=stats.calls,
                null_chunk_bytes=(a2a.forward_impl.chunk_bytes, a2a.backward_impl.chunk_bytes) if name == "null"
                else None,
            )
        dist.barrier()
        return results
    finally:
        wire._all_to_all = real
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return run_ranks(_exchange_twice, 2)


@pytest.mark.slow
def test_null_codec_sends_exactly_dlacs_bytes_per_table_and_direction(runs: list[dict]) -> None:
    for rank, r in enumerate(runs):
        dlac, null = r["dlac"], r["null"]
        # DLAC compressed something: fewer payload bytes than float32 for every table it sent.
        assert all(0 < n < 3 * ROWS[1 - rank] * d * 4 for n, d in zip(dlac["table_sent"].values(), DIMS[rank]))
        assert null["table_sent"] == dlac["table_sent"] and set(null["table_sent"]) == set(TABLES[rank])
        assert null["table_backward_sent"] == dlac["table_backward_sent"]
        assert set(null["table_backward_sent"]) == set(TABLES[1 - rank])  # it sends the other rank's gradients
        assert (null["sent"], null["backward_sent"]) == (dlac["sent"], dlac["backward_sent"])
        # What went on the wire: the same payload all-to-alls, forward and backward alike, call for call.
        assert null["wire"] == dlac["wire"] and len(null["wire"]) == 2 * 3
        for out_bytes, in_bytes in null["wire"]:
            assert out_bytes[rank] == in_bytes[rank] == 0  # a rank keeps its own block
        fwd, bwd = null["null_chunk_bytes"]
        assert fwd == {t: dlac["table_sent"][t] // 3 for t in TABLES[rank]}
        assert bwd == {t: dlac["table_backward_sent"][t] // 3 for t in TABLES[1 - rank]}


@pytest.mark.slow
def test_null_codec_decodes_nothing_and_keeps_the_own_block_exact(runs: list[dict]) -> None:
    for rank, r in enumerate(runs):
        null, x = {**r["null"], "out": torch.tensor(r["null"]["out"])}, _inputs(rank)
        first = sum(sum(d) for d in DIMS[:rank])
        own_cols = slice(first, first + sum(DIMS[rank]))
        own_rows = slice(sum(ROWS[:rank]), sum(ROWS[: rank + 1]))
        torch.testing.assert_close(null["out"][:, own_cols], x[own_rows], rtol=0, atol=0)
        others = torch.cat([null["out"][:, :first], null["out"][:, own_cols.stop :]], dim=1)
        assert others.numel() and not others.any()  # the other rank's columns: zeros, nothing decoded
        # This rank's own rows: the upstream gradient as DLAC's exchange passes it on, exactly.
        grad, dlac_grad = torch.tensor(null["grad"]), torch.tensor(r["dlac"]["grad"])
        torch.testing.assert_close(grad[own_rows], dlac_grad[own_rows], rtol=0, atol=0)
        assert grad[own_rows].any() and not torch.cat([grad[: own_rows.start], grad[own_rows.stop :]]).any()


def test_bytes_per_call_and_install_refuse_what_they_cannot_stand_in_for() -> None:
    from lightning_dlac.comm import CommStats
    from lightning_dlac.comm.null_codec import NullChunkCodec, bytes_per_call

    with pytest.raises(ValueError, match="no forward exchange"):
        bytes_per_call(CommStats())
    stats = CommStats(calls=4, backward_calls=2, table_sent_bytes={"a": 400}, table_backward_sent_bytes={"b": 90})
    assert bytes_per_call(stats) == {"forward": {"a": 100.0}, "backward": {"b": 45.0}}
    with pytest.raises(ValueError, match="integer >= 0"):
        NullChunkCodec({"a": -1})
    codec = NullChunkCodec({"a": 3, "b": 5})
    payload, sizes = codec.encode(torch.ones(4, 6), [0, 2, 4], [0, 2, 6], 0.01, ("a", "b"))
    assert sizes.tolist() == [3, 5, 3, 5] and payload.numel() == 16 and not payload.any()
    with pytest.raises(ValueError, match=r"no byte count for table\(s\) \['c'\]"):
        codec.encode(torch.ones(4, 6), [0, 4], [0, 2, 6], 0.01, ("a", "c"))
    assert codec.decode(payload, sizes, [0, 2, 4], [0, 2, 6], torch.device("cpu")).eq(0).all()
    # Into a block of the caller's result, as the DLAC codec decodes: that block zeroed in place, nothing else touched
    # (a fresh tensor copied in would make the ceiling do more work than the launch it bounds).
    result = torch.full((4, 9), 7.0)
    block = result[:, 1:7]
    assert codec.decode(payload, sizes, [0, 2, 4], [0, 2, 6], torch.device("cpu"), out=block) is block
    assert not block.any() and result[:, [0, 7, 8]].eq(7).all()
    from lightning_dlac.comm.exchange import decode_chunks

    result.fill_(7.0)
    assert decode_chunks(payload, sizes, [0, 2, 4], [0, 2, 6], codec, torch.device("cpu"), out=block) is block
    assert not block.any() and result[:, [0, 7, 8]].eq(7).all()


def _refusals(rank: int, world_size: int) -> list[str]:
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig
    from lightning_dlac.comm.null_codec import install_null_codec

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        errors = []
        for config, backward in ((CompressionConfig(), None), (CompressionConfig(error_every=0), {"a": 1.0})):
            a2a = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, DIMS, TABLES, config, ErrorBounds())
            try:
                install_null_codec([a2a], {t: 1.0 for t in TABLES[rank]}, backward)
            except ValueError as err:
                errors.append(str(err))
        a2a = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, DIMS, TABLES, CompressionConfig(error_every=0),
                                                 ErrorBounds())
        try:
            install_null_codec([a2a], {})
        except ValueError as err:
            errors.append(str(err))
        return errors
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_install_null_codec_refuses_error_sampling_cast_gradients_and_missing_tables() -> None:
    for errors in run_ranks(_refusals, 2):
        assert len(errors) == 3
        assert "error_every=0" in errors[0]
        assert "backward='dlac'" in errors[1]
        assert "no byte count for table(s)" in errors[2]
