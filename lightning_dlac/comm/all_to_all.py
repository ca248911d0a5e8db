"""Compressed drop-in for TorchRec's ``PooledEmbeddingsAllToAll``.

The layering follows TorchRec's: pure exchange functions (``exchange.py``, like ``comm_ops``), an autograd Function
joining the two directions, and a thin module. The module wraps the pure exchange with what a training run needs
around it, each in one place: statistics (:class:`~lightning_dlac.comm.CommStats`, counters that only grow), phase
timing that is right on a GPU (:class:`~lightning_dlac.comm.timing.PhaseTimer`), the uncompressed fallback of
``compress="auto"`` (:class:`~lightning_dlac.comm.fallback.UncompressedFallback`), error sampling, non-finite notes
and the chunk observer that calibration measures through.

The exchange is split as TorchRec's ``All2All_Pooled_Req`` / ``All2All_Pooled_Wait`` pair: :meth:`forward` encodes,
exchanges the sizes and launches the payload all-to-all (``async_op=True``), and returns a pending awaitable whose
``wait()`` waits for the bytes and decodes. The backward likewise: the gradient of the waited output launches the
gradient exchange, and the gradient of the launch waits for it and decodes, so autograd and DDP's gradient
all-reduce can run in between. With ``CompressionConfig(overlap=False)`` (the default on gloo) each exchange is
waited on as soon as it is launched (the synchronous path).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import PooledEmbeddingsAwaitable
from torchrec.distributed.types import Awaitable

from lightning_dlac.codec import decode_grid
from lightning_dlac.codec.format import HEADER_SIZE
from lightning_dlac.comm import exchange
from lightning_dlac.comm.config import BackwardCompression, CompressionConfig
from lightning_dlac.comm.exchange import BackwardInFlight, Encoded, Layout, offsets
from lightning_dlac.comm.fallback import FallbackCall, UncompressedFallback
from lightning_dlac.comm.stats import CommStats
from lightning_dlac.comm.timing import PhaseTimer

_WIRE = {BackwardCompression.FP32: torch.float32, BackwardCompression.BF16: torch.bfloat16,
         BackwardCompression.FP16: torch.float16}


class BoundSource(Protocol):
    """Where an exchange reads its per-table relative bounds (:class:`~lightning_dlac.comm.ErrorBounds`, or a
    calibration probe's bounds); a bound of 0 sends that table exactly."""

    def effective_many(self, tables: Sequence[str]) -> torch.Tensor: ...


class _Ready(Awaitable[torch.Tensor]):
    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor


@dataclass(eq=False)
class _Call:
    """One exchange between its launch and its wait, in both directions: what the wait and the backward need."""

    batch_size_per_rank: list[int]
    on_record: bool  # counts in the statistics (decided at launch: an off-the-record block may end before the wait)
    timer: PhaseTimer
    dtype: torch.dtype  # of local_embs: the output and the gradient come back in it
    finish: Callable[[], torch.Tensor] | None = None  # waits for the forward payload and decodes it
    fallback: FallbackCall | None = None
    backward: BackwardInFlight | None = None
    grad: torch.Tensor | None = None  # the backward's result once waited on


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


class CompressedPooledEmbeddingsAllToAll(nn.Module):
    """Error-bounded compressed replacement of TorchRec's ``PooledEmbeddingsAllToAll``: same inputs, same output
    layout, an awaitable with the same callbacks. :meth:`forward` launches the payload exchange and returns; the
    awaitable's ``wait()`` waits for it, decodes and applies the callbacks (synchronous, as with
    ``config.overlap=False`` and by default on gloo, the exchange has finished when :meth:`forward` returns). Phase
    times cover the work on this rank's side of both halves. With the uncompressed fallback, a call the fallback
    times counts every phase from its launch to the next launch (its forward and its gradient exchange), read at
    that next launch.

    Args:
        pg: Process group of the exchange.
        dims_per_rank: Embedding dimension of each column block (one per feature / column shard), per rank, in
            the column order of that rank's ``local_embs``.
        tables_per_rank: Table name of each column block, per rank (the key of its error bound).
        config: Compression settings.
        bounds: Per-table bounds, read at every call.
        callbacks: Applied to the output on ``wait()``, as TorchRec's (e.g. the column-wise permute).

    Attributes:
        observer: If set, called as ``observer(table, chunk)`` with every (destination rank, local table) chunk this
            rank is about to encode in a forward exchange that is on the record (see :meth:`off_the_record`).
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        dims_per_rank: Sequence[Sequence[int]],
        tables_per_rank: Sequence[Sequence[str]],
        config: CompressionConfig,
        bounds: BoundSource,
        callbacks: Sequence[Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        super().__init__()
        if len(dims_per_rank) != pg.size() or len(tables_per_rank) != pg.size():
            raise ValueError(f"dims_per_rank / tables_per_rank need one entry per rank ({pg.size()}).")
        self.layout = Layout(dist.get_rank(pg), tuple(map(tuple, dims_per_rank)), tuple(map(tuple, tables_per_rank)))
        self._pg = pg
        self._config = config
        self._bounds = bounds
        self._callbacks = list(callbacks or [])
        self._on_record = True
        self._overlap = config.overlap if config.overlap is not None else dist.get_backend(pg) == "nccl"
        self._stats = CommStats()
        self._timer: PhaseTimer | None = None
        self._fallback = UncompressedFallback(config.fallback_check_every, self._slowest) if config.auto_fallback \
            else None
        self._timed: FallbackCall | None = None  # the fallback's timed call whose time is being summed
        self._timed_s = 0.0
        self.observer: Callable[[str, torch.Tensor], None] | None = None

    @property
    def overlapped(self) -> bool:
        """Whether forward launches the payload exchange and ``wait()`` finishes it (else it finishes at once)."""
        return self._overlap

    @property
    def callbacks(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """Output callbacks, as on TorchRec's module."""
        return self._callbacks

    @property
    def local_tables(self) -> list[str]:
        """Tables whose pooled embeddings this rank sends."""
        return list(self.layout.local_tables)

    @property
    def tables_per_rank(self) -> list[list[str]]:
        """Table name of each column block, per rank (every rank's tables, not only this one's)."""
        return [list(t) for t in self.layout.tables_per_rank]

    @property
    def dim_sum_per_rank(self) -> list[int]:
        """Sum of the embedding dims each rank contributes."""
        return list(self.layout.dim_sums)

    @property
    def stats(self) -> CommStats:
        """A snapshot of this exchange's counters since it was installed (they only grow)."""
        self._fold_times()
        return self._stats.copy()

    @contextlib.contextmanager
    def off_the_record(self, bounds: BoundSource) -> Iterator[None]:
        """Within the block, forward exchanges read ``bounds``, are always compressed, are not observed and count
        in no statistics: exchanges that measure something (a calibration probe) rather than train."""
        saved = self._bounds, self._on_record
        self._bounds, self._on_record = bounds, False
        try:
            yield
        finally:
            self._bounds, self._on_record = saved

    def forward(
        self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> PooledEmbeddingsAwaitable:
        """Exchange ``local_embs`` ([sum of batch sizes, local dim sum]) and return an awaitable of this rank's
        pooled embeddings ([local batch size, total dim sum])."""
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
        on_record = self._on_record
        timer = self._timer_for(local_embs) if on_record else PhaseTimer(local_embs.device)  # off the record: nobody
        call = _Call(list(batch_size_per_rank), on_record, timer, local_embs.dtype)
        launched = _ExchangeLaunch.apply(local_embs, self, call)
        if self._overlap:
            pending: Awaitable[torch.Tensor] = _PendingExchange(self, call, launched)
        else:
            pending = _Ready(_ExchangeWait.apply(launched, self, call))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=pending)
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    # ------------------------------------------------------------------ forward

    def _launch_forward(self, x: torch.Tensor, call: _Call) -> None:
        """Encode, exchange sizes and launch the payload exchange; leave in ``call.finish`` what waits for it."""
        x = x.detach().float()
        batch_size_per_rank, timer, layout = call.batch_size_per_rank, call.timer, self.layout
        row_splits = offsets(batch_size_per_rank)
        eps = self._bounds.effective_many(layout.local_tables)
        if call.on_record:
            if self.observer is not None:
                for name, chunk in self._chunks(x, row_splits):
                    self.observer(name, chunk)
            if self._fallback is not None:
                self._start_fallback_call(call)
        if call.fallback is not None and call.fallback.uncompressed:
            label = "dlac exchange (uncompressed)"
            with timer.phase("exchange_s", label):
                flight = exchange.start_forward_uncompressed(x, batch_size_per_rank, layout, self._pg)
            self._stats.uncompressed_calls += 1
            rows = x.size(0) - batch_size_per_rank[layout.rank]  # the rows kept here are not traffic
            per_table = [rows * d * 4 for d in layout.dims_per_rank[layout.rank]]
            self._count_forward(rows, sum(per_table), per_table)

            def finish() -> torch.Tensor:
                with timer.phase("exchange_s", label):
                    return exchange.finish_forward_uncompressed(flight, batch_size_per_rank, layout)
        else:
            with timer.phase("encode_s", "dlac encode"):
                encoded = exchange.encode_for_others(x, row_splits, layout, eps, self._config.impl)
            with timer.phase("exchange_s", "dlac exchange"):
                recv_sizes = exchange.exchange_sizes(encoded.sizes, layout, self._pg)
                flight = exchange.start_payload(encoded.payload, encoded.sizes, recv_sizes, layout, self._pg)
            own = x[row_splits[layout.rank] : row_splits[layout.rank + 1]]
            if call.on_record:  # while the payload is on its way
                n_local, world = len(layout.local_tables), layout.world
                per_table = encoded.sizes.view(world, n_local).sum(0).tolist() if n_local else []
                # The payload plus the size exchange: one int64 per (other rank, local table).
                sent = int(encoded.payload.numel()) + (world - 1) * n_local * 8
                self._count_forward(x.size(0) - batch_size_per_rank[layout.rank], sent, per_table)
                self._note_non_finite(x, row_splits, encoded)
                every = self._config.error_every
                if every and layout.local_tables and (self._stats.calls - 1) % every == 0:
                    self._sample_error(x, encoded, eps)

            def finish() -> torch.Tensor:
                with timer.phase("exchange_s", "dlac exchange"):
                    received = flight.wait()
                with timer.phase("decode_s", "dlac decode"):
                    return exchange.decode_from_others(received, recv_sizes, own, layout, self._config.impl)

        call.finish = finish

    def _start_fallback_call(self, call: _Call) -> None:
        """Give the fallback the previous call's time if it asked for it, then take its decision for ``call``.

        A call's time is every phase of this exchange from its launch to the next launch: the forward exchange and
        the gradient exchange of its backward (an uncompressed call sends both uncompressed), so it is read here,
        at the next launch, when both are done."""
        self._fold_times()
        if self._timed is not None:
            self._fallback.record(self._timed.uncompressed, self._timed_s)
        call.fallback = self._fallback.next_call()
        self._timed, self._timed_s = (call.fallback, 0.0) if call.fallback.timed else (None, 0.0)

    def _wait_forward(self, call: _Call) -> torch.Tensor:
        """Wait for the payload ``call`` launched and decode it."""
        assert call.finish is not None, "a forward exchange is waited on before it was launched"
        out = call.finish()
        call.finish = None  # the wait holds the received buffers: drop them with it
        return out

    # ------------------------------------------------------------------ backward

    def _launch_backward(self, grad: torch.Tensor, call: _Call) -> None:
        """Launch the exchange sending ``grad`` ([local batch, total dim]) back to the ranks that own each column."""
        grad = grad.contiguous().float()
        mode = self._backward_mode(call)
        with call.timer.phase("backward_s", f"dlac backward ({mode})"):
            if mode is BackwardCompression.DLAC:
                call.backward = exchange.start_backward_dlac(grad, call.batch_size_per_rank, self.layout,
                                                             self._config.backward_eps, self._config.impl, self._pg)
            else:
                call.backward = exchange.start_backward_cast(grad, call.batch_size_per_rank, self.layout, _WIRE[mode],
                                                             self._pg)
        if call.on_record:
            s = self._stats
            s.backward_calls += 1
            s.backward_raw_bytes += grad.size(0) * (grad.size(1) - self.layout.dim_sums[self.layout.rank]) * 4
            s.backward_sent_bytes += call.backward.sent
        if not self._overlap:
            call.grad = self._wait_backward(call)

    def _backward_mode(self, call: _Call) -> BackwardCompression:
        """The gradient exchange's encoding: float32 for a call the fallback sends uncompressed (TorchRec's exchange
        in both directions), the configured one otherwise."""
        if call.fallback is not None and call.fallback.uncompressed:
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
            out = exchange.finish_backward(call.backward, call.batch_size_per_rank, self.layout, self._config.impl)
        call.backward = None
        if comm_ops.get_gradient_division():
            out = out / self.layout.world  # TorchRec scales embedding gradients like DDP averages dense ones
        return out

    # ------------------------------------------------------------------ wrappers: statistics, timing, checks

    def _timer_for(self, t: torch.Tensor) -> PhaseTimer:
        if self._timer is None:
            self._timer = PhaseTimer(t.device)
        return self._timer

    def _fold_times(self) -> dict[str, float]:
        """Move the timer's finished phases into the counters (and into the time of the fallback's timed call, while
        one is being summed); return them."""
        times = self._timer.collect() if self._timer is not None else {}
        for name, seconds in times.items():
            setattr(self._stats, name, getattr(self._stats, name) + seconds)
        if self._timed is not None:
            self._timed_s += sum(times.values())
        return times

    def _slowest(self, seconds: Sequence[float]) -> list[float]:
        """The maximum over ranks of this rank's ``seconds`` (the uncompressed fallback decides from it)."""
        times = torch.tensor(list(seconds), dtype=torch.float64)
        if dist.get_backend(self._pg) == "nccl":
            times = times.cuda()
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self._pg)
        return times.tolist()

    def _count_forward(self, rows: int, sent_bytes: int, table_sent_bytes: Sequence[int]) -> None:
        """Count one forward call that sent ``rows`` rows to other ranks: ``sent_bytes`` in all, and the payload
        bytes of each local table."""
        layout, s = self.layout, self._stats
        s.calls += 1
        s.raw_bytes += rows * layout.dim_sums[layout.rank] * 4
        s.sent_bytes += sent_bytes
        for name, dim, sent in zip(layout.local_tables, layout.dims_per_rank[layout.rank], table_sent_bytes):
            s.table_raw_bytes[name] = s.table_raw_bytes.get(name, 0) + rows * dim * 4
            s.table_sent_bytes[name] = s.table_sent_bytes.get(name, 0) + int(sent)

    def _chunks(self, x: torch.Tensor, row_splits: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
        """(table, chunk) of every (destination rank, local table) block of ``x``, in the codec's chunk order."""
        cols = self.layout.local_cols
        for r in range(self.layout.world):
            for c, name in enumerate(self.layout.local_tables):
                yield name, x[row_splits[r] : row_splits[r + 1], cols[c] : cols[c + 1]]

    def _note_non_finite(self, x: torch.Tensor, row_splits: list[int], encoded: Encoded) -> None:
        """Count chunks for other ranks that held NaN/Inf. The codec sends such chunks raw (exactly), so only chunks
        whose size is exactly a raw chunk's are scanned: nothing is scanned on the usual, compressed path."""
        counts = self._stats.table_non_finite_chunks
        for (name, chunk), size in zip(self._chunks(x, row_splits), encoded.sizes.tolist()):
            if chunk.numel() and size == HEADER_SIZE + chunk.numel() * 4 and not bool(torch.isfinite(chunk).all()):
                counts[name] = counts.get(name, 0) + 1

    def _sample_error(self, x: torch.Tensor, encoded: Encoded, eps: torch.Tensor) -> None:
        """Decode our own payload and record max |x - x_hat| / bound per table (the bound is a guarantee; this
        makes it visible)."""
        x = x.cpu()
        cols, tables = self.layout.local_cols, self.layout.local_tables
        eps_of = dict(zip(tables, eps.tolist()))
        worst = dict.fromkeys(tables, 0.0)
        for r0, rs, payload, sizes in encoded.grids:
            x_hat = decode_grid(payload, sizes, rs, cols, impl=self._config.impl).cpu()
            for r, c in itertools.product(range(len(rs) - 1), range(len(tables))):
                rows, columns = slice(rs[r], rs[r + 1]), slice(cols[c], cols[c + 1])
                chunk, chunk_hat = x[r0:][rows, columns], x_hat[rows, columns]
                if chunk.numel() == 0 or not torch.isfinite(chunk).all():
                    continue  # nothing sent, or sent raw, exactly (and counted by _note_non_finite)
                bound = eps_of[tables[c]] * float(chunk.max() - chunk.min())
                err = float((chunk - chunk_hat).abs().max())
                ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
                worst[tables[c]] = max(worst[tables[c]], ratio)
        observed = self._stats.table_max_error_ratio
        for name, w in worst.items():
            observed[name] = max(observed.get(name, 0.0), w)


class _ExchangeLaunch(torch.autograd.Function):
    """Forward: launch the exchange, return a placeholder that :class:`_ExchangeWait` takes. Backward: wait for the
    gradient exchange that :class:`_ExchangeWait`'s backward launched (TorchRec's ``All2All_Pooled_Req``)."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: CompressedPooledEmbeddingsAllToAll, call: _Call):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.call = a2a, call
        a2a._launch_forward(local_embs, call)
        return local_embs.new_zeros(1)  # ties the launch to the wait in the autograd graph

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):  # noqa: ANN001, ANN205
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
        return a2a._wait_forward(call).to(call.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        ctx.a2a._launch_backward(grad_output, ctx.call)
        return grad_output.new_zeros(ctx.launched_shape), None, None
