"""Parsing Criteo TSV bytes into rows: the native parser or its reference, driven block by block over a byte range.

:func:`resolve_parser` picks the parser: the native one (``criteo_tsv.cpp`` beside this module, JIT-built on first
use like the codec, GIL released) or the pure-Python reference in :mod:`lightning_dlac.criteo.spec` (the
specification both follow, far slower; both rates: docs/benchmarks.md, 'Data: Criteo preprocessing and loading').
``DLAC_PREPROCESS_IMPL`` = ``auto`` (default: native if it builds, else one warning and the reference) | ``native``
| ``ref``, the same words as ``DLAC_CODEC_IMPL``.

:func:`parse_range` feeds one byte range of a file through a parser in blocks and yields the rows; the converter
(:mod:`lightning_dlac.criteo.convert`) writes them to disk and :func:`read_tsv` (``CriteoTSVDataModule``) keeps
them in memory, so both accept exactly the same lines and name a bad one the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dlac.criteo import spec
from lightning_dlac.criteo.format import DENSE_COLUMNS, NUM_FIELDS, SPARSE_COLUMNS, CriteoFormatError
from lightning_dlac.native import NativeLibrary, NativeUnavailable, build_extension

__all__ = ["ENV_IMPL", "Block", "CriteoRows", "Parser", "parse_range", "read_tsv", "resolve_parser"]

ENV_IMPL = "DLAC_PREPROCESS_IMPL"
# Bytes read per block. With the row buffers sized for the shortest valid line (41 bytes) a block parses in one
# call; a reader holds about 8 MiB + 8 MiB / 41 * 264 B = 60 MiB.
BLOCK_BYTES = 8 << 20
MIN_LINE_BYTES = NUM_FIELDS + 1  # label plus 39 tabs plus newline: no valid line is shorter
# A line that does not fit in this many bytes is not Criteo (real lines are about 150-200 bytes).
MAX_LINE_BYTES = 64 << 20


@dataclass(frozen=True)
class Parser:
    """A parser: ``name`` ("native" or "ref") and the two functions of :mod:`lightning_dlac.criteo.spec`'s
    signatures, ``count_lines(data, length)`` and ``parse(data, length, dense, sparse, labels, skip_bad, final)``."""

    name: str
    count_lines: Callable[[Any, int], int]
    parse: Callable[..., tuple[int, ...]]


REFERENCE = Parser("ref", spec.count_lines, spec.parse)


def _build() -> Any:
    source = Path(__file__).with_name("criteo_tsv.cpp")
    if not source.is_file():
        raise NativeUnavailable(f"the parser source {source} is missing")
    _, module = build_extension(
        "native Criteo parser", "dlac_criteo_tsv", [source], cflags=["-O3"], dir_prefix="criteo_tsv_",
        python_module=True,
    )  # fmt: skip
    return module


_LIBRARY = NativeLibrary(
    "native Criteo parser",
    ENV_IMPL,
    _build,
    "the reference parser (pure Python, about 30x slower)",
)


def resolve_parser(impl: str = "auto") -> Parser:
    """Choose the parser: the native one or the pure-Python reference.

    Args:
        impl: ``auto`` | ``native`` | ``ref``; ``auto`` reads ``DLAC_PREPROCESS_IMPL`` (native if it builds, else one
            warning and the reference).

    Returns:
        The parser.

    Raises:
        NativeUnavailable: ``native`` was asked for and the parser does not build (the message holds the build log).
        ValueError: An unknown ``impl``.
    """
    if _LIBRARY.choose(impl) == "ref":
        return REFERENCE
    module = _LIBRARY.load()
    return Parser("native", module.count_lines, module.parse)


@dataclass(frozen=True)
class Block:
    """Rows parsed from one piece of a byte range. The arrays are views of the reader's buffers, valid until the
    next block is read: copy or write them out first."""

    # int32 [rows, 13]: the integer features as written (missing = 0), before any transform.
    dense: np.ndarray
    # int64 [rows, 26]: the categoricals as integers (missing = 0), not hashed.
    sparse: np.ndarray
    # int32 [rows, 1]: 0 or 1.
    labels: np.ndarray
    # Input lines consumed: the rows plus the bad lines skipped.
    lines: int
    # Bad lines skipped (only with skip_bad).
    bad: int
    # The smallest integer feature of these rows (INT32_MAX when there are none).
    dense_min: int
    # (line number, message) of the first bad line skipped in this block, if any.
    first_error: tuple[int, str] | None


def parse_range(
    parser: Parser,
    path: Path,
    start: int,
    end: int,
    first_line: int = 0,
    skip_bad: bool = False,
    max_rows: int | None = None,
    stopped: Callable[[], bool] | None = None,
) -> Iterator[Block]:
    """Parse bytes ``[start, end)`` of ``path`` (whole lines) block by block.

    Args:
        parser: From :func:`resolve_parser`.
        path: The TSV file.
        start: First byte; must be the start of a line.
        end: Byte after the range; a line start or the end of the file.
        first_line: Lines of the file before ``start`` (for the line numbers in errors).
        skip_bad: Skip bad lines (counted in the blocks) instead of raising at the first.
        max_rows: Stop after this many rows (``None``: at ``end``); lines after them are not read.
        stopped: Polled before each block; reading ends quietly once it returns True.

    Yields:
        :class:`Block` after block, in file order.

    Raises:
        CriteoFormatError: A bad line (file and line number in the message), unless ``skip_bad``; a line longer than
            64 MiB in any case.
    """
    cap = BLOCK_BYTES // MIN_LINE_BYTES + 1
    dense = np.empty((cap, DENSE_COLUMNS), np.int32)
    sparse = np.empty((cap, SPARSE_COLUMNS), np.int64)
    labels = np.empty((cap, 1), np.int32)
    buf = bytearray(BLOCK_BYTES)
    held = 0  # bytes at the start of buf not parsed yet (an incomplete line)
    lines_done = rows_done = 0
    pos = start
    with path.open("rb", buffering=0) as f:
        f.seek(start)
        while True:
            if stopped is not None and stopped():
                return
            if held == len(buf):
                if len(buf) >= MAX_LINE_BYTES:
                    line_no = first_line + lines_done + 1
                    raise CriteoFormatError(
                        f"{path}, line {line_no}: longer than {MAX_LINE_BYTES >> 20} MiB; not a Criteo TSV file.",
                        str(path),
                        line_no,
                    )
                buf.extend(bytes(len(buf)))  # a line longer than the block: grow until it fits
            want = min(len(buf) - held, end - pos)
            got = f.readinto(memoryview(buf)[held : held + want]) if want > 0 else 0
            pos += got
            length = held + got
            final = pos >= end or got == 0
            offset = 0
            while True:
                room = cap if max_rows is None else min(cap, max_rows - rows_done)
                if room <= 0:
                    return
                view = memoryview(buf)[offset:length]
                out = parser.parse(view, length - offset, dense[:room], sparse[:room], labels[:room], skip_bad, final)
                rows, lines, consumed, bad, dmin, code, err_line, fld, nfields, err_off, err_len = out
                first_error = None
                if code:
                    line_no = first_line + lines_done + err_line + 1
                    text = bytes(view[err_off : err_off + err_len])
                    message = spec.describe_error(path, line_no, code, fld, nfields, text)
                    if not skip_bad:
                        raise CriteoFormatError(message, str(path), line_no)
                    first_error = (line_no, message)
                lines_done += lines
                rows_done += rows
                yield Block(dense[:rows], sparse[:rows], labels[:rows], lines, bad, dmin, first_error)
                offset += consumed
                if consumed == 0 or offset >= length or rows < room:
                    break
            held = length - offset
            if final:
                # With final=True the parser takes an unterminated last line too, so nothing is left over.
                assert held == 0, f"{path}: {held} bytes at the end of bytes {start}..{end} were not parsed"
                return
            if held:
                buf[:held] = buf[offset:length]


@dataclass(frozen=True)
class CriteoRows:
    """The rows of a Criteo TSV file as parsed (:func:`read_tsv`).

    Args:
        labels: int32 ``[N]``: 0 or 1.
        dense: int32 ``[N, 13]``: the integer features as written (missing = 0); see
            :func:`~lightning_dlac.criteo.dense_log1p` / :func:`~lightning_dlac.criteo.dense_torchrec`.
        sparse: int64 ``[N, 26]``: the categoricals as integers (missing = 0), not hashed.
        dense_min: The smallest integer feature of the rows (TorchRec's transform subtracts it); ``INT32_MAX``
            without rows.
    """

    # int32 [N]: 0 or 1.
    labels: np.ndarray
    # int32 [N, 13]: the integer features as written (missing = 0); see format.dense_log1p / dense_torchrec.
    dense: np.ndarray
    # int64 [N, 26]: the categoricals as integers (missing = 0), not hashed.
    sparse: np.ndarray
    # The smallest integer feature of the rows (TorchRec's transform subtracts it); INT32_MAX without rows.
    dense_min: int


def read_tsv(path: str | os.PathLike, max_rows: int | None = None, impl: str = "auto") -> CriteoRows:
    """Read a Criteo TSV file (or its first ``max_rows`` rows) into memory, every line checked as the converter does.

    Args:
        path: The file.
        max_rows: Read at most this many rows (``None``: all).
        impl: ``auto`` | ``native`` | ``ref`` parser (:func:`resolve_parser`).

    Returns:
        The rows as parsed.

    Raises:
        CriteoFormatError: The first bad line (file and line number in the message).
        FileNotFoundError: No such file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Criteo TSV file not found: {str(path)!r}.")
    parser = resolve_parser(impl)
    pieces = [
        (b.labels[:, 0].copy(), b.dense.copy(), b.sparse.copy(), b.dense_min)
        for b in parse_range(parser, path, 0, path.stat().st_size, max_rows=max_rows)
        if len(b.labels)
    ]
    if not pieces:
        dense, sparse = np.empty((0, DENSE_COLUMNS), np.int32), np.empty((0, SPARSE_COLUMNS), np.int64)
        return CriteoRows(np.empty(0, np.int32), dense, sparse, spec.INT32_MAX)
    labels, dense, sparse, mins = zip(*pieces)
    return CriteoRows(np.concatenate(labels), np.concatenate(dense), np.concatenate(sparse), min(mins))
