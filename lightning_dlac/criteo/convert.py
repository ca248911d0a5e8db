"""The converter: Criteo TSV files to TorchRec's binary layout, streamed and in parallel (``dlac preprocess criteo``).

For each input ``<dir>/<stem>[.txt|.tsv]`` (Criteo 1TB ``day_0`` .. ``day_23``, Criteo Kaggle ``train.txt``) it
writes, to the output directory::

    <stem>_dense.npy   float32 [N, 13]   log(x - min + 2), min over the whole file's integer features
    <stem>_sparse.npy  int64   [N, 26]   the hex categoricals as integers (not hashed: the loader takes them modulo
                                         the table sizes)
    <stem>_labels.npy  int32   [N, 1]

the same arrays, value for value, as :meth:`torchrec.datasets.criteo.BinaryCriteoUtils.tsv_to_npys` (missing
values are 0 before the transform, as there), so TorchRec's :class:`InMemoryBinaryCriteoIterDataPipe` and
``CriteoBinaryDataModule`` read them.

How it streams (resident memory about 60 MB per worker, whatever the file size):

1. The file is cut into ``workers`` byte ranges at line boundaries and each range's newlines are counted, so every
   range knows the row it starts at and the outputs can be sized up front.
2. Each worker parses its range in blocks (:func:`lightning_dlac.criteo.parser.parse_range`, every line checked
   against :mod:`lightning_dlac.criteo.spec`) and writes the rows at their final offsets with ``os.pwrite``. The
   integer features are stored raw (int32) in the dense file for now.
3. Once the file's minimum integer feature is known, the dense file is rewritten in place as
   ``log(x - min + 2)`` float32 (both 4 bytes per value), block by block.
4. The ``.npy`` headers get the final row count, the files are flushed to disk, and only then renamed from
   ``<name>.partial`` to ``<name>``: a failed or interrupted run leaves no file that looks finished.

The first bad line stops the run with the file and line number, unless ``skip_bad_lines`` (then bad lines are
counted and reported).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_dlac.criteo import parser as _parser
from lightning_dlac.criteo.format import BINARY_OUTPUTS, DENSE_COLUMNS, binary_paths, dense_torchrec
from lightning_dlac.criteo.spec import INT32_MAX
from lightning_dlac.criteo.writers import npy_header, pwrite_all

log = logging.getLogger(__name__)

__all__ = ["CriteoConversion", "preprocess_criteo"]

# Files are cut into ranges of at least this many bytes (smaller ones are not worth a thread).
MIN_RANGE_BYTES = 1 << 20
# Every .npy header here is padded to this length, so the header can be rewritten in place with the final row
# count (numpy pads 1.0 headers to a multiple of 64; a 2-D shape of any realistic size fits in 128).
HEADER_BYTES = 128
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lzma")


@dataclass(frozen=True)
class CriteoConversion:
    """What :func:`preprocess_criteo` wrote for one input file.

    Args:
        input: The input TSV.
        stem: ``<stem>`` of the outputs.
        rows: Rows written.
        bad_lines: Lines skipped as malformed (only with ``skip_bad_lines``).
        seconds: Wall time of the conversion, seconds.
        paths: The three output files: dense, sparse, labels.
        first_bad_line: The first skipped line's error message, if any.
    """

    # The input TSV.
    input: Path
    # ``<stem>`` of the outputs.
    stem: str
    # Rows written.
    rows: int
    # Lines skipped as malformed (only with ``skip_bad_lines``).
    bad_lines: int
    # Wall time of the conversion, seconds.
    seconds: float
    # The three output files: dense, sparse, labels.
    paths: tuple[Path, Path, Path]
    # The first skipped line's error message, if any.
    first_bad_line: str | None = None

    @property
    def rows_per_second(self) -> float:
        """Input lines converted per second."""
        return (self.rows + self.bad_lines) / self.seconds if self.seconds > 0 else float("inf")


def _stem(path: Path) -> str:
    if path.suffix.lower() in _COMPRESSED_SUFFIXES:
        raise ValueError(
            f"{path} is compressed; decompress it first (e.g. `gunzip -k {path}`): the converter splits the file"
            " into byte ranges read in parallel, which a compressed stream does not allow."
        )
    return path.stem if path.suffix.lower() in (".txt", ".tsv", ".csv") else path.name


def _split_ranges(path: Path, size: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` byte ranges covering the file, each starting at a line start (some may be empty)."""
    cuts = [0]
    with path.open("rb") as f:
        for k in range(1, parts):
            target = size * k // parts
            if target <= cuts[-1]:
                cuts.append(cuts[-1])
                continue
            # Cut after the first newline at or after byte target - 1, so a target that is a line start stays put.
            pos = target - 1
            f.seek(pos)
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    pos = size
                    break
                i = chunk.find(b"\n")
                if i >= 0:
                    pos += i + 1
                    break
                pos += len(chunk)
            cuts.append(pos)
    cuts.append(size)
    return [(cuts[k], cuts[k + 1]) for k in range(parts)]


class _Stop(Exception):
    """Another worker failed; this one stops quietly."""


@dataclass
class _RangeResult:
    rows: int = 0
    lines: int = 0
    bad: int = 0
    dmin: int = INT32_MAX
    first_error: tuple[int, str] | None = None  # (line number, message)


def _count_range(parser: _parser.Parser, path: Path, start: int, end: int) -> int:
    """Lines in bytes [start, end) of the file; a final unterminated line counts."""
    n = 0
    block = _parser.BLOCK_BYTES
    buf = bytearray(block)
    last = b"\n"
    with path.open("rb", buffering=0) as f:
        f.seek(start)
        pos = start
        while pos < end:
            got = f.readinto(memoryview(buf)[: min(block, end - pos)])
            if not got:
                break
            n += parser.count_lines(buf, got)
            last = bytes(buf[got - 1 : got])
            pos += got
    return n + (end > start and last != b"\n")


def _convert_range(
    parser: _parser.Parser,
    path: Path,
    byte_range: tuple[int, int],
    first_line: int,
    first_row: int,
    fds: Sequence[int],
    skip_bad: bool,
    stop: threading.Event,
    progress: Callable[[int], None],
) -> _RangeResult:
    """Parse bytes [start, end) of the file (whole lines) and write its rows from row ``first_row`` on."""
    result = _RangeResult()
    row_bytes = [dtype.itemsize * cols for _, dtype, cols in BINARY_OUTPUTS]
    start, end = byte_range
    for block in _parser.parse_range(parser, path, start, end, first_line, skip_bad, stopped=stop.is_set):
        rows = len(block.labels)
        if rows:
            at = first_row + result.rows
            for fd, arr, nbytes in zip(fds, (block.dense, block.sparse, block.labels), row_bytes):
                pwrite_all(fd, arr, HEADER_BYTES + at * nbytes)
            result.rows += rows
            result.dmin = min(result.dmin, block.dense_min)
        if block.first_error is not None and result.first_error is None:
            result.first_error = block.first_error
        result.bad += block.bad
        result.lines += block.lines
        progress(block.lines)
    if stop.is_set():
        raise _Stop
    return result


def _finish_dense(fd: int, dmin: int, blocks: list[tuple[int, int]], pool: ThreadPoolExecutor) -> None:
    """Rewrite the raw int32 dense features as TorchRec's ``log(x - min + 2)`` float32, in place, block by block."""

    def one(block: tuple[int, int]) -> None:
        lo, hi = block
        nbytes = (hi - lo) * DENSE_COLUMNS * 4
        offset = HEADER_BYTES + lo * DENSE_COLUMNS * 4
        raw = np.frombuffer(os.pread(fd, nbytes, offset), dtype=np.int32)
        if raw.size * 4 != nbytes:
            raise OSError(f"short read of the dense features at rows {lo}..{hi}")
        pwrite_all(fd, dense_torchrec(raw, dmin), offset)

    list(pool.map(one, blocks))


def _compact(fds: Sequence[int], ranges: list[tuple[int, int, int]]) -> None:
    """Move each range's rows down to close the gaps skipped lines left: ``ranges`` = (slot start, rows, target)."""
    chunk_rows = 1 << 16
    for fd, (_, dtype, cols) in zip(fds, BINARY_OUTPUTS):
        nbytes = dtype.itemsize * cols
        for slot, rows, target in ranges:
            if slot == target:
                continue
            # target < slot, so copying forwards never overwrites rows not yet moved.
            for lo in range(0, rows, chunk_rows):
                n = min(chunk_rows, rows - lo)
                data = os.pread(fd, n * nbytes, HEADER_BYTES + (slot + lo) * nbytes)
                pwrite_all(fd, data, HEADER_BYTES + (target + lo) * nbytes)


def _run_ranges(
    parser: _parser.Parser,
    path: Path,
    ranges: list[tuple[int, int]],
    starts: list[int],
    fds: Sequence[int],
    skip_bad_lines: bool,
    pool: ThreadPoolExecutor,
    advance: Callable[[int], None],
) -> list[_RangeResult]:
    """Convert every range on the pool; the first error (by line) is raised once all workers have stopped."""
    stop = threading.Event()

    def run(k: int) -> _RangeResult:
        try:
            return _convert_range(
                parser, path, ranges[k], starts[k], starts[k], fds, skip_bad_lines, stop, advance,
            )  # fmt: skip
        except BaseException:
            stop.set()
            raise

    futures = [pool.submit(run, k) for k in range(len(ranges))]
    results: list[_RangeResult] = []
    errors: list[Exception] = []
    try:
        for fut in futures:
            try:
                results.append(fut.result())
            except _Stop:
                pass
            except Exception as e:  # noqa: BLE001 - re-raised below, the earliest line first
                errors.append(e)
    except BaseException:
        # Ctrl-C (or a worker's KeyboardInterrupt): stop the others at their next block and wait for them, so no
        # thread still writes through a descriptor that the caller's cleanup closes.
        stop.set()
        wait(futures)
        raise
    if errors:
        errors.sort(key=lambda e: getattr(e, "line", 0))
        raise errors[0]
    return results


def _convert_file(
    path: Path,
    output_dir: Path,
    workers: int,
    skip_bad_lines: bool,
    parser: _parser.Parser,
    progress: bool,
    overwrite: bool,
) -> CriteoConversion:
    t0 = time.perf_counter()
    stem = _stem(path)
    finals = binary_paths(output_dir, stem)
    if not overwrite:
        existing = [p for p in finals if p.exists()]
        if existing:
            raise FileExistsError(
                f"{existing[0]} already exists; pass --overwrite (overwrite=True) to replace it, or choose another"
                " --output directory."
            )
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path} is empty: nothing to convert.")
    parts = max(1, min(workers, size // MIN_RANGE_BYTES + 1))
    ranges = _split_ranges(path, size, parts)
    partials = [p.with_name(p.name + ".partial") for p in finals]
    fds: list[int] = []
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=parts) as pool:
        counts = list(pool.map(lambda r: _count_range(parser, path, *r), ranges))
        total = sum(counts)
        starts = np.cumsum([0, *counts]).tolist()
        try:
            for p, (_, dtype, cols) in zip(partials, BINARY_OUTPUTS):
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                fds.append(fd)
                pwrite_all(fd, npy_header(dtype, (total, cols), HEADER_BYTES), 0)
                os.ftruncate(fd, HEADER_BYTES + total * dtype.itemsize * cols)
            bar = tqdm(
                total=total, unit="rows", unit_scale=True, desc=stem, disable=not progress, file=sys.stderr,
                smoothing=0.1, mininterval=0.5,
            )  # fmt: skip
            bar_lock = threading.Lock()

            def advance(n: int) -> None:
                with bar_lock:
                    bar.update(n)

            try:
                results = _run_ranges(parser, path, ranges, starts, fds, skip_bad_lines, pool, advance)
            finally:
                bar.close()
            rows = sum(r.rows for r in results)
            bad = sum(r.bad for r in results)
            if rows == 0:
                raise ValueError(f"{path}: none of its {total} lines is a valid Criteo row; nothing written.")
            targets = np.cumsum([0, *(r.rows for r in results)]).tolist()
            if bad:
                _compact(fds, [(starts[k], results[k].rows, targets[k]) for k in range(parts)])
            dmin = min(r.dmin for r in results)
            block_rows = 1 << 18
            blocks = [(lo, min(lo + block_rows, rows)) for lo in range(0, rows, block_rows)]
            _finish_dense(fds[0], dmin, blocks, pool)
            for fd, (_, dtype, cols) in zip(fds, BINARY_OUTPUTS):
                pwrite_all(fd, npy_header(dtype, (rows, cols), HEADER_BYTES), 0)
                os.ftruncate(fd, HEADER_BYTES + rows * dtype.itemsize * cols)
            # Data on disk before the names say "finished": a crash after a rename never exposes a torn file.
            list(pool.map(os.fsync, fds))
            for fd in fds:
                os.close(fd)
            fds.clear()
            for partial, final in zip(partials, finals):
                os.replace(partial, final)
        finally:
            for fd in fds:
                os.close(fd)
            for p in partials:
                if p.exists():
                    p.unlink()
    first_bad = min((r.first_error for r in results if r.first_error), default=None)
    return CriteoConversion(
        input=path,
        stem=stem,
        rows=rows,
        bad_lines=bad,
        seconds=time.perf_counter() - t0,
        paths=finals,
        first_bad_line=first_bad[1] if first_bad else None,
    )


def preprocess_criteo(
    inputs: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    workers: int = 1,
    skip_bad_lines: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    impl: str = "auto",
) -> list[CriteoConversion]:
    """Convert Criteo TSV files to TorchRec's binary layout (see the module docstring).

    Args:
        inputs: TSV files (``day_0`` .. ``day_23``, ``train.txt``); each gives ``<stem>_{dense,sparse,labels}.npy``.
        output_dir: Directory for the outputs (created if missing).
        workers: Threads per file, each parsing its own byte range.
        skip_bad_lines: Skip malformed lines (counted and reported) instead of stopping at the first one.
        progress: Show a progress bar (rows and rows/s) on stderr.
        overwrite: Replace existing outputs instead of refusing.
        impl: ``auto`` | ``native`` | ``ref`` parser (see ``DLAC_PREPROCESS_IMPL``).

    Returns:
        One :class:`CriteoConversion` per input, in order.

    Raises:
        CriteoFormatError: A malformed line (file and line number in the message), unless ``skip_bad_lines``.
        FileNotFoundError: An input is missing.
        FileExistsError: An output exists and ``overwrite`` is False.
        ValueError: ``workers`` is below 1, no input is given, an input is compressed, or two inputs share an output
            stem.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}.")
    paths = [Path(p).expanduser() for p in inputs]
    if not paths:
        raise ValueError("no input files given.")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"Criteo TSV file not found: {str(p)!r}.")
    stems = [_stem(p) for p in paths]
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    if dupes:
        raise ValueError(f"several inputs share the output stem {dupes[0]!r}; convert them into different --output.")
    out = Path(output_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    parser = _parser.resolve_parser(impl)
    results = []
    for p in paths:
        result = _convert_file(p, out, workers, skip_bad_lines, parser, progress, overwrite)
        if result.bad_lines:
            log.warning(
                "%s: skipped %d malformed line(s) of %d; the first: %s",
                p, result.bad_lines, result.rows + result.bad_lines, result.first_bad_line,
            )  # fmt: skip
        results.append(result)
    return results
