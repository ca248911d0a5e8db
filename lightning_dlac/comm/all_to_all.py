"""Compressed drop-in for TorchRec's ``PooledEmbeddingsAllToAll``.

The layering follows TorchRec's: pure exchange functions (``exchange.py``, like ``comm_ops``), an autograd Function
joining the two directions, and a thin module. The module wraps the pure exchange with what a training run needs
around it, each in one place: statistics (:class:`~lightning_dlac.comm.CommStats`, counters that only grow), phase
timing that is right on a GPU (:class:`~lightning_dlac.comm.timing.PhaseTimer`), the uncompressed fallback of
``compress="auto"`` (:class:`~lightning_dlac.comm.fallback.UncompressedFallback`), error sampling, non-finite notes
and the chunk observer that calibration measures through.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
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
from lightning_dlac.comm.exchange import Encoded, Layout, offsets
from lightning_dlac.comm.fallback import UncompressedFallback
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


class CompressedPooledEmbeddingsAllToAll(nn.Module):
    """Error-bounded compressed replacement of TorchRec's ``PooledEmbeddingsAllToAll``: same inputs, same output
    layout, an awaitable with the same callbacks. The exchange itself is synchronous: it has finished when
    :meth:`forward` returns, and ``wait()`` only applies the callbacks.

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
        self._stats = CommStats()
        self._timer: PhaseTimer | None = None
        self._fallback = UncompressedFallback(config.fallback_check_every, self._slowest) if config.auto_fallback \
            else None
        self.observer: Callable[[str, torch.Tensor], None] | None = None

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
        out = _CompressedAllToAllFn.apply(local_embs, self, list(batch_size_per_rank))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=_Ready(out))
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    # ------------------------------------------------------------------ forward

    def _exchange_forward(self, x: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        x = x.detach().float()
        row_splits = offsets(batch_size_per_rank)
        eps = self._bounds.effective_many(self.layout.local_tables)
        if not self._on_record:
            return self._compressed(x, row_splits, eps, PhaseTimer(x.device))[0]  # timed for nobody
        if self.observer is not None:
            for name, chunk in self._chunks(x, row_splits):
                self.observer(name, chunk)
        call = self._fallback.next_call() if self._fallback is not None else None
        if call is not None and call.timed:
            self._fold_times()  # so that the next read holds this call's phases only
        if call is not None and call.uncompressed:
            with self._timer_for(x).phase("exchange_s", "dlac exchange (uncompressed)"):
                out = exchange.forward_uncompressed(x, batch_size_per_rank, self.layout, self._pg)
            self._stats.uncompressed_calls += 1
            rows = x.size(0) - batch_size_per_rank[self.layout.rank]  # the rows kept here are not traffic
            per_table = [rows * d * 4 for d in self.layout.dims_per_rank[self.layout.rank]]
            self._count_forward(rows, sum(per_table), per_table)
        else:
            out, encoded = self._compressed(x, row_splits, eps, self._timer_for(x))
            n_local, world = len(self.layout.local_tables), self.layout.world
            per_table = encoded.sizes.view(world, n_local).sum(0).tolist() if n_local else []
            # The payload plus the size exchange: one int64 per (other rank, local table).
            sent = int(encoded.payload.numel()) + (world - 1) * n_local * 8
            self._count_forward(x.size(0) - batch_size_per_rank[self.layout.rank], sent, per_table)
            self._note_non_finite(x, row_splits, encoded)
            every = self._config.error_every
            if every and self.layout.local_tables and (self._stats.calls - 1) % every == 0:
                self._sample_error(x, encoded, eps)
        if call is not None and call.timed:
            self._fallback.record(call.uncompressed, sum(self._fold_times().values()))
        return out

    def _compressed(
        self, x: torch.Tensor, row_splits: list[int], eps: torch.Tensor, timer: PhaseTimer
    ) -> tuple[torch.Tensor, Encoded]:
        """The pure compressed exchange, its phases timed."""
        impl, layout = self._config.impl, self.layout
        with timer.phase("encode_s", "dlac encode"):
            encoded = exchange.encode_for_others(x, row_splits, layout, eps, impl)
        with timer.phase("exchange_s", "dlac exchange"):
            recv_sizes = exchange.exchange_sizes(encoded.sizes, layout, self._pg)
            received = exchange.exchange_payload(encoded.payload, encoded.sizes, recv_sizes, layout, self._pg)
        with timer.phase("decode_s", "dlac decode"):
            own = x[row_splits[layout.rank] : row_splits[layout.rank + 1]]
            out = exchange.decode_from_others(received, recv_sizes, own, layout, impl)
        return out, encoded

    # ------------------------------------------------------------------ backward

    def _exchange_backward(self, grad: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        """Send ``grad`` ([local batch, total dim]) back to the ranks that own each column; return this rank's
        gradient of ``local_embs`` ([sum of batch sizes, local dim sum])."""
        grad = grad.contiguous().float()
        mode = BackwardCompression(self._config.backward)
        timer = self._timer_for(grad) if self._on_record else PhaseTimer(grad.device)
        with timer.phase("backward_s", f"dlac backward ({mode})"):
            if mode is BackwardCompression.DLAC:
                out, sent = exchange.backward_dlac(grad, batch_size_per_rank, self.layout, self._config.backward_eps,
                                                   self._config.impl, self._pg)
            else:
                out, sent = exchange.backward_cast(grad, batch_size_per_rank, self.layout, _WIRE[mode], self._pg)
        if self._on_record:
            s = self._stats
            s.backward_calls += 1
            s.backward_raw_bytes += grad.size(0) * (grad.size(1) - self.layout.dim_sums[self.layout.rank]) * 4
            s.backward_sent_bytes += sent
        if comm_ops.get_gradient_division():
            out = out / self.layout.world  # TorchRec scales embedding gradients like DDP averages dense ones
        return out

    # ------------------------------------------------------------------ wrappers: statistics, timing, checks

    def _timer_for(self, t: torch.Tensor) -> PhaseTimer:
        if self._timer is None:
            self._timer = PhaseTimer(t.device)
        return self._timer

    def _fold_times(self) -> dict[str, float]:
        """Move the timer's finished phases into the counters; return them."""
        times = self._timer.collect() if self._timer is not None else {}
        for name, seconds in times.items():
            setattr(self._stats, name, getattr(self._stats, name) + seconds)
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


class _CompressedAllToAllFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: CompressedPooledEmbeddingsAllToAll, batch_size_per_rank: list[int]):  # noqa: ANN001, ANN205
        ctx.a2a = a2a
        ctx.batch_size_per_rank = batch_size_per_rank
        return a2a._exchange_forward(local_embs, batch_size_per_rank).to(local_embs.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        grad = ctx.a2a._exchange_backward(grad_output, ctx.batch_size_per_rank)
        return grad.to(grad_output.dtype), None, None
