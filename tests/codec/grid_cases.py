"""The grids and damaged payloads the device pipeline is held to the CPU kernels on, byte for byte and bit for bit:
on a GPU by test_codec_cuda.py and cuda_sanitizer_workload.py, and compiled for the host (the emulation) by
test_codec_device_pipeline.py, so that every case also runs in CI. Each grid case is (x, row_splits, col_splits,
bounds, relative), the arguments of ``dlac::encode_grid``.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from conftest import zipf_payload

from lightning_dlac.codec.format import CRC_OFFSET, HEADER_SIZE

Case = tuple[torch.Tensor, list[int], list[int], torch.Tensor, bool]

# The widths of the column blocks: 8 to 128, the DLRM widths 64 and 128 among them, and odd ones between.
WIDTHS = [8, 16, 24, 32, 40, 48, 56, 64, 72, 96, 120, 128]


def _splits(widths: list[int]) -> list[int]:
    out = [0]
    for w in widths:
        out.append(out[-1] + w)
    return out


def _tables(rows: int, widths: list[int], seed: int, vocab: int = 400) -> torch.Tensor:
    """Zipf lookups, one table per column block (DEDUP and HUFF chunks)."""
    return torch.cat([zipf_payload(rows=rows, dim=w, vocab=vocab, seed=seed + k) for k, w in enumerate(widths)], dim=1)


def nan_inf() -> Case:
    # Chunks with a NaN, a +Inf, a -Inf, all three, every element NaN or infinite: sent RAW, bit for bit; their
    # neighbours in the same row block and column block quantize as usual.
    widths = [8, 16, 64, 24]
    x = _tables(600, widths, seed=1)
    cs = _splits(widths)
    x[5, 3] = float("nan")
    x[250, cs[1] + 7] = float("inf")
    x[420, cs[2] + 63] = -float("inf")
    x[599, cs[3]] = float("nan")
    x[598, cs[3] + 1] = float("inf")
    x[597, cs[3] + 2] = -float("inf")
    x[400:600, cs[1]: cs[2]] = float("nan")
    x[400:600:2, cs[0]: cs[1]] = float("inf")
    x[401:600:2, cs[0]: cs[1]] = -float("inf")
    return x, [0, 200, 400, 600], cs, torch.tensor([0.01, 0.05, 0.01, 0.03]), True


def dims_relative() -> Case:
    x = _tables(1500, WIDTHS, seed=2)
    bounds = torch.tensor([0.01, 0.05, 0.003, 0.01, 0.02, 0.01, 0.05, 0.01, 1e-4, 0.01, 0.03, 0.01])
    return x, [0, 256, 1000, 1500], _splits(WIDTHS), bounds, True


def dims_absolute() -> Case:
    # Absolute bounds: from 1e-6 (codes past the Huffman alphabet: PACK) to one larger than the range (CONST-like
    # codes of 0 and 1), and 0 (RAW).
    x = _tables(1500, WIDTHS, seed=3) * torch.linspace(0.5, 20.0, sum(WIDTHS))
    bounds = torch.tensor([1e-3, 1e-2, 1e-6, 5e-4, 0.0, 1e-3, 2e-3, 1e-3, 1e-4, 1.0, 1e3, 1e-3])
    return x, [0, 700, 700, 1500], _splits(WIDTHS), bounds, False


def empty_and_zero_width() -> Case:
    # Row blocks of 0 rows, column blocks of 0 columns, a 1-row and a 1-column block: CONST chunks (header only)
    # between quantized ones; nothing may be read or written for an empty chunk.
    widths = [0, 16, 0, 1, 64, 0]
    x = _tables(301, widths, seed=4)
    return x, [0, 0, 100, 100, 300, 301, 301], _splits(widths), torch.tensor([0.01, 0.01, 0.05, 0.01, 0.01, 0.0]), True


def multi_hot() -> Case:
    # Sum-pooled bags of 1 to 100 Zipf ids per sample (MLPerf DLRM v2 pooling factors: 1, 3, 8, 27, 100), dims 64
    # and 128: wider ranges, rows that repeat far less than one-hot lookups.
    g = torch.Generator().manual_seed(5)
    rows, parts, widths = 1024, [], []
    for pool, dim in [(1, 64), (3, 128), (8, 64), (27, 128), (100, 64)]:
        table = torch.randn(2000, dim, generator=g) * 0.05
        p = 1.0 / torch.arange(1, 2001, dtype=torch.float64) ** 1.1
        ids = torch.multinomial(p, rows * pool, replacement=True, generator=g).view(rows, pool)
        parts.append(table[ids].sum(dim=1))
        widths.append(dim)
    x = torch.cat(parts, dim=1).contiguous()
    return x, [0, 256, 512, 768, 1024], _splits(widths), torch.tensor([0.01, 0.01, 0.05, 0.01, 0.003]), True


def gradient() -> Case:
    # The backward exchange's payload: per-sample scale (p - y) / batch times a direction that differs per sample,
    # heavy-tailed, every row distinct (no raw-row repeats past the first 256 rows), some rows exactly zero (samples
    # that miss a table) and denormal entries; dims 64 and 128.
    g = torch.Generator().manual_seed(6)
    rows, widths = 2048, [64, 128, 64, 128]
    scale = (torch.rand(rows, 1, generator=g) - 0.5) / 256
    tail = -torch.log(torch.rand(rows, sum(widths), generator=g).clamp_min(1e-12))  # |Laplace|
    direction = torch.randn(rows, sum(widths), generator=g) * tail
    x = (scale * direction).float()
    x[::17] = 0.0
    x[3, :8] = 1e-41
    bounds = torch.tensor([0.01, 0.01, 0.05, 0.003])
    return x, [0, 512, 1024, 1536, 2048], _splits(widths), bounds, True


def thousands_of_chunks() -> Case:
    # 26 tables x 100 destinations = 2600 chunks of 3 to 40 rows, as an all-to-all over 100 ranks sends them: many
    # chunks, each with its own histograms and hash set.
    g = torch.Generator().manual_seed(7)
    widths = [8, 16, 32, 64] * 6 + [128, 8]
    rows_per = torch.randint(3, 41, (100,), generator=g).tolist()
    rs = _splits(rows_per)
    x = _tables(rs[-1], widths, seed=8, vocab=60)
    bounds = torch.tensor([0.01, 0.05, 0.0, 0.01] * 6 + [0.01, 0.02])
    return x, rs, _splits(widths), bounds, True


CASES = {f.__name__: f for f in (nan_inf, dims_relative, dims_absolute, empty_and_zero_width, multi_hot, gradient,
                                 thousands_of_chunks)}


def refresh_crc(buf: bytearray) -> None:
    """Recompute the checksum of one chunk in place (so a structural edit reaches the decoder behind it)."""
    if len(buf) >= HEADER_SIZE:
        crc = zlib.crc32(bytes(buf[:CRC_OFFSET]) + b"\0\0\0\0" + bytes(buf[CRC_OFFSET + 4:]))
        buf[CRC_OFFSET: CRC_OFFSET + 4] = struct.pack("<I", crc)


def damaged_payloads(payload: torch.Tensor, sizes: torch.Tensor, n: int,
                     seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """``n`` corrupted copies of a grid payload (a host tensor), each with the sizes that go with it and the chunk that
    was damaged, in turn: a bit flip, 1-4 bytes overwritten (often in the header) behind a recomputed checksum, the
    chunk cut short with its size."""
    rnd = random.Random(seed)
    data = payload.numpy().tobytes()
    offs = [0]
    for size in sizes.tolist():
        offs.append(offs[-1] + size)
    for k in range(n):
        chunk = rnd.randrange(len(offs) - 1)
        buf = bytearray(data[offs[chunk]: offs[chunk + 1]])
        new_sizes = sizes.clone()
        if k % 3 == 0:
            buf[rnd.randrange(len(buf))] ^= 1 << rnd.randrange(8)
        elif k % 3 == 1:
            for _ in range(rnd.randint(1, 4)):
                i = rnd.randrange(len(buf)) if rnd.random() < 0.5 else rnd.randrange(min(len(buf), 64))
                buf[i] = rnd.randrange(256)
            refresh_crc(buf)
        else:
            cut = rnd.randrange(len(buf))
            buf = buf[:cut]
            new_sizes[chunk] = cut
        whole = data[: offs[chunk]] + bytes(buf) + data[offs[chunk + 1]:]
        yield torch.frombuffer(bytearray(whole), dtype=torch.uint8), new_sizes, chunk


def verdict(op: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """(result, None) or (None, error message without the C++ backtrace). The decoders' verdict on the bytes is a
    ValueError (the Python API's CodecError); any other error is not a verdict and propagates."""
    try:
        return op(*args), None
    except ValueError as e:
        return None, str(e).split("\nException raised from")[0]
