"""Settings of the compressed all-to-all: :class:`CompressionConfig`, the exchange's own, and
:class:`CompressionOptions`, a trainer's (the exchange's, whether to install it, the bound every table starts from).
The per-table bounds themselves are :class:`~lightning_dlac.adaptive.ErrorBounds`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from lightning_dlac.adaptive.bounds import check_relative_bound
from lightning_dlac.checks import check_count, parse_enum
from lightning_dlac.comm.peers import PeerPolicy, check_policy


class BackwardCompression(str, Enum):
    """How the gradient all-to-all (backward of the pooled-embedding exchange) is sent."""

    FP32 = "fp32"  # uncompressed, exactly TorchRec's backward
    BF16 = "bf16"  # fixed-size cast, as TorchRec's qcomm BF16 codec
    FP16 = "fp16"  # fixed-size cast, as TorchRec's qcomm FP16 codec
    DLAC = "dlac"  # error-bounded DLAC codec with its own bound

    def __str__(self) -> str:
        return self.value

    @property
    def wire_dtype(self) -> torch.dtype | None:
        """The dtype a fixed-size encoding sends (``None`` for ``dlac``, whose size depends on the data)."""
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(self.value)


@dataclass
class CompressionConfig:
    """How the pooled-embedding all-to-all is compressed.

    The forward exchange's bounds are not here: they live in :class:`ErrorBounds`, which the policy updates.

    Args:
        backward: Gradient exchange: ``fp32``, ``bf16``, ``fp16`` or ``dlac``.
        backward_eps: Relative error bound of the gradient exchange when ``backward="dlac"``.
        error_every: Measure the observed max error / bound every this many calls (one extra decode on the sender);
            0 turns the measurement off.
        impl: Codec implementation: ``auto`` (native kernels, falling back to the reference), ``native`` or ``ref``.
        auto_fallback: The uncompressed fallback: time the compressed and the uncompressed exchange (forward and
            gradients; uncompressed is float32 both ways) and send uncompressed while that is faster (a fast link, a
            slow codec).
        fallback_check_every: With ``auto_fallback``, calls between checks of the way not taken (more while the two
            ways' times differ a lot, see :class:`~lightning_dlac.comm.fallback.UncompressedFallback`).
        overlap: Launch each payload exchange and return, waiting for it (and decoding) only when its result is
            needed, as TorchRec's request / wait pair; ``False`` waits at once (the synchronous path). ``None``
            (default): overlapped on NCCL, synchronous on gloo, where the loopback or TCP transfer is CPU work that
            competes with the step's compute (the paired CPU launches: docs/benchmarks.md, 'Why the gloo default
            is synchronous').
        pieces: How many pieces the synchronous exchange sends (:mod:`lightning_dlac.comm.pieces`): every rank's
            tables cut into this many groups of about equal width, so that the codec encodes one piece (and
            decodes another) while a third is on the wire; the result is the same, bit for bit. Default 1 (the
            exchange whole): each piece adds a meeting of the ranks, so pieces pay only where the transfer is long
            next to the codec (pieces against the whole exchange on throttled links: docs/benchmarks.md, 'Sending
            the exchange in pieces'). The overlapped path (``overlap``) and the cast gradient exchanges send one
            piece.
        compress_peers: Which peers' payloads are compressed (:mod:`lightning_dlac.comm.peers`): ``"auto"``
            (default: only those to other nodes when the job spans several nodes on NCCL, every peer's on one node
            or on gloo),
            ``"all"``, ``"other_nodes"``, or a function ``(src, dst) -> bool`` (or its import path). The others go
            as float32, exactly, in both directions.

    Raises:
        ValueError: If a field is out of range or not one of its choices (the message names it and what it takes).
    """

    backward: BackwardCompression | str = BackwardCompression.BF16  # gradient exchange encoding
    backward_eps: float = 0.01  # relative bound of the gradient exchange with backward="dlac"
    error_every: int = 10  # observed-error measurement period, in calls (0 = never)
    impl: str = "auto"  # codec implementation: auto | native | ref
    auto_fallback: bool = False  # send uncompressed while that is faster
    fallback_check_every: int = 64  # calls between checks of the way not taken
    overlap: bool | None = None  # wait for a launched exchange only when needed; None: on NCCL only
    compress_peers: PeerPolicy = "auto"  # which peers' payloads are compressed: auto | all | other_nodes | (s, d)
    pieces: int = 1  # pieces the synchronous exchange is sent in (1: whole)

    def __post_init__(self) -> None:
        self.backward_eps = check_relative_bound(self.backward_eps, "backward_eps")
        self.backward = parse_enum(BackwardCompression, self.backward, "backward")
        if self.error_every < 0:
            raise ValueError(f"error_every={self.error_every} must be >= 0 (0 disables the measurement).")
        self.fallback_check_every = check_count(self.fallback_check_every, "fallback_check_every", 1)
        self.compress_peers = check_policy(self.compress_peers)
        self.pieces = check_count(self.pieces, "pieces", 1)
        if self.impl not in ("auto", "native", "ref"):
            raise ValueError(f"impl={self.impl!r} is not supported; choose 'auto', 'native' or 'ref'.")


@dataclass
class CompressionOptions(CompressionConfig):
    """How a trainer compresses the embedding all-to-all (``DLACStrategy(compression=...)``).

    It is a :class:`CompressionConfig` (the exchange's settings, every field of it) plus whether the compressed exchange
    is installed at all and the bound every table starts from. ``DLACStrategy(compression=CompressionOptions(...))``
    takes it, and in YAML its fields go under ``init_args.compression``. The strategy installs the exchange with it (it
    is a :class:`CompressionConfig`) and starts its :class:`~lightning_dlac.adaptive.ErrorBounds` at ``eps``; a plain
    training loop does the same with ``install_compressed_all_to_all(dmp, options, ErrorBounds(options.eps))``. The
    fields not listed below are :class:`CompressionConfig`'s, with its defaults.

    Args:
        enabled: Install the compressed exchange. ``False`` keeps TorchRec's uncompressed all-to-all exactly (A/B
            runs; the other fields then do nothing). With ``auto_fallback`` the exchange also sends uncompressed
            while that is faster.
        eps: Relative error bound of every table until a policy (``DLACCallback``) sets per-table bounds.

    Raises:
        ValueError: If a field is out of range, ``enabled`` is not a bool, or ``auto_fallback`` is set without
            ``enabled``.
    """

    enabled: bool = True  # install the compressed exchange; False: TorchRec's uncompressed all-to-all exactly
    eps: float = 0.01  # relative error bound of every table until a policy sets per-table bounds

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled={self.enabled!r} must be true or false (auto_fallback=True for the fallback).")
        self.eps = check_relative_bound(self.eps, "eps")
        if self.auto_fallback and not self.enabled:
            raise ValueError(
                "auto_fallback=True needs enabled=True: the fallback chooses between the compressed and the"
                " uncompressed exchange, and enabled=False installs no compressed one. Drop one of the two."
            )
