"""What benchmarks/e2e_bandwidth.py compares DLAC's exchange with, besides TorchRec's float32: TorchRec's qcomm codecs
(wrapped to count their bytes), a zero-cost stand-in that sends 1/8 of the elements, and a zero-cost stand-in that
sends exactly the bytes a DLAC launch sent (the ceilings of fixed 8x compression and of DLAC at its own ratios)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch


class ZeroCost8xCodec:
    """TorchRec QuantizedCommCodec that sends the first 1/8 of the elements and decodes by padding with zeros.

    It costs nothing to encode or decode, so it is the ceiling any fixed 8x compression of this exchange could reach.
    Its values are garbage (7/8 zeros): the loss stays finite but the model does not learn the tables.
    """

    def encode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        flat = input_tensor.reshape(-1)
        return flat[: self.calc_quantized_size(flat.numel())].clone()

    def decode(self, input_grad: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        return torch.nn.functional.pad(input_grad.reshape(-1), (0, 7 * input_grad.numel()))

    @property
    def quantized_dtype(self) -> torch.dtype:
        return torch.float32

    def calc_quantized_size(self, input_len: int, ctx: Any = None) -> int:
        return math.ceil(input_len / 8)

    def create_context(self) -> Any:
        return None

    def padded_size(
        self, input_tensor: torch.Tensor, dim_per_rank: list[int], my_rank: int, qcomm_ctx: Any
    ) -> tuple[int, int]:
        # ceil(n / 8) per chunk must add up to ceil(N / 8) of the whole buffer: every chunk is B_rank x D rows.
        if any(d % 8 for d in dim_per_rank):
            raise ValueError(f"ZeroCost8xCodec needs every rank's dim sum to be a multiple of 8, got {dim_per_rank}.")
        return input_tensor.shape[1], 0


class CountingCodec:
    """Wraps a TorchRec QuantizedCommCodec and counts the float32 bytes it was given and the bytes it produced."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.raw_bytes = 0
        self.sent_bytes = 0
        self.codec_s = 0.0

    def reset(self) -> None:
        self.calls, self.raw_bytes, self.sent_bytes, self.codec_s = 0, 0, 0, 0.0

    def encode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.encode(input_tensor, ctx)
        self.codec_s += time.perf_counter() - t0
        self.calls += 1
        self.raw_bytes += input_tensor.numel() * input_tensor.element_size()
        self.sent_bytes += out.numel() * out.element_size()
        return out

    def decode(self, input_grad: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.decode(input_grad, ctx)
        self.codec_s += time.perf_counter() - t0
        return out

    @property
    def quantized_dtype(self) -> torch.dtype:
        # torchrec 1.8's NoOpQuantizedCommCodec defines quantized_dtype as a method, its other codecs as a property.
        dtype = self.inner.quantized_dtype
        return dtype() if callable(dtype) else dtype

    def calc_quantized_size(self, input_len: int, ctx: Any = None) -> int:
        return self.inner.calc_quantized_size(input_len, ctx)

    def create_context(self) -> Any:
        return self.inner.create_context()

    def padded_size(self, input_tensor: torch.Tensor, dim_per_rank: list[int], my_rank: int, qcomm_ctx: Any) -> Any:
        return self.inner.padded_size(input_tensor, dim_per_rank, my_rank, qcomm_ctx)


def _codecs_registry(variant: Any) -> tuple[dict[str, Any] | None, CountingCodec | None, CountingCodec | None]:
    """The qcomm_codecs_registry for the sharder of an e2e_bandwidth ``Variant`` (its ``kind``, ``forward`` and
    ``backward``), and the counting wrappers of the pooled all-to-all codecs."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp, NoOpQuantizedCommCodec, QuantizedCommCodecs

    if variant.kind == "qcomm":
        precision = {"fp16": CommType.FP16, "int8": CommType.INT8, "bf16": CommType.BF16, "fp32": CommType.FP32}
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=precision[variant.forward], backward_precision=precision[variant.backward])
        )
    elif variant.kind == "zero":
        backward = ZeroCost8xCodec() if variant.backward == "zero8" else NoOpQuantizedCommCodec()
        registry = {CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name: QuantizedCommCodecs(ZeroCost8xCodec(), backward)}
    else:
        return None, None, None
    key = CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name
    fwd, bwd = CountingCodec(registry[key].forward), CountingCodec(registry[key].backward)
    registry[key] = QuantizedCommCodecs(forward=fwd, backward=bwd)
    return registry, fwd, bwd


class ZeroCostSameBytesExchange(torch.nn.Module):
    """Stand-in for the compressed all-to-all that sends, per step and per rank, exactly the bytes a DLAC launch
    sent (its mean per step, both directions: the int64 size exchange, then the payload) and costs nothing to
    encode or decode: the ceiling of DLAC at its own compression ratios.

    Like DLAC, a rank keeps its own rows exactly and sends nothing for them; every other column arrives as zeros
    (garbage, as the zero-cost 8x stand-in's): the loss stays finite, the tables do not learn.

    Args:
        pg: Process group.
        dims_per_rank: Column block dims per rank (the output dist's layout).
        callbacks: The output dist's callbacks, applied on ``wait()``.
        fwd_bytes: Per rank: forward bytes it sends per step (size exchange included), split evenly over the others.
        bwd_bytes: The same for the gradient exchange.
    """

    def __init__(self, pg: Any, dims_per_rank: list[list[int]], callbacks: list[Any], fwd_bytes: list[int],
                 bwd_bytes: list[int]) -> None:
        import torch.distributed as dist

        super().__init__()
        self.pg, self.rank, self.world = pg, dist.get_rank(pg), dist.get_world_size(pg)
        self.dim_sums = [sum(d) for d in dims_per_rank]
        self.n_local = [len(d) for d in dims_per_rank]
        self.callbacks = list(callbacks or [])
        self.fwd_bytes, self.bwd_bytes = fwd_bytes, bwd_bytes
        self.sent = {"fwd": 0, "bwd": 0}

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None) -> Any:
        from torchrec.distributed.dist_data import PooledEmbeddingsAwaitable
        from torchrec.distributed.types import Awaitable

        class Ready(Awaitable[torch.Tensor]):
            def _wait_impl(self) -> torch.Tensor:
                return out

        if not batch_size_per_rank:
            batch_size_per_rank = [local_embs.size(0) // self.world] * self.world
        out = _ZeroCostSameBytesFn.apply(local_embs, self, list(batch_size_per_rank))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=Ready())
        awaitable.callbacks.extend(self.callbacks)
        return awaitable

    def send(self, per_rank_bytes: list[int], n_sizes: list[int], direction: str) -> None:
        """One size exchange and one payload exchange with DLAC's byte counts (forward: a rank sends one size per
        local table to each other rank; backward: one per destination's table)."""
        import torch.distributed as dist

        me, world = self.rank, self.world
        others = world - 1
        if not others:
            return
        # Sizes: forward, rank s sends n_local[s] int64 to each other rank; backward, it sends n_local[d] to rank d.
        size_out = [0 if d == me else (n_sizes[me] if direction == "fwd" else n_sizes[d]) for d in range(world)]
        size_in = [0 if s == me else (n_sizes[s] if direction == "fwd" else n_sizes[me]) for s in range(world)]
        sizes_recv = torch.empty(sum(size_in), dtype=torch.int64)
        dist.all_to_all_single(sizes_recv, torch.zeros(sum(size_out), dtype=torch.int64), size_in, size_out,
                               group=self.pg)

        def payload(src: int) -> int:  # bytes rank src sends to each other rank, its size exchange taken out
            size_bytes = (n_sizes[src] if direction == "fwd" else sum(n_sizes) - n_sizes[src]) * 8
            return max(0, per_rank_bytes[src] - size_bytes) // others

        out_splits = [0 if d == me else payload(me) for d in range(world)]
        in_splits = [0 if s == me else payload(s) for s in range(world)]
        received = torch.empty(sum(in_splits), dtype=torch.uint8)
        dist.all_to_all_single(received, torch.zeros(sum(out_splits), dtype=torch.uint8), in_splits, out_splits,
                               group=self.pg)
        self.sent[direction] += sum(out_splits) + sum(size_out) * 8


class _ZeroCostSameBytesFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: ZeroCostSameBytesExchange, batch_size_per_rank: list[int]):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.batch_size_per_rank = a2a, batch_size_per_rank
        a2a.send(a2a.fwd_bytes, a2a.n_local, "fwd")
        me = a2a.rank
        first_row, first_col = sum(batch_size_per_rank[:me]), sum(a2a.dim_sums[:me])
        out = local_embs.new_zeros(batch_size_per_rank[me], sum(a2a.dim_sums))
        out[:, first_col : first_col + a2a.dim_sums[me]] = local_embs[first_row : first_row + batch_size_per_rank[me]]
        return out

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        a2a, batch_size_per_rank = ctx.a2a, ctx.batch_size_per_rank
        a2a.send(a2a.bwd_bytes, a2a.n_local, "bwd")
        me = a2a.rank
        first_row, first_col = sum(batch_size_per_rank[:me]), sum(a2a.dim_sums[:me])
        grad = grad_output.new_zeros(sum(batch_size_per_rank), a2a.dim_sums[me])
        grad[first_row : first_row + batch_size_per_rank[me]] = grad_output[:, first_col : first_col + a2a.dim_sums[me]]
        return grad, None, None


def _install_zero_cost_same_bytes(model: torch.nn.Module, fwd_bytes: list[int],
                                  bwd_bytes: list[int]) -> list[ZeroCostSameBytesExchange]:
    """Put a :class:`ZeroCostSameBytesExchange` where install_compressed_all_to_all puts DLAC's exchange."""
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingDist

    installed = []
    for sebc in model.modules():
        if isinstance(sebc, ShardedEmbeddingBagCollection):
            for dist_module in sebc._output_dists:
                if type(dist_module) is TwPooledEmbeddingDist:
                    a2a = ZeroCostSameBytesExchange(dist_module._pg, dist_module._emb_dim_per_rank_per_feature,
                                                    dist_module._callbacks, fwd_bytes, bwd_bytes)
                    dist_module._dist = a2a
                    installed.append(a2a)
    if len(installed) != 1:
        raise RuntimeError(f"zero_same_ratio expects one table-wise output dist, found {len(installed)}: DLAC's"
                           " per-step bytes are per model, not per dist.")
    return installed


