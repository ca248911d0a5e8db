"""The pure exchange: the wire functions both compressed all-to-alls are built from, and the pooled layout on them.

These functions move tensors and nothing else: no statistics, no timing, no policy (the modules in
``all_to_all.py`` and ``sequence.py`` wrap them with a :class:`~lightning_dlac.comm.recorder.Recorder`). Every rank
calls the same function with the same layout.

**Wire functions** (any layout; a *chunk* is one table's rows for one destination rank, encoded on its own):

- :func:`encode_chunks`: one ``encode_grid`` over a block of rows, returned as a :class:`Grid`;
- :func:`exchange_sizes`: every chunk's record (its compressed bytes, and its rows where the receiver cannot know
  them) to its destination, in one small int64 all-to-all; :func:`exchange_unknown_sizes` leaves out the records
  a receiver knows (a payload sent as is, a rank's own block);
- :func:`start_payload` / :meth:`InFlight.wait`: the payloads, one variable-split ``all_to_all_single``;
- :func:`start_cast`: rows sent as float32, bf16 or fp16 instead (TorchRec's fixed-size exchanges);
- :func:`decode_chunks`: the received chunks back into one tensor, or into a block of the caller's output, so
  that nothing is concatenated;
- :func:`assemble`, :func:`as_bytes`, :func:`copy_raw`: payloads made of pieces, and float blocks sent as they are
  (byte for byte: a piece's offset in a payload need not suit a float view).

**Per-peer compression.** A layout carries a :class:`~lightning_dlac.comm.peers.PeerPlan`: which (source,
destination) payloads are DLAC-encoded. A payload the plan does not compress goes as float32, exactly (a cast
gradient exchange sends it float32 instead of the wire dtype), and a gradient goes back compressed exactly where its
embeddings came compressed. Consecutive compressed peers share one grid (one ``encode_grid`` / ``decode_grid``),
so the plan that compresses for everyone runs as two grids around a rank's own block.

Where a wire function takes ``impl``, it is the DLAC codec implementation (``"auto"``, ``"native"``, ``"ref"``) or a
:class:`ChunkCodec` that stands in for the codec and nothing else: the benchmarks' null codec
(:mod:`lightning_dlac.comm.null_codec`), which sends a given number of bytes per chunk without encoding or decoding.

A layout where a rank sends or receives nothing (fewer tables than ranks, an empty batch) needs no special case:
a grid without chunks encodes to nothing and decodes to an empty tensor of the right shape.

**Pooled layout** (``local_embs`` is [sum of batch sizes, local dim sum], rows grouped by destination), forward:

1. encode every (destination rank, local table) chunk for the other ranks with that table's bound; the rows a rank
   keeps for itself never leave it (their chunk sizes are exchanged as 0) and arrive exactly;
2. exchange the per-chunk compressed byte counts;
3. exchange the payloads;
4. decode and reassemble the columns in TorchRec's order (source rank, then its tables).

Backward sends the gradients the other way: float32, cast to bf16/fp16, or DLAC-encoded (again keeping the rank's
own block local).

Each payload exchange comes as a start / finish pair, as TorchRec's ``comm_ops`` request / wait: ``start_*`` does
what must happen before the bytes move (encoding, the size exchange) and launches the payload all-to-all with
``async_op=True``; it returns an :class:`InFlight` that ``finish_*`` waits on before decoding. Whatever the caller
runs in between overlaps with the transfer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from lightning_dlac.codec import CodecError, cast_column_blocks, decode, decode_grid, encode_grid, native_available
from lightning_dlac.comm.peers import PeerPlan, runs


class CompressedExchangeError(RuntimeError):
    """A compressed payload could not be decoded on the receiving rank."""


def offsets(sizes: Sequence[int]) -> list[int]:
    """``[0, s0, s0 + s1, ...]``."""
    return [0, *itertools.accumulate(sizes)]


def rank_sums(sizes: torch.Tensor, counts: Sequence[int]) -> list[int]:
    """The sum of each rank's entries of ``sizes`` (``counts[r]`` consecutive ones per rank), read in one transfer."""
    ends = torch.tensor(offsets(counts), device=sizes.device)
    totals = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    return (totals[ends[1:]] - totals[ends[:-1]]).tolist()


# ---------------------------------------------------------------------- wire functions


class ChunkCodec(Protocol):
    """What may encode and decode the chunks of a grid in place of the DLAC codec (see :func:`encode_chunks`)."""

    def encode(self, block: torch.Tensor, row_splits: list[int], col_splits: list[int], eps: torch.Tensor | float,
               tables: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The uint8 payload of every (row block, column block) chunk of ``block``, row-block-major, and the int64
        byte count of each, as ``encode_grid`` returns them."""
        ...

    def decode(self, received: torch.Tensor, sizes: torch.Tensor, row_splits: list[int], col_splits: list[int],
               device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 [row_splits[-1], col_splits[-1]] tensor on ``device`` that the chunks stand for; with ``out``
        (that shape, a block of the caller's result) written into it and returned, as ``decode_grid(out=)`` does."""
        ...


# The codec of a wire function: a DLAC implementation name ("auto", "native", "ref") or a stand-in.
Impl = str | ChunkCodec


class Grid(NamedTuple):
    """One :func:`encode_chunks` call: the block of rows it encoded, its splits, the chunks (row-block-major) and
    their sizes, and the table of each column block (the key of its bound)."""

    block: torch.Tensor
    row_splits: list[int]
    col_splits: list[int]
    payload: torch.Tensor
    sizes: torch.Tensor
    tables: tuple[str, ...] = ()

    def chunks(self) -> Iterator[tuple[str, torch.Tensor, int]]:
        """``(table, chunk, chunk index)`` of every chunk, in payload order (``table`` is ``""`` where unnamed)."""
        rs, cs = self.row_splits, self.col_splits
        for k, (r, c) in enumerate(itertools.product(range(len(rs) - 1), range(len(cs) - 1))):
            name = self.tables[c] if c < len(self.tables) else ""
            yield name, self.block[rs[r] : rs[r + 1], cs[c] : cs[c + 1]], k


class InFlight(NamedTuple):
    """A launched all-to-all: its receive buffer, valid once :meth:`wait` has returned, and the collective's work
    handle (``None`` when the collective ran synchronously)."""

    received: torch.Tensor
    work: dist.Work | None = None

    def wait(self) -> torch.Tensor:
        """Block until the bytes have arrived (on a GPU: until the current stream is ordered after them); return the
        receive buffer."""
        if self.work is not None:
            self.work.wait()
        return self.received


def _all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], pg,
                async_op: bool = False) -> dist.Work | None:
    return dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=pg,
                                  async_op=async_op)


def _has_chunks(row_splits: Sequence[int], col_splits: Sequence[int]) -> bool:
    return len(row_splits) > 1 and len(col_splits) > 1


def encode_chunks(block: torch.Tensor, row_splits: Sequence[int], col_splits: Sequence[int],
                  eps: torch.Tensor | float, impl: Impl, tables: Sequence[str] = ()) -> Grid:
    """Encode every (row block, column block) chunk of ``block``, column block ``c`` with relative bound ``eps[c]``
    (one ``encode_grid``; or ``impl.encode`` where ``impl`` is a :class:`ChunkCodec`). Without a row block or a column
    block there is no chunk: the payload is empty."""
    rs, cs = list(row_splits), list(col_splits)
    if not _has_chunks(rs, cs):
        empty = torch.zeros(0, dtype=torch.uint8, device=block.device)
        return Grid(block, rs, cs, empty, torch.zeros(0, dtype=torch.int64, device=block.device), tuple(tables))
    if not isinstance(impl, str):
        return Grid(block, rs, cs, *impl.encode(block, rs, cs, eps, tuple(tables)), tuple(tables))
    return Grid(block, rs, cs, *encode_grid(block, rs, cs, eps=eps, impl=impl), tuple(tables))


def decode_chunks(received: torch.Tensor, sizes: torch.Tensor, row_splits: Sequence[int], col_splits: Sequence[int],
                  impl: Impl, device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 [row_splits[-1], col_splits[-1]] tensor on ``device`` that :func:`encode_chunks` chunks (their
    ``sizes``, concatenated in ``received``) were made from; empty when there is no chunk (a rank that receives
    nothing). With ``out`` (that shape, on ``device``, columns contiguous: a block of the caller's output), the
    chunks are decoded into it and ``out`` is returned. Raises :class:`~lightning_dlac.codec.CodecError` on a bad
    payload."""
    if not _has_chunks(row_splits, col_splits):
        rows, cols = (row_splits[-1] if row_splits else 0), (col_splits[-1] if col_splits else 0)
        return torch.zeros(rows, cols, device=device) if out is None else out
    if not isinstance(impl, str):
        return impl.decode(received, sizes, list(row_splits), list(col_splits), device, out=out)
    if out is not None:
        return decode_grid(received, sizes, list(row_splits), list(col_splits), impl=impl, out=out)
    return decode_grid(received, sizes, list(row_splits), list(col_splits), impl=impl).to(device)


def assemble(pieces: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One uint8 payload from ``pieces`` (uint8 tensors of any shape whose last dimension is contiguous: a block of
    float32 columns seen as bytes, or an encoded payload), each copied once, in order."""
    sizes = [p.numel() for p in pieces]
    payload = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    for piece, (a, b) in zip(pieces, itertools.pairwise(offsets(sizes))):
        if b > a:
            payload[a:b].view(piece.shape).copy_(piece)
    return payload


def as_bytes(block: torch.Tensor) -> torch.Tensor:
    """``block`` (2-D, last dimension contiguous) seen as its bytes, [rows, cols * element size] uint8, no copy."""
    if block.numel() == 0:
        return torch.zeros(block.size(0), 0, dtype=torch.uint8, device=block.device)
    return block.view(torch.uint8)


def copy_raw(out: torch.Tensor, received: torch.Tensor) -> None:
    """Copy ``received`` (uint8, the bytes of a float block sent as is) into ``out`` (its shape and dtype, last
    dimension contiguous), byte for byte: a byte offset in a payload need not be aligned for a float view."""
    if out.numel():
        as_bytes(out).copy_(received.view(out.size(0), -1))


def to_wire(block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``block`` (2-D float32, last dimension contiguous) as the bytes of ``dtype``: cast where it is narrower, as it
    is (no copy) for float32."""
    return as_bytes(block if dtype == block.dtype else block.to(dtype))


def from_wire(out: torch.Tensor, received: torch.Tensor, dtype: torch.dtype) -> None:
    """Copy ``received`` (the bytes :func:`to_wire` made of a block of ``out``'s shape, in ``dtype``) into ``out``:
    float32 byte for byte (:func:`copy_raw`), a narrower dtype cast back."""
    if dtype == out.dtype:
        copy_raw(out, received)
    else:
        out.copy_(received.view(dtype).view(out.shape))


def place_rows(out: torch.Tensor, received: torch.Tensor, sizes: torch.Tensor, rows_of: Sequence[Sequence[int]],
               col_splits: Sequence[int], compressed: Sequence[bool], me: int, own: torch.Tensor | None,
               impl: Impl) -> torch.Tensor:
    """Fill ``out`` with every source rank's row block, in rank order: a run of consecutive compressed sources
    decoded at once straight into its rows (source ``s`` sent one chunk per (row block ``rows_of[s]``, column block
    of ``col_splits``), ``sizes`` each chunk's bytes), a source that sent its rows as they are copied, this rank's
    own block (``me``) copied from ``own`` (``None``: :func:`place_own` put it there already, while the payload was
    on its way). Returns ``out``; raises :class:`~lightning_dlac.codec.CodecError` on a bad payload."""
    n_cols = len(col_splits) - 1
    row_at = offsets([sum(r) for r in rows_of])
    chunk_at = offsets([len(r) * n_cols for r in rows_of])
    byte_at = offsets(rank_sums(sizes, [len(r) * n_cols for r in rows_of]))
    for packed, lo, hi in runs(compressed):
        if packed:
            rows = offsets([r for s in range(lo, hi) for r in rows_of[s]])
            decode_chunks(received[byte_at[lo] : byte_at[hi]], sizes[chunk_at[lo] : chunk_at[hi]], rows, col_splits,
                          impl, out.device, out=out[row_at[lo] : row_at[hi]])
            continue
        for s in range(lo, hi):
            block = out[row_at[s] : row_at[s + 1]]
            if s != me:
                copy_raw(block, received[byte_at[s] : byte_at[s + 1]])
            elif own is not None:
                place_own(block, own)
    return out


def place_own(block: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """Copy ``own``, the block of the result this rank keeps (it never goes on the wire and arrives exactly), into
    ``block``, its place in the result, and return ``block``. The exchanges call it between launching the payload
    and waiting for it, so that the copy overlaps the transfer instead of following it."""
    return block.copy_(own)


def with_own(sizes: torch.Tensor, at: int, n_own: int) -> torch.Tensor:
    """The chunk sizes for the other ranks with ``n_own`` zeros inserted at ``at``: this rank's own chunks, which are
    never sent (the size exchange has a record for every destination)."""
    own = sizes.new_zeros(n_own, *sizes.shape[1:])
    return torch.cat([sizes[:at], own, sizes[at:]])


def exchange_sizes(sizes: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int], pg) -> torch.Tensor:
    """Send each destination its chunks' records and return the records every source sent to this rank.

    Args:
        sizes: int64 ``[chunks]`` or ``[chunks, k]``, one record per chunk (compressed bytes, then any other
            integers), grouped by destination in rank order: ``send_counts[d]`` records for rank ``d``.
        send_counts: Records for each destination rank.
        recv_counts: Records from each source rank.
        pg: Process group.

    Returns:
        The records received, grouped by source in rank order, shaped like ``sizes``.
    """
    width = sizes.size(1) if sizes.dim() == 2 else 1
    received = torch.empty(sum(recv_counts) * width, dtype=torch.int64, device=sizes.device)
    _all_to_all(received, sizes.reshape(-1), [c * width for c in recv_counts], [c * width for c in send_counts], pg)
    return received.view(-1, width) if sizes.dim() == 2 else received


def exchange_unknown_sizes(sizes: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                           sends: Sequence[bool], known: Sequence[torch.Tensor | None], pg) -> torch.Tensor:
    """:func:`exchange_sizes` of 1-D records where some receivers know theirs already (a payload sent as is: rows x
    dims x 4 bytes; a rank's own: 0): destination ``d``'s records go only where ``sends[d]``, and from source ``s``
    nothing arrives where ``known[s]`` (its records, as this rank computes them) is given; ``known[s]`` stands in
    for them. Every rank still joins the one collective (the records of the compressed peers need it), with only the
    records nobody could know in it. The plan behind ``sends`` and ``known`` must agree across ranks: rank ``r``
    sends to ``d`` exactly where ``d`` does not know the records from ``r``.

    Returns:
        The records of every source, grouped by source in rank order, as :func:`exchange_sizes` returns them.
    """
    send_at = offsets(send_counts)
    parts = [sizes[send_at[d] : send_at[d + 1]] for d, go in enumerate(sends) if go]
    sent = torch.cat(parts) if parts else sizes.new_zeros(0)
    unknown = [0 if k is not None else c for c, k in zip(recv_counts, known)]
    got = exchange_sizes(sent, [c if go else 0 for c, go in zip(send_counts, sends)], unknown, pg)
    got_at = offsets(unknown)
    pieces = [k.to(got.device) if k is not None else got[got_at[s] : got_at[s + 1]] for s, k in enumerate(known)]
    return torch.cat(pieces) if pieces else got


def size_records_plan(compressed_to: Sequence[bool], compressed_from: Sequence[bool], me: int,
                      elements: Callable[[int], Sequence[int]]) -> tuple[list[bool], list[torch.Tensor | None]]:
    """The ``sends`` and ``known`` of :func:`exchange_unknown_sizes` for a per-peer plan: records go to the ranks this
    one compresses for (``compressed_to``, itself excluded); from a source that does not compress for this rank
    (``compressed_from``) the records are computed here, 4 bytes per float32 element of each of its chunks
    (``elements(s)``), and this rank's own chunks are 0 bytes (never sent)."""
    sends = [c and d != me for d, c in enumerate(compressed_to)]
    known = [None if c and s != me else
             torch.tensor([0 if s == me else 4 * n for n in elements(s)], dtype=torch.int64)
             for s, c in enumerate(compressed_from)]
    return sends, known


def start_payload(payload: torch.Tensor, send_bytes: list[int], recv_bytes: list[int], pg) -> InFlight:
    """Launch the payload exchange (``send_bytes[d]`` bytes of ``payload`` to rank ``d``, in rank order): once waited
    on, the bytes every source rank sent to this one, concatenated in rank order."""
    received = torch.empty(sum(recv_bytes), dtype=torch.uint8, device=payload.device)
    return InFlight(received, _all_to_all(received, payload, recv_bytes, send_bytes, pg, async_op=True))


def start_cast(values: torch.Tensor, send_numel: list[int], recv_numel: list[int], wire_dtype: torch.dtype,
               pg) -> InFlight:
    """Launch the exchange of the float elements ``values`` (1-D, ``send_numel[d]`` for rank ``d`` in rank order)
    as ``wire_dtype`` (float32, bf16, fp16); once waited on, the ``wire_dtype`` elements every source rank sent."""
    wire = values.to(wire_dtype)
    received = torch.empty(sum(recv_numel), dtype=wire_dtype, device=values.device)
    size = wire.element_size()
    # Raw bytes: the collective moves them whatever the dtype (gloo has no all-to-all for every float type).
    work = _all_to_all(received.view(torch.uint8), wire.view(torch.uint8), [n * size for n in recv_numel],
                       [n * size for n in send_numel], pg, async_op=True)
    return InFlight(received, work)


# ---------------------------------------------------------------------- result buffers


# How many references an untyped storage has (tensors and views on it, storage objects); None where torch lacks it.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


class ResultBuffers:
    """New result tensors whose memory is reused from one call to the next where nothing holds it any more.

    An exchange's result is as large as the step's pooled embeddings (or their gradient), and a large new tensor on
    the CPU costs the first code that writes it a page fault per page whenever the allocator hands it fresh
    memory (glibc maps large blocks anew, and unmaps them when freed, until its threshold adapts). :meth:`empty`
    returns a new tensor (its own, with no autograd history) on the memory of the previous result when no tensor or
    view of that result is alive any more, which the storage's reference count says exactly; otherwise, and on other
    devices (whose caching allocators keep memory already, and whose kernels may still read it on another stream),
    fresh memory. One instance per kind of result: a forward output and a gradient are alive together."""

    def __init__(self) -> None:
        self._held: torch.UntypedStorage | None = None
        self._idle = 0  # the held storage's reference count when only this object holds it

    def empty(self, rows: int, cols: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A [rows, cols] tensor of ``dtype`` and unspecified contents on ``device``."""
        nbytes = rows * cols * dtype.itemsize
        if device.type != "cpu" or _storage_use_count is None or nbytes == 0:
            return torch.empty(rows, cols, device=device, dtype=dtype)
        held = self._held
        if held is None or held.nbytes() != nbytes or _storage_use_count(held._cdata) != self._idle:
            held = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()  # the temporary tensor is gone at once
            self._held, self._idle = held, _storage_use_count(held._cdata)
        return torch.empty(0, dtype=dtype).set_(held, 0, (rows, cols))


# ---------------------------------------------------------------------- the pooled layout


@dataclass(frozen=True)
class TableLayout:
    """Which tables each rank sends chunks of, and this rank's place among the ranks.

    Args:
        rank: This rank.
        tables_per_rank: Table name of each chunk column (a column block, a feature), per rank, in the order of
            that rank's ``local_embs`` (the key of its error bound). A rank may have none.
    """

    rank: int
    tables_per_rank: tuple[tuple[str, ...], ...]
    peers: PeerPlan | None = field(default=None, kw_only=True)  # None: every payload compressed (PeerPlan.everyone)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside the layout's {self.world} ranks.")
        if self.peers is not None and self.peers.world != self.world:
            raise ValueError(f"a peer plan of {self.peers.world} ranks for a layout of {self.world}.")

    @cached_property
    def plan(self) -> PeerPlan:
        """Which payloads are DLAC-encoded (:class:`~lightning_dlac.comm.peers.PeerPlan`)."""
        return self.peers if self.peers is not None else PeerPlan.everyone(self.world)

    @cached_property
    def compress_to(self) -> tuple[bool, ...]:
        """Per destination, whether this rank's forward payload for it is compressed (its own: ``False``)."""
        return self.plan.to(self.rank)

    @cached_property
    def compress_from(self) -> tuple[bool, ...]:
        """Per source, whether its forward payload for this rank comes compressed. A gradient goes back as its
        embeddings came: this rank's gradient for owner ``r`` is compressed where ``compress_from[r]`` is."""
        return self.plan.source(self.rank)

    @cached_property
    def mixed(self) -> bool:
        """Whether some peer of this rank gets (or sends it) a payload as is, in either direction."""
        others = self.other_ranks
        return not all(self.compress_to[r] and self.compress_from[r] for r in others)

    @property
    def world(self) -> int:
        return len(self.tables_per_rank)

    @property
    def local_tables(self) -> tuple[str, ...]:
        """Tables whose embeddings this rank sends."""
        return self.tables_per_rank[self.rank]

    @property
    def chunk_counts(self) -> list[int]:
        """Chunk columns per rank (chunks each rank sends to every destination)."""
        return [len(t) for t in self.tables_per_rank]

    @property
    def other_ranks(self) -> list[int]:
        """Every rank but this one, in rank order: whom this rank exchanges with."""
        return [r for r in range(self.world) if r != self.rank]


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


# ---------------------------------------------------------------------- pooled forward


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
            grid = encode_chunks(x[r0 : row_splits[hi]], rs, cols, eps, impl, layout.local_tables)
            grids.append(grid)
            pieces.append(grid.payload.to(dev))
            sizes.append(grid.sizes.to(dev))
            continue
        for d in range(lo, hi):
            rows = row_splits[d + 1] - row_splits[d]
            if d != me:
                pieces.append(as_bytes(x[row_splits[d] : row_splits[d + 1]]))
            sizes.append(torch.tensor([0 if d == me else rows * c * 4 for c in dims], dtype=torch.int64, device=dev))
    all_sizes = torch.cat(sizes) if sizes else torch.zeros(0, dtype=torch.int64, device=dev)
    return Encoded(assemble(pieces, dev), all_sizes, grids, rank_sums(all_sizes, [n_local] * layout.world))


def start_forward(encoded: Encoded, layout: Layout, rows: int, pg) -> tuple[InFlight, torch.Tensor]:
    """Exchange the chunk sizes and launch the payload exchange; return it and every source's chunk sizes for this
    rank (source rank, then its tables). Only compressed chunks' sizes travel: this rank computes those of a source
    that sends its ``rows`` (this rank's batch) as they are, and of its own block (:func:`exchange_unknown_sizes`)."""
    me, counts = layout.rank, layout.chunk_counts
    sends, known = size_records_plan(layout.compress_to, layout.compress_from, me,
                                     lambda s: [rows * d for d in layout.dims_per_rank[s]])
    recv_sizes = exchange_unknown_sizes(encoded.sizes, [counts[me]] * layout.world, counts, sends, known, pg)
    flight = start_payload(encoded.payload, encoded.send_bytes, rank_sums(recv_sizes, counts), pg)
    return flight, recv_sizes


def start_output(own: torch.Tensor, layout: Layout, buffers: ResultBuffers | None = None) -> torch.Tensor:
    """This rank's pooled-embedding output [local batch, total dim] (a tensor from ``buffers`` where given) with the
    exact block it kept, ``own``, already in its columns (:func:`place_own`) and the other sources' columns
    unspecified until :func:`decode_from_others` fills them: made while the payload is on its way."""
    me, col_at = layout.rank, offsets(layout.dim_sums)
    out = (buffers or ResultBuffers()).empty(own.size(0), col_at[-1], own.device)
    place_own(out[:, col_at[me] : col_at[me + 1]], own)
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
                    decode_chunks(received[byte_at[a] : byte_at[b]], recv_sizes[chunk_at[a] : chunk_at[b]],
                                  [0, rows], dims, impl, own.device, out=out[:, cols[a][0] : cols[b - 1][1]])
                continue
            for s in range(lo, hi):
                if s != me:  # this rank's own block is in place already
                    copy_raw(out[:, cols[s][0] : cols[s][1]], received[byte_at[s] : byte_at[s + 1]])
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
    return start_cast(x.contiguous().view(-1), [b * d_me for b in batch_size_per_rank],
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


# ---------------------------------------------------------------------- pooled backward


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
    given) with its own exact block, ``own``, already in its rows (:func:`place_own`) and the other sources' rows
    unspecified until :func:`finish_backward` fills them: made while the payload is on its way."""
    row_at = offsets(batch_size_per_rank)
    out = (buffers or ResultBuffers()).empty(row_at[-1], own.size(1), own.device)
    place_own(out[row_at[me] : row_at[me + 1]], own)
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
    flight = start_cast(send, [b_me * d for d in layout.dim_sums], [b * d_me for b in batch_size_per_rank],
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
        piece = to_wire(block, to_dtype[r])  # a narrower dtype's piece is cast on its way
        pieces.append(piece)
        send_bytes.append(piece.numel())
    recv_bytes = [0 if s == me else b * d_me * from_dtype[s].itemsize for s, b in enumerate(batch_size_per_rank)]
    flight = start_payload(assemble(pieces, grad.device), send_bytes, recv_bytes, pg)
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
                grid = encode_chunks(grad[:, cols[a][0] : cols[b - 1][1]], [0, b_me], offsets(dims), eps, impl,
                                     tables)
                pieces.append(grid.payload.to(dev))
                sizes.append(grid.sizes.to(dev))
            continue
        for r in range(lo, hi):  # ours stays here, exactly; an uncompressed owner's columns go as float32
            if r != me:
                pieces.append(as_bytes(grad[:, cols[r][0] : cols[r][1]]))
            raw = [0 if r == me else b_me * d * 4 for d in layout.dims_per_rank[r]]
            sizes.append(torch.tensor(raw, dtype=torch.int64, device=dev))
    payload = assemble(pieces, dev)
    all_sizes = torch.cat(sizes) if sizes else torch.zeros(0, dtype=torch.int64, device=dev)
    # Only compressed chunks' sizes travel: an owner knows the size of a gradient sent as is (the source's batch rows
    # x its dims x 4) and of its own block (0).
    local_dims = layout.dims_per_rank[me]
    sends, known = size_records_plan(layout.compress_from, layout.compress_to, me,
                                     lambda s: [batch_size_per_rank[s] * d for d in local_dims])
    recv_sizes = exchange_unknown_sizes(all_sizes, counts, [n_local] * world, sends, known, pg)
    send_bytes = rank_sums(all_sizes, counts)
    flight = start_payload(payload, send_bytes, rank_sums(recv_sizes, [n_local] * world), pg)
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
                from_wire(block, received[at : at + n], dtype)
            elif not placed:
                place_own(block, own)
            at += n
        return out
    # Decoded (a run of compressed sources at once) or copied straight into the result's row blocks; the gradients
    # come back as the embeddings went.
    try:
        return place_rows(out, received, pending.recv_sizes, [[b] for b in batch_size_per_rank], layout.local_cols,
                          layout.compress_to, me, None if placed else own, impl)
    except CodecError as err:
        raise CompressedExchangeError(
            f"rank {me}: embedding gradients received for tables {list(layout.local_tables)} failed to decode"
            f" ({err})."
        ) from err
