"""A pooled exchange sent in pieces, so that the codec works while the wire does.

Sent whole, a compressed exchange costs encode + transfer + decode, one after the other: nothing else can happen
on the sender while it encodes, nor on the receiver while the bytes travel. Cut into ``K`` pieces, the encode of
piece ``k + 1`` and the decode of piece ``k - 1`` run while piece ``k`` is on the wire, and the exchange costs
about ``E / K + max(W, E + D) + D / K`` instead of ``E + W + D`` (``E``, ``W``, ``D``: the whole exchange's encode,
transfer and decode).

A piece is a contiguous group of every rank's tables (column blocks): rank ``r``'s tables are cut into ``K`` groups
of about equal width, and piece ``k`` is every rank's group ``k``. Each chunk (one table's rows for one peer) is in
exactly one piece and is encoded exactly as in the whole exchange, so the pieces' result is the whole exchange's,
bit for bit; each piece is a :class:`~lightning_dlac.comm.pooled.Layout` of its own (its own size exchange and
payload all-to-all), whose columns the whole layout's result places with :attr:`Piece.cols`.

Sending in pieces is opt-in (``CompressionConfig(pieces=K)``; default 1, the exchange whole). It pays only where
the transfer is long next to the codec: each piece adds a size exchange, which on gloo waits for the previous
piece's payload and for every peer to have encoded its own piece, so the ranks meet ``K`` times instead of once.
How pieces compare with the whole exchange in the 2-rank DLRM race on throttled links, DLAC's and the null codec's
(``benchmarks/results/e2e_pieces.json``): docs/benchmarks.md, 'Sending the exchange in pieces'.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

import torch

from lightning_dlac.comm.exchange import offsets
from lightning_dlac.comm.pooled import Layout


class Piece(NamedTuple):
    """One piece of a pooled exchange: the layout of its tables, and where its columns lie in each rank's block.

    Attributes:
        layout: The piece as a layout of its own: every rank's tables of this piece, the same rank and peer plan.
        cols: Per rank, ``(start, end)``: the piece's columns within that rank's columns of the whole layout (its
            ``local_embs`` on the sender, its block of the output on a receiver, of the gradient on the owner).
        tables: Per rank, ``(start, end)``: the piece's tables among that rank's tables of the whole layout.
        out_cols: Per rank, ``(start, end)``: the piece's columns of that rank in the forward output and in the
            gradient handed back (every rank's block side by side).
    """

    layout: Layout
    cols: tuple[tuple[int, int], ...]
    tables: tuple[tuple[int, int], ...]
    out_cols: tuple[tuple[int, int], ...]

    @property
    def local_cols(self) -> slice:
        """This rank's columns of the piece in its ``local_embs`` (and in its gradient)."""
        return slice(*self.cols[self.layout.rank])

    @property
    def local_tables(self) -> slice:
        """This rank's tables of the piece among its tables (e.g. of its per-table bounds)."""
        return slice(*self.tables[self.layout.rank])


def piece_bounds(dims: Sequence[int], count: int) -> list[int]:
    """Cut tables of widths ``dims`` into ``count`` contiguous groups of about equal width: the ``count + 1`` table
    offsets ``[0, ..., len(dims)]`` of the groups (a group may be empty where tables are fewer than groups, or one
    table is wider than a group). Boundary ``j`` is the table offset whose column offset is nearest to ``j / count``
    of the total width."""
    if count < 1:
        raise ValueError(f"a layout is cut into at least one piece, got {count}.")
    col_at = offsets(dims)
    total = col_at[-1]
    bounds = [0]
    for j in range(1, count):
        target = total * j / count
        i = bisect.bisect_left(col_at, target)
        if i > 0 and (i == len(col_at) or target - col_at[i - 1] <= col_at[i] - target):
            i -= 1
        bounds.append(max(bounds[-1], min(i, len(dims))))
    return [*bounds, len(dims)]


def split_layout(layout: Layout, count: int) -> tuple[Piece, ...]:
    """``layout`` cut into ``count`` pieces (:func:`piece_bounds` of every rank's tables), in order; one piece is the
    layout itself."""
    block_at = offsets(layout.dim_sums)  # each rank's block in the output

    def piece(sub: Layout, cols: Sequence[tuple[int, int]], tables: Sequence[tuple[int, int]]) -> Piece:
        out_cols = tuple((at + a, at + b) for at, (a, b) in zip(block_at, cols))
        return Piece(sub, tuple(cols), tuple(tables), out_cols)

    if count == 1:
        return (piece(layout, [(0, s) for s in layout.dim_sums], [(0, n) for n in layout.chunk_counts]),)
    bounds = [piece_bounds(dims, count) for dims in layout.dims_per_rank]
    col_at = [offsets(dims) for dims in layout.dims_per_rank]
    pieces = []
    for k in range(count):
        ranges = [(b[k], b[k + 1]) for b in bounds]
        sub = Layout(layout.rank,
                     tuple(tables[a:b] for tables, (a, b) in zip(layout.tables_per_rank, ranges)),
                     tuple(dims[a:b] for dims, (a, b) in zip(layout.dims_per_rank, ranges)),
                     peers=layout.peers)
        pieces.append(piece(sub, [(c[a], c[b]) for c, (a, b) in zip(col_at, ranges)], ranges))
    return tuple(pieces)


def piece_count(layout: Layout, requested: int) -> int:
    """How many pieces an exchange of ``layout`` is sent in: ``requested``, but no more than the largest table count
    of a rank (a piece without any table would be a collective for nothing), and one with a single rank."""
    if layout.world < 2:
        return 1
    return max(1, min(requested, max(layout.chunk_counts, default=1)))


T = TypeVar("T")


def in_turn(pieces: Sequence[Piece], launch: Callable[[Piece], T], finish: Callable[[Piece, T], object]) -> list[T]:
    """Launch every piece in order and finish each one right after the next is launched (piece ``k`` is decoded
    while piece ``k + 1`` travels): what each launch returned, all finished but the last, which the caller finishes
    when it needs it."""
    launched: list[T] = []
    for k, piece in enumerate(pieces):
        launched.append(launch(piece))
        if k:
            finish(pieces[k - 1], launched[k - 1])
    return launched


def merge_piece_sizes(sizes: Sequence[torch.Tensor], counts: Sequence[Sequence[int]]) -> torch.Tensor:
    """The chunk sizes of the whole exchange, in its order, from each piece's (``sizes[k]``, in piece ``k``'s
    order). Chunks come in groups (the destinations of a forward send, the owners of a backward one), and
    ``counts[k][g]`` is how many chunks piece ``k`` has in group ``g`` (this rank's tables of the piece for every
    destination of a forward send; owner ``g``'s tables of the piece in a backward one); in the whole exchange each
    group holds every piece's chunks of it, one piece after the other."""
    if len(sizes) == 1:  # the whole exchange: already in its order
        return sizes[0]
    per_piece = [[s[a:b] for a, b in itertools.pairwise(offsets(c))] for s, c in zip(sizes, counts)]
    parts = [blocks[g] for g in range(len(counts[0])) for blocks in per_piece]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
