"""Compressed drop-in for TorchRec's ``PooledEmbeddingsAllToAll``.

The layering follows TorchRec's: pure exchange functions (the wire functions of ``exchange.py``, like ``comm_ops``,
and the pooled layout's start / finish functions on them, ``pooled.py``), an autograd Function joining the two
directions, and a thin module. The module wraps the pure exchange with what a training run needs around it: what it
shares with the sequence exchange (:class:`~lightning_dlac.comm.base.RecordedExchange` and its
:class:`~lightning_dlac.comm.recorder.Recorder`: statistics, phase timing, the record switch, the observer,
non-finite counts, error sampling) and, its own, the uncompressed fallback of ``auto_fallback=True``
(:class:`~lightning_dlac.comm.fallback.UncompressedFallback`).

The exchange is split as TorchRec's ``All2All_Pooled_Req`` / ``All2All_Pooled_Wait`` pair: :meth:`forward` encodes,
exchanges the sizes and launches the payload all-to-all (``async_op=True``), and returns a pending awaitable whose
``wait()`` waits for the bytes and decodes. The backward likewise: the gradient of the waited output launches the
gradient exchange, and the gradient of the launch waits for it and decodes, so autograd and DDP's gradient
all-reduce can run in between. With ``CompressionConfig(overlap=False)`` (the default on gloo) each exchange is
waited on as soon as it is launched (the synchronous path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import PooledEmbeddingsAwaitable
from torchrec.distributed.types import Awaitable

from lightning_dlac.adaptive.bounds import BoundSource
from lightning_dlac.comm import pooled
from lightning_dlac.comm.base import Ready, RecordedExchange
from lightning_dlac.comm.buffers import ResultBuffers
from lightning_dlac.comm.collectives import all_reduce
from lightning_dlac.comm.config import BackwardCompression, CompressionConfig
from lightning_dlac.comm.exchange import Impl, InFlight, offsets
from lightning_dlac.comm.fallback import FallbackCall, UncompressedFallback
from lightning_dlac.comm.peers import PeerPlan
from lightning_dlac.comm.pieces import Piece, in_turn, merge_piece_sizes, piece_count, split_layout
from lightning_dlac.comm.pooled import BackwardInFlight, Layout
from lightning_dlac.comm.timing import PhaseTimer


@dataclass(eq=False)
class _Call:
    """One exchange between its launch and its wait, in both directions: what the wait and the backward need."""

    batch_size_per_rank: list[int]
    number: int  # this exchange's forward call count, 1 for its first (a silent peer's error names it)
    on_record: bool  # counts in the statistics (decided at launch: an off-the-record block may end before the wait)
    timer: PhaseTimer
    dtype: torch.dtype  # of local_embs: the output and the gradient come back in it
    finish: Callable[[], torch.Tensor] | None = None  # waits for the forward payload and decodes it
    fallback: FallbackCall | None = None
    backward: BackwardInFlight | None = None
    grad: torch.Tensor | None = None  # the backward's result once waited on
    ranges: torch.Tensor | None = None  # value range of each output column block's chunk, for the gradient observer


class _PendingExchange(Awaitable[torch.Tensor]):
    """The awaitable of a launched forward exchange: ``wait()`` waits for the payload and decodes (once)."""

    def __init__(self, a2a: CompressedPooledEmbeddingsAllToAll, call: _Call, launched: torch.Tensor) -> None:
        super().__init__()
        self._a2a, self._call, self._launched = a2a, call, launched
        self._out: torch.Tensor | None = None

    def _wait_impl(self) -> torch.Tensor:
        if self._out is None:
            self._out = _ExchangeWait.apply(self._launched, self._a2a, self._call)
            self._launched = None  # type: ignore[assignment] - the autograd graph holds it now
        return self._out


class CompressedPooledEmbeddingsAllToAll(RecordedExchange):
    """Error-bounded compressed replacement of TorchRec's ``PooledEmbeddingsAllToAll``.

    Same inputs, same output layout, an awaitable with the same callbacks. :meth:`forward` launches the payload exchange
    and returns; the awaitable's ``wait()`` waits for it, decodes and applies the callbacks (synchronous, as with
    ``config.overlap=False`` and by default on gloo, the exchange has finished when :meth:`forward` returns). Phase
    times cover the work on this rank's side of both halves. With the uncompressed fallback, a call the fallback times
    counts every phase from its launch to the next launch (its forward and its gradient exchange), read at that next
    launch.

    Args:
        pg: Process group of the exchange.
        dims_per_rank: Embedding dimension of each column block (one per feature / column shard), per rank, in
            the column order of that rank's ``local_embs``.
        tables_per_rank: Table name of each column block, per rank (the key of its error bound).
        config: Compression settings.
        bounds: Per-table bounds, read at every call.
        callbacks: Applied to the output on ``wait()``, as TorchRec's (e.g. the column-wise permute).
        peers: Which payloads are compressed (:class:`~lightning_dlac.comm.peers.PeerPlan`); ``None``: the plan of
            ``config.compress_peers`` on the launcher's nodes (a collective: every rank builds its exchanges
            together). A plan that compresses nothing runs TorchRec's uncompressed exchange.

    Attributes:
        recorder: Statistics, timing, record switch and observer (:class:`~lightning_dlac.comm.recorder.Recorder`);
            its observer sees every (destination rank, local table) chunk of a forward exchange on the record.
        forward_impl: The codec of the forward exchange: ``config.impl``, or a stand-in
            :class:`~lightning_dlac.comm.exchange.ChunkCodec` (the benchmarks' null codec,
            :func:`~lightning_dlac.comm.null_codec.install_null_codec`, puts one here).
        backward_impl: The same for a DLAC-compressed gradient exchange.

    Raises:
        ValueError: If ``dims_per_rank`` or ``tables_per_rank`` does not have one entry per rank of ``pg``, or
            ``peers`` is a plan for another number of ranks.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        dims_per_rank: Sequence[Sequence[int]],
        tables_per_rank: Sequence[Sequence[str]],
        config: CompressionConfig,
        bounds: BoundSource,
        callbacks: Sequence[Callable[[torch.Tensor], torch.Tensor]] | None = None,
        peers: PeerPlan | None = None,
    ) -> None:
        if len(dims_per_rank) != pg.size():
            raise ValueError(f"dims_per_rank needs one entry per rank ({pg.size()}), got {len(dims_per_rank)}.")
        super().__init__(pg, tables_per_rank, config, bounds, peers)
        self.layout = Layout(dist.get_rank(pg), self._tables_per_rank, tuple(map(tuple, dims_per_rank)),
                             peers=self.peers)
        self._callbacks = list(callbacks or [])
        self._overlap = config.overlap if config.overlap is not None else dist.get_backend(pg) == "nccl"
        self._fallback = UncompressedFallback(config.fallback_check_every, self._slowest) if config.auto_fallback \
            else None
        self._timed: FallbackCall | None = None  # the fallback's timed call whose time is being summed
        self.forward_impl: Impl = config.impl
        self.backward_impl: Impl = config.impl
        # The memory of the previous output and gradient, reused once nothing holds them (the CPU's page faults).
        self._forward_buffers = ResultBuffers()
        self._backward_buffers = ResultBuffers()
        self._cast_scratch = ResultBuffers()  # the gradient cast whole before its owners' blocks are gathered
        self._cast_sends = ResultBuffers()  # and the blocks gathered, until the exchange has sent them
        self._splits: dict[int, tuple[Piece, ...]] = {}  # the layout cut into pieces, by count

    @property
    def overlapped(self) -> bool:
        """Whether forward launches the payload exchange and ``wait()`` finishes it (else it finishes at once)."""
        return self._overlap

    @property
    def callbacks(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """Output callbacks, as on TorchRec's module."""
        return self._callbacks

    def forward(
        self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> PooledEmbeddingsAwaitable:
        """Exchange ``local_embs`` and return an awaitable of this rank's pooled embeddings.

        Args:
            local_embs: This rank's tables' pooled embeddings for every rank, ``[sum of batch sizes, local dim sum]``.
            batch_size_per_rank: Each rank's batch size; ``None`` (or empty): the global batch split evenly.

        Returns:
            An awaitable of ``[local batch size, total dim sum]``, with the module's callbacks.

        Raises:
            ValueError: If ``local_embs`` is not ``[batch, local dim sum]``, or the ranks do not divide its batch.
        """
        me, world = self.layout.rank, self.layout.world
        if local_embs.dim() != 2 or local_embs.size(1) != self.layout.dim_sums[me]:
            raise ValueError(
                f"local_embs must be [batch, {self.layout.dim_sums[me]}] on rank {me}, got {list(local_embs.shape)}."
            )
        if not batch_size_per_rank:
            total = local_embs.size(0)
            if total % world:
                raise ValueError(f"{world} ranks do not divide the global batch size {total}.")
            batch_size_per_rank = [total // world] * world
        on_record = self.recorder.on_record
        self._calls += 1
        call = _Call(list(batch_size_per_rank), self._calls, on_record,
                     self.recorder.call_timer(local_embs.device, on_record), local_embs.dtype)
        launched = _ExchangeLaunch.apply(local_embs, self, call)
        if self._overlap:
            pending: Awaitable[torch.Tensor] = _PendingExchange(self, call, launched)
        else:
            pending = Ready(_ExchangeWait.apply(launched, self, call))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=pending)
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    # ------------------------------------------------------------------ forward

    def _launch_forward(self, x: torch.Tensor, call: _Call) -> None:
        """Encode, exchange sizes and launch the payload exchange; leave in ``call.finish`` what waits for it."""
        x = x.detach().float()
        batch_size_per_rank, timer, layout, rec = call.batch_size_per_rank, call.timer, self.layout, self.recorder
        row_splits = offsets(batch_size_per_rank)
        tables = layout.local_tables
        eps = rec.bounds.effective_many(tables)
        if call.on_record:
            rec.observe(layout.chunks(x, row_splits))
            if self._fallback is not None:
                self._start_fallback_call(call)
        rows = x.size(0) - batch_size_per_rank[layout.rank]  # the rows kept here are not traffic
        table_raw = [rows * d * 4 for d in layout.dims_per_rank[layout.rank]]
        if self._uncompressed(call):
            label = "dlac exchange (uncompressed)"
            with timer.phase("exchange_s", label):
                flight = pooled.start_forward_uncompressed(x, batch_size_per_rank, layout, self._pg)
            fallback = call.fallback is not None and call.fallback.uncompressed
            if call.on_record:
                rec.count_forward(tables, table_raw, table_raw, sum(table_raw), uncompressed=fallback,
                                  table_passed=None if fallback else table_raw)
                self.count_links([b * layout.dim_sums[layout.rank] * 4 for b in batch_size_per_rank],
                                 layout.compress_to)

            def finish() -> torch.Tensor:
                with timer.phase("exchange_s", label):
                    return pooled.finish_forward_uncompressed(flight, batch_size_per_rank, layout)
        else:
            own = x[row_splits[layout.rank] : row_splits[layout.rank + 1]]
            pieces = self._pieces()
            out: torch.Tensor | None = None

            def launch(piece: Piece) -> tuple[pooled.Encoded, InFlight, torch.Tensor]:
                nonlocal out
                with timer.phase("encode_s", "dlac encode"):
                    encoded = pooled.encode_for_others(x[:, piece.local_cols], row_splits, piece.layout,
                                                         eps[piece.local_tables], self.forward_impl)
                with timer.phase("exchange_s", "dlac exchange"):
                    flight, recv_sizes = pooled.start_forward(encoded, piece.layout, own.size(0), self._pg)
                    if out is None:
                        # The exact block this rank kept goes into the output while the bytes travel (exchange
                        # time: it overlaps the transfer).
                        out = pooled.start_output(own, layout, self._forward_buffers)
                return encoded, flight, recv_sizes

            def decode(piece: Piece, flight: InFlight, recv_sizes: torch.Tensor) -> torch.Tensor:
                with timer.phase("exchange_s", "dlac exchange"):
                    received = flight.wait()
                with timer.phase("decode_s", "dlac decode"):
                    return pooled.decode_from_others(received, recv_sizes, own, piece.layout, self.forward_impl,
                                                       out=out, cols=piece.out_cols)

            # One piece unless the exchange is sent in pieces (then synchronous): every piece but the last is
            # decoded while the next one travels.
            sent = in_turn(pieces, launch, lambda piece, launched: decode(piece, *launched[1:]))
            if call.on_record:  # while the payload is on its way
                n_local, world = len(tables), layout.world
                encoded = [e for e, _, _ in sent]
                sizes = merge_piece_sizes([e.sizes for e in encoded],
                                          [[len(p.layout.local_tables)] * world for p in pieces])
                per_chunk = sizes.view(world, n_local)
                table_sent = per_chunk.sum(0).tolist() if n_local else []
                passed = [d for d in layout.other_ranks if not layout.compress_to[d]]
                table_passed = per_chunk[passed].sum(0).tolist() if passed and n_local else None
                # The payload plus the size exchange: one int64 per (compressed destination, local table).
                records = sum(layout.compress_to[d] for d in layout.other_ranks) * n_local
                sent_bytes = sum(int(e.payload.numel()) for e in encoded) + records * 8
                rec.count_forward(tables, table_raw, table_sent, sent_bytes, table_passed=table_passed)
                self.count_links([sum(b) for b in zip(*(e.send_bytes for e in encoded))], layout.compress_to)
                rec.check([g for e in encoded for g in e.grids], dict(zip(tables, eps.tolist())))
                del encoded
            _, last_flight, last_sizes = sent[-1]
            del sent

            def finish() -> torch.Tensor:
                return decode(pieces[-1], last_flight, last_sizes)

        call.finish = finish

    def _start_fallback_call(self, call: _Call) -> None:
        """Give the fallback the previous call's time if it asked for it, then take its decision for ``call``.

        A call's time is every phase of this exchange from its launch to the next launch: the forward exchange and
        the gradient exchange of its backward (an uncompressed call sends both uncompressed), so it is read here,
        at the next launch, when both are done."""
        if self._timed is not None:
            self._fallback.record(self._timed.uncompressed, self.recorder.interval_s())
        call.fallback = self._fallback.next_call()
        self._timed = call.fallback if call.fallback.timed else None
        self.recorder.start_interval()

    def _wait_forward(self, call: _Call) -> torch.Tensor:
        """Wait for the payload ``call`` launched and decode it."""
        assert call.finish is not None, "a forward exchange is waited on before it was launched"
        out = call.finish()
        call.finish = None  # the wait holds the received buffers: drop them with it
        if call.on_record and self.recorder.gradient_observer is not None:
            call.ranges = self._block_ranges(out.detach())
        return out

    # ------------------------------------------------------------------ backward

    def _launch_backward(self, grad: torch.Tensor, call: _Call) -> None:
        """Launch the exchange sending ``grad`` ([local batch, total dim]) back to the ranks that own each column."""
        grad = grad.contiguous().float()
        mode = self._backward_mode(call)
        with call.timer.phase("backward_s", f"dlac backward ({mode})"):
            pieces = self._pieces() if mode is BackwardCompression.DLAC else ()
            if len(pieces) > 1:
                call.backward, call.grad = self._backward_in_pieces(grad, call.batch_size_per_rank, pieces)
            elif mode is BackwardCompression.DLAC:
                call.backward = pooled.start_backward_dlac(grad, call.batch_size_per_rank, self.layout,
                                                             self._config.backward_eps, self.backward_impl, self._pg,
                                                             self._backward_buffers)
            else:
                call.backward = pooled.start_backward_cast(grad, call.batch_size_per_rank, self.layout,
                                                             mode.wire_dtype, self._pg, self._cast_scratch,
                                                             self._cast_sends, self._backward_buffers)
        if call.on_record:
            raw = grad.size(0) * (grad.size(1) - self.layout.dim_sums[self.layout.rank]) * 4
            table_sent, table_passed = self._backward_table_sent(call.backward, grad.size(0), mode)
            self.recorder.count_backward(raw, call.backward.sent, table_sent, table_passed)
            self._count_backward_links(call.backward, grad.size(0), mode)
            if call.ranges is not None:
                self.recorder.observe_gradients(self._output_tables, call.ranges, grad, self._output_cols)
                call.ranges = None
        if call.grad is not None:  # sent in pieces: done already, and its figures are counted
            call.backward = None
        if not self._overlap:
            call.grad = self._wait_backward(call)

    def _backward_in_pieces(self, grad: torch.Tensor, batch_size_per_rank: list[int],
                            pieces: Sequence[Piece]) -> tuple[BackwardInFlight, torch.Tensor]:
        """The DLAC gradient exchange sent in ``pieces`` (synchronous): piece ``k + 1`` is encoded and launched
        before piece ``k`` is waited on and decoded, into its columns of the result. Returns the whole exchange's
        figures (what the statistics read: every chunk's size in the whole exchange's order, the bytes to each
        owner and in all) and the gradient, divided as :meth:`_wait_backward` divides it."""
        layout, me = self.layout, self.layout.rank
        owners = offsets(layout.dim_sums)
        own = grad[:, owners[me] : owners[me + 1]]
        out = pooled.start_gradient(own, batch_size_per_rank, me, self._backward_buffers)

        def finish(piece: Piece, pending: BackwardInFlight) -> None:
            pooled.finish_backward(pending, batch_size_per_rank, piece.layout, self.backward_impl)

        launched = in_turn(pieces, lambda piece: pooled.start_backward_dlac(
            grad, batch_size_per_rank, piece.layout, self._config.backward_eps, self.backward_impl, self._pg,
            cols=piece.out_cols, out=out[:, piece.local_cols]), finish)
        finish(pieces[-1], launched[-1])
        whole = BackwardInFlight(launched[-1].flight, sum(p.sent for p in launched), None, own,
                                 merge_piece_sizes([p.sizes for p in launched],
                                                   [p.layout.chunk_counts for p in pieces]),
                                 send_bytes=[sum(b) for b in zip(*(p.send_bytes for p in launched))], out=out)
        return whole, self._divided(out)

    def _pieces(self) -> tuple[Piece, ...]:
        """The pieces this call's exchange is sent in: one where the exchange is overlapped (its launch returns
        before the bytes have arrived; sending in pieces would wait for all but the last), else the configured
        count (:func:`~lightning_dlac.comm.pieces.piece_count`)."""
        count = 1 if self._overlap else piece_count(self.layout, self._config.pieces)
        if count not in self._splits:
            self._splits[count] = split_layout(self.layout, count)
        return self._splits[count]

    def _uncompressed(self, call: _Call) -> bool:
        """Whether ``call`` is TorchRec's uncompressed exchange in both directions: the fallback chose it, or the
        peer plan compresses no payload at all."""
        return (call.fallback is not None and call.fallback.uncompressed) or not self.peers.any

    def _backward_mode(self, call: _Call) -> BackwardCompression:
        """The gradient exchange's encoding: float32 for a call sent uncompressed (TorchRec's exchange in both
        directions), the configured one otherwise (float32 to the peers the plan does not compress)."""
        if self._uncompressed(call):
            return BackwardCompression.FP32
        return BackwardCompression(self._config.backward)

    def _wait_backward(self, call: _Call) -> torch.Tensor:
        """This rank's gradient of ``local_embs`` ([sum of batch sizes, local dim sum]) once the exchange
        :meth:`_launch_backward` started has arrived."""
        if call.grad is not None:
            return call.grad
        assert call.backward is not None, "a gradient exchange is waited on before it was launched"
        mode = self._backward_mode(call)
        with call.timer.phase("backward_s", f"dlac backward ({mode})"):
            out = pooled.finish_backward(call.backward, call.batch_size_per_rank, self.layout, self.backward_impl,
                                           self._backward_buffers)
        call.backward = None
        return self._divided(out)

    def _divided(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` divided by the world size where TorchRec scales embedding gradients, as DDP averages dense ones;
        in place: ``out`` is the exchange's own new tensor (the float32 cast's receive buffer, or the decoded
        gradient)."""
        if comm_ops.get_gradient_division():
            out.div_(self.layout.world)
        return out

    # ------------------------------------------------------------------ helpers

    @cached_property
    def _output_tables(self) -> list[str]:
        """Table of each column block of the output (source rank, then its blocks: TorchRec's order)."""
        return [t for tables in self.layout.tables_per_rank for t in tables]

    @cached_property
    def _output_cols(self) -> list[int]:
        """Column offsets of the output's blocks."""
        return offsets([d for dims in self.layout.dims_per_rank for d in dims])

    def _block_ranges(self, out: torch.Tensor) -> torch.Tensor:
        """max - min of each output column block: the value range of the chunk that brought it to this rank (up to
        the codec's error), on the output's device."""
        cols = self._output_cols
        if out.numel() == 0 or len(cols) < 2:
            return out.new_zeros(len(cols) - 1)
        return torch.stack([out[:, a:b].max() - out[:, a:b].min() if b > a else out.new_zeros(())
                            for a, b in zip(cols[:-1], cols[1:])])

    def _backward_widths(self, mode: BackwardCompression) -> list[int]:
        """Bytes per element a cast gradient exchange sends each owner rank: the wire dtype's, float32's to the
        owners the plan does not compress for."""
        wire = (mode.wire_dtype or torch.float32).itemsize
        return [wire if c else 4 for c in self.layout.compress_from]

    def _backward_table_sent(self, pending: BackwardInFlight, rows: int,
                             mode: BackwardCompression) -> tuple[dict[str, int], dict[str, int]]:
        """Payload bytes a gradient exchange sent for each table of the other ranks (it sends them their tables'
        gradients): the chunk sizes of a DLAC exchange, rows x dim x the wire dtype's width of a cast; and of those,
        the bytes sent as they are to owners the plan does not compress for."""
        layout = self.layout
        chunks = [(r, t, d) for r in range(layout.world)
                  for t, d in zip(layout.tables_per_rank[r], layout.dims_per_rank[r])]
        if pending.sizes is None:
            widths = self._backward_widths(mode)
            sizes = [rows * d * widths[r] for r, _, d in chunks]
        else:  # one per (owner rank, table) in rank order, this rank's own as zeros
            sizes = pending.sizes.tolist()
        sent: dict[str, int] = {}
        passed: dict[str, int] = {}
        for (r, table, _), n in zip(chunks, sizes):
            if r != layout.rank:
                sent[table] = sent.get(table, 0) + int(n)
                if not layout.compress_from[r]:
                    passed[table] = passed.get(table, 0) + int(n)
        return sent, passed

    def _count_backward_links(self, pending: BackwardInFlight, rows: int, mode: BackwardCompression) -> None:
        """Count a gradient exchange's payload bytes by link class."""
        send_bytes = pending.send_bytes
        if send_bytes is None:  # a cast: each owner's columns at the wire width
            widths = self._backward_widths(mode)
            send_bytes = [rows * d * w for d, w in zip(self.layout.dim_sums, widths)]
        self.count_links(send_bytes, self.layout.compress_from)

    def _slowest(self, seconds: Sequence[float]) -> list[float]:
        """The maximum over ranks of this rank's ``seconds`` (the uncompressed fallback decides from it)."""
        return all_reduce(torch.tensor(list(seconds), dtype=torch.float64), "max", self._pg).tolist()


class _ExchangeLaunch(torch.autograd.Function):
    """Forward: launch the exchange, return a placeholder that :class:`_ExchangeWait` takes. Backward: wait for the
    gradient exchange that :class:`_ExchangeWait`'s backward launched (TorchRec's ``All2All_Pooled_Req``)."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: CompressedPooledEmbeddingsAllToAll, call: _Call):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.call = a2a, call
        with a2a._enter("forward", call.number):
            a2a._launch_forward(local_embs, call)
        return local_embs.new_zeros(1)  # ties the launch to the wait in the autograd graph

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):  # noqa: ANN001, ANN205
        with ctx.a2a._watch("backward", ctx.call.number):
            grad = ctx.a2a._wait_backward(ctx.call)
        ctx.call.grad = None
        return grad.to(ctx.call.dtype), None, None


class _ExchangeWait(torch.autograd.Function):
    """Forward: wait for the payload and decode. Backward: launch the gradient exchange (TorchRec's
    ``All2All_Pooled_Wait``)."""

    @staticmethod
    def forward(ctx, launched: torch.Tensor, a2a: CompressedPooledEmbeddingsAllToAll, call: _Call):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.call = a2a, call
        ctx.launched_shape = launched.shape
        with a2a._watch("forward", call.number):
            return a2a._wait_forward(call).to(call.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        with ctx.a2a._enter("backward", ctx.call.number):
            ctx.a2a._launch_backward(grad_output, ctx.call)
        return grad_output.new_zeros(ctx.launched_shape), None, None
