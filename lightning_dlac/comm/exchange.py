"""The pure exchange: encode, size exchange, payload exchange, decode, for both directions.

These functions move tensors and nothing else: no statistics, no timing, no policy (the module in
``all_to_all.py`` wraps them with those). Every rank calls the same function with the same layout.

Forward, on every rank (``local_embs`` is [sum of batch sizes, local dim sum], rows grouped by destination):
1. encode every (destination rank, local table) chunk for the other ranks with that table's bound; the rows a rank
   keeps for itself never leave it (their chunk sizes are exchanged as 0) and arrive exactly;
2. exchange the per-chunk compressed byte counts (a small int64 all-to-all);
3. exchange the payloads with one variable-split ``all_to_all_single``;
4. decode and reassemble the columns in TorchRec's order (source rank, then its tables).

Backward sends the gradients the other way: float32, cast to bf16/fp16, or DLAC-encoded (again keeping the rank's
own block local).

Each payload exchange comes as a start / finish pair, as TorchRec's ``comm_ops`` request / wait: ``start_*`` does
what must happen before the bytes move (encoding, the size exchange) and launches the payload all-to-all with
``async_op=True``; it returns an :class:`InFlight` that ``finish_*`` waits on before decoding. Whatever the caller
runs in between overlaps with the transfer. The plain functions (``exchange_payload``, ``backward_cast``, ...) are
the pair called back to back.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
import torch.distributed as dist

from lightning_dlac.codec import CodecError, decode, decode_grid, encode_grid


class CompressedExchangeError(RuntimeError):
    """A compressed payload could not be decoded on the receiving rank."""


def offsets(sizes: Sequence[int]) -> list[int]:
    """``[0, s0, s0 + s1, ...]``."""
    return [0, *itertools.accumulate(sizes)]


@dataclass(frozen=True)
class Layout:
    """Which columns each rank contributes to the pooled-embedding exchange, and this rank's place in it.

    Args:
        rank: This rank.
        dims_per_rank: Embedding dimension of each column block (one per feature / column shard), per rank, in the
            column order of that rank's ``local_embs``.
        tables_per_rank: Table name of each column block, per rank (the key of its error bound).
    """

    rank: int
    dims_per_rank: tuple[tuple[int, ...], ...]
    tables_per_rank: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if len(self.dims_per_rank) != len(self.tables_per_rank):
            raise ValueError("dims_per_rank and tables_per_rank need one entry per rank each.")
        for r, (dims, names) in enumerate(zip(self.dims_per_rank, self.tables_per_rank)):
            if len(dims) != len(names):
                raise ValueError(f"rank {r}: {len(dims)} column blocks but {len(names)} table names.")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside the layout's {self.world} ranks.")

    @property
    def world(self) -> int:
        return len(self.dims_per_rank)

    @property
    def local_tables(self) -> tuple[str, ...]:
        """Tables whose pooled embeddings this rank sends."""
        return self.tables_per_rank[self.rank]

    @cached_property
    def dim_sums(self) -> list[int]:
        """Sum of the embedding dims each rank contributes."""
        return [sum(d) for d in self.dims_per_rank]

    @cached_property
    def local_cols(self) -> list[int]:
        """Column offsets of this rank's blocks in its ``local_embs``."""
        return offsets(self.dims_per_rank[self.rank])

    @property
    def chunk_counts(self) -> list[int]:
        """Column blocks per rank (chunks each rank sends to every destination)."""
        return [len(t) for t in self.tables_per_rank]

    def others(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The ranks before and after this one as [lo, hi) ranges: whom a rank exchanges with, keeping its own."""
        return (0, self.rank), (self.rank + 1, self.world)


class Grid(NamedTuple):
    """One ``encode_grid`` call over a block of rows: the block's first row, its row splits, the output."""

    first_row: int
    row_splits: list[int]
    payload: torch.Tensor
    sizes: torch.Tensor


class Encoded(NamedTuple):
    """This rank's compressed forward send: one payload, every chunk's size (0 for its own), and the grids."""

    payload: torch.Tensor
    sizes: torch.Tensor
    grids: list[Grid]


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


def _join(grids: Sequence[Grid | None], n_local: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One payload for the all-to-all from the grids before and after this rank, and every destination's chunk
    sizes with 0 for this rank's own."""
    before, after = grids
    sizes = [torch.zeros(n_local, dtype=torch.int64, device=dev)]
    if before is not None:
        sizes.insert(0, before.sizes.to(dev))
    if after is not None:
        sizes.append(after.sizes.to(dev))
    present = [g for g in grids if g is not None]
    payload = torch.cat([g.payload.to(dev) for g in present]) if present else torch.zeros(0, dtype=torch.uint8,
                                                                                              device=dev)
    return payload, torch.cat(sizes)


# ---------------------------------------------------------------------- forward


def encode_for_others(
    x: torch.Tensor, row_splits: list[int], layout: Layout, eps: torch.Tensor, impl: str
) -> Encoded:
    """Encode the (destination, local table) chunks of ``x`` for every rank but this one."""
    cols = layout.local_cols
    grids: list[Grid | None] = []
    for lo, hi in layout.others():
        grid = None
        if hi > lo and len(cols) > 1:
            r0 = row_splits[lo]
            rs = [r - r0 for r in row_splits[lo : hi + 1]]
            grid = Grid(r0, rs, *encode_grid(x[r0 : row_splits[hi]], rs, cols, eps=eps, impl=impl))
        grids.append(grid)
    payload, sizes = _join(grids, len(layout.local_tables), x.device)
    return Encoded(payload, sizes, [g for g in grids if g is not None])


def exchange_sizes(sizes: torch.Tensor, layout: Layout, pg) -> torch.Tensor:
    """Every source rank's chunk sizes for this rank (source rank, then its tables)."""
    counts = layout.chunk_counts
    received = torch.empty(sum(counts), dtype=torch.int64, device=sizes.device)
    _all_to_all(received, sizes, counts, [counts[layout.rank]] * layout.world, pg)
    return received


def start_payload(payload: torch.Tensor, sizes: torch.Tensor, recv_sizes: torch.Tensor, layout: Layout,
                  pg) -> InFlight:
    """Launch the payload exchange: once waited on, the bytes every source rank sent to this one, concatenated in
    rank order."""
    n_local = len(layout.local_tables)
    send = sizes.view(layout.world, n_local).sum(1).tolist() if n_local else [0] * layout.world
    recv = [int(s.sum()) for s in recv_sizes.split(layout.chunk_counts)]
    received = torch.empty(sum(recv), dtype=torch.uint8, device=payload.device)
    return InFlight(received, _all_to_all(received, payload, recv, send, pg, async_op=True))


def exchange_payload(payload: torch.Tensor, sizes: torch.Tensor, recv_sizes: torch.Tensor, layout: Layout,
                     pg) -> torch.Tensor:
    """The payload bytes every source rank sent to this one, concatenated in rank order."""
    return start_payload(payload, sizes, recv_sizes, layout, pg).wait()


def decode_from_others(
    received: torch.Tensor, recv_sizes: torch.Tensor, own: torch.Tensor, layout: Layout, impl: str
) -> torch.Tensor:
    """This rank's pooled embeddings [local batch, total dim]: the decoded columns of every other rank around
    ``own``, the exact block this rank kept."""
    me, rows = layout.rank, own.size(0)
    cols = offsets([d for s in range(layout.world) if s != me for d in layout.dims_per_rank[s]])
    decoded = own.new_empty(rows, 0)
    if len(cols) > 1:
        mine = offsets(layout.chunk_counts)
        keep = torch.cat([recv_sizes[: mine[me]], recv_sizes[mine[me + 1] :]])
        try:
            decoded = decode_grid(received, keep, [0, rows], cols, impl=impl).to(own.device)
        except CodecError as err:
            raise locate_decode_error(received, recv_sizes, layout, rows, impl) from err
    first = sum(layout.dim_sums[:me])  # this rank's columns in the output
    return torch.cat([decoded[:, :first], own, decoded[:, first:]], dim=1)


def start_forward_uncompressed(x: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, pg) -> InFlight:
    """Launch TorchRec's forward exchange: float32 rows to their destination, in one all-to-all."""
    me = layout.rank
    d_me, b_me = layout.dim_sums[me], batch_size_per_rank[me]
    recv_numel = [b_me * d for d in layout.dim_sums]
    received = torch.empty(sum(recv_numel), dtype=torch.float32, device=x.device)
    work = _all_to_all(received, x.contiguous().view(-1), recv_numel, [b * d_me for b in batch_size_per_rank], pg,
                       async_op=True)
    return InFlight(received, work)


def finish_forward_uncompressed(flight: InFlight, batch_size_per_rank: list[int], layout: Layout) -> torch.Tensor:
    """Wait for :func:`start_forward_uncompressed`'s exchange; this rank's pooled embeddings."""
    b_me = batch_size_per_rank[layout.rank]
    received = flight.wait()
    recv_numel = [b_me * d for d in layout.dim_sums]
    return torch.cat([blk.view(b_me, d) for blk, d in zip(received.split(recv_numel), layout.dim_sums)], dim=1)


def forward_uncompressed(x: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, pg) -> torch.Tensor:
    """TorchRec's forward exchange: float32 rows to their destination, in one all-to-all."""
    flight = start_forward_uncompressed(x, batch_size_per_rank, layout, pg)
    return finish_forward_uncompressed(flight, batch_size_per_rank, layout)


def locate_decode_error(received: torch.Tensor, recv_sizes: torch.Tensor, layout: Layout, rows: int,
                        impl: str) -> CompressedExchangeError:
    """Slow path after a failed decode: find the source rank and table whose chunk is bad."""
    me = layout.rank
    sizes = recv_sizes.tolist()
    offset = index = 0
    for src, count in enumerate(layout.chunk_counts):
        if src == me:  # nothing of ours was sent
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


def start_backward_cast(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout,
                        wire_dtype: torch.dtype, pg) -> BackwardInFlight:
    """Launch the gradient exchange of ``grad`` ([local batch, total dim]) to the column owners as ``wire_dtype``
    (float32, bf16, fp16)."""
    me = layout.rank
    d_me, b_me = layout.dim_sums[me], grad.size(0)
    owners = offsets(layout.dim_sums)
    # Column block of each owner rank, flattened in rank order: TorchRec's backward all-to-all layout.
    send = torch.cat([grad[:, a:b].reshape(-1) for a, b in itertools.pairwise(owners)])
    wire = send.to(wire_dtype)
    recv_numel = [b * d_me for b in batch_size_per_rank]
    send_numel = [b_me * d for d in layout.dim_sums]
    received = torch.empty(sum(recv_numel), dtype=wire_dtype, device=grad.device)
    size = wire.element_size()
    # Raw bytes: the collective moves them whatever the dtype (gloo has no all-to-all for every float type).
    work = _all_to_all(received.view(torch.uint8), wire.view(torch.uint8), [n * size for n in recv_numel],
                       [n * size for n in send_numel], pg, async_op=True)
    sent = b_me * (grad.size(1) - d_me) * size  # this rank's own block is a local copy
    return BackwardInFlight(InFlight(received, work), sent, None, grad[:, owners[me] : owners[me + 1]])


def start_backward_dlac(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, eps: float, impl: str,
                        pg) -> BackwardInFlight:
    """As :func:`start_backward_cast`, the gradients DLAC-encoded with relative bound ``eps`` (the size exchange
    runs before the payload is launched: the receive buffer's size depends on it)."""
    me, world = layout.rank, layout.world
    b_me, dev = grad.size(0), grad.device
    counts = layout.chunk_counts
    n_local = counts[me]
    owners = offsets(layout.dim_sums)  # each owner rank's columns of grad
    # The other owners' columns as at most two grids (owners before and after this rank); ours stay here, exactly.
    grids: list[Grid | None] = []
    for lo, hi in layout.others():
        dims = [d for r in range(lo, hi) for d in layout.dims_per_rank[r]]
        grid = None
        if dims:
            bounds = torch.full((len(dims),), eps, dtype=torch.float32)
            block = grad[:, owners[lo] : owners[hi]]
            grid = Grid(0, [0, b_me], *encode_grid(block, [0, b_me], offsets(dims), eps=bounds, impl=impl))
        grids.append(grid)
    payload, sizes = _join(grids, n_local, dev)
    recv_sizes = torch.empty(world * n_local, dtype=torch.int64, device=dev)
    _all_to_all(recv_sizes, sizes, [n_local] * world, counts, pg)
    send_bytes = [int(s.sum()) for s in sizes.split(counts)]
    recv_bytes = recv_sizes.view(world, n_local).sum(1).tolist() if n_local else [0] * world
    received = torch.empty(sum(recv_bytes), dtype=torch.uint8, device=dev)
    work = _all_to_all(received, payload, recv_bytes, send_bytes, pg, async_op=True)
    sent = int(payload.numel()) + (sizes.numel() - n_local) * 8
    return BackwardInFlight(InFlight(received, work), sent, recv_sizes, grad[:, owners[me] : owners[me + 1]])


def finish_backward(pending: BackwardInFlight, batch_size_per_rank: list[int], layout: Layout,
                    impl: str) -> torch.Tensor:
    """Wait for a gradient exchange that :func:`start_backward_cast` or :func:`start_backward_dlac` launched; return
    this rank's gradient of ``local_embs`` ([sum of batch sizes, local dim sum], float32)."""
    me = layout.rank
    received, own = pending.flight.wait(), pending.own
    dev, d_me = own.device, own.size(1)
    if pending.recv_sizes is None:  # a cast: every source rank's rows, in rank order, this rank's own among them
        recv_numel = [b * d_me for b in batch_size_per_rank]
        blocks = [blk.view(b, d_me) for blk, b in zip(received.split(recv_numel), batch_size_per_rank)]
        return torch.cat(blocks, dim=0).float()
    n_local = len(layout.local_tables)
    if not n_local:
        return torch.zeros(sum(batch_size_per_rank), 0, device=dev)
    others = [b for r, b in enumerate(batch_size_per_rank) if r != me]
    recv_sizes = pending.recv_sizes
    keep = torch.cat([recv_sizes[: me * n_local], recv_sizes[(me + 1) * n_local :]])
    try:
        decoded = decode_grid(received, keep, offsets(others), layout.local_cols, impl=impl).to(dev)
    except CodecError as err:
        raise CompressedExchangeError(
            f"rank {me}: embedding gradients received for tables {list(layout.local_tables)} failed to decode"
            f" ({err})."
        ) from err
    first = sum(batch_size_per_rank[:me])  # the rows of this rank's own batch in the result
    return torch.cat([decoded[:first], own, decoded[first:]], dim=0)


def backward_cast(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, wire_dtype: torch.dtype,
                  pg) -> tuple[torch.Tensor, int]:
    """Send ``grad`` ([local batch, total dim]) back to the column owners as ``wire_dtype`` (float32, bf16, fp16);
    return this rank's gradient of ``local_embs`` and the bytes sent to other ranks."""
    pending = start_backward_cast(grad, batch_size_per_rank, layout, wire_dtype, pg)
    return finish_backward(pending, batch_size_per_rank, layout, "auto"), pending.sent


def backward_dlac(grad: torch.Tensor, batch_size_per_rank: list[int], layout: Layout, eps: float, impl: str,
                  pg) -> tuple[torch.Tensor, int]:
    """As :func:`backward_cast`, the gradients DLAC-encoded with relative bound ``eps``."""
    pending = start_backward_dlac(grad, batch_size_per_rank, layout, eps, impl, pg)
    return finish_backward(pending, batch_size_per_rank, layout, impl), pending.sent
