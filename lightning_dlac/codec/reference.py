"""Pure PyTorch reference codec: the specification that the native kernels must match byte for byte.

Everything here is vectorized torch code (Python loops run over chunks, Huffman alphabets and doubling steps,
never over elements). The native CPU kernels in cuda_ext/ implement the same algorithm; tests compare payload bytes
and decoded tensors bit for bit. docs/codec.md describes the format and the arithmetic in words.
"""

from __future__ import annotations

import heapq
import math
import struct
from collections.abc import Sequence

import torch

from lightning_dlac.codec.format import (
    CRC_OFFSET,
    FLAG_SEC0_HUFF,
    FLAG_SEC1_HUFF,
    HEADER_SIZE,
    HUFF_BLOCK,
    HUFF_MAX_ALPHABET,
    HUFF_MAX_LEN,
    HUFF_SECTION_HEADER,
    MAX_CHUNK_ELEMENTS,
    MAX_QVALUE,
    STEP_FACTORS,
    CodecError,
    Header,
    Mode,
    bits_for,
    buffer_crc,
    ceil_div,
    pack_header,
    parse_header,
)

_F32 = torch.float32
_MAX_REL_EPS = 1.0  # a relative bound must be < 1: the whole range quantized to one step carries no information


# ----------------------------------------------------------------------------------------------------------------
# Input validation (shared with the dispatching API)
# ----------------------------------------------------------------------------------------------------------------


def check_chunk(x: torch.Tensor, name: str = "x") -> None:
    """Raise TypeError / ValueError unless ``x`` is a 2-D float32 tensor small enough to be one chunk."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != _F32:
        raise TypeError(f"{name} must be float32, got {x.dtype}; convert it with {name}.float()")
    if x.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D [rows, dim], got shape {tuple(x.shape)}; reshape it, e.g. {name}.reshape(-1, dim)"
        )


def _check_chunk_size(rows: int, dim: int, where: str) -> None:
    if rows * dim > MAX_CHUNK_ELEMENTS:
        raise ValueError(
            f"{where} has {rows}x{dim} = {rows * dim} elements, more than the {MAX_CHUNK_ELEMENTS} a chunk may hold; "
            "split it into more row blocks with encode_grid"
        )


def check_scalar_bound(eps: float | None, abs_eb: float | None) -> tuple[float, bool]:
    """Validate a chunk bound; return (bound as a float32 value, relative?)."""
    if (eps is None) == (abs_eb is None):
        raise ValueError("give exactly one error bound: eps=<relative, e.g. 0.01> or abs_eb=<absolute, e.g. 1e-3>")
    relative = eps is not None
    value = eps if relative else abs_eb
    name = "eps" if relative else "abs_eb"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single number for encode(); use encode_grid for per-block bounds")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v32 = _to_f32(float(value))
    if not math.isfinite(value) or not value > 0 or not v32 > 0 or not math.isfinite(v32):
        raise ValueError(f"{name}={value!r} is not a valid error bound: it must be a finite number > 0 in float32")
    if relative and value >= _MAX_REL_EPS:
        raise ValueError(
            f"eps={value!r} is a relative bound and must be < 1 (a fraction of the chunk's value range, e.g. 0.01); "
            "pass abs_eb= for an absolute bound"
        )
    return v32, relative


def check_grid_bounds(
    eps: torch.Tensor | Sequence[float] | float | None,
    abs_eb: torch.Tensor | Sequence[float] | float | None,
    num_col_blocks: int,
) -> tuple[torch.Tensor, bool]:
    """Validate per-column-block bounds; return (float32 CPU tensor [num_col_blocks], relative?). 0 means raw."""
    if (eps is None) == (abs_eb is None):
        raise ValueError(
            "give exactly one of eps= (relative bounds) or abs_eb= (absolute bounds), one per column block"
        )
    relative = eps is not None
    name = "eps" if relative else "abs_eb"
    value = eps if relative else abs_eb
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [float(value)] * num_col_blocks
    t = torch.as_tensor(value)
    if t.is_floating_point():
        t = t.detach().to("cpu", _F32)
    else:
        raise TypeError(f"{name} must hold floating-point bounds, got {t.dtype}")
    if t.dim() != 1 or t.numel() != num_col_blocks:
        raise ValueError(f"{name} must have one bound per column block ({num_col_blocks}), got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"{name} must be finite and >= 0 (0 sends the block raw), got {t.tolist()}")
    if relative and (t >= _MAX_REL_EPS).any():
        raise ValueError(f"relative bounds eps must be < 1 (e.g. 0.01), got {t.tolist()}; use abs_eb= for absolute")
    return t.contiguous(), relative


def check_splits(splits: torch.Tensor | Sequence[int], total: int, name: str) -> list[int]:
    """Validate split points [0, ..., total] (non-decreasing); return them as a list of ints."""
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.dim() != 1:
            raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints")
        out = [int(v) for v in splits.tolist()]
    else:
        try:
            out = [int(v) for v in splits]
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a sequence of ints, got {splits!r}") from e
    if len(out) < 2 or out[0] != 0 or out[-1] != total or any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(
            f"{name}={out} must be non-decreasing split points from 0 to {total} with at least one block, "
            f"e.g. [0, {total}]"
        )
    return out


def _to_f32(v: float) -> float:
    return torch.tensor(v, dtype=_F32).item()


# ----------------------------------------------------------------------------------------------------------------
# Quantization
# ----------------------------------------------------------------------------------------------------------------


def within(x: torch.Tensor, x_hat: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
    """Exact test of |x - x_hat| <= eb for float32 tensors (TwoSum: the float32 difference plus its rounding error)."""
    s = x - x_hat
    bb = s - x
    err = (x - (s - bb)) + ((-x_hat) - bb)
    a = s.abs()
    on_edge = (a == eb) & (((s > 0) & (err <= 0)) | ((s < 0) & (err >= 0)))
    return (a < eb) | on_edge


def quantize(x: torch.Tensor, bound: float, relative: bool):
    """Quantize one chunk.

    Returns ``(Mode.CONST, lo)``, ``(Mode.RAW, None)`` or ``(None, (lo, eb, step, codes))`` with int64 codes.
    """
    if x.numel() == 0:
        return Mode.CONST, 0.0
    if bound == 0.0 or not bool(torch.isfinite(x).all()):
        return Mode.RAW, None
    zero = torch.zeros((), dtype=_F32)
    lo = x.min() + zero  # + 0 turns -0.0 into +0.0, so the header does not depend on which zero min() returned
    hi = x.max() + zero
    if bool(lo == hi):
        return Mode.CONST, lo.item()
    b32 = torch.tensor(bound, dtype=_F32)
    eb = b32 * (hi - lo) if relative else b32
    if not (bool(torch.isfinite(eb)) and bool(eb > 0)):
        return Mode.RAW, None
    for k in STEP_FACTORS:
        step = eb * torch.tensor(k, dtype=_F32)
        if not (bool(torch.isfinite(step)) and bool(step > 0)):
            return Mode.RAW, None
        q = _quantize_with_step(x, lo, eb, step)
        if q is False:
            return Mode.RAW, None  # a value too far from min for 24-bit codes: smaller steps cannot help
        if q is not None:
            return None, (lo.item(), eb.item(), step.item(), q.to(torch.int64))
    return Mode.RAW, None


def _quantize_with_step(x: torch.Tensor, lo: torch.Tensor, eb: torch.Tensor, step: torch.Tensor):
    """Codes for one step (float32 tensor), None if some element cannot be held within eb, False on code overflow."""
    v = (x - lo) / step
    if not bool((v <= MAX_QVALUE).all()):
        return False
    q = torch.round(v)  # round half to even, exact in float32 below 2**23
    ok = within(x, lo + q * step, eb)
    if not bool(ok.all()):
        bad = ~ok
        xb, qb = x[bad], q[bad]
        down = qb - 1
        ok_down = (qb >= 1) & within(xb, lo + down * step, eb)
        up = qb + 1
        ok_up = within(xb, lo + up * step, eb)
        if not bool((ok_down | ok_up).all()):
            return None
        q[bad] = torch.where(ok_down, down, up)
    return q


# ----------------------------------------------------------------------------------------------------------------
# Lossless streams: PACK and HUFF
# ----------------------------------------------------------------------------------------------------------------

_BYTE_WEIGHTS = torch.tensor([1 << i for i in range(8)], dtype=torch.int64)


def _bits_to_bytes(bits: torch.Tensor) -> bytes:
    """LSB-first bit array (uint8 0/1, any length) -> bytes, zero padded to a whole byte."""
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, torch.zeros(pad, dtype=bits.dtype)])
    return (bits.view(-1, 8).to(torch.int64) * _BYTE_WEIGHTS).sum(1).to(torch.uint8).numpy().tobytes()


def _bytes_to_bits(data: bytes) -> torch.Tensor:
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    b = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    return ((b.unsqueeze(1) >> torch.arange(8)) & 1).to(torch.uint8).reshape(-1)


def pack_stream(vals: torch.Tensor, width: int) -> bytes:
    """Fixed-width packing: value i occupies bits [i*width, (i+1)*width) of an LSB-first bit stream."""
    if width == 0 or vals.numel() == 0:
        return b""
    bits = ((vals.reshape(-1, 1) >> torch.arange(width)) & 1).to(torch.uint8).reshape(-1)
    return _bits_to_bytes(bits)


def unpack_stream(data: bytes, n: int, width: int) -> torch.Tensor:
    if width == 0:
        return torch.zeros(n, dtype=torch.int64)
    bits = _bytes_to_bits(data)[: n * width].view(n, width).to(torch.int64)
    return (bits << torch.arange(width)).sum(1)


def huffman_lengths(freq: Sequence[int], max_len: int = HUFF_MAX_LEN) -> list[int]:
    """Deterministic length-limited Huffman code lengths (0 for unused symbols).

    1. Huffman tree with a min-heap keyed by (weight, id): leaves are ids 0..A-1 (the symbol), each merge pops the
       two smallest keys and pushes a new internal node with the next id A, A+1, ...
    2. The tree gives the number of codes per depth; if deeper than ``max_len``, the JPEG (Annex K.3) adjustment
       moves codes up until none is deeper.
    3. Lengths are handed out shortest first to the symbols sorted by (frequency descending, symbol ascending).
    A single used symbol gets length 1.
    """
    a = len(freq)
    used = [s for s in range(a) if freq[s] > 0]
    lens = [0] * a
    if len(used) == 1:
        lens[used[0]] = 1
        return lens
    heap = [(int(freq[s]), s) for s in used]
    heapq.heapify(heap)
    parent: dict[int, int] = {}
    next_id = a
    while len(heap) > 1:
        w1, n1 = heapq.heappop(heap)
        w2, n2 = heapq.heappop(heap)
        parent[n1] = parent[n2] = next_id
        heapq.heappush(heap, (w1 + w2, next_id))
        next_id += 1
    root = next_id - 1
    depth = {root: 0}
    for node in range(root - 1, a - 1, -1):  # internal nodes: parents have larger ids than children
        depth[node] = depth[parent[node]] + 1
    counts = [0] * (max(len(used), max_len) + 1)
    for s in used:
        counts[depth[parent[s]] + 1] += 1
    i = len(counts) - 1
    while i > max_len:
        while counts[i] > 0:
            j = i - 2
            while counts[j] == 0:
                j -= 1
            counts[i] -= 2
            counts[i - 1] += 1
            counts[j + 1] += 2
            counts[j] -= 1
        i -= 1
    order = sorted(used, key=lambda s: (-int(freq[s]), s))
    k = 0
    for length in range(1, max_len + 1):
        for _ in range(counts[length]):
            lens[order[k]] = length
            k += 1
    return lens


def canonical_codes(lens: Sequence[int]) -> list[int]:
    """Canonical (deflate-style) codes: shorter codes first, equal lengths in symbol order, MSB-first values."""
    max_len = max(lens) if lens else 0
    bl_count = [0] * (max_len + 2)
    for length in lens:
        if length:
            bl_count[length] += 1
    next_code = [0] * (max_len + 2)
    code = 0
    for length in range(1, max_len + 1):
        code = (code + bl_count[length - 1]) << 1
        next_code[length] = code
    codes = [0] * len(lens)
    for s, length in enumerate(lens):
        if length:
            codes[s] = next_code[length]
            next_code[length] += 1
    return codes


def _reverse(code: int, length: int) -> int:
    return int(format(code, f"0{length}b")[::-1], 2) if length else 0


def huff_stream_size(n: int, alphabet: int, freq: torch.Tensor, lens: Sequence[int]) -> int:
    total_bits = int((freq * torch.tensor(lens, dtype=torch.int64)).sum())
    return HUFF_SECTION_HEADER + ceil_div(alphabet, 2) + 4 * ceil_div(n, HUFF_BLOCK) + ceil_div(total_bits, 8)


def huff_encode(vals: torch.Tensor, alphabet: int, lens: Sequence[int]) -> bytes:
    """HUFF section: u32 alphabet, u32 blocks, nibble lengths, u32 block end bit offsets, LSB-first bitstream."""
    n = vals.numel()
    nblocks = ceil_div(n, HUFF_BLOCK)
    codes = canonical_codes(lens)
    rev = torch.tensor([_reverse(c, length) for c, length in zip(codes, lens)], dtype=torch.int64)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    ln = lens_t[vals]
    rv = rev[vals]
    ends = torch.cumsum(ln, 0)
    total = int(ends[-1])
    block_last = torch.clamp(torch.arange(1, nblocks + 1) * HUFF_BLOCK, max=n) - 1
    block_ends = ends[block_last]
    j = torch.arange(HUFF_MAX_LEN)
    mask = j < ln.unsqueeze(1)
    bits = ((rv.unsqueeze(1) >> j) & 1).to(torch.uint8)
    pos = (ends - ln).unsqueeze(1) + j
    bitarr = torch.zeros(total, dtype=torch.uint8)
    bitarr[pos[mask]] = bits[mask]
    lens_padded = list(lens) + [0] * (alphabet % 2)
    nib = torch.tensor(lens_padded, dtype=torch.int64).view(-1, 2)
    nibbles = (nib[:, 0] | (nib[:, 1] << 4)).to(torch.uint8).numpy().tobytes()
    return (
        struct.pack("<II", alphabet, nblocks)
        + nibbles
        + block_ends.numpy().astype("<u4").tobytes()
        + _bits_to_bytes(bitarr)
    )


def huff_decode(data: bytes, n: int, where: str) -> torch.Tensor:
    """Decode a HUFF section of ``n`` symbols; raise CodecError on anything inconsistent.

    Decoding is vectorized by pointer doubling: the decode table is applied at every bit position, and symbol starts
    are the positions reachable from the block starts by repeatedly jumping over one code.
    """
    nblocks = ceil_div(n, HUFF_BLOCK)
    if len(data) < HUFF_SECTION_HEADER:
        raise CodecError(f"{where}: truncated Huffman section")
    alphabet, nb = struct.unpack_from("<II", data)
    if not 1 <= alphabet <= HUFF_MAX_ALPHABET or nb != nblocks:
        raise CodecError(f"{where}: invalid Huffman section header (alphabet {alphabet}, blocks {nb})")
    off = HUFF_SECTION_HEADER
    nib_bytes = ceil_div(alphabet, 2)
    if len(data) < off + nib_bytes + 4 * nblocks:
        raise CodecError(f"{where}: truncated Huffman section")
    nib = torch.frombuffer(bytearray(data[off: off + nib_bytes]), dtype=torch.uint8).to(torch.int64)
    lens_t = torch.stack([nib & 15, nib >> 4], 1).reshape(-1)
    if alphabet % 2 and int(lens_t[-1]) != 0:
        raise CodecError(f"{where}: invalid Huffman code lengths")
    lens_t = lens_t[:alphabet]
    off += nib_bytes
    ends = torch.frombuffer(bytearray(data[off: off + 4 * nblocks]), dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF
    off += 4 * nblocks
    stream = data[off:]
    lens = lens_t.tolist()
    if max(lens) > HUFF_MAX_LEN or max(lens) == 0:
        raise CodecError(f"{where}: invalid Huffman code lengths")
    left = 1
    for length in range(1, HUFF_MAX_LEN + 1):
        left = 2 * left - lens.count(length)
        if left < 0:
            raise CodecError(f"{where}: oversubscribed Huffman code")
    counts = torch.full((nblocks,), HUFF_BLOCK, dtype=torch.int64)
    counts[-1] = n - (nblocks - 1) * HUFF_BLOCK
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends[:-1]])
    span = ends - starts
    if bool((span < counts).any()) or bool((span > HUFF_MAX_LEN * counts).any()):
        raise CodecError(f"{where}: invalid Huffman block offsets")
    total = int(ends[-1])
    if ceil_div(total, 8) != len(stream):
        raise CodecError(f"{where}: Huffman bitstream size does not match its block offsets")

    # Decode table over HUFF_MAX_LEN-bit windows (LSB-first): entry = (symbol, length), length 0 = no such code.
    codes = canonical_codes(lens)
    syms = [s for s in range(alphabet) if lens[s]]
    sl = torch.tensor([lens[s] for s in syms], dtype=torch.int64)
    sr = torch.tensor([_reverse(codes[s], lens[s]) for s in syms], dtype=torch.int64)
    reps = 1 << (HUFF_MAX_LEN - sl)
    rep_sym = torch.repeat_interleave(torch.tensor(syms, dtype=torch.int64), reps)
    rep_len = torch.repeat_interleave(sl, reps)
    k = torch.arange(int(reps.sum())) - torch.repeat_interleave(torch.cumsum(reps, 0) - reps, reps)
    idx = torch.repeat_interleave(sr, reps) + (k << rep_len)
    tsym = torch.zeros(1 << HUFF_MAX_LEN, dtype=torch.int64)
    tlen = torch.zeros(1 << HUFF_MAX_LEN, dtype=torch.int64)
    tsym[idx] = rep_sym
    tlen[idx] = rep_len

    bits = torch.cat([_bytes_to_bits(stream)[:total], torch.zeros(HUFF_MAX_LEN, dtype=torch.uint8)]).to(torch.int64)
    peek = torch.zeros(total, dtype=torch.int64)
    for j in range(HUFF_MAX_LEN):
        peek |= bits[j: j + total] << j
    len_at = tlen[peek]
    positions = torch.arange(total)
    nxt = torch.where(len_at > 0, positions + len_at, total).clamp(max=total)
    jump = torch.cat([nxt, torch.tensor([total])])
    marked = torch.zeros(total + 1, dtype=torch.bool)
    marked[starts] = True
    for _ in range(HUFF_MAX_LEN):  # reach every position within 2**12 - 1 = HUFF_BLOCK - 1 codes of a block start
        marked[jump[marked]] = True
        jump = jump[jump]
    pos = torch.nonzero(marked[:total]).reshape(-1)
    block_of = torch.searchsorted(ends, pos, right=True)
    if pos.numel() != n or not torch.equal(torch.bincount(block_of, minlength=nblocks), counts):
        raise CodecError(f"{where}: corrupt Huffman bitstream (symbol count mismatch)")
    lp = len_at[pos]
    after = pos + lp
    last = torch.cumsum(counts, 0) - 1
    if bool((lp == 0).any()) or bool((after > ends[block_of]).any()) or not torch.equal(after[last], ends):
        raise CodecError(f"{where}: corrupt Huffman bitstream")
    return tsym[peek[pos]]


def _best_stream(vals: torch.Tensor, vmax: int) -> tuple[bool, int, int, list[int] | None]:
    """Choose PACK or HUFF for a stream: returns (huff?, size, pack width, huffman lengths). Ties go to PACK."""
    n = vals.numel()
    width = bits_for(vmax)
    size = ceil_div(n * width, 8)
    if vmax + 1 <= HUFF_MAX_ALPHABET:
        freq = torch.bincount(vals, minlength=vmax + 1)
        lens = huffman_lengths(freq.tolist())
        hsize = huff_stream_size(n, vmax + 1, freq, lens)
        if hsize < size:
            return True, hsize, 0, lens
    return False, size, width, None


def _encode_stream(vals: torch.Tensor, vmax: int, choice) -> bytes:
    huff, _, width, lens = choice
    return huff_encode(vals, vmax + 1, lens) if huff else pack_stream(vals, width)


def _decode_stream(data: bytes, n: int, huff: bool, width: int, where: str) -> torch.Tensor:
    if huff:
        return huff_decode(data, n, where)
    return unpack_stream(data, n, width)


def unique_rows(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique rows in order of first appearance, and the index of each row's unique row."""
    rows = codes.shape[0]
    uniq, inv = torch.unique(codes, dim=0, return_inverse=True)
    u = uniq.shape[0]
    first = torch.full((u,), rows, dtype=torch.int64).scatter_reduce(0, inv, torch.arange(rows), "amin")
    order = torch.argsort(first)
    rank = torch.empty(u, dtype=torch.int64)
    rank[order] = torch.arange(u)
    return uniq[order], rank[inv]


# ----------------------------------------------------------------------------------------------------------------
# Chunks
# ----------------------------------------------------------------------------------------------------------------


def _finish(h: Header, body: bytes) -> torch.Tensor:
    buf = bytearray(pack_header(h) + body)
    crc = buffer_crc(buf)
    buf[CRC_OFFSET: CRC_OFFSET + 4] = struct.pack("<I", crc)
    return torch.frombuffer(buf, dtype=torch.uint8).clone()


def _header(mode: Mode, rows: int, dim: int, **kw) -> Header:
    base = dict(flags=0, width0=0, width1=0, min=0.0, abs_eb=0.0, step=0.0, nuniq=0, sec0=0, sec1=0, crc=0)
    base.update(kw)
    return Header(mode=mode, rows=rows, dim=dim, **base)


def encode_chunk(x: torch.Tensor, bound: float, relative: bool) -> torch.Tensor:
    """Encode one chunk (validated 2-D float32, any strides) with a float32 bound; 0 means RAW."""
    rows, dim = x.shape
    x = x.detach().to("cpu").contiguous()
    mode, q = quantize(x, bound, relative)
    if mode == Mode.CONST:
        return _finish(_header(Mode.CONST, rows, dim, min=q), b"")
    n = rows * dim
    raw_size = 4 * n
    if mode is None:
        lo, eb, step, codes = q
        flat = codes.reshape(-1)
        qmax = int(flat.max())
        choice = _best_stream(flat, qmax)
        best = (choice[1], Mode.HUFF if choice[0] else Mode.PACK)
        dedup = None
        if rows > 1:
            uniq, index = unique_rows(codes)
            u = uniq.shape[0]
            if u < rows:
                c0 = _best_stream(uniq.reshape(-1), qmax)
                c1 = _best_stream(index, u - 1)
                dedup = (uniq, index, c0, c1)
                if c0[1] + c1[1] < best[0]:
                    best = (c0[1] + c1[1], Mode.DEDUP)
        if best[0] < raw_size:
            common = dict(min=lo, abs_eb=eb, step=step)
            if best[1] == Mode.DEDUP:
                uniq, index, c0, c1 = dedup
                s0 = _encode_stream(uniq.reshape(-1), qmax, c0)
                s1 = _encode_stream(index, uniq.shape[0] - 1, c1)
                flags = (FLAG_SEC0_HUFF if c0[0] else 0) | (FLAG_SEC1_HUFF if c1[0] else 0)
                h = _header(Mode.DEDUP, rows, dim, flags=flags, width0=c0[2], width1=c1[2], nuniq=uniq.shape[0],
                            sec0=len(s0), sec1=len(s1), **common)
                return _finish(h, s0 + s1)
            s0 = _encode_stream(flat, qmax, choice)
            flags = FLAG_SEC0_HUFF if choice[0] else 0
            h = _header(best[1], rows, dim, flags=flags, width0=choice[2], sec0=len(s0), **common)
            return _finish(h, s0)
    body = x.numpy().astype("<f4").tobytes()
    return _finish(_header(Mode.RAW, rows, dim, sec0=len(body)), body)


def _as_bytes(buf: torch.Tensor | bytes | bytearray | memoryview) -> bytes:
    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8 or buf.dim() != 1:
            raise TypeError(f"an encoded buffer must be a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
        return buf.detach().cpu().contiguous().numpy().tobytes()
    return bytes(buf)


def decode_chunk(buf: torch.Tensor | bytes, where: str = "buffer") -> torch.Tensor:
    """Decode one chunk buffer to a float32 [rows, dim] tensor; raise CodecError if it is not a valid buffer."""
    data = _as_bytes(buf)
    h = parse_header(data, where)
    rows, dim = h.rows, h.dim
    n = rows * dim
    sec0 = data[HEADER_SIZE: HEADER_SIZE + h.sec0]
    sec1 = data[HEADER_SIZE + h.sec0:]
    if h.mode == Mode.CONST:
        return torch.full((rows, dim), h.min, dtype=_F32)
    if h.mode == Mode.RAW:
        if n == 0:
            return torch.zeros((rows, dim), dtype=_F32)
        return torch.frombuffer(bytearray(sec0), dtype=_F32).view(rows, dim).clone()
    if h.mode == Mode.PACK:
        codes = unpack_stream(sec0, n, h.width0).view(rows, dim)
    elif h.mode == Mode.HUFF:
        codes = huff_decode(sec0, n, where).view(rows, dim)
    else:
        u = h.nuniq
        uniq = _decode_stream(sec0, u * dim, bool(h.flags & FLAG_SEC0_HUFF), h.width0, where).view(u, dim)
        index = _decode_stream(sec1, rows, bool(h.flags & FLAG_SEC1_HUFF), h.width1, where)
        if bool((index >= u).any()):
            raise CodecError(f"{where}: DEDUP index out of range")
        codes = uniq[index]
    return dequantize(codes, h.min, h.step)


def dequantize(codes: torch.Tensor, lo: float, step: float) -> torch.Tensor:
    """x_hat = lo + float32(q) * step, each operation rounded to float32."""
    return torch.tensor(lo, dtype=_F32) + codes.to(_F32) * torch.tensor(step, dtype=_F32)


# ----------------------------------------------------------------------------------------------------------------
# Grids
# ----------------------------------------------------------------------------------------------------------------


def encode_grid(
    x: torch.Tensor, row_splits: list[int], col_splits: list[int], bounds: torch.Tensor, relative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode every (row block, column block) chunk, row-block-major; inputs already validated."""
    parts = []
    sizes = []
    bl = bounds.tolist()
    for r in range(len(row_splits) - 1):
        for c in range(len(col_splits) - 1):
            chunk = x[row_splits[r]: row_splits[r + 1], col_splits[c]: col_splits[c + 1]]
            enc = encode_chunk(chunk, bl[c], relative)
            parts.append(enc)
            sizes.append(enc.numel())
    payload = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    return payload, torch.tensor(sizes, dtype=torch.int64)


def decode_grid(
    payload: torch.Tensor, sizes: list[int], row_splits: list[int], col_splits: list[int],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode a grid payload into a [row_splits[-1], col_splits[-1]] float32 tensor (``out`` where given: written
    chunk by chunk, as the native ``decode_grid_into``); inputs already validated."""
    if out is None:
        out = torch.empty((row_splits[-1], col_splits[-1]), dtype=_F32)
    data = _as_bytes(payload)
    off = 0
    ncols = len(col_splits) - 1
    for i, size in enumerate(sizes):
        r, c = divmod(i, ncols)
        rows = row_splits[r + 1] - row_splits[r]
        dim = col_splits[c + 1] - col_splits[c]
        where = f"chunk {i} (row block {r}, column block {c})"
        chunk = data[off: off + size]
        off += size
        h = parse_header(chunk, where)
        if (h.rows, h.dim) != (rows, dim):
            raise CodecError(f"{where}: header shape {h.rows}x{h.dim} does not match the block's {rows}x{dim}")
        out[row_splits[r]: row_splits[r + 1], col_splits[c]: col_splits[c + 1]] = decode_chunk(chunk, where)
    return out
