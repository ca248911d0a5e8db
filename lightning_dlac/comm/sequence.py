"""Compressed drop-in for TorchRec's ``SequenceEmbeddingsAllToAll``: the exchange of a sharded EmbeddingCollection's
unpooled (per-id) embeddings.

Where it plugs in (torchrec 1.8): ``ShardedEmbeddingCollection._output_dists[i]`` is one output dist per sharding
type; the table-wise and column-wise ones are ``TwSequenceEmbeddingDist``, whose ``_dist`` is a
``SequenceEmbeddingsAllToAll``. On each rank ``local_embs`` is ``[ids looked up here, D]``, ordered feature-major
(this rank's features), then by the source rank whose batch the ids came from, then id order; TorchRec permutes it
destination-major (``forward_recat``) and sends each rank its rows, and the receiver gets, per source rank, that
rank's features in order, rows for its own batch.

Chunks are what the pooled path calls them: one table's (feature's) rows for one destination rank, and the exchange
is built from the same wire functions (:mod:`lightning_dlac.comm.exchange`) and the same
:class:`~lightning_dlac.comm.recorder.Recorder`; only the layout differs. A chunk's row count depends on the ids, so
the size exchange carries two int64 per chunk: its compressed bytes and its rows. Steps, forward:

1. select each (destination, feature) chunk of ``local_embs``; the rows for this rank itself never leave it;
2. encode the chunks for other ranks with the feature's table bound (one grid per feature), and lay them out
   destination-major;
3. exchange (bytes, rows) per chunk, then the payloads;
4. decode every other source's chunks at once and place this rank's own block between them.

Any rank may own fewer features than another, or none: it then sends no chunk, and a rank that receives no rows
gets an empty tensor.

Backward sends the gradients of the received rows back to their owners as float32, bf16, fp16 (TorchRec's
fixed-size casts) or DLAC-encoded, the own block again kept local, and divides them by the world size as
TorchRec's ``All2All_Seq_Req`` does while ``comm_ops.get_gradient_division()`` is on.

Not compressed (TorchRec's module runs unchanged): variable batch sizes across ranks, and row-wise sharding, whose
output dist is a different module (``RwSequenceEmbeddingDist``): :func:`~lightning_dlac.comm.inject.
install_compressed_all_to_all` logs which tables those are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import SequenceEmbeddingsAllToAll, SequenceEmbeddingsAwaitable
from torchrec.distributed.types import Awaitable

from lightning_dlac.adaptive.bounds import BoundSource
from lightning_dlac.codec import CodecError
from lightning_dlac.comm import exchange
from lightning_dlac.comm.base import Ready, RecordedExchange, TableLayout
from lightning_dlac.comm.config import BackwardCompression, CompressionConfig
from lightning_dlac.comm.exchange import CompressedExchangeError, Grid, offsets, rank_sums
from lightning_dlac.comm.peers import PeerPlan, runs
from lightning_dlac.comm.timing import PhaseTimer


@dataclass(frozen=True)
class SequenceLayout(TableLayout):
    """The sequence-embedding exchange of one call: a :class:`~lightning_dlac.comm.base.TableLayout` whose chunk
    columns are features, and the rows of each chunk.

    Args:
        send_rows: Rows per (destination rank, local feature): ``send_rows[d][i]`` rows of this rank's feature ``i``
            go to rank ``d`` (this rank's own among them, kept here).
    """

    send_rows: tuple[tuple[int, ...], ...] = ()

    @property
    def chunk_starts(self) -> list[int]:
        """Row offsets of the (destination, feature) chunks in destination-major order."""
        return offsets([r for rows in self.send_rows for r in rows])

    def chunks(self, x: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """(table, chunk) of every (destination, feature) chunk of ``x`` (destination-major rows), own included."""
        starts, tables = self.chunk_starts, self.local_tables
        for k in range(len(starts) - 1):
            yield tables[k % len(tables)], x[starts[k] : starts[k + 1]]


class SequenceEncoded(NamedTuple):
    """This rank's compressed sequence send: one payload, a (bytes, rows) record per (destination, feature) chunk (0
    for its own), and the grids (one per feature)."""

    payload: torch.Tensor
    records: torch.Tensor
    grids: list[Grid]


def encode_sequence(x: torch.Tensor, layout: SequenceLayout, eps: torch.Tensor, impl: str) -> SequenceEncoded:
    """Encode the (destination, feature) chunks of ``x`` (destination-major rows) for every rank the layout's plan
    compresses for, each feature with its bound (one grid per feature), and lay them out destination-major; a rank
    the plan does not compress for gets its rows as they are (float32)."""
    n, starts, dev, me = len(layout.local_tables), layout.chunk_starts, x.device, layout.rank
    packed = [j for j in layout.other_ranks if layout.compress_to[j]]
    grids, pieces_of = [], []  # pieces_of[i][k]: feature i's chunk for packed[k]
    for i, table in enumerate(layout.local_tables):
        parts = [x[starts[j * n + i] : starts[j * n + i + 1]] for j in packed]
        if not parts:
            pieces_of.append([])
            continue
        rows = offsets([layout.send_rows[j][i] for j in packed])
        grid = exchange.encode_chunks(torch.cat(parts), rows, [0, x.size(1)], eps[i : i + 1], impl, (table,))
        grids.append(grid)
        pieces_of.append(grid.payload.split(grid.sizes.tolist()))
    pieces, records = [], []
    for j in range(layout.world):
        rows = layout.send_rows[j]
        if j == me:
            records += [(0, r) for r in rows]
        elif layout.compress_to[j]:
            k = packed.index(j)
            chunk = [pieces_of[i][k].to(dev) for i in range(n)]
            pieces += chunk
            records += [(c.numel(), r) for c, r in zip(chunk, rows)]
        else:
            pieces.append(exchange.as_bytes(x[starts[j * n] : starts[(j + 1) * n]]))
            records += [(r * x.size(1) * 4, r) for r in rows]
    table = torch.tensor(records, dtype=torch.int64).view(-1, 2)  # [destination, feature, (bytes, rows)]
    return SequenceEncoded(exchange.assemble(pieces, dev), table.to(dev), grids)


@dataclass(eq=False)
class _SeqCall:
    """One exchange, for its backward: the row layout of both sides, the record switch and the timer."""

    gather: torch.Tensor  # rows of local_embs in send order (destination, then feature)
    layout: SequenceLayout
    on_record: bool
    timer: PhaseTimer
    recv_rows: list[list[int]] = field(default_factory=list)  # [source][its feature] rows received


class CompressedSequenceEmbeddingsAllToAll(RecordedExchange):
    """Error-bounded compressed replacement of TorchRec's ``SequenceEmbeddingsAllToAll`` (same call, same output,
    an awaitable): the (destination rank, table) chunks of sequence embeddings DLAC-encoded with the table's bound.

    The exchange runs when :meth:`forward` is called (the awaitable is ready); the gradient exchange runs in the
    backward. Calls TorchRec's module cannot be compressed for (variable batch sizes) go to ``uncompressed``.

    Args:
        pg: Process group of the exchange.
        tables_per_rank: Table name of each feature, per rank, in the order of that rank's ``local_embs`` features
            (the key of its error bound). A rank may have none.
        config: Compression settings (``auto_fallback`` and ``overlap`` apply to pooled exchanges only).
        bounds: Per-table bounds, read at every call (``effective_many(tables)``).
        uncompressed: TorchRec's module, for the calls that stay uncompressed (and every call where the peer plan
            compresses nothing).
        peers: Which payloads are compressed; ``None``: ``config.compress_peers`` on the launcher's nodes.

    Attributes:
        recorder: Statistics, timing, record switch and observer (:class:`~lightning_dlac.comm.recorder.Recorder`);
            its observer sees every (destination rank, feature) chunk of a forward exchange on the record.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        tables_per_rank: Sequence[Sequence[str]],
        config: CompressionConfig,
        bounds: BoundSource,
        uncompressed: SequenceEmbeddingsAllToAll,
        peers: PeerPlan | None = None,
    ) -> None:
        super().__init__(pg, tables_per_rank, config, bounds, peers)
        self._rank = dist.get_rank(pg)
        self._uncompressed = uncompressed

    def forward(
        self,
        local_embs: torch.Tensor,
        lengths: torch.Tensor,
        input_splits: list[int],
        output_splits: list[int],
        unbucketize_permute_tensor: torch.Tensor | None = None,
        batch_size_per_rank: list[int] | None = None,
        sparse_features_recat: torch.Tensor | None = None,
    ) -> Awaitable[torch.Tensor]:
        """As ``SequenceEmbeddingsAllToAll.forward``: ``local_embs`` [ids looked up here, D], ``lengths`` the ids per
        (local feature, sample of the global batch), ``input_splits`` / ``output_splits`` the ids this rank sent /
        received in the input dist. Returns an awaitable of this rank's embeddings [ids of its batch, D]."""
        world = self._pg.size()
        variable = batch_size_per_rank is not None and len(set(batch_size_per_rank)) > 1
        if world == 1 or variable or unbucketize_permute_tensor is not None or not self.peers.any:
            return self._uncompressed(local_embs, lengths, input_splits, output_splits, unbucketize_permute_tensor,
                                      batch_size_per_rank, sparse_features_recat)
        n_local = len(self._tables_per_rank[self._rank])
        if local_embs.dim() != 2 or lengths.numel() % max(n_local * world, 1):
            raise ValueError(f"rank {self._rank}: local_embs [ids, D] and lengths for {n_local} features x {world}"
                             f" ranks expected, got {list(local_embs.shape)} and {lengths.numel()} lengths.")
        # Rows of each (feature, source rank) block of local_embs, then the block order TorchRec sends in.
        if sparse_features_recat is not None:
            recat = torch.ops.fbgemm.invert_permute(sparse_features_recat)
        else:
            recat = self._uncompressed._forward_recat_tensor
        block_rows = lengths.reshape(n_local * world, -1).sum(dim=1).tolist() if n_local else []
        starts = offsets(block_rows)
        order = recat.tolist()
        send_rows = tuple(tuple(block_rows[order[j * n_local + i]] for i in range(n_local)) for j in range(world))
        pieces = [torch.arange(starts[r], starts[r + 1]) for r in order]
        gather = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
        on_record = self.recorder.on_record
        layout = SequenceLayout(self._rank, self._tables_per_rank, send_rows, peers=self.peers)
        call = _SeqCall(gather.to(local_embs.device), layout,
                        on_record, self.recorder.call_timer(local_embs.device, on_record))
        out = _SequenceExchange.apply(local_embs, self, call)
        return SequenceEmbeddingsAwaitable(tensor_awaitable=Ready(out), unbucketize_permute_tensor=None,
                                           embedding_dim=local_embs.size(1))

    # ------------------------------------------------------------------ forward

    def _exchange_forward(self, local_embs: torch.Tensor, call: _SeqCall) -> torch.Tensor:
        """This rank's embeddings [ids of its batch, D] (source rank, its features, ids)."""
        layout, rec, timer, pg = call.layout, self.recorder, call.timer, self._pg
        x = local_embs.detach().float()[call.gather]  # destination-major, then local feature
        me, dim, n, counts = layout.rank, x.size(1), len(layout.local_tables), layout.chunk_counts
        if call.on_record:
            rec.observe(layout.chunks(x))
        eps = rec.bounds.effective_many(layout.local_tables)
        with timer.phase("encode_s", "dlac sequence encode"):
            encoded = encode_sequence(x, layout, eps, self._config.impl)
        with timer.phase("exchange_s", "dlac sequence exchange"):
            records = exchange.exchange_sizes(encoded.records, [n] * layout.world, counts, pg).cpu()
            send_bytes = rank_sums(encoded.records[:, 0], [n] * layout.world)
            flight = exchange.start_payload(encoded.payload, send_bytes, rank_sums(records[:, 0], counts), pg)
            per_source = records.split(counts)
            call.recv_rows = [list(layout.send_rows[me]) if s == me else m[:, 1].tolist()
                              for s, m in enumerate(per_source)]
            # The exact rows this rank kept go into the result while the bytes travel (exchange time: it overlaps
            # the transfer).
            out = torch.empty(sum(map(sum, call.recv_rows)), dim, device=x.device)
            row_at = offsets([sum(r) for r in call.recv_rows])
            starts = layout.chunk_starts
            exchange.place_own(out[row_at[me] : row_at[me + 1]], x[starts[me * n] : starts[(me + 1) * n]])
        if call.on_record:  # while the payload is on its way
            raw = [sum(layout.send_rows[j][i] for j in layout.other_ranks) * dim * 4 for i in range(n)]
            passed = [sum(layout.send_rows[j][i] for j in layout.other_ranks if not layout.compress_to[j]) * dim * 4
                      for i in range(n)]
            # Every feature has a grid when some destination is compressed, none otherwise.
            table_sent = [p + int(g.payload.numel()) for p, g in zip(passed, encoded.grids)] if encoded.grids \
                else passed
            # The payload plus the size exchange: two int64 per (other rank, local feature).
            sent = int(encoded.payload.numel()) + (layout.world - 1) * n * 16
            rec.count_forward(layout.local_tables, raw, table_sent, sent, table_passed=passed)
            self.count_links(send_bytes, layout.compress_to)
            rec.check(encoded.grids, dict(zip(layout.local_tables, eps.tolist())))
        with timer.phase("exchange_s", "dlac sequence exchange"):
            received = flight.wait()
        with timer.phase("decode_s", "dlac sequence decode"):
            try:
                return exchange.place_rows(out, received, records[:, 0], call.recv_rows, [0, dim],
                                           layout.compress_from, me, None, self._config.impl)
            except CodecError as err:
                raise CompressedExchangeError(
                    f"rank {me}: sequence embeddings received from ranks {layout.other_ranks} failed to decode"
                    f" ({err}). The payload was corrupted in transit or the ranks run different lightning-dlac"
                    " versions."
                ) from err

    # ------------------------------------------------------------------ backward

    def _exchange_backward(self, grad: torch.Tensor, call: _SeqCall, num_local_rows: int) -> torch.Tensor:
        """The gradient of ``local_embs`` from the gradient of the received rows ([ids of this rank's batch, D]).

        Each source's rows go back to it as its embeddings came: compressed (``backward`` mode) where they came
        compressed, float32 otherwise; this rank's own rows stay here."""
        layout = call.layout
        me = layout.rank
        grad = grad.contiguous().float()
        mode = BackwardCompression(self._config.backward)
        with call.timer.phase("backward_s", f"dlac sequence backward ({mode})"):
            if mode is BackwardCompression.DLAC:
                in_send_order, sent = self._backward_dlac(grad, call)
            else:
                in_send_order, sent = self._backward_cast(grad, call, mode.wire_dtype)
            out = grad.new_zeros(num_local_rows, grad.size(1))
            out.index_copy_(0, call.gather, in_send_order)
            if comm_ops.get_gradient_division():
                out /= layout.world
        if call.on_record:
            own = sum(call.recv_rows[me])
            # The payload, and with DLAC the size exchange: one int64 per (other rank, its feature).
            records = 8 * sum(layout.chunk_counts) - 8 * layout.chunk_counts[me] if mode is BackwardCompression.DLAC \
                else 0
            self.recorder.count_backward((grad.size(0) - own) * grad.size(1) * 4, sum(sent) + records)
            self.count_links(sent, layout.compress_from)
        return out

    def _own_rows(self, grad: torch.Tensor, call: _SeqCall) -> torch.Tensor:
        """This rank's own rows of ``grad`` (the gradient of the rows it kept)."""
        src = offsets([sum(r) for r in call.recv_rows])
        return grad[src[call.layout.rank] : src[call.layout.rank + 1]]

    def _backward_cast(self, grad: torch.Tensor, call: _SeqCall,
                       wire_dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        """Send each source its rows of ``grad`` back as ``wire_dtype`` (float32 where its embeddings came as they
        were); return the rows every rank sent this one in send order (this rank's own among them) and the bytes
        sent to each rank."""
        layout, dim = call.layout, grad.size(1)
        me = layout.rank
        src = offsets([sum(r) for r in call.recv_rows])
        to_dtype = [wire_dtype if c else torch.float32 for c in layout.compress_from]
        from_dtype = [wire_dtype if c else torch.float32 for c in layout.compress_to]
        pieces, send = [], []
        for s in range(layout.world):
            block = grad[src[s] : src[s + 1]]
            if s == me:
                send.append(0)
                continue
            pieces.append(exchange.to_wire(block, to_dtype[s]))
            send.append(pieces[-1].numel())
        back_rows = [sum(r) for r in layout.send_rows]
        recv = [0 if j == me else back_rows[j] * dim * from_dtype[j].itemsize for j in range(layout.world)]
        received = exchange.start_payload(exchange.assemble(pieces, grad.device), send, recv, self._pg).wait()
        at = offsets(back_rows)
        out = torch.empty(at[-1], dim, device=grad.device)
        byte = 0
        for j in range(layout.world):
            block = out[at[j] : at[j + 1]]
            if j == me:
                block.copy_(self._own_rows(grad, call))
                continue
            exchange.from_wire(block, received[byte : byte + recv[j]], from_dtype[j])
            byte += recv[j]
        return out, send

    def _backward_dlac(self, grad: torch.Tensor, call: _SeqCall) -> tuple[torch.Tensor, list[int]]:
        """As :meth:`_backward_cast`, each (source, feature) chunk DLAC-encoded with ``backward_eps`` (one grid per
        run of consecutive compressed sources)."""
        layout, dim, impl = call.layout, grad.size(1), self._config.impl
        me, counts = layout.rank, layout.chunk_counts
        n_local = counts[me]
        src = offsets([sum(r) for r in call.recv_rows])
        pieces, sizes = [], []
        for packed, lo, hi in runs(layout.compress_from):
            if packed:
                rows = offsets([r for s in range(lo, hi) for r in call.recv_rows[s]])
                grid = exchange.encode_chunks(grad[src[lo] : src[hi]], rows, [0, dim], self._config.backward_eps,
                                              impl)
                pieces.append(grid.payload.to(grad.device))
                sizes += grid.sizes.tolist()
                continue
            for s in range(lo, hi):
                if s != me:
                    pieces.append(exchange.as_bytes(grad[src[s] : src[s + 1]]))
                sizes += [0 if s == me else r * dim * 4 for r in call.recv_rows[s]]
        sizes_t = torch.tensor(sizes, dtype=torch.int64, device=grad.device)
        # Only compressed chunks' sizes travel: this rank knows those of the rows it sent a source as they are (they
        # come back as they went) and of its own rows (0).
        sends, known = exchange.size_records_plan(layout.compress_from, layout.compress_to, me,
                                                  lambda s: [r * dim for r in layout.send_rows[s]])
        recv_sizes = exchange.exchange_unknown_sizes(sizes_t, counts, [n_local] * layout.world, sends, known,
                                                     self._pg)
        send = rank_sums(sizes_t, counts)
        flight = exchange.start_payload(exchange.assemble(pieces, grad.device), send,
                                        rank_sums(recv_sizes, [n_local] * layout.world), self._pg)
        out = torch.empty(sum(map(sum, layout.send_rows)), dim, device=grad.device)
        row_at = offsets([sum(r) for r in layout.send_rows])  # the own rows, while the bytes travel
        exchange.place_own(out[row_at[me] : row_at[me + 1]], self._own_rows(grad, call))
        try:
            back = exchange.place_rows(out, flight.wait(), recv_sizes, layout.send_rows, [0, dim], layout.compress_to,
                                       me, None, impl)
        except CodecError as err:
            raise CompressedExchangeError(
                f"rank {me}: sequence-embedding gradients for tables {list(layout.local_tables)} failed to decode"
                f" ({err})."
            ) from err
        return back, send


class _SequenceExchange(torch.autograd.Function):
    """Forward: the compressed sequence-embedding exchange. Backward: the gradient exchange back to the owners."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: CompressedSequenceEmbeddingsAllToAll, call: _SeqCall):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.call, ctx.rows, ctx.dtype = a2a, call, local_embs.size(0), local_embs.dtype
        a2a._calls += 1
        ctx.number = a2a._calls
        with a2a._enter("forward", ctx.number):
            return a2a._exchange_forward(local_embs, call).to(local_embs.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        with ctx.a2a._enter("backward", ctx.number):
            grad = ctx.a2a._exchange_backward(grad_output, ctx.call, ctx.rows)
        return grad.to(ctx.dtype), None, None
