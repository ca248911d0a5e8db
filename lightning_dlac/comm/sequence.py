"""Compressed drop-in for TorchRec's ``SequenceEmbeddingsAllToAll``: the exchange of a sharded EmbeddingCollection's
unpooled (per-id) embeddings.

Where it plugs in (torchrec 1.8): ``ShardedEmbeddingCollection._output_dists[i]`` is one output dist per sharding
type; the table-wise and column-wise ones are ``TwSequenceEmbeddingDist``, whose ``_dist`` is a
``SequenceEmbeddingsAllToAll``. On each rank ``local_embs`` is ``[ids looked up here, D]``, ordered feature-major
(this rank's features), then by the source rank whose batch the ids came from, then id order; TorchRec permutes it
destination-major (``forward_recat``) and sends each rank its rows, and the receiver gets, per source rank, that
rank's features in order, rows for its own batch.

Chunks are what the pooled path calls them: one table's (feature's) rows for one destination rank. Unlike the
pooled path, a chunk's row count depends on the ids, so the size exchange carries two int64 per chunk: its
compressed bytes and its rows. Steps, forward:

1. select each (destination, feature) chunk of ``local_embs``; the rows for this rank itself never leave it;
2. encode the chunks for other ranks with the feature's table bound (one ``encode_grid`` per feature);
3. exchange (bytes, rows) per chunk, then the payloads with one variable-split ``all_to_all_single``;
4. decode every other source's chunks in one ``decode_grid`` and place this rank's own block between them.

Backward sends the gradients of the received rows back to their owners as float32, bf16, fp16 (TorchRec's
fixed-size casts) or DLAC-encoded, the own block again kept local, and divides them by the world size as
TorchRec's ``All2All_Seq_Req`` does while ``comm_ops.get_gradient_division()`` is on.

Not compressed (TorchRec's module runs unchanged): variable batch sizes across ranks, and row-wise sharding, whose
output dist is a different module (``RwSequenceEmbeddingDist``): :func:`~lightning_dlac.comm.inject.
install_compressed_all_to_all` logs which tables those are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed import comm_ops
from torchrec.distributed.dist_data import SequenceEmbeddingsAllToAll, SequenceEmbeddingsAwaitable
from torchrec.distributed.types import Awaitable

from lightning_dlac.codec import CodecError, decode_grid, encode_grid
from lightning_dlac.codec.format import HEADER_SIZE
from lightning_dlac.comm.config import BackwardCompression, CompressionConfig
from lightning_dlac.comm.exchange import CompressedExchangeError, offsets
from lightning_dlac.comm.stats import CommStats
from lightning_dlac.comm.timing import PhaseTimer

_WIRE = {BackwardCompression.FP32: torch.float32, BackwardCompression.BF16: torch.bfloat16,
         BackwardCompression.FP16: torch.float16}


class _Ready(Awaitable[torch.Tensor]):
    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor


@dataclass(eq=False)
class _SeqCall:
    """What the backward of one forward exchange needs: the row layout of both sides."""

    gather: torch.Tensor  # rows of local_embs in send order (destination, then feature)
    send_rows: list[list[int]]  # [destination][local feature] rows sent
    recv_rows: list[list[int]]  # [source][its feature] rows received
    on_record: bool


class CompressedSequenceEmbeddingsAllToAll(nn.Module):
    """Error-bounded compressed replacement of TorchRec's ``SequenceEmbeddingsAllToAll`` (same call, same output,
    an awaitable): the (destination rank, table) chunks of sequence embeddings DLAC-encoded with the table's bound.

    The exchange runs when :meth:`forward` is called (the awaitable is ready); the gradient exchange runs in the
    backward. Calls TorchRec's module cannot be compressed for (variable batch sizes) go to ``uncompressed``.

    Args:
        pg: Process group of the exchange.
        tables_per_rank: Table name of each feature, per rank, in the order of that rank's ``local_embs`` features
            (the key of its error bound).
        config: Compression settings (``auto_fallback`` and ``overlap`` apply to pooled exchanges only).
        bounds: Per-table bounds, read at every call (``effective_many(tables)``).
        uncompressed: TorchRec's module, for the calls that stay uncompressed.

    Attributes:
        observer: If set, called as ``observer(table, chunk)`` with every chunk this rank is about to encode in a
            forward exchange that is on the record.
    """

    def __init__(
        self,
        pg: dist.ProcessGroup,
        tables_per_rank: Sequence[Sequence[str]],
        config: CompressionConfig,
        bounds,  # noqa: ANN001 - a BoundSource (ErrorBounds or a calibration probe's bounds)
        uncompressed: SequenceEmbeddingsAllToAll,
    ) -> None:
        super().__init__()
        if len(tables_per_rank) != pg.size():
            raise ValueError(f"tables_per_rank needs one entry per rank ({pg.size()}), got {len(tables_per_rank)}.")
        self._pg = pg
        self._rank = dist.get_rank(pg)
        self._tables_per_rank = [list(t) for t in tables_per_rank]
        self._config = config
        self._bounds = bounds
        self._uncompressed = uncompressed
        self._on_record = True
        self._stats = CommStats()
        self._timer: PhaseTimer | None = None
        self.observer: Callable[[str, torch.Tensor], None] | None = None

    @property
    def local_tables(self) -> list[str]:
        """Tables whose sequence embeddings this rank sends (one entry per local feature)."""
        return list(self._tables_per_rank[self._rank])

    @property
    def tables_per_rank(self) -> list[list[str]]:
        """Table name of each feature, per rank."""
        return [list(t) for t in self._tables_per_rank]

    @property
    def stats(self) -> CommStats:
        """A snapshot of this exchange's counters since it was installed (they only grow)."""
        self._fold_times()
        return self._stats.copy()

    @contextlib.contextmanager
    def off_the_record(self, bounds) -> Iterator[None]:  # noqa: ANN001 - a BoundSource
        """Within the block, forward exchanges read ``bounds``, are not observed and count in no statistics."""
        saved = self._bounds, self._on_record
        self._bounds, self._on_record = bounds, False
        try:
            yield
        finally:
            self._bounds, self._on_record = saved

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
        if world == 1 or variable or unbucketize_permute_tensor is not None:
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
        send_rows = [[block_rows[order[j * n_local + i]] for i in range(n_local)] for j in range(world)]
        pieces = [torch.arange(starts[r], starts[r + 1]) for r in order]
        gather = torch.cat(pieces).to(local_embs.device) if pieces else torch.zeros(0, dtype=torch.long)
        call = _SeqCall(gather, send_rows, [], self._on_record)
        out = _SequenceExchange.apply(local_embs, self, call)
        awaitable = SequenceEmbeddingsAwaitable(tensor_awaitable=_Ready(out), unbucketize_permute_tensor=None,
                                                embedding_dim=local_embs.size(1))
        return awaitable

    # ------------------------------------------------------------------ forward

    def _exchange_forward(self, local_embs: torch.Tensor, call: _SeqCall) -> torch.Tensor:
        me, world = self._rank, self._pg.size()
        x = local_embs.detach().float()[call.gather]  # destination-major, then local feature
        dim, dev = x.size(1), x.device
        tables = self._tables_per_rank[me]
        n_local = len(tables)
        timer = self._timer_for(x) if call.on_record else PhaseTimer(x.device)
        chunk_starts = offsets([r for rows in call.send_rows for r in rows])
        eps = self._bounds.effective_many(tables) if n_local else torch.zeros(0)
        payloads: dict[tuple[int, int], torch.Tensor] = {}
        sizes = torch.zeros(world, n_local, 2, dtype=torch.int64)
        with timer.phase("encode_s", "dlac sequence encode"):
            for i in range(n_local):
                others = [j for j in range(world) if j != me]
                parts = [x[chunk_starts[j * n_local + i] : chunk_starts[j * n_local + i + 1]] for j in others]
                if call.on_record and self.observer is not None:
                    for part in parts:
                        self.observer(tables[i], part)
                block = torch.cat(parts) if parts else x.new_zeros(0, dim)
                rs = offsets([call.send_rows[j][i] for j in others])
                payload, chunk_sizes = encode_grid(block, rs, [0, dim], eps=eps[i : i + 1], impl=self._config.impl)
                for j, piece, size, part in zip(others, payload.split(chunk_sizes.tolist()), chunk_sizes.tolist(),
                                                parts):
                    payloads[(j, i)] = piece
                    sizes[j, i, 0], sizes[j, i, 1] = size, part.size(0)
                    if call.on_record and part.numel() and size == HEADER_SIZE + part.numel() * 4 \
                            and not bool(torch.isfinite(part).all()):
                        nf = self._stats.table_non_finite_chunks
                        nf[tables[i]] = nf.get(tables[i], 0) + 1
        send = torch.cat([payloads[(j, i)].to(dev) for j in range(world) if j != me for i in range(n_local)]) \
            if n_local and world > 1 else torch.zeros(0, dtype=torch.uint8, device=dev)
        counts = [len(t) for t in self._tables_per_rank]
        with timer.phase("exchange_s", "dlac sequence exchange"):
            recv_meta = torch.empty(sum(counts) * 2, dtype=torch.int64, device=dev)
            dist.all_to_all_single(recv_meta, sizes.view(-1).to(dev), output_split_sizes=[c * 2 for c in counts],
                                   input_split_sizes=[n_local * 2] * world, group=self._pg)
            meta = recv_meta.view(-1, 2).cpu()
            send_bytes = sizes[:, :, 0].sum(dim=1).tolist()
            per_source = meta.split(counts)
            recv_bytes = [int(m[:, 0].sum()) for m in per_source]
            received = torch.empty(sum(recv_bytes), dtype=torch.uint8, device=dev)
            dist.all_to_all_single(received, send, output_split_sizes=recv_bytes, input_split_sizes=send_bytes,
                                   group=self._pg)
        own = x[chunk_starts[me * n_local] : chunk_starts[(me + 1) * n_local]]
        call.recv_rows = [m[:, 1].tolist() if s != me else list(call.send_rows[me]) for s, m in enumerate(per_source)]
        with timer.phase("decode_s", "dlac sequence decode"):
            other_sizes = torch.cat([m[:, 0] for s, m in enumerate(per_source) if s != me])
            other_rows = [r for s in range(world) if s != me for r in call.recv_rows[s]]
            try:
                decoded = decode_grid(received, other_sizes, offsets(other_rows), [0, dim], impl=self._config.impl)
            except CodecError as err:
                raise CompressedExchangeError(
                    f"rank {me}: sequence embeddings received from ranks {[s for s in range(world) if s != me]}"
                    f" failed to decode ({err}). The payload was corrupted in transit or the ranks run different"
                    " lightning-dlac versions."
                ) from err
            before = sum(sum(call.recv_rows[s]) for s in range(me))
            out = torch.cat([decoded[:before].to(dev), own, decoded[before:].to(dev)])
        if call.on_record:
            self._count_forward(x, call, sizes, chunk_starts, eps)
        return out

    def _count_forward(self, x: torch.Tensor, call: _SeqCall, sizes: torch.Tensor, chunk_starts: list[int],
                       eps: torch.Tensor) -> None:
        me, world = self._rank, self._pg.size()
        tables, s = self._tables_per_rank[me], self._stats
        dim = x.size(1)
        s.calls += 1
        rows = sum(sum(call.send_rows[j]) for j in range(world) if j != me)
        s.raw_bytes += rows * dim * 4
        s.sent_bytes += int(sizes[:, :, 0].sum()) + (world - 1) * len(tables) * 16  # payload + (bytes, rows) pairs
        for i, name in enumerate(tables):
            table_rows = sum(call.send_rows[j][i] for j in range(world) if j != me)
            s.table_raw_bytes[name] = s.table_raw_bytes.get(name, 0) + table_rows * dim * 4
            s.table_sent_bytes[name] = s.table_sent_bytes.get(name, 0) + int(sizes[:, i, 0].sum())
        every = self._config.error_every
        if every and tables and (s.calls - 1) % every == 0:
            self._sample_error(x, call, chunk_starts, eps)

    def _sample_error(self, x: torch.Tensor, call: _SeqCall, chunk_starts: list[int], eps: torch.Tensor) -> None:
        """Encode and decode this call's chunks again and record max |x - x_hat| / bound per table."""
        me, world = self._rank, self._pg.size()
        tables = self._tables_per_rank[me]
        observed = self._stats.table_max_error_ratio
        for j in range(world):
            if j == me:
                continue
            for i, name in enumerate(tables):
                chunk = x[chunk_starts[j * len(tables) + i] : chunk_starts[j * len(tables) + i + 1]].cpu()
                if chunk.numel() == 0 or not torch.isfinite(chunk).all():
                    continue
                payload, sizes = encode_grid(chunk, [0, chunk.size(0)], [0, chunk.size(1)], eps=eps[i : i + 1],
                                             impl=self._config.impl)
                x_hat = decode_grid(payload, sizes, [0, chunk.size(0)], [0, chunk.size(1)],
                                    impl=self._config.impl).cpu()
                bound = float(eps[i]) * float(chunk.max() - chunk.min())
                err = float((chunk - x_hat).abs().max())
                ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
                observed[name] = max(observed.get(name, 0.0), ratio)

    # ------------------------------------------------------------------ backward

    def _exchange_backward(self, grad: torch.Tensor, call: _SeqCall, num_local_rows: int) -> torch.Tensor:
        """The gradient of ``local_embs`` from the gradient of the received rows ([ids of this rank's batch, D])."""
        me, world = self._rank, self._pg.size()
        grad = grad.contiguous().float()
        dim, dev = grad.size(1), grad.device
        mode = BackwardCompression(self._config.backward)
        recv_total = [sum(r) for r in call.recv_rows]  # rows of each source's block in grad
        send_total = [sum(r) for r in call.send_rows]  # rows each destination sends back to this rank
        src = offsets(recv_total)
        own = grad[src[me] : src[me + 1]]
        others = [s for s in range(world) if s != me]
        timer = self._timer_for(grad) if call.on_record else PhaseTimer(grad.device)
        with timer.phase("backward_s", f"dlac sequence backward ({mode})"):
            block = torch.cat([grad[src[s] : src[s + 1]] for s in others]) if others else grad.new_zeros(0, dim)
            if mode is BackwardCompression.DLAC:
                rows = [r for s in others for r in call.recv_rows[s]]
                payload, chunk_sizes = encode_grid(block, offsets(rows), [0, dim],
                                                   eps=float(self._config.backward_eps), impl=self._config.impl)
                counts = [len(call.recv_rows[s]) for s in range(world)]
                per_dest = iter(chunk_sizes.split([counts[s] for s in others]))
                sizes = torch.cat([torch.zeros(counts[s], dtype=torch.int64) if s == me else next(per_dest)
                                   for s in range(world)])
                n_local = len(call.send_rows[me])
                recv_sizes = torch.empty(world * n_local, dtype=torch.int64, device=dev)
                dist.all_to_all_single(recv_sizes, sizes.to(dev), output_split_sizes=[n_local] * world,
                                       input_split_sizes=counts, group=self._pg)
                recv_sizes = recv_sizes.cpu()
                send_bytes = [int(s.sum()) for s in sizes.split(counts)]
                recv_bytes = [int(s.sum()) for s in recv_sizes.split([n_local] * world)]
                received = torch.empty(sum(recv_bytes), dtype=torch.uint8, device=dev)
                dist.all_to_all_single(received, payload.to(dev), output_split_sizes=recv_bytes,
                                       input_split_sizes=send_bytes, group=self._pg)
                keep = torch.cat([recv_sizes[j * n_local : (j + 1) * n_local] for j in others]) if others else \
                    recv_sizes[:0]
                back_rows = [r for j in others for r in call.send_rows[j]]
                try:
                    back = decode_grid(received, keep, offsets(back_rows), [0, dim], impl=self._config.impl).to(dev)
                except CodecError as err:
                    raise CompressedExchangeError(
                        f"rank {me}: sequence-embedding gradients for tables {self.local_tables} failed to decode"
                        f" ({err})."
                    ) from err
                sent = int(payload.numel()) + (world - 1) * n_local * 8
            else:
                wire_dtype = _WIRE[mode]
                wire = block.to(wire_dtype)
                size = wire.element_size()
                received = torch.empty(sum(send_total) - send_total[me], dim, dtype=wire_dtype, device=dev)
                send_splits = [0 if s == me else recv_total[s] * dim * size for s in range(world)]
                recv_splits = [0 if j == me else send_total[j] * dim * size for j in range(world)]
                dist.all_to_all_single(received.view(torch.uint8).view(-1), wire.view(torch.uint8).view(-1),
                                       output_split_sizes=recv_splits, input_split_sizes=send_splits, group=self._pg)
                back = received.float()
                sent = int(wire.numel()) * size
            before = sum(send_total[:me])
            grad_sent_order = torch.cat([back[:before], own, back[before:]])
            out = grad.new_zeros(num_local_rows, dim)
            out.index_copy_(0, call.gather, grad_sent_order)
            if comm_ops.get_gradient_division():
                out /= world
        if call.on_record:
            s = self._stats
            s.backward_calls += 1
            s.backward_raw_bytes += int(block.numel()) * 4
            s.backward_sent_bytes += sent
        return out

    # ------------------------------------------------------------------ timing

    def _timer_for(self, t: torch.Tensor) -> PhaseTimer:
        if self._timer is None:
            self._timer = PhaseTimer(t.device)
        return self._timer

    def _fold_times(self) -> dict[str, float]:
        times = self._timer.collect() if self._timer is not None else {}
        for name, seconds in times.items():
            setattr(self._stats, name, getattr(self._stats, name) + seconds)
        return times


class _SequenceExchange(torch.autograd.Function):
    """Forward: the compressed sequence-embedding exchange. Backward: the gradient exchange back to the owners."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: CompressedSequenceEmbeddingsAllToAll, call: _SeqCall):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.call, ctx.rows, ctx.dtype = a2a, call, local_embs.size(0), local_embs.dtype
        return a2a._exchange_forward(local_embs, call).to(local_embs.dtype)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        grad = ctx.a2a._exchange_backward(grad_output, ctx.call, ctx.rows)
        return grad.to(ctx.dtype), None, None
