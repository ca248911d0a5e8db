"""The pure exchange: the wire functions both compressed all-to-alls are built from.

These functions move tensors and nothing else: no statistics, no timing, no policy, and no layout of their own
(rows, columns and chunk counts come in as plain sequences). The pooled layout is built on them in
:mod:`lightning_dlac.comm.pooled`, the sequence layout in :mod:`lightning_dlac.comm.sequence`; the modules there wrap
them with a :class:`~lightning_dlac.comm.recorder.Recorder`. Every rank calls the same function with the same layout.

**Wire functions** (a *chunk* is one table's rows for one destination rank, encoded on its own):

- :func:`encode_chunks`: one ``encode_grid`` over a block of rows, returned as a :class:`Grid`;
- :func:`exchange_sizes`: every chunk's record (its compressed bytes, and its rows where the receiver cannot know
  them) to its destination, in one small int64 all-to-all; :func:`exchange_unknown_sizes` leaves out the records
  a receiver knows (a payload sent as is, a rank's own block);
- :func:`start_payload` / :meth:`InFlight.wait`: the payloads, one variable-split ``all_to_all_single``;
- :func:`start_cast`: rows sent as float32, bf16 or fp16 instead (TorchRec's fixed-size exchanges);
- :func:`decode_chunks`: the received chunks back into one tensor, or into a block of the caller's output, so
  that nothing is concatenated; :func:`place_rows` does it for every source's row block at once;
- :func:`assemble`, :func:`as_bytes`, :func:`copy_raw`: payloads made of pieces, and float blocks sent as they are
  (byte for byte: a piece's offset in a payload need not suit a float view).

**Per-peer compression.** A layout carries a :class:`~lightning_dlac.comm.peers.PeerPlan`: which (source,
destination) payloads are DLAC-encoded. A payload the plan does not compress goes as float32, exactly (a cast
gradient exchange sends it float32 instead of the wire dtype); :func:`size_records_plan` says which size records
must travel under a plan.

Where a wire function takes ``impl``, it is the DLAC codec implementation (``"auto"``, ``"native"``, ``"ref"``) or a
:class:`ChunkCodec` that stands in for the codec and nothing else: the benchmarks' null codec
(:mod:`lightning_dlac.comm.null_codec`), which sends a given number of bytes per chunk without encoding or decoding.

A layout where a rank sends or receives nothing (fewer tables than ranks, an empty batch) needs no special case:
a grid without chunks encodes to nothing and decodes to an empty tensor of the right shape.

A payload exchange is launched (``start_*``, ``async_op=True``) and waited on (:meth:`InFlight.wait`) apart, as
TorchRec's ``comm_ops`` request / wait: whatever the caller runs in between overlaps with the transfer.
"""

from __future__ import annotations

import importlib
import itertools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist

from lightning_dlac.codec import decode_grid, encode_grid
from lightning_dlac.comm.liveness import PeerTimeoutError, is_timeout
from lightning_dlac.comm.peers import runs


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
        receive buffer. Raises :class:`~lightning_dlac.comm.liveness.PeerTimeoutError` where a peer never sent."""
        if self.work is not None:
            try:
                self.work.wait()
            except RuntimeError as error:
                _raise_timeout(error, "payload")
                raise
        return self.received


def _raise_timeout(error: RuntimeError, collective: str) -> None:
    """Raise ``error`` as a :class:`~lightning_dlac.comm.liveness.PeerTimeoutError` of ``collective`` where it is a
    collective's timeout (the exchange around it names the silent rank); return otherwise."""
    if is_timeout(error):
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise PeerTimeoutError(rank, collective, str(error)) from error


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

    Raises:
        PeerTimeoutError: A peer did not answer within the process group's timeout.
    """
    width = sizes.size(1) if sizes.dim() == 2 else 1
    received = torch.empty(sum(recv_counts) * width, dtype=torch.int64, device=sizes.device)
    try:
        _all_to_all(received, sizes.reshape(-1), [c * width for c in recv_counts], [c * width for c in send_counts],
                    pg)
    except RuntimeError as error:
        _raise_timeout(error, "sizes")
        raise
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


# ---------------------------------------------------------------------- names that moved out

# The pooled layout, the layout base and the result buffers were defined here until this module became the wire
# functions alone (issue 52). Imported from here they still work, for one release, with a DeprecationWarning that
# names their new home.
_MOVED = {
    "TableLayout": "base",
    "ResultBuffers": "buffers",
    **dict.fromkeys(
        ("Layout", "Encoded", "BackwardInFlight", "encode_for_others", "start_forward", "start_output",
         "decode_from_others", "adjacent", "start_forward_uncompressed", "finish_forward_uncompressed",
         "locate_decode_error", "gather_owner_blocks", "start_gradient", "start_backward_cast",
         "start_backward_mixed_cast", "start_backward_dlac", "finish_backward"),
        "pooled",
    ),
}


def __getattr__(name: str) -> Any:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"lightning_dlac.comm.exchange.{name} is deprecated: it moved to lightning_dlac.comm.{home}.{name};"
                  f" import it from there", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f"lightning_dlac.comm.{home}"), name)
