"""The pooled layout on the wire functions: what the pooled all-to-all
(:class:`~lightning_dlac.comm.all_to_all.CompressedPooledEmbeddingsAllToAll`) sends and receives, as pure start /
finish functions (no statistics, no timing, no policy: the module wraps them).

A :class:`Layout` says which column blocks each rank holds (``local_embs`` is [sum of batch sizes, local dim sum],
rows grouped by destination). Forward:

1. encode every (destination rank, local table) chunk for the other ranks with that table's bound
   (:func:`encode_for_others`); the rows a rank keeps for itself never leave it (their chunk sizes are exchanged as
   0) and arrive exactly;
2. exchange the per-chunk compressed byte counts and launch the payload exchange (:func:`start_forward`);
3. decode and reassemble the columns in TorchRec's order, source rank then its tables (:func:`decode_from_others`,
   into the output :func:`start_output` made while the payload was on its way).

Backward sends the gradients the other way: float32, cast to bf16/fp16 (:func:`start_backward_cast`), or
DLAC-encoded (:func:`start_backward_dlac`), again keeping the rank's own block local; :func:`finish_backward` waits and
decodes. A layout's :class:`~lightning_dlac.comm.peers.PeerPlan` says which payloads are encoded; the others go as
float32, exactly, and a gradient goes back compressed exactly where its embeddings came compressed. Consecutive
compressed peers share one grid, so the plan that compresses for everyone runs as two grids around a rank's own block.

Each exchange comes as a start / finish pair, as TorchRec's ``comm_ops`` request / wait: ``start_*`` does what must
happen before the bytes move (encoding, the size exchange) and launches the payload all-to-all with
``async_op=True``; it returns an :class:`~lightning_dlac.comm.exchange.InFlight` (or :class:`BackwardInFlight`) that
``finish_*`` waits on before decoding. Whatever the caller runs in between overlaps with the transfer.

The wire functions are called through their module (``exchange.encode_chunks``), as the sequence exchange calls them,
so that a tool that wraps them there (benchmarks/exchange_profile.py) sees every call.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch

from lightning_dlac.codec import CodecError, cast_column_blocks, decode, native_available
from lightning_dlac.comm import exchange
from lightning_dlac.comm.base import TableLayout
from lightning_dlac.comm.buffers import ResultBuffers
from lightning_dlac.comm.exchange import CompressedExchangeError, Grid, Impl, InFlight, offsets, rank_sums
from lightning_dlac.comm.peers import runs


@dataclass(frozen=True)
class Layout(TableLayout):
    """The pooled-embedding exchange's columns: a :class:`TableLayout` whose chunk columns are column blocks.

    Args:
        dims_per_rank: Embedding dimension of each column block (one per feature / column shard), per rank, in the
            column order of that rank's ``local_embs``.
    """

    dims_per_rank: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if len(self.dims_per_rank) != len(self.tables_per_rank):
            raise ValueError("dims_per_rank and tables_per_rank need one entry per rank each.")
        for r, (dims, names) in enumerate(zip(self.dims_per_rank, self.tables_per_rank)):
            if len(dims) != len(names):
                raise ValueError(f"rank {r}: {len(dims)} column blocks but {len(names)} table names.")
        super().__post_init__()

    @cached_property
    def dim_sums(self) -> list[int]:
        """Sum of the embedding dims each rank contributes."""
        return [sum(d) for d in self.dims_per_rank]

    @cached_property
    def local_cols(self) -> list[int]:
        """Column offsets of this rank's blocks in its ``local_embs``."""
        return offsets(self.dims_per_rank[self.rank])

    def chunks(self, x: torch.Tensor, row_splits: Sequence[int]) -> Iterator[tuple[str, torch.Tensor]]:
        """(table, chunk) of every (destination rank, local table) block of ``x``, own included, in the codec's
        chunk order."""
        cols = self.local_cols
        for r in range(self.world):
            for c, name in enumerate(self.local_tables):
                yield name, x[row_splits[r] : row_splits[r + 1], cols[c] : cols[c + 1]]


class Encoded(NamedTuple):
    """This rank's forward send: one payload, every chunk's size (0 for its own; a chunk sent as is counts its
    float32 bytes), the grids of the compressed chunks, and the payload bytes for each destination."""

    payload: torch.Tensor
    sizes: torch.Tensor
    grids: list[Grid]
    send_bytes: list[int]


# ---------------------------------------------------------------------- forward


def encode_for_others(
    x: torch.Tensor, row_splits: list[int], layout: Layout, eps: torch.Tensor, impl: Impl
) -> Encoded:
    """Encode the (destination, local table) chunks of ``x`` for every rank the layout's plan compresses for (one
    grid per run of consecutive such ranks); the rows for the others go as they are, float32."""
    me, dev, cols = layout.rank, x.device, layout.local_cols
    n_local = len(layout.local_tables)
    dims = layout.dims_per_rank[me]
    grids, pieces, sizes = [], [], []
    for compressed, lo, hi in runs(layout.compress_to):
        if compressed:
            r0 = row_splits[lo]
            rs = [r - r0 for r in row_splits[lo : hi + 1]]
            grid = exchange.encode_chunks(x[r0 : row_splits[hi]], rs, cols, eps, impl, layout.local_tables)
            grids.append(grid)
            pieces.append(grid.payload.to(dev))
            sizes.append(grid.sizes.to(dev))
            continue
        for d in range(lo, hi):
            rows = row_splits[d + 1] - row_splits[d]
            if d != me:
                pieces.append(exchange.as_bytes(x[row_splits[d] : row_splits[d + 1]]))
            sizes.append(torch.tensor([0 if d == me else rows * c * 4 for c in dims], dtype=torch.int64, device=dev))
    all_sizes = torch.cat(sizes) if sizes else torch.zeros(0, dtype=torch.int64, device=dev)
    return Encoded(exchange.assemble(pieces, dev), all_sizes, grids, rank_sums(all_sizes, [n_local] * layout.world))


def start_forward(encoded: Encoded, layout: Layout, rows: int, pg) -> tuple[InFlight, torch.Tensor]:
    """Exchange the chunk sizes and launch the payload exchange; return it and every source's chunk sizes for this
    rank (source rank, then its tables). Only compressed chunks' sizes travel: this rank computes those of a source
    that sends its ``rows`` (this rank's batch) as they are, and of its own block
    (:func:`~lightning_dlac.comm.exchange.exchange_unknown_sizes`)."""
    me, counts = layout.rank, layout.chunk_counts
    sends, known = exchange.size_records_plan(layout.compress_to, layout.compress_from, me,
                                              lambda s: [rows * d for d in layout.dims_per_rank[s]])
    recv_sizes = exchange.exchange_unknown_sizes(encoded.sizes, [counts[me]] * layout.world, counts, sends, known, pg)
    flight = exchange.start_payload(encoded.payload, encoded.send_bytes, rank_sums(recv_sizes, counts), pg)
    return flight, recv_sizes


def start_output(own: torch.Tensor, layout: Layout, buffers: ResultBuffers | None = None) -> torch.Tensor:
    """This rank's pooled-embedding output [local batch, total dim] (a tensor from ``buffers`` where given) with the
    exact block it kept, ``own``, already in its columns (:func:`~lightning_dlac.comm.exchange.place_own`) and the
    other sources' columns unspecified until :func:`decode_from_others` fills them: made while the payload is on its
    way."""
    me, col_at = layout.rank, offsets(layout.dim_sums)
    out = (buffers or ResultBuffers()).empty(own.size(0), col_at[-1], own.device)
    exchange.place_own(out[:, col_at[me] : col_at[me + 1]], own)
    return out


def decode_from_others(
    received: torch.Tensor, recv_sizes: torch.Tensor, own: torch.Tensor, layout: Layout, impl: Impl,
    buffers: ResultBuffers | None = None, out: torch.Tensor | None = None,
    cols: Sequence[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """This rank's pooled embeddings [local batch, total dim]: every source's columns decoded (a run of consecutive
    compressed sources whose columns are side by side at once) or copied (a source that sent them as is) straight
    into their block of ``out``, the output :func:`start_output` made with the exact block this rank kept in place
    (made here from ``own`` and ``buffers`` where ``out`` is not given). ``cols`` gives each source's columns in
    ``out`` where ``layout`` is a piece of the output's layout (:mod:`~lightning_dlac.comm.pieces`; default: the
    sources' blocks side by side, the whole layout)."""
    me, rows, counts = layout.rank, own.size(0), layout.chunk_counts
    chunk_at, col_at = offsets(counts), offsets(layout.dim_sums)
    cols = list(cols) if cols is not None else list(itertools.pairwise(col_at))
    byte_at = offsets(rank_sums(recv_sizes, counts))
    if out is None:
        out = start_output(own, layout, buffers)
    try:
        for compressed, lo, hi in runs(layout.compress_from):
            if compressed:
                for a, b in adjacent(cols, lo, hi):
                    dims = offsets([d for s in range(a, b) for d in layout.dims_per_rank[s]])
                    exchange.decode_chunks(received[byte_at[a] : byte_at[b]], recv_sizes[chunk_at[a] : chunk_at[b]],
                                           [0, rows], dims, impl, own.device, out=out[:, cols[a][0] : cols[b - 1][1]])
                continue
            for s in range(lo, hi):
                if s != me:  # this rank's own block is in place already
                    exchange.copy_raw(out[:, cols[s][0] : cols[s][1]], received[byte_at[s] : byte_at[s + 1]])
    except CodecError as err:
        raise locate_decode_error(received, recv_sizes, layout, rows, impl) from err
    return out


def adjacent(cols: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranks ``lo`` to ``hi`` (exclusive) in maximal ``(first, end)`` ranges whose columns ``cols[r]`` lie side
    by side (one codec call can cover each range): the whole range for a whole layout's blocks."""
    out: list[tuple[int, int]] = []
    for r in range(lo, hi):
        if out and cols[r][0] == cols[out[-1][1] - 1][1]:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out


def start_forward_uncompressed(x: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, pg) -> InFlight:
    """Launch TorchRec's forward exchange: float32 rows to their destination, in one all-to-all."""
    me = layout.rank
    d_me, b_me = layout.dim_sums[me], batch_size_per_rank[me]
    return exchange.start_cast(x.contiguous().view(-1), [b * d_me for b in batch_size_per_rank],
                               [b_me * d for d in layout.dim_sums], torch.float32, pg)


def finish_forward_uncompressed(flight: InFlight, batch_size_per_rank: list[int], layout: Layout) -> torch.Tensor:
    """Wait for :func:`start_forward_uncompressed`'s exchange; this rank's pooled embeddings."""
    b_me = batch_size_per_rank[layout.rank]
    received = flight.wait()
    recv_numel = [b_me * d for d in layout.dim_sums]
    return torch.cat([blk.view(b_me, d) for blk, d in zip(received.split(recv_numel), layout.dim_sums)], dim=1)


def locate_decode_error(received: torch.Tensor, recv_sizes: torch.Tensor, layout: Layout, rows: int,
                        impl: str) -> CompressedExchangeError:
    """Slow path after a failed decode: find the source rank and table whose chunk is bad."""
    me = layout.rank
    sizes = recv_sizes.tolist()
    offset = index = 0
    for src, count in enumerate(layout.chunk_counts):
        if not layout.compress_from[src]:  # nothing of ours was sent, or the source sent its rows as they are
            offset += sum(sizes[index : index + count])
            index += count
            continue
        for c in range(count):
            size = sizes[index]
            try:
                x_hat = decode(received[offset : offset + size], impl=impl)
                expected = [rows, layout.dims_per_rank[src][c]]
                if list(x_hat.shape) != expected:
                    raise CodecError(f"shape {list(x_hat.shape)} instead of {expected}")
            except CodecError as err:
                return CompressedExchangeError(
                    f"rank {me}: pooled embeddings of table {layout.tables_per_rank[src][c]!r} received from rank"
                    f" {src} failed to decode ({err}). The payload was corrupted in transit or the ranks run"
                    " different lightning-dlac versions."
                )
            offset += size
            index += 1
    return CompressedExchangeError(f"rank {me}: the received pooled embeddings failed to decode.")


# ---------------------------------------------------------------------- backward


class BackwardInFlight(NamedTuple):
    """A launched gradient exchange: what :func:`finish_backward` needs, and the bytes sent to other ranks."""

    flight: InFlight
    sent: int
    recv_sizes: torch.Tensor | None  # DLAC: every source rank's chunk sizes for this rank; casts: None
    own: torch.Tensor  # this rank's own gradient block [local batch, local dim sum], never sent
    sizes: torch.Tensor | None = None  # DLAC: bytes of each (owner rank, table) chunk sent, 0 for own; casts: None
    recv_dtypes: tuple[torch.dtype, ...] | None = None  # a cast some peers send as float32: each source's dtype
    send_bytes: list[int] | None = None  # payload bytes to each owner rank (None: the cast's, rows x dims x width)
    out: torch.Tensor | None = None  # the result with ``own`` in place (placed while the payload is on its way)


def gather_owner_blocks(grad: torch.Tensor, owners: Sequence[int], wire_dtype: torch.dtype,
                        scratch: ResultBuffers | None = None, sends: ResultBuffers | None = None) -> torch.Tensor:
    """The column block ``owners[r]:owners[r + 1]`` of ``grad`` for each owner rank ``r``, flattened in rank order
    (TorchRec's backward all-to-all layout) as ``wire_dtype``: the bits of
    ``torch.cat([grad[:, a:b].reshape(-1), ...]).to(wire_dtype)`` (``copy_`` rounds as ``.to()`` does), in a tensor
    from ``sends`` (reused once the exchange that sent it holds it no more). On the CPU with the native ops, a
    narrower wire dtype is gathered and cast in one pass over ``grad``
    (:func:`~lightning_dlac.codec.cast_column_blocks`: about the time of a contiguous cast of the same elements).
    Otherwise it is cast first, whole and contiguous, into a tensor from ``scratch`` (on this CPU the contiguous cast
    and the narrower gather took about 0.6 of a cast from strided column blocks), and the blocks are gathered from
    there."""
    rows = grad.size(0)
    send = (sends or ResultBuffers()).empty(rows, owners[-1], grad.device, wire_dtype).view(-1)
    if wire_dtype != grad.dtype and grad.device.type == "cpu" and native_available():
        return cast_column_blocks(grad, owners, send, impl="native")
    source = grad
    if wire_dtype != grad.dtype and len(owners) > 2 and grad.is_contiguous():
        source = (scratch or ResultBuffers()).empty(rows, owners[-1], grad.device, wire_dtype).copy_(grad)
    for a, b in itertools.pairwise(owners):
        send[rows * a : rows * b].view(rows, b - a).copy_(source[:, a:b])
    return send


def start_gradient(own: torch.Tensor, batch_size_per_rank: Sequence[int], me: int,
                   buffers: ResultBuffers | None = None) -> torch.Tensor:
    """This rank's gradient of ``local_embs`` [sum of batch sizes, local dim sum] (a tensor from ``buffers`` where
    given) with its own exact block, ``own``, already in its rows (:func:`~lightning_dlac.comm.exchange.place_own`)
    and the other sources' rows unspecified until :func:`finish_backward` fills them: made while the payload is on
    its way."""
    row_at = offsets(batch_size_per_rank)
    out = (buffers or ResultBuffers()).empty(row_at[-1], own.size(1), own.device)
    exchange.place_own(out[row_at[me] : row_at[me + 1]], own)
    return out


def start_backward_cast(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout,
                        wire_dtype: torch.dtype, pg, scratch: ResultBuffers | None = None,
                        sends: ResultBuffers | None = None, buffers: ResultBuffers | None = None) -> BackwardInFlight:
    """Launch the gradient exchange of ``grad`` ([local batch, total dim]) to the column owners as ``wire_dtype``
    (float32, bf16, fp16); to the owners the layout's plan does not compress for, as float32
    (:func:`start_backward_mixed_cast`, whose result comes from ``buffers``)."""
    if layout.mixed and wire_dtype != torch.float32:
        return start_backward_mixed_cast(grad, batch_size_per_rank, layout, wire_dtype, pg, buffers)
    me = layout.rank
    d_me, b_me = layout.dim_sums[me], grad.size(0)
    owners = offsets(layout.dim_sums)
    send = gather_owner_blocks(grad, owners, wire_dtype, scratch, sends)
    flight = exchange.start_cast(send, [b_me * d for d in layout.dim_sums], [b * d_me for b in batch_size_per_rank],
                                 wire_dtype, pg)
    sent = b_me * (grad.size(1) - d_me) * flight.received.element_size()  # this rank's own block is a local copy
    return BackwardInFlight(flight, sent, None, grad[:, owners[me] : owners[me + 1]])


def start_backward_mixed_cast(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout,
                              wire_dtype: torch.dtype, pg, buffers: ResultBuffers | None = None) -> BackwardInFlight:
    """As :func:`start_backward_cast` where some peers get float32 and the others ``wire_dtype``: one byte
    all-to-all whose piece for each owner is its column block in that owner's dtype (this rank's own stays here,
    placed in the result, a tensor from ``buffers``, while the payload is on its way)."""
    me = layout.rank
    owners, d_me = offsets(layout.dim_sums), layout.dim_sums[me]
    to_dtype = [wire_dtype if c else torch.float32 for c in layout.compress_from]  # as the embeddings came
    from_dtype = [wire_dtype if c else torch.float32 for c in layout.compress_to]
    pieces, send_bytes = [], []
    for r in range(layout.world):
        block = grad[:, owners[r] : owners[r + 1]]
        if r == me:
            send_bytes.append(0)
            continue
        piece = exchange.to_wire(block, to_dtype[r])  # a narrower dtype's piece is cast on its way
        pieces.append(piece)
        send_bytes.append(piece.numel())
    recv_bytes = [0 if s == me else b * d_me * from_dtype[s].itemsize for s, b in enumerate(batch_size_per_rank)]
    flight = exchange.start_payload(exchange.assemble(pieces, grad.device), send_bytes, recv_bytes, pg)
    own = grad[:, owners[me] : owners[me + 1]]
    return BackwardInFlight(flight, sum(send_bytes), None, own, recv_dtypes=tuple(from_dtype),
                            send_bytes=send_bytes, out=start_gradient(own, batch_size_per_rank, me, buffers))


def start_backward_dlac(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, eps: float, impl: Impl,
                        pg, buffers: ResultBuffers | None = None, cols: Sequence[tuple[int, int]] | None = None,
                        out: torch.Tensor | None = None) -> BackwardInFlight:
    """As :func:`start_backward_cast`, the gradients DLAC-encoded with relative bound ``eps`` for the owners whose
    embeddings came compressed (one grid per run of consecutive such owners), float32 for the others (the size
    exchange runs before the payload is launched: the receive buffer's size depends on it); this rank's own block
    is placed in the result (a tensor from ``buffers``) while the payload is on its way.

    Where ``layout`` is a piece of the gradient's layout (:mod:`~lightning_dlac.comm.pieces`), ``cols`` gives each
    owner's columns of the piece in ``grad`` and ``out`` is the piece's columns of the result, made (and this rank's
    own block placed) once for all pieces by :func:`start_gradient`."""
    me, world = layout.rank, layout.world
    b_me, dev = grad.size(0), grad.device
    counts = layout.chunk_counts
    n_local = counts[me]
    cols = list(cols) if cols is not None else list(itertools.pairwise(offsets(layout.dim_sums)))
    pieces, sizes = [], []
    for compressed, lo, hi in runs(layout.compress_from):  # a gradient goes back as its embeddings came
        if compressed:
            for a, b in adjacent(cols, lo, hi):
                dims = [d for r in range(a, b) for d in layout.dims_per_rank[r]]
                tables = [t for r in range(a, b) for t in layout.tables_per_rank[r]]
                grid = exchange.encode_chunks(grad[:, cols[a][0] : cols[b - 1][1]], [0, b_me], offsets(dims), eps,
                                              impl, tables)
                pieces.append(grid.payload.to(dev))
                sizes.append(grid.sizes.to(dev))
            continue
        for r in range(lo, hi):  # ours stays here, exactly; an uncompressed owner's columns go as float32
            if r != me:
                pieces.append(exchange.as_bytes(grad[:, cols[r][0] : cols[r][1]]))
            raw = [0 if r == me else b_me * d * 4 for d in layout.dims_per_rank[r]]
            sizes.append(torch.tensor(raw, dtype=torch.int64, device=dev))
    payload = exchange.assemble(pieces, dev)
    all_sizes = torch.cat(sizes) if sizes else torch.zeros(0, dtype=torch.int64, device=dev)
    # Only compressed chunks' sizes travel: an owner knows the size of a gradient sent as is (the source's batch rows
    # x its dims x 4) and of its own block (0).
    local_dims = layout.dims_per_rank[me]
    sends, known = exchange.size_records_plan(layout.compress_from, layout.compress_to, me,
                                              lambda s: [batch_size_per_rank[s] * d for d in local_dims])
    recv_sizes = exchange.exchange_unknown_sizes(all_sizes, counts, [n_local] * world, sends, known, pg)
    send_bytes = rank_sums(all_sizes, counts)
    flight = exchange.start_payload(payload, send_bytes, rank_sums(recv_sizes, [n_local] * world), pg)
    records = sum(c for c, go in zip(counts, sends) if go)  # the size records sent
    sent = int(payload.numel()) + records * 8
    own = grad[:, cols[me][0] : cols[me][1]]
    if out is None:
        out = start_gradient(own, batch_size_per_rank, me, buffers)
    return BackwardInFlight(flight, sent, recv_sizes, own, all_sizes, send_bytes=send_bytes, out=out)


def finish_backward(pending: BackwardInFlight, batch_size_per_rank: list[int], layout: Layout,
                    impl: Impl, buffers: ResultBuffers | None = None) -> torch.Tensor:
    """Wait for a gradient exchange that :func:`start_backward_cast` or :func:`start_backward_dlac` launched; return
    this rank's gradient of ``local_embs`` ([sum of batch sizes, local dim sum], float32; a bf16 / fp16 cast or a
    DLAC decode in a tensor from ``buffers`` where given)."""
    me = layout.rank
    received, own = pending.flight.wait(), pending.own
    d_me = own.size(1)
    row_at = offsets(batch_size_per_rank)
    if pending.recv_sizes is None and pending.recv_dtypes is None:
        # A cast: every source rank's rows, in rank order, this rank's own among them: already the result's layout,
        # one cast (none for float32, whose receive buffer is the result).
        rows = received.view(sum(batch_size_per_rank), d_me)
        if rows.dtype == torch.float32:
            return rows
        return (buffers or ResultBuffers()).empty(rows.size(0), d_me, rows.device).copy_(rows)
    placed = pending.out is not None  # the own block is in place already
    out = pending.out if placed else (buffers or ResultBuffers()).empty(row_at[-1], d_me, own.device)
    if pending.recv_dtypes is not None:  # a cast, float32 from some sources: each source's bytes in its dtype
        at = 0
        for s, dtype in enumerate(pending.recv_dtypes):
            block = out[row_at[s] : row_at[s + 1]]
            n = 0 if s == me else block.numel() * dtype.itemsize
            if s != me:
                exchange.from_wire(block, received[at : at + n], dtype)
            elif not placed:
                exchange.place_own(block, own)
            at += n
        return out
    # Decoded (a run of compressed sources at once) or copied straight into the result's row blocks; the gradients
    # come back as the embeddings went.
    try:
        return exchange.place_rows(out, received, pending.recv_sizes, [[b] for b in batch_size_per_rank],
                                   layout.local_cols, layout.compress_to, me, None if placed else own, impl)
    except CodecError as err:
        raise CompressedExchangeError(
            f"rank {me}: embedding gradients received for tables {list(layout.local_tables)} failed to decode"
            f" ({err})."
        ) from err
