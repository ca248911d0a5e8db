"""What the benchmarks compare DLAC's exchange with on TorchRec's own path, besides its float32: TorchRec's qcomm codecs
(wrapped to count their bytes; a Lightning run gives the registry to its sharders through
``ShardingOptions(qcomm_codecs_registry=...)``) and a zero-cost codec that sends 1/8 of the elements (the ceiling of a
fixed 8x compression there). DLAC's own ceiling runs inside DLAC's exchange: the null codec,
lightning_dlac/comm/null_codec.py."""

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


def codec_precision(codec: CountingCodec | None) -> str | None:
    """The precision a counted qcomm codec sends (``fp16``, ``mx4``, ...; ``None`` for another codec)."""
    precision = getattr(getattr(codec, "inner", None), "_comm_precision", None)
    return None if precision is None else str(getattr(precision, "value", precision))


def codecs_registry(variant: Any) -> tuple[dict[str, Any] | None, CountingCodec | None, CountingCodec | None]:
    """The qcomm_codecs_registry for the sharder of an end-to-end ``Variant`` (benchmarks/lib/e2e.py: its ``kind``,
    ``forward`` and ``backward``), and the counting wrappers of the pooled all-to-all codecs."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp, NoOpQuantizedCommCodec, QuantizedCommCodecs

    if variant.kind == "qcomm":
        # TorchRec's own choices for the device the run is on (the CPU), its fallbacks included: on gloo a BF16
        # backward becomes FP16 (the codec's precision that ran is recorded with each launch).
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=CommType(variant.forward), backward_precision=CommType(variant.backward)),
            device=torch.device("cpu"),
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
