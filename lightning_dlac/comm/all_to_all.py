"""Compressed drop-in for TorchRec's ``PooledEmbeddingsAllToAll``.

Forward, on every rank:
1. encode every (destination rank, local table) chunk of ``local_embs`` for the other ranks with that table's
   current bound; the rows a rank keeps for itself never leave it, so they are neither encoded nor sent and arrive
   exactly (their chunk sizes are exchanged as 0);
2. exchange the per-chunk compressed byte counts (a small int64 all-to-all);
3. exchange the payloads with one variable-split ``all_to_all_single``;
4. decode and reassemble the columns in TorchRec's order (source rank, then its tables).

Backward sends the gradients the other way, uncompressed, cast to bf16/fp16, or DLAC-encoded (again keeping the
rank's own block local).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.profiler import record_function
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import PooledEmbeddingsAwaitable
from torchrec.distributed.types import Awaitable

from lightning_dlac.codec import CodecError, decode, decode_grid, encode_grid
from lightning_dlac.codec.format import HEADER_SIZE
from lightning_dlac.comm.config import BackwardCompression, CommStats, CompressionConfig, ErrorBounds

log = logging.getLogger(__name__)

_CAST = {BackwardCompression.BF16: torch.bfloat16, BackwardCompression.FP16: torch.float16}


class CompressedExchangeError(RuntimeError):
    """A compressed payload could not be decoded on the receiving rank."""


class _Ready(Awaitable[torch.Tensor]):
    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)]


def _around(rank: int, world: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The ranks before and after ``rank``, as [lo, hi) ranges: whom a rank exchanges with, keeping its own block."""
    return (0, rank), (rank + 1, world)


class _Grid(NamedTuple):
    """One encode_grid call over a block of rows and columns: the block's first row, its row splits, the output."""

    first_row: int
    row_splits: list[int]
    payload: torch.Tensor
    sizes: torch.Tensor


def _all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], pg) -> None:
    # gloo and NCCL both move raw bytes; uint8 views keep the dtype question out of the collective.
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=pg)


class CompressedPooledEmbeddingsAllToAll(nn.Module):
    """Error-bounded compressed replacement of TorchRec's ``PooledEmbeddingsAllToAll``: same inputs, same output
    layout and the same awaitable behaviour.

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
            rank is about to encode in the forward exchange (not during an :meth:`ErrorBounds.probe`). Calibration
            uses it to measure each table's statistics on the real payload.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        dims_per_rank: Sequence[Sequence[int]],
        tables_per_rank: Sequence[Sequence[str]],
        config: CompressionConfig,
        bounds: ErrorBounds,
        callbacks: Sequence[Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        super().__init__()
        if len(dims_per_rank) != pg.size() or len(tables_per_rank) != pg.size():
            raise ValueError(f"dims_per_rank / tables_per_rank need one entry per rank ({pg.size()}).")
        for r, (dims, names) in enumerate(zip(dims_per_rank, tables_per_rank)):
            if len(dims) != len(names):
                raise ValueError(f"rank {r}: {len(dims)} column blocks but {len(names)} table names.")
        self._pg = pg
        self._rank = dist.get_rank(pg)
        self._world = pg.size()
        self._dims = [list(d) for d in dims_per_rank]
        self._tables = [list(t) for t in tables_per_rank]
        self._config = config
        self._bounds = bounds
        self._callbacks = list(callbacks or [])
        self.stats = CommStats()
        self.observer: Callable[[str, torch.Tensor], None] | None = None
        self._skip = _SkipPolicy(pg, config.probe_every)
        self._col_splits = [_offsets(d) for d in self._dims]
        self._all_col_splits = _offsets([d for dims in self._dims for d in dims])

    @property
    def callbacks(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """Output callbacks, as on TorchRec's module."""
        return self._callbacks

    @property
    def local_tables(self) -> list[str]:
        """Tables whose pooled embeddings this rank sends."""
        return list(self._tables[self._rank])

    @property
    def tables_per_rank(self) -> list[list[str]]:
        """Table name of each column block, per rank (every rank's tables, not only this one's)."""
        return [list(t) for t in self._tables]

    @property
    def dim_sum_per_rank(self) -> list[int]:
        """Sum of the embedding dims each rank contributes."""
        return [sum(d) for d in self._dims]

    def forward(
        self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None
    ) -> PooledEmbeddingsAwaitable:
        """Exchange ``local_embs`` ([sum of batch sizes, local dim sum]) and return an awaitable of this rank's
        pooled embeddings ([local batch size, total dim sum])."""
        if local_embs.dim() != 2 or local_embs.size(1) != self.dim_sum_per_rank[self._rank]:
            raise ValueError(
                f"local_embs must be [batch, {self.dim_sum_per_rank[self._rank]}] on rank {self._rank}, got"
                f" {list(local_embs.shape)}."
            )
        if not batch_size_per_rank:
            total = local_embs.size(0)
            if total % self._world:
                raise ValueError(f"{self._world} ranks do not divide the global batch size {total}.")
            batch_size_per_rank = [total // self._world] * self._world
        out = _CompressedAllToAllFn.apply(local_embs, self, list(batch_size_per_rank))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=_Ready(out))
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    # ------------------------------------------------------------------ forward exchange

    def _exchange_forward(self, x: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        me, world, stats = self._rank, self._world, self.stats
        row_splits = _offsets(batch_size_per_rank)
        my_tables = self._tables[me]
        n_local = len(my_tables)
        x = x.detach().float()
        dev = x.device
        eps = self._bounds.effective_many(my_tables)
        probing = self._bounds.probing
        if self.observer is not None and not probing:
            for name, chunk in self._local_chunks(x, row_splits):
                self.observer(name, chunk)

        if self._config.skip_when_slower and not probing and self._skip.next_is_raw():
            return self._exchange_uncompressed(x, batch_size_per_rank)

        t0 = time.perf_counter()
        with record_function("## dlac encode ##"):
            before, after = self._encode_for_others(x, row_splits, eps)
            payload, sizes = self._join(before, after, n_local, dev)
        t1 = time.perf_counter()

        with record_function("## dlac exchange ##"):
            chunk_counts = [len(t) for t in self._tables]
            recv_sizes = torch.empty(sum(chunk_counts), dtype=torch.int64, device=dev)
            _all_to_all(recv_sizes, sizes, chunk_counts, [n_local] * world, self._pg)
            send_bytes = sizes.view(world, n_local).sum(1).tolist() if n_local else [0] * world
            recv_per_src = [int(s.sum()) for s in recv_sizes.split(chunk_counts)]
            received = torch.empty(sum(recv_per_src), dtype=torch.uint8, device=dev)
            _all_to_all(received, payload, recv_per_src, send_bytes, self._pg)
        t2 = time.perf_counter()

        with record_function("## dlac decode ##"):
            b_me = batch_size_per_rank[me]
            others = [s for s in range(world) if s != me]
            cols = _offsets([d for s in others for d in self._dims[s]])
            decoded = x.new_empty(b_me, 0)
            if len(cols) > 1:
                mine = _offsets(chunk_counts)
                keep = torch.cat([recv_sizes[: mine[me]], recv_sizes[mine[me + 1]:]])
                try:
                    decoded = decode_grid(received, keep, [0, b_me], cols, impl=self._config.impl).to(dev)
                except CodecError as err:
                    raise self._locate_decode_error(received, recv_sizes, chunk_counts, b_me) from err
            first = sum(self.dim_sum_per_rank[:me])  # this rank's columns in the output
            out = torch.cat([decoded[:, :first], x[row_splits[me]: row_splits[me + 1]], decoded[:, first:]], dim=1)
        t3 = time.perf_counter()
        if probing:
            return out  # calibration probes are not traffic: they leave the statistics alone
        if self._config.skip_when_slower:
            self._skip.record(compressed=True, seconds=t3 - t0)

        stats.encode_s += t1 - t0
        stats.exchange_s += t2 - t1
        stats.decode_s += t3 - t2
        per_table = sizes.view(world, n_local).sum(0).tolist() if n_local else []
        remote_rows = x.size(0) - batch_size_per_rank[me]
        self._count_forward(remote_rows, int(payload.numel()) + (world - 1) * n_local * 8, per_table)
        if n_local:
            self._note_non_finite(x, sizes, row_splits)
            every = self._config.error_every
            if every and (stats.calls - 1) % every == 0:
                self._measure_error(x, [g for g in (before, after) if g is not None], eps)
        return out

    def _encode_for_others(
        self, x: torch.Tensor, row_splits: list[int], eps: torch.Tensor
    ) -> list[_Grid | None]:
        """Encode the (destination, local table) chunks of ``x`` for every rank but this one: [grid of the
        destinations before this rank, grid of those after it], None where there is none."""
        cols = self._col_splits[self._rank]
        grids: list[_Grid | None] = []
        for lo, hi in _around(self._rank, self._world):
            grid = None
            if hi > lo and len(cols) > 1:
                r0 = row_splits[lo]
                rs = [r - r0 for r in row_splits[lo: hi + 1]]
                grid = _Grid(r0, rs, *encode_grid(x[r0: row_splits[hi]], rs, cols, eps=eps, impl=self._config.impl))
            grids.append(grid)
        return grids

    @staticmethod
    def _join(
        before: _Grid | None, after: _Grid | None, n_local: int, dev: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One payload for the all-to-all, and every destination's chunk sizes with 0 for this rank's own."""
        sizes = [torch.zeros(n_local, dtype=torch.int64, device=dev)]
        if before is not None:
            sizes.insert(0, before.sizes.to(dev))
        if after is not None:
            sizes.append(after.sizes.to(dev))
        grids = [g for g in (before, after) if g is not None]
        empty = torch.zeros(0, dtype=torch.uint8, device=dev)
        payload = torch.cat([g.payload.to(dev) for g in grids]) if grids else empty
        return payload, torch.cat(sizes)

    def _exchange_uncompressed(self, x: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        """TorchRec's exchange: float32 rows to their destination, in one all-to-all (``skip_when_slower``)."""
        me = self._rank
        d_me, b_me = self.dim_sum_per_rank[me], batch_size_per_rank[me]
        t0 = time.perf_counter()
        with record_function("## dlac exchange (uncompressed) ##"):
            recv_numel = [b_me * d for d in self.dim_sum_per_rank]
            received = torch.empty(sum(recv_numel), dtype=torch.float32, device=x.device)
            send_numel = [b * d_me for b in batch_size_per_rank]
            _all_to_all(received, x.contiguous().view(-1), recv_numel, send_numel, self._pg)
            out = torch.cat([blk.view(b_me, d) for blk, d in zip(received.split(recv_numel), self.dim_sum_per_rank)],
                            dim=1)
        seconds = time.perf_counter() - t0
        self._skip.record(compressed=False, seconds=seconds)
        self.stats.uncompressed_calls += 1
        self.stats.exchange_s += seconds
        rows = x.size(0) - batch_size_per_rank[me]  # the rows this rank keeps are not traffic
        self._count_forward(rows, rows * d_me * 4, [rows * dim * 4 for dim in self._dims[me]])
        return out

    def _count_forward(self, rows: int, sent_bytes: int, table_sent_bytes: Sequence[int]) -> None:
        """Count one forward call that sent ``rows`` rows to other ranks: float32 bytes they stand for, bytes it
        sent, per local table."""
        me, stats = self._rank, self.stats
        stats.calls += 1
        stats.raw_bytes += rows * self.dim_sum_per_rank[me] * 4
        stats.sent_bytes += sent_bytes
        for name, dim, sent in zip(self._tables[me], self._dims[me], table_sent_bytes):
            stats.table_raw_bytes[name] = stats.table_raw_bytes.get(name, 0) + rows * dim * 4
            stats.table_sent_bytes[name] = stats.table_sent_bytes.get(name, 0) + int(sent)

    def _local_chunks(self, x: torch.Tensor, row_splits: list[int]) -> Iterator[tuple[str, torch.Tensor]]:
        """(table, chunk) of every (destination rank, local table) block of ``x``, in the codec's chunk order."""
        cols, tables = self._col_splits[self._rank], self._tables[self._rank]
        for r in range(self._world):
            for c, name in enumerate(tables):
                yield name, x[row_splits[r] : row_splits[r + 1], cols[c] : cols[c + 1]]

    def _note_non_finite(self, x: torch.Tensor, sizes: torch.Tensor, row_splits: list[int]) -> None:
        """Record tables whose chunk for another rank held NaN/Inf. The codec sends such chunks raw (exactly), so
        only chunks whose size is exactly a raw chunk's are checked: nothing is scanned on the usual, compressed
        path (and the rows a rank keeps for itself, passed on as they are, are not scanned at all)."""
        for (name, chunk), size in zip(self._local_chunks(x, row_splits), sizes.tolist()):
            if chunk.numel() and size == HEADER_SIZE + chunk.numel() * 4 and not bool(torch.isfinite(chunk).all()):
                self.stats.non_finite_tables.add(name)

    def _measure_error(self, x: torch.Tensor, grids: list[_Grid], eps: torch.Tensor) -> None:
        """Decode our own payload and record max |x - x_hat| / bound per table (the bound is a guarantee; this
        makes it visible)."""
        x = x.cpu()
        cols, tables = self._col_splits[self._rank], self._tables[self._rank]
        eps_of = dict(zip(tables, eps.tolist()))
        worst = dict.fromkeys(eps_of, 0.0)
        for r0, rs, payload, sizes in grids:
            x_hat = decode_grid(payload, sizes, rs, cols, impl=self._config.impl).cpu()
            for r, c in itertools.product(range(len(rs) - 1), range(len(tables))):
                rows, columns = slice(rs[r], rs[r + 1]), slice(cols[c], cols[c + 1])
                chunk, chunk_hat = x[r0:][rows, columns], x_hat[rows, columns]
                if chunk.numel() == 0 or not torch.isfinite(chunk).all():
                    continue  # nothing sent, or sent raw, exactly (and recorded by _note_non_finite)
                bound = eps_of[tables[c]] * float(chunk.max() - chunk.min())
                err = float((chunk - chunk_hat).abs().max())
                worst[tables[c]] = max(
                    worst[tables[c]], err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
                )
        for name, w in worst.items():
            self.stats.table_max_error_ratio[name] = max(self.stats.table_max_error_ratio.get(name, 0.0), w)

    def _locate_decode_error(
        self, received: torch.Tensor, recv_sizes: torch.Tensor, chunk_counts: list[int], rows: int
    ) -> CompressedExchangeError:
        """Slow path after a failed decode: find the source rank and table whose chunk is bad."""
        offset = 0
        sizes = recv_sizes.tolist()
        index = 0
        for src, count in enumerate(chunk_counts):
            if src == self._rank:  # nothing of ours was sent
                index += count
                continue
            for c in range(count):
                size = sizes[index]
                chunk = received[offset : offset + size]
                try:
                    x_hat = decode(chunk, impl=self._config.impl)
                    if tuple(x_hat.shape) != (rows, self._dims[src][c]):
                        raise CodecError(f"shape {list(x_hat.shape)} instead of {[rows, self._dims[src][c]]}")
                except CodecError as err:
                    return CompressedExchangeError(
                        f"rank {self._rank}: pooled embeddings of table {self._tables[src][c]!r} received from rank"
                        f" {src} failed to decode ({err}). The payload was corrupted in transit or the ranks run"
                        " different lightning-dlac versions."
                    )
                offset += size
                index += 1
        return CompressedExchangeError(f"rank {self._rank}: the received pooled embeddings failed to decode.")

    # ------------------------------------------------------------------ backward exchange

    def _exchange_backward(self, grad: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        """Send ``grad`` ([local batch, total dim]) back to the ranks that own each column; return this rank's
        gradient of ``local_embs`` ([sum of batch sizes, local dim sum])."""
        me, world = self._rank, self._world
        mode = BackwardCompression(self._config.backward)
        b_me = batch_size_per_rank[me]
        d_me = self.dim_sum_per_rank[me]
        t0 = time.perf_counter()
        grad = grad.contiguous().float()
        if mode is BackwardCompression.DLAC:
            out = self._backward_dlac(grad, batch_size_per_rank)
        else:
            # Column block of each owner rank, flattened in rank order: TorchRec's backward all-to-all layout.
            send = torch.cat([grad[:, a:b].reshape(-1) for a, b in itertools.pairwise(_offsets(self.dim_sum_per_rank))])
            recv_numel = [b * d_me for b in batch_size_per_rank]
            send_numel = [b_me * d for d in self.dim_sum_per_rank]
            if mode is BackwardCompression.FP32:
                wire = send
                received = torch.empty(sum(recv_numel), dtype=torch.float32, device=grad.device)
                _all_to_all(received, wire, recv_numel, send_numel, self._pg)
            else:
                wire = send.to(_CAST[mode])
                received = torch.empty(sum(recv_numel), dtype=wire.dtype, device=grad.device)
                _all_to_all(received.view(torch.uint8), wire.view(torch.uint8), [n * 2 for n in recv_numel],
                            [n * 2 for n in send_numel], self._pg)
            # Bytes to other ranks: this rank's own block is a local copy.
            self.stats.backward_sent_bytes += b_me * (grad.size(1) - d_me) * wire.element_size()
            out = torch.cat(
                [blk.view(b, d_me) for blk, b in zip(received.split(recv_numel), batch_size_per_rank)], dim=0
            ).float()
        self.stats.backward_calls += 1
        self.stats.backward_raw_bytes += b_me * (grad.size(1) - d_me) * 4
        self.stats.backward_s += time.perf_counter() - t0
        if comm_ops.get_gradient_division():
            out = out / world  # TorchRec scales embedding gradients like DDP averages dense ones
        return out

    def _backward_dlac(self, grad: torch.Tensor, batch_size_per_rank: list[int]) -> torch.Tensor:
        me, world = self._rank, self._world
        b_me = grad.size(0)
        dev = grad.device
        chunk_counts = [len(t) for t in self._tables]
        n_local = chunk_counts[me]
        owners = _offsets(self.dim_sum_per_rank)  # each owner rank's columns of grad
        # The columns of the other owners' tables, as at most two grids (owners before and after this rank); this
        # rank's own columns stay here, exactly.
        grids: list[_Grid | None] = []
        with record_function("## dlac encode grad ##"):
            for lo, hi in _around(me, world):
                dims = [d for r in range(lo, hi) for d in self._dims[r]]
                grid = None
                if dims:
                    eps = torch.full((len(dims),), self._config.backward_eps, dtype=torch.float32)
                    block = grad[:, owners[lo]: owners[hi]]
                    grid = _Grid(0, [0, b_me], *encode_grid(block, [0, b_me], _offsets(dims), eps=eps,
                                                            impl=self._config.impl))
                grids.append(grid)
        payload, sizes = self._join(*grids, n_local, dev)
        recv_sizes = torch.empty(world * n_local, dtype=torch.int64, device=dev)
        _all_to_all(recv_sizes, sizes, [n_local] * world, chunk_counts, self._pg)
        send_bytes = [int(s.sum()) for s in sizes.split(chunk_counts)]
        recv_bytes = recv_sizes.view(world, n_local).sum(1).tolist() if n_local else [0] * world
        received = torch.empty(sum(recv_bytes), dtype=torch.uint8, device=dev)
        _all_to_all(received, payload, recv_bytes, send_bytes, self._pg)
        self.stats.backward_sent_bytes += int(payload.numel()) + (sizes.numel() - n_local) * 8
        with record_function("## dlac decode grad ##"):
            if not n_local:
                return torch.zeros(sum(batch_size_per_rank), 0, device=dev)
            others = [b for r, b in enumerate(batch_size_per_rank) if r != me]
            keep = torch.cat([recv_sizes[: me * n_local], recv_sizes[(me + 1) * n_local:]])
            try:
                decoded = decode_grid(received, keep, _offsets(others), self._col_splits[me],
                                      impl=self._config.impl).to(dev)
            except CodecError as err:
                raise CompressedExchangeError(
                    f"rank {me}: embedding gradients received for tables {self._tables[me]} failed to decode ({err})."
                ) from err
            first = sum(batch_size_per_rank[:me])  # the rows of this rank's own batch in the result
            own = grad[:, owners[me]: owners[me + 1]]
            return torch.cat([decoded[:first], own, decoded[first:]], dim=0)


class _SkipPolicy:
    """Whether the next forward exchange goes uncompressed, for ``CompressionConfig(skip_when_slower=True)``.

    Both ways are timed from the caller's side (compressed: encode to decode; uncompressed: the one all-to-all),
    each as an exponential moving average. The first calls measure each way (compressed twice, so that one-time
    set-up does not count, then uncompressed once); after that the faster way is used, and every ``probe_every``
    calls the other way is tried once to refresh its time. Decisions use the slowest rank's times (one all-reduce
    of two numbers per decision), so every rank takes the same way at the same call, as the collectives require.
    """

    def __init__(self, pg: dist.ProcessGroup, probe_every: int) -> None:
        self._pg = pg
        self._every = probe_every
        self._calls = 0
        self._ema: dict[bool, float | None] = {True: None, False: None}
        self._use_raw = False
        self._is_trial = False  # the current call tries the way not taken (or is the first uncompressed one)

    @property
    def uses_uncompressed(self) -> bool:
        """The current decision."""
        return self._use_raw

    def next_is_raw(self) -> bool:
        k = self._calls
        self._calls += 1
        self._is_trial = k == 2 or (k > 2 and (k - 2) % self._every == 0)
        if k < 2:
            return False  # warm-up: measure the compressed way (its first call includes one-time costs)
        if k == 2:
            return True
        return not self._use_raw if self._is_trial else self._use_raw

    def record(self, compressed: bool, seconds: float) -> None:
        prev = self._ema[compressed]
        self._ema[compressed] = seconds if prev is None or self._calls <= 2 else 0.5 * prev + 0.5 * seconds
        if not self._is_trial or self._ema[not compressed] is None:
            return
        times = torch.tensor([self._ema[True], self._ema[False]], dtype=torch.float64)
        if dist.get_backend(self._pg) == "nccl":
            times = times.cuda()
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self._pg)
        compressed_s, raw_s = times.tolist()
        self._use_raw = raw_s < compressed_s
        self._is_trial = False


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
