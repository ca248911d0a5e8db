"""Public codec functions: validate inputs, then dispatch to the reference or the native kernels."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence

import torch
from torch.profiler import record_function

from lightning_dlac.codec import reference as ref
from lightning_dlac.codec._loader import resolve_impl
from lightning_dlac.codec.format import HEADER, HEADER_SIZE, MAGIC, MAX_CHUNK_ELEMENTS, CodecError, Mode, parse_header

Splits = torch.Tensor | Sequence[int]
Bounds = torch.Tensor | Sequence[float] | float


# ----------------------------------------------------------------------------------------------------------------
# Which implementation ran: counters that only grow
# ----------------------------------------------------------------------------------------------------------------

_calls: dict[str, dict[str, int]] = {"native": {"encode": 0, "decode": 0}, "ref": {"encode": 0, "decode": 0}}
_calls_lock = threading.Lock()


def _count(impl: str, op: str) -> None:
    with _calls_lock:
        _calls[impl][op] += 1


def impl_calls() -> dict[str, dict[str, int]]:
    """How many encode and decode calls each implementation has run in this process.

    :func:`encode` and :func:`encode_grid` count as ``encode``, :func:`decode` and :func:`decode_grid` as
    ``decode``, under the implementation ``impl`` resolved to (``"auto"`` and ``DLAC_CODEC_IMPL`` included), once
    their inputs are validated. The counters only grow: take a snapshot before the work and subtract. They say which
    codec actually ran, e.g. that a run meant to use the native kernels did not quietly fall back to the reference.

    Returns:
        A snapshot, ``{"native": {"encode": n, "decode": n}, "ref": {"encode": n, "decode": n}}``.
    """
    with _calls_lock:
        return {impl: dict(ops) for impl, ops in _calls.items()}



def encode(x: torch.Tensor, eps: float | None = None, abs_eb: float | None = None, impl: str = "auto") -> torch.Tensor:
    """Encode a 2-D float32 chunk with a relative (``eps``) or absolute (``abs_eb``) bound into a uint8 buffer.

    Args:
        x: The chunk, 2-D float32 ``[rows, dim]``, at most ``MAX_CHUNK_ELEMENTS`` elements.
        eps: Relative bound, a fraction of the chunk's value range (``0 < eps < 1``); give it or ``abs_eb``.
        abs_eb: Absolute bound (``> 0``) instead of ``eps``.
        impl: ``"auto"`` | ``"ref"`` | ``"native"``.

    Returns:
        The encoded chunk, a 1-D uint8 tensor that :func:`decode` reads.

    Raises:
        TypeError: If ``x`` is not a float32 tensor, or the bound is not a number.
        ValueError: If ``x`` is not 2-D or is too large for one chunk, if not exactly one of ``eps`` and ``abs_eb``
            is given, if the bound is not finite and positive (a relative one: below 1), or if ``impl`` is not
            ``"auto"``, ``"ref"`` or ``"native"``.
        NativeUnavailable: If ``impl="native"`` (or ``DLAC_CODEC_IMPL=native``) and the native kernels do not build.
    """
    ref.check_chunk(x)
    bound, relative = ref.check_scalar_bound(eps, abs_eb)
    impl = resolve_impl(impl)
    x = _placed(x, impl)
    rows, dim = x.shape
    ref._check_chunk_size(rows, dim, "x")
    _count(impl, "encode")
    with record_function("## dlac encode ##"):
        if impl == "native":
            bounds = torch.tensor([bound], dtype=torch.float32)
            return torch.ops.dlac.encode_grid(x, [0, rows], [0, dim], bounds, relative)[0]
        return ref.encode_chunk(x, bound, relative)


def decode(buf: torch.Tensor | bytes, impl: str = "auto") -> torch.Tensor:
    """Decode one buffer made by :func:`encode` to a float32 [rows, dim] tensor.

    Args:
        buf: The buffer, a 1-D uint8 tensor or bytes.
        impl: ``"auto"`` | ``"ref"`` | ``"native"``.

    Returns:
        The decoded chunk, float32 ``[rows, dim]``.

    Raises:
        TypeError: If ``buf`` is neither bytes nor a 1-D uint8 tensor.
        ValueError: If ``impl`` is not ``"auto"``, ``"ref"`` or ``"native"``.
        CodecError: If the buffer is truncated, corrupted or not a DLAC buffer.
        NativeUnavailable: If ``impl="native"`` (or ``DLAC_CODEC_IMPL=native``) and the native kernels do not build.
    """
    impl = resolve_impl(impl)
    buf = _as_buffer(buf, "buf", impl)
    _count(impl, "decode")
    with record_function("## dlac decode ##"):
        if impl == "native":
            n = buf.numel()
            if n < HEADER_SIZE:
                raise CodecError(f"buffer: {n} bytes is shorter than the {HEADER_SIZE}-byte DLAC header (truncated?)")
            fields = HEADER.unpack_from(buf[:HEADER_SIZE].cpu().numpy().tobytes())
            if fields[0] != MAGIC:
                raise CodecError(f"buffer: not a DLAC buffer (magic {fields[0]!r}, expected {MAGIC!r})")
            rows, dim = fields[7], fields[8]
            if rows * dim > MAX_CHUNK_ELEMENTS:
                raise CodecError(f"buffer: {rows}x{dim} exceeds the {MAX_CHUNK_ELEMENTS}-element chunk limit")
            sizes = torch.tensor([n], dtype=torch.int64)
            try:
                return _native_decode(buf, sizes, [0, rows], [0, dim])
            except CodecError as err:
                # The native op decodes a 1x1 grid; name the buffer as the reference does, not "chunk 0".
                raise CodecError(str(err).replace("chunk 0 (row block 0, column block 0)", "buffer", 1)) from None
        return ref.decode_chunk(buf)


def encode_grid(
    x: torch.Tensor,
    row_splits: Splits,
    col_splits: Splits,
    eps: Bounds | None = None,
    abs_eb: Bounds | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode every block x[row_splits[r]:row_splits[r+1], col_splits[c]:col_splits[c+1]] as its own chunk.

    Args:
        x: 2-D float32 tensor.
        row_splits: Row block boundaries [0, ..., rows] (one row block per destination rank).
        col_splits: Column block boundaries [0, ..., dim] (one column block per table).
        eps: Relative bound per column block (float32 [num_col_blocks], or one number for all); 0 sends raw.
        abs_eb: Absolute bound per column block instead of ``eps``; 0 sends raw.
        impl: ``"auto"`` | ``"ref"`` | ``"native"``.

    Returns:
        (payload, sizes): the chunks concatenated in row-block-major order as a 1-D uint8 tensor, and each chunk's
        size in bytes (int64 [num_row_blocks * num_col_blocks]). With the native kernels, both are on x's device
        (the CUDA kernels encode where x is); the reference encodes a host copy and returns CPU tensors.

    Raises:
        TypeError: If ``x`` is not a float32 tensor, or the splits or bounds are not integers / floating point.
        ValueError: If ``x`` is not 2-D, the splits do not run from 0 to its shape, a block is too large for one
            chunk, not exactly one of ``eps`` and ``abs_eb`` is given, a bound is negative, not finite or (a
            relative one) not below 1, or ``impl`` is not ``"auto"``, ``"ref"`` or ``"native"``.
        NativeUnavailable: If ``impl="native"`` (or ``DLAC_CODEC_IMPL=native``) and the native kernels do not build.
    """
    ref.check_chunk(x)
    impl = resolve_impl(impl)
    x = _placed(x, impl)
    rs = ref.check_splits(row_splits, x.shape[0], "row_splits")
    cs = ref.check_splits(col_splits, x.shape[1], "col_splits")
    bounds, relative = ref.check_grid_bounds(eps, abs_eb, len(cs) - 1)
    for r in range(len(rs) - 1):
        for c in range(len(cs) - 1):
            ref._check_chunk_size(rs[r + 1] - rs[r], cs[c + 1] - cs[c], f"block ({r}, {c})")
    _count(impl, "encode")
    with record_function("## dlac encode ##"):
        if impl == "native":
            return torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)
        return ref.encode_grid(x, rs, cs, bounds, relative)


def decode_grid(
    payload: torch.Tensor, sizes: torch.Tensor | Sequence[int], row_splits: Splits, col_splits: Splits,
    impl: str = "auto", out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode an :func:`encode_grid` payload into a float32 [row_splits[-1], col_splits[-1]] tensor.

    The result is on the payload's device with the native kernels (CUDA payloads decode on the GPU), else on the
    CPU. With ``out`` (a float32 tensor of that shape whose columns are contiguous, any row stride: e.g. a block of
    columns of a larger tensor), the chunks are decoded into it and ``out`` is returned: the same values, without a
    tensor to copy from (the native CPU kernel writes there directly; the reference, and a device without kernels,
    decode and copy). After an error ``out``'s contents are unspecified.

    Args:
        payload: The chunks, a 1-D uint8 tensor (or bytes) as :func:`encode_grid` returned them.
        sizes: Each chunk's size in bytes, in payload order (row-block-major).
        row_splits: Row block boundaries [0, ..., rows], as given to :func:`encode_grid`.
        col_splits: Column block boundaries [0, ..., dim], as given to :func:`encode_grid`.
        impl: ``"auto"`` | ``"ref"`` | ``"native"``.
        out: Where to decode to (see above); ``None`` allocates the result.

    Returns:
        The decoded float32 ``[rows, dim]`` tensor (``out`` where given).

    Raises:
        TypeError: If ``payload`` is neither bytes nor a 1-D uint8 tensor, or the splits are not integers.
        ValueError: If ``sizes`` does not hold one integer per chunk, the splits are not split points, ``out`` is
            not a float32 tensor of the result's shape with contiguous columns, or ``impl`` is not ``"auto"``,
            ``"ref"`` or ``"native"``.
        CodecError: If the sizes do not add up to the payload, a chunk's shape does not match its block, or a chunk
            is corrupted; the message names the chunk.
        NativeUnavailable: If ``impl="native"`` (or ``DLAC_CODEC_IMPL=native``) and the native kernels do not build.
    """
    impl = resolve_impl(impl)
    payload = _as_buffer(payload, "payload", impl)
    rs = ref.check_splits(row_splits, _last(row_splits), "row_splits")
    cs = ref.check_splits(col_splits, _last(col_splits), "col_splits")
    nchunks = (len(rs) - 1) * (len(cs) - 1)
    sz = torch.as_tensor(sizes)
    if sz.is_floating_point() or sz.dim() != 1 or sz.numel() != nchunks:
        raise ValueError(f"sizes must be a 1-D integer tensor with one entry per chunk ({nchunks}), got {sz.shape}")
    sz = sz.to("cpu", torch.int64).contiguous()
    if bool((sz < 0).any()) or int(sz.sum()) != payload.numel():
        raise CodecError(
            f"chunk sizes sum to {int(sz.sum())} bytes but the payload holds {payload.numel()} (truncated payload?)"
        )
    if out is not None:
        _check_out(out, rs[-1], cs[-1])
    _count(impl, "decode")
    with record_function("## dlac decode ##"):
        if impl == "native":
            if out is None:
                return _native_decode(payload, sz, rs, cs)
            if out.device == payload.device:
                _native_decode(payload, sz, rs, cs, out)
            else:  # a payload placed on the host (a device without kernels): decode there, then copy
                out.copy_(_native_decode(payload, sz, rs, cs))
            return out
        if out is None or out.device.type == "cpu":
            return ref.decode_grid(payload, sz.tolist(), rs, cs, out)
        return out.copy_(ref.decode_grid(payload, sz.tolist(), rs, cs))


def cast_column_blocks(x: torch.Tensor, col_splits: Splits, out: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Cast the column blocks of ``x``, each flattened row by row and laid one after the other, into ``out``.

    ``out`` gets the bits of ``torch.cat([x[:, a:b].reshape(-1), ...]).to(out.dtype)`` (a NaN's payload bits aside).
    The native CPU kernel (``dlac::cast_column_blocks``) does it in one pass over ``x``, row by row; the reference,
    and a tensor off the CPU, copy each block with ``copy_``.

    Args:
        x: 2-D float32 tensor, columns contiguous.
        col_splits: Column block boundaries [0, ..., dim]: block ``c`` is ``col_splits[c]:col_splits[c + 1]``.
        out: A contiguous 1-D bfloat16 or float16 tensor of ``x.numel()`` elements on ``x``'s device.
        impl: ``"auto"`` | ``"ref"`` | ``"native"``.

    Returns:
        ``out``.

    Raises:
        TypeError: If the splits are not integers.
        ValueError: If ``x`` is not 2-D float32 with contiguous columns, the splits are not split points of its
            columns, ``out`` is not as described above, or ``impl`` is not ``"auto"``, ``"ref"`` or ``"native"``.
        NativeUnavailable: If ``impl="native"`` (or ``DLAC_CODEC_IMPL=native``) and the native kernels do not build.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.dim() != 2:
        raise ValueError(f"x must be a 2-D float32 tensor, got {getattr(x, 'dtype', type(x))}")
    if x.size(1) > 1 and x.stride(1) != 1:
        raise ValueError("x's columns must be contiguous (column stride 1)")
    cs = ref.check_splits(col_splits, x.size(1), "col_splits")
    if (out.dtype not in (torch.bfloat16, torch.float16) or out.dim() != 1 or not out.is_contiguous()
            or out.numel() != x.numel() or out.device != x.device):
        raise ValueError(f"out must be a contiguous 1-D bfloat16 or float16 tensor of {x.numel()} elements on"
                         f" {x.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
    if resolve_impl(impl) == "native" and x.device.type == "cpu":
        torch.ops.dlac.cast_column_blocks(x, cs, out)
        return out
    rows = x.size(0)
    for a, b in zip(cs[:-1], cs[1:]):
        out[rows * a : rows * b].view(rows, b - a).copy_(x[:, a:b])
    return out


def _check_out(out: torch.Tensor, rows: int, cols: int) -> None:
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or tuple(out.shape) != (rows, cols):
        what = f"{out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out)
        raise ValueError(f"out must be a float32 [{rows}, {cols}] tensor, got {what}")
    if cols > 1 and out.stride(1) != 1:
        raise ValueError("out's columns must be contiguous (column stride 1)")


def _last(splits: Splits) -> int:
    try:
        return int(splits[-1])
    except (TypeError, IndexError, ValueError) as e:
        raise ValueError(f"split points must be a non-empty sequence of ints, got {splits!r}") from e


def device_kernels(device: torch.device | str) -> bool:
    """True if the loaded native library has kernels for tensors on ``device`` (CPU always; CUDA when the CUDA
    sources were built, i.e. torch has CUDA and a GPU was visible at build time)."""
    key = torch.device(device).type.upper()
    return key == "CPU" or all(
        torch._C._dispatch_has_kernel_for_dispatch_key(op, key) for op in ("dlac::encode_grid", "dlac::decode_grid")
    )


def _placed(x: torch.Tensor, impl: str) -> torch.Tensor:
    """x where the kernels can read it: in place when the native library has kernels for its device, else a host
    copy (the reference, or a device without kernels); callers move results back to their device."""
    x = x.detach()
    if x.device.type == "cpu" or (impl == "native" and device_kernels(x.device)):
        return x
    return x.cpu()


def _as_buffer(buf: torch.Tensor | bytes, name: str, impl: str = "ref") -> torch.Tensor:
    if isinstance(buf, (bytes, bytearray, memoryview)):
        return torch.frombuffer(bytearray(buf), dtype=torch.uint8) if len(buf) else torch.zeros(0, dtype=torch.uint8)
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
        is_tensor = isinstance(buf, torch.Tensor)
        what = f"{buf.dtype} tensor of shape {tuple(buf.shape)}" if is_tensor else type(buf).__name__
        raise TypeError(f"{name} must be a 1-D uint8 tensor (as returned by encode), got {what}")
    return _placed(buf, impl).contiguous()


def _native_decode(payload: torch.Tensor, sizes: torch.Tensor, rs: list[int], cs: list[int],
                   out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The native decoder (into ``out`` where given); its verdict on the bytes (a ValueError naming the chunk)
    becomes a CodecError. Anything else, a CUDA fault above all (torch.AcceleratorError, naming the kernels), is
    raised as it is: it says nothing about the payload."""
    try:
        if out is not None:
            return torch.ops.dlac.decode_grid_into(payload, sizes, rs, cs, out)
        return torch.ops.dlac.decode_grid(payload, sizes, rs, cs)
    except ValueError as e:
        msg = str(e).split("\nException raised from")[0]
        raise CodecError(msg) from None


# ----------------------------------------------------------------------------------------------------------------
# Statistics helpers
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChunkInfo:
    """What one encoded chunk is: mode, shape, sizes and quantization parameters (what :func:`inspect` returns).

    Args:
        mode: How the chunk's body is stored.
        rows: Rows of the chunk.
        dim: Columns of the chunk.
        raw_bytes: Its float32 size, ``4 * rows * dim``.
        compressed_bytes: Its encoded size, header included.
        min: The chunk's minimum, the quantization's origin.
        abs_eb: The absolute bound it was encoded with; 0 for CONST and RAW chunks (exact).
        step: The quantization step (``2 * abs_eb`` unless float32 rounding needed slack); 0 for CONST and RAW.
        nuniq: Unique rows of a DEDUP chunk, else 0.
    """

    mode: Mode
    rows: int
    dim: int
    raw_bytes: int  # 4 * rows * dim
    compressed_bytes: int  # header included
    min: float
    abs_eb: float  # 0 for CONST and RAW chunks (exact)
    step: float  # quantization step (2 * abs_eb unless float32 rounding needed slack), 0 for CONST and RAW
    nuniq: int  # unique rows of a DEDUP chunk, else 0

    @property
    def ratio(self) -> float:
        """The compression ratio, raw bytes over compressed bytes."""
        return self.raw_bytes / self.compressed_bytes


def inspect(buf: torch.Tensor | bytes, where: str = "buffer") -> ChunkInfo:
    """Describe one encoded chunk, validating its header and checksum.

    Args:
        buf: The chunk, a 1-D uint8 tensor or bytes.
        where: How error messages name the chunk.

    Returns:
        The chunk's :class:`ChunkInfo`.

    Raises:
        CodecError: If the header is truncated, corrupted or not a DLAC header.
    """
    data = buf.detach().cpu().contiguous().numpy().tobytes() if isinstance(buf, torch.Tensor) else bytes(buf)
    h = parse_header(data, where)
    return ChunkInfo(h.mode, h.rows, h.dim, 4 * h.rows * h.dim, len(data), h.min, h.abs_eb, h.step, h.nuniq)


def inspect_grid(payload: torch.Tensor, sizes: torch.Tensor | Sequence[int]) -> list[ChunkInfo]:
    """Describe every chunk of an :func:`encode_grid` payload, in payload order.

    Args:
        payload: The chunks, a 1-D uint8 tensor.
        sizes: Each chunk's size in bytes, in payload order.

    Returns:
        One :class:`ChunkInfo` per chunk.

    Raises:
        CodecError: If a chunk's header is invalid (the message names the chunk) or the sizes do not add up to the
            payload.
    """
    data = payload.detach().cpu().contiguous().numpy().tobytes()
    out = []
    off = 0
    for i, size in enumerate(torch.as_tensor(sizes).tolist()):
        out.append(inspect(data[off: off + size], f"chunk {i}"))
        off += size
    if off != len(data):
        raise CodecError(f"chunk sizes sum to {off} bytes but the payload holds {len(data)}")
    return out


def max_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Largest ``|x - x_hat|`` over the finite elements of ``x``, in float64.

    Args:
        x: The original tensor.
        x_hat: Its reconstruction, the same shape.

    Returns:
        The largest absolute error (0 for empty tensors); ``inf`` if a non-finite element of ``x`` did not come
        back exactly, or a finite one came back non-finite.

    Raises:
        ValueError: If the shapes differ.
    """
    if x.shape != x_hat.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(x_hat.shape)}")
    if x.numel() == 0:
        return 0.0
    x64, h64 = x.detach().double().cpu(), x_hat.detach().double().cpu()
    finite = torch.isfinite(x64)
    xs, hs = x64[~finite], h64[~finite]
    if not (torch.equal(xs.isnan(), hs.isnan()) and torch.equal(xs.nan_to_num(0.0), hs.nan_to_num(0.0))):
        return math.inf
    if not bool(torch.isfinite(h64[finite]).all()):
        return math.inf
    d = (x64[finite] - h64[finite]).abs()
    return float(d.max()) if d.numel() else 0.0

