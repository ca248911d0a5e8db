"""``dlac preprocess criteo``: Criteo TSV files to TorchRec's binary layout, streamed and in parallel.

For each input ``<dir>/<stem>[.txt|.tsv]`` (Criteo 1TB ``day_0`` .. ``day_23``, Criteo Kaggle ``train.txt``) it
writes, to ``--output``::

    <stem>_dense.npy   float32 [N, 13]   log(x - min + 2), min over the whole file's integer features
    <stem>_sparse.npy  int64   [N, 26]   the hex categoricals as integers (not hashed: the loader takes them modulo
                                         the table sizes)
    <stem>_labels.npy  int32   [N, 1]

the same arrays, value for value, as :meth:`torchrec.datasets.criteo.BinaryCriteoUtils.tsv_to_npys` (missing
values are 0 before the transform, as there), so TorchRec's :class:`InMemoryBinaryCriteoIterDataPipe` and
``examples.data.CriteoBinaryDataModule`` read them.

How it streams (resident memory about 50 MB per worker, whatever the file size):

1. The file is cut into ``workers`` byte ranges at line boundaries and each range's newlines are counted, so every
   range knows the row it starts at and the outputs can be sized up front.
2. Each worker reads its range in blocks, parses them (the native parser in ``cuda_ext/criteo/``, GIL released, or
   the pure-Python specification below) and writes the rows at their final offsets with ``os.pwrite``. The
   integer features are stored raw (int32) in the dense file for now.
3. Once the file's minimum integer feature is known, the dense file is rewritten in place as
   ``log(x - min + 2)`` float32 (both 4 bytes per value), block by block.
4. The ``.npy`` headers get the final row count, the files are flushed to disk, and only then renamed from
   ``<name>.partial`` to ``<name>``: a failed or interrupted run leaves no file that looks finished.

Lines are checked strictly (the parser below is the specification): 40 tab-separated fields; label ``0`` or ``1``;
integers empty or ``[+-]?[0-9]+`` within int32; categoricals empty or hex below 2**63. The first bad line stops the
run with the file and line number, unless ``skip_bad_lines`` (then bad lines are counted and reported).

``DLAC_PREPROCESS_IMPL`` = ``auto`` (default: native if it builds, else a one-time warning and the Python parser,
about 40k rows/s against over 1M) | ``native`` | ``python`` chooses the parser, like ``DLAC_CODEC_IMPL`` for the codec.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import re
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "CriteoConversion",
    "CriteoFormatError",
    "DENSE_COLUMNS",
    "SPARSE_COLUMNS",
    "binary_paths",
    "check_criteo_binary",
    "main",
    "preprocess_criteo",
]

DENSE_COLUMNS = 13
SPARSE_COLUMNS = 26
_NUM_FIELDS = 1 + DENSE_COLUMNS + SPARSE_COLUMNS
ENV_IMPL = "DLAC_PREPROCESS_IMPL"
IMPLS = ("auto", "native", "python")
# Bytes read per block and worker. With the row buffers sized for the shortest valid line (41 bytes) a block parses
# in one call; a worker holds about 8 MiB + 8 MiB / 41 * 264 B = 60 MiB.
BLOCK_BYTES = 8 << 20
_MIN_LINE_BYTES = _NUM_FIELDS + 1  # label plus 39 tabs plus newline: no valid line is shorter
# Files are cut into ranges of at least this many bytes (smaller ones are not worth a thread).
_MIN_RANGE_BYTES = 1 << 20
# A line that does not fit in this many bytes is not Criteo (real lines are about 150-200 bytes).
_MAX_LINE_BYTES = 64 << 20
# Every .npy header here is padded to this length, so the header can be rewritten in place with the final row
# count (numpy pads 1.0 headers to a multiple of 64; a 2-D shape of any realistic size fits in 128).
_HEADER_BYTES = 128
_COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lzma")

# (suffix, dtype, columns) of the three outputs, in TorchRec's naming.
_OUTPUTS: tuple[tuple[str, np.dtype, int], ...] = (
    ("dense", np.dtype(np.float32), DENSE_COLUMNS),
    ("sparse", np.dtype(np.int64), SPARSE_COLUMNS),
    ("labels", np.dtype(np.int32), 1),
)

# Error codes shared with cuda_ext/criteo/criteo_tsv.cpp.
_ERR_FIELD_COUNT, _ERR_LABEL, _ERR_DENSE, _ERR_DENSE_RANGE, _ERR_HEX, _ERR_HEX_RANGE = 1, 2, 3, 4, 5, 6


class CriteoFormatError(ValueError):
    """A Criteo TSV line that does not parse; ``path`` and ``line`` (1-based) say where."""

    def __init__(self, message: str, path: str, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


@dataclass(frozen=True)
class CriteoConversion:
    """What :func:`preprocess_criteo` wrote for one input file."""

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


def binary_paths(directory: str | os.PathLike, stem: str) -> tuple[Path, Path, Path]:
    """The ``(dense, sparse, labels)`` .npy paths of ``stem`` in ``directory``, in TorchRec's naming."""
    d = Path(directory)
    return tuple(d / f"{stem}_{suffix}.npy" for suffix, _, _ in _OUTPUTS)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------------------------------
# The parser: the Python specification and the native build of the same thing.

_DENSE_RE = re.compile(rb"[+-]?[0-9]+")
_HEX_RE = re.compile(rb"[0-9a-fA-F]+")
_LINE_RE = re.compile(rb"[01](?:\t(?:[+-]?[0-9]+)?){13}(?:\t[0-9a-fA-F]*){26}")
_INT32_MIN, _INT32_MAX, _HEX_LIMIT = -(2**31), 2**31 - 1, 2**63


def _check_line(line: bytes) -> tuple[int, int, int]:
    """(error code, field, field count) of a line; ``(0, -1, -1)`` if it parses."""
    fields = line.split(b"\t")
    if len(fields) != _NUM_FIELDS:
        return _ERR_FIELD_COUNT, -1, len(fields)
    if fields[0] not in (b"0", b"1"):
        return _ERR_LABEL, 0, -1
    for k in range(DENSE_COLUMNS):
        v = fields[1 + k]
        if v:
            if not _DENSE_RE.fullmatch(v):
                return _ERR_DENSE, 1 + k, -1
            if not _INT32_MIN <= int(v) <= _INT32_MAX:
                return _ERR_DENSE_RANGE, 1 + k, -1
    for k in range(SPARSE_COLUMNS):
        v = fields[1 + DENSE_COLUMNS + k]
        if v:
            if not _HEX_RE.fullmatch(v):
                return _ERR_HEX, 1 + DENSE_COLUMNS + k, -1
            if int(v, 16) >= _HEX_LIMIT:
                return _ERR_HEX_RANGE, 1 + DENSE_COLUMNS + k, -1
    return 0, -1, -1


def _python_parse(
    data: Any, length: int, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, skip_bad: bool, final: bool
) -> tuple[int, ...]:
    """The specification of the native ``parse`` (same arguments, same result tuple; see criteo_tsv.cpp)."""
    buf = bytes(memoryview(data)[:length])
    capacity = min(len(dense), len(sparse), len(labels))
    rows = lines = bad = pos = 0
    err = (0, -1, -1, -1, -1, 0)  # code, line, field, nfields, offset, length
    d_rows: list[list[int]] = []
    s_rows: list[list[int]] = []
    l_rows: list[int] = []
    while pos < length and rows < capacity:
        nl = buf.find(b"\n", pos)
        if nl < 0 and not final:
            break
        end = nl if nl >= 0 else length
        line = buf[pos:end]
        if line.endswith(b"\r"):
            line = line[:-1]
        code = 0
        if _LINE_RE.fullmatch(line):
            fields = line.split(b"\t")
            row_dense = [int(v) if v else 0 for v in fields[1 : 1 + DENSE_COLUMNS]]
            row_sparse = [int(v, 16) if v else 0 for v in fields[1 + DENSE_COLUMNS :]]
            if min(row_dense) < _INT32_MIN or max(row_dense) > _INT32_MAX or max(row_sparse) >= _HEX_LIMIT:
                code, fld, nfields = _check_line(line)
            else:
                l_rows.append(fields[0] == b"1")
                d_rows.append(row_dense)
                s_rows.append(row_sparse)
                rows += 1
        else:
            code, fld, nfields = _check_line(line)
        if code:
            if err[0] == 0:
                err = (code, lines, fld, nfields, pos, len(line))
            if not skip_bad:
                break
            bad += 1
        lines += 1
        pos = end + 1 if nl >= 0 else length
    if rows:
        dense[:rows] = np.asarray(d_rows, dtype=np.int32)
        sparse[:rows] = np.asarray(s_rows, dtype=np.int64)
        labels[:rows, 0] = np.asarray(l_rows, dtype=np.int32)
    dmin = int(dense[:rows].min()) if rows else _INT32_MAX
    return (rows, lines, pos, bad, dmin, err[0], err[1], err[2], err[3], err[4], err[5])


def _python_count_lines(data: Any, length: int) -> int:
    return bytes(memoryview(data)[:length]).count(b"\n")


@dataclass(frozen=True)
class _Parser:
    name: str
    count_lines: Callable[[Any, int], int]
    parse: Callable[..., tuple[int, ...]]


_PYTHON = _Parser("python", _python_count_lines, _python_parse)
_native_lock = threading.Lock()
_native_state: dict[str, Any] = {"module": None, "error": None, "warned": False}


def _native_source() -> Path:
    from lightning_dlac.codec._loader import sources_dir

    return sources_dir() / "criteo" / "criteo_tsv.cpp"


def _load_native() -> Any:
    """Build (once per source hash, cached on disk like the codec) and import the native parser."""
    with _native_lock:
        if _native_state["module"] is not None:
            return _native_state["module"]
        if _native_state["error"] is not None:
            raise RuntimeError(_native_state["error"])
        try:
            import torch
            from torch.utils import cpp_extension

            from lightning_dlac.codec._loader import ENV_DIR

            source = _native_source()
            if not source.is_file():
                raise RuntimeError(f"the parser source {source} is missing")
            if shutil.which(os.environ.get("CXX", "c++")) is None:
                raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
            flags = ["-O3"]
            digest = hashlib.sha256(source.read_bytes() + " ".join(flags).encode() + torch.__version__.encode())
            root = Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "lightning_dlac")
            directory = root / f"criteo_tsv_{digest.hexdigest()[:16]}"
            directory.mkdir(parents=True, exist_ok=True)
            module = cpp_extension.load(
                name=f"dlac_criteo_tsv_{digest.hexdigest()[:16]}",
                sources=[str(source)],
                extra_cflags=flags,
                build_directory=str(directory),
                verbose=False,
            )
        except Exception as e:  # noqa: BLE001 - any build failure becomes one explained error
            _native_state["error"] = f"building the native Criteo parser failed: {str(e)[-3000:]}"
            raise RuntimeError(_native_state["error"]) from e
        _native_state["module"] = module
        return module


def _resolve_parser(impl: str = "auto") -> _Parser:
    """Map ``impl`` (and ``DLAC_PREPROCESS_IMPL`` when "auto") to a parser; auto falls back with one warning."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
    if impl == "auto":
        impl = os.environ.get(ENV_IMPL, "auto").strip().lower() or "auto"
        if impl not in IMPLS:
            raise ValueError(f"{ENV_IMPL}={impl!r} is not one of {IMPLS}")
    if impl == "python":
        return _PYTHON
    try:
        module = _load_native()
    except RuntimeError as e:
        if impl == "native":
            raise
        if not _native_state["warned"]:
            _native_state["warned"] = True
            warnings.warn(
                f"lightning_dlac: the native Criteo parser is unavailable, using the Python parser (about 30x"
                f" slower). Cause: {str(e).splitlines()[0]} (set {ENV_IMPL}=native to see the build log, or"
                f" {ENV_IMPL}=python to silence this).",
                RuntimeWarning,
                stacklevel=3,
            )
        return _PYTHON
    return _Parser("native", module.count_lines, module.parse)


# --------------------------------------------------------------------------------------------------------------------
# .npy files with a fixed-size header, written at offsets.


def _npy_header(dtype: np.dtype, shape: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    header = out.getvalue()
    if len(header) > _HEADER_BYTES:
        raise RuntimeError(f"a .npy header for shape {shape} needs {len(header)} bytes, more than {_HEADER_BYTES}")
    # Re-pad to exactly _HEADER_BYTES: the header text ends with spaces and a newline that numpy accepts as padding.
    text = header[10:].rstrip(b"\n")
    text = text.ljust(_HEADER_BYTES - 10 - 1) + b"\n"
    return header[:8] + (len(text)).to_bytes(2, "little") + text


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset``: a short write is continued, writing nothing (disk full) raises."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"could not write the output at byte {offset} (disk full?)")
        view, offset = view[n:], offset + n


def _format_error(path: Path, line_no: int, code: int, fld: int, nfields: int, text: bytes) -> str:
    where = f"{path}, line {line_no}"
    if code == _ERR_FIELD_COUNT:
        hint = " (a blank line)" if not text.strip() else ""
        return (
            f"{where}: expected {_NUM_FIELDS} tab-separated fields (label, {DENSE_COLUMNS} integer, {SPARSE_COLUMNS}"
            f" categorical), got {nfields}{hint}. Criteo's Kaggle test.txt has no label column and cannot be converted."
        )
    fields = text.split(b"\t")
    value = fields[fld].decode("utf-8", "replace") if 0 <= fld < len(fields) else "?"
    if code == _ERR_LABEL:
        return f"{where}: the label (field 1) must be 0 or 1, got {value!r}."
    if code in (_ERR_DENSE, _ERR_DENSE_RANGE):
        what = "is not an integer" if code == _ERR_DENSE else "is outside the int32 range"
        return f"{where}: integer feature int_{fld - 1} (field {fld + 1}) {what}: {value!r}."
    what = "is not a hex string" if code == _ERR_HEX else "is 2**63 or more"
    return f"{where}: categorical feature cat_{fld - 1 - DENSE_COLUMNS} (field {fld + 1}) {what}: {value!r}."


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
    dmin: int = _INT32_MAX
    first_error: tuple[int, str] | None = None  # (line number, message)
    error_lines: list[int] = field(default_factory=list)


def _count_range(parser: _Parser, path: Path, start: int, end: int) -> int:
    """Lines in bytes [start, end) of the file; a final unterminated line counts."""
    n = 0
    buf = bytearray(BLOCK_BYTES)
    last = b"\n"
    with path.open("rb", buffering=0) as f:
        f.seek(start)
        pos = start
        while pos < end:
            got = f.readinto(memoryview(buf)[: min(BLOCK_BYTES, end - pos)])
            if not got:
                break
            n += parser.count_lines(buf, got)
            last = bytes(buf[got - 1 : got])
            pos += got
    return n + (end > start and last != b"\n")


def _convert_range(
    parser: _Parser,
    path: Path,
    start: int,
    end: int,
    first_line: int,
    first_row: int,
    fds: Sequence[int],
    skip_bad: bool,
    stop: threading.Event,
    progress: Callable[[int], None],
) -> _RangeResult:
    """Parse bytes [start, end) of the file (whole lines) and write its rows from row ``first_row`` on."""
    result = _RangeResult()
    cap = BLOCK_BYTES // _MIN_LINE_BYTES + 1
    dense = np.empty((cap, DENSE_COLUMNS), np.int32)
    sparse = np.empty((cap, SPARSE_COLUMNS), np.int64)
    labels = np.empty((cap, 1), np.int32)
    row_bytes = [dtype.itemsize * cols for _, dtype, cols in _OUTPUTS]
    buf = bytearray(BLOCK_BYTES)
    held = 0  # bytes at the start of buf not parsed yet (an incomplete line)
    pos = start
    with path.open("rb", buffering=0) as f:
        f.seek(start)
        while True:
            if stop.is_set():
                raise _Stop
            if held == len(buf):
                if len(buf) >= _MAX_LINE_BYTES:
                    line_no = first_line + result.lines + 1
                    raise CriteoFormatError(
                        f"{path}, line {line_no}: longer than {_MAX_LINE_BYTES >> 20} MiB; not a Criteo TSV file.",
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
                view = memoryview(buf)[offset:length]
                out = parser.parse(view, length - offset, dense, sparse, labels, skip_bad, final)
                rows, lines, consumed, bad, dmin, code, err_line, fld, nfields, err_off, err_len = out
                if rows:
                    at = first_row + result.rows
                    for fd, arr, nbytes in zip(fds, (dense, sparse, labels), row_bytes):
                        _pwrite_all(fd, arr[:rows], _HEADER_BYTES + at * nbytes)
                    result.rows += rows
                    result.dmin = min(result.dmin, dmin)
                if code:
                    line_no = first_line + result.lines + err_line + 1
                    text = bytes(view[err_off : err_off + err_len])
                    message = _format_error(path, line_no, code, fld, nfields, text)
                    if not skip_bad:
                        raise CriteoFormatError(message, str(path), line_no)
                    if result.first_error is None:
                        result.first_error = (line_no, message)
                result.bad += bad
                result.lines += lines
                progress(lines)
                offset += consumed
                if consumed == 0 or offset >= length or rows < cap:
                    break
            held = length - offset
            if final:
                # With final=True the parser takes an unterminated last line too, so nothing is left over.
                assert held == 0, f"{path}: {held} bytes at the end of bytes {start}..{end} were not parsed"
                return result
            if held:
                buf[:held] = buf[offset:length]


def _finish_dense(fd: int, dmin: int, blocks: list[tuple[int, int]], pool: ThreadPoolExecutor) -> None:
    """Rewrite the raw int32 dense features as TorchRec's ``log(x - min + 2)`` float32, in place, block by block."""
    with np.errstate(over="ignore"):
        shift = np.int32(dmin) - np.int32(2)  # the same int32 arithmetic as tsv_to_npys, overflow included

    def one(block: tuple[int, int]) -> None:
        lo, hi = block
        nbytes = (hi - lo) * DENSE_COLUMNS * 4
        offset = _HEADER_BYTES + lo * DENSE_COLUMNS * 4
        raw = np.frombuffer(os.pread(fd, nbytes, offset), dtype=np.int32).copy()
        if raw.size * 4 != nbytes:
            raise OSError(f"short read of the dense features at rows {lo}..{hi}")
        raw -= shift
        _pwrite_all(fd, np.log(raw, dtype=np.float32), offset)

    list(pool.map(one, blocks))


def _compact(fds: Sequence[int], ranges: list[tuple[int, int, int]]) -> None:
    """Move each range's rows down to close the gaps skipped lines left: ``ranges`` = (slot start, rows, target)."""
    chunk_rows = 1 << 16
    for fd, (_, dtype, cols) in zip(fds, _OUTPUTS):
        nbytes = dtype.itemsize * cols
        for slot, rows, target in ranges:
            if slot == target:
                continue
            # target < slot, so copying forwards never overwrites rows not yet moved.
            for lo in range(0, rows, chunk_rows):
                n = min(chunk_rows, rows - lo)
                data = os.pread(fd, n * nbytes, _HEADER_BYTES + (slot + lo) * nbytes)
                _pwrite_all(fd, data, _HEADER_BYTES + (target + lo) * nbytes)


def _convert_file(
    path: Path,
    output_dir: Path,
    workers: int,
    skip_bad_lines: bool,
    parser: _Parser,
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
    parts = max(1, min(workers, size // _MIN_RANGE_BYTES + 1))
    ranges = _split_ranges(path, size, parts)
    partials = [p.with_name(p.name + ".partial") for p in finals]
    fds: list[int] = []
    from tqdm import tqdm

    with ThreadPoolExecutor(max_workers=parts) as pool:
        counts = list(pool.map(lambda r: _count_range(parser, path, *r), ranges))
        total = sum(counts)
        starts = np.cumsum([0, *counts]).tolist()
        try:
            for p, (_, dtype, cols) in zip(partials, _OUTPUTS):
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                fds.append(fd)
                _pwrite_all(fd, _npy_header(dtype, (total, cols)), 0)
                os.ftruncate(fd, _HEADER_BYTES + total * dtype.itemsize * cols)
            bar = tqdm(
                total=total, unit="rows", unit_scale=True, desc=stem, disable=not progress, file=sys.stderr,
                smoothing=0.1, mininterval=0.5,
            )  # fmt: skip
            bar_lock = threading.Lock()

            def advance(n: int) -> None:
                with bar_lock:
                    bar.update(n)

            stop = threading.Event()

            def run(k: int) -> _RangeResult:
                try:
                    return _convert_range(
                        parser, path, ranges[k][0], ranges[k][1], starts[k], starts[k], fds, skip_bad_lines, stop,
                        advance,
                    )  # fmt: skip
                except BaseException:
                    stop.set()
                    raise

            futures = [pool.submit(run, k) for k in range(parts)]
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
                # Ctrl-C (or a worker's KeyboardInterrupt): stop the others at their next block and wait for them,
                # so no thread still writes through a descriptor that the cleanup below closes.
                stop.set()
                wait(futures)
                raise
            finally:
                bar.close()
            if errors:
                errors.sort(key=lambda e: getattr(e, "line", 0))
                raise errors[0]
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
            for fd, (_, dtype, cols) in zip(fds, _OUTPUTS):
                _pwrite_all(fd, _npy_header(dtype, (rows, cols)), 0)
                os.ftruncate(fd, _HEADER_BYTES + rows * dtype.itemsize * cols)
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
        impl: ``auto`` | ``native`` | ``python`` parser (see ``DLAC_PREPROCESS_IMPL``).

    Returns:
        One :class:`CriteoConversion` per input, in order.

    Raises:
        CriteoFormatError: A malformed line (file and line number in the message), unless ``skip_bad_lines``.
        FileNotFoundError: An input is missing.
        FileExistsError: An output exists and ``overwrite`` is False.
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
    parser = _resolve_parser(impl)
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


# --------------------------------------------------------------------------------------------------------------------
# Reading the outputs back: checks shared with examples.data.CriteoBinaryDataModule.


def _npy_shape(path: Path, dtype: np.dtype, cols: int) -> int:
    """Rows of a .npy that must hold ``dtype`` ``[N, cols]``; an error naming the file and the problem otherwise."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Create it with `dlac preprocess criteo --output {path.parent} <TSV files>`."
        )
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, file_dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, file_dtype = np.lib.format.read_array_header_2_0(f)
            header = f.tell()
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a valid .npy file ({e}); re-create it with `dlac preprocess criteo`.") from e
    if file_dtype != dtype:
        raise ValueError(f"{path} holds {file_dtype}, expected {dtype}; re-create it with `dlac preprocess criteo`.")
    if len(shape) != 2 or shape[1] != cols or fortran:
        raise ValueError(
            f"{path} has shape {shape}{' (Fortran order)' if fortran else ''}, expected a C-order [N, {cols}] array."
        )
    expected = header + shape[0] * cols * dtype.itemsize
    if size != expected:
        raise ValueError(
            f"{path} is {'truncated' if size < expected else 'longer than its header says'}: {size} bytes, expected"
            f" {expected} for {shape[0]} rows; re-create it with `dlac preprocess criteo`."
        )
    return int(shape[0])


def check_criteo_binary(directory: str | os.PathLike, stem: str) -> int:
    """Validate ``<stem>_{dense,sparse,labels}.npy`` in ``directory`` from their headers; return the row count.

    Raises:
        FileNotFoundError: A file is missing.
        ValueError: Wrong dtype or shape, a truncated file, or row counts that differ between the three.
    """
    rows = [_npy_shape(p, dtype, cols) for p, (_, dtype, cols) in zip(binary_paths(directory, stem), _OUTPUTS)]
    if len(set(rows)) != 1:
        names = ", ".join(f"{p.name}: {n}" for p, n in zip(binary_paths(directory, stem), rows))
        raise ValueError(f"{stem}: the dense, sparse and labels files disagree on the row count ({names}).")
    return rows[0]


# --------------------------------------------------------------------------------------------------------------------
# Command line.


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlac preprocess",
        description="Convert datasets to the binary layouts the DataModules read.",
    )
    sub = parser.add_subparsers(dest="dataset", required=True)
    criteo = sub.add_parser(
        "criteo",
        help="Criteo TSV (Kaggle train.txt, 1TB day_N) -> TorchRec's <stem>_{dense,sparse,labels}.npy",
        description="Criteo TSV files (Kaggle train.txt, 1TB day_0..day_23) -> TorchRec's binary layout:"
        " <stem>_dense.npy float32 [N,13], <stem>_sparse.npy int64 [N,26], <stem>_labels.npy int32 [N,1].",
    )
    criteo.add_argument("inputs", nargs="+", metavar="INPUT", help="Criteo TSV files (decompressed)")
    criteo.add_argument("--output", "-o", required=True, help="output directory (created if missing)")
    criteo.add_argument("--workers", "-j", type=int, default=1, help="threads per file (default 1)")
    criteo.add_argument(
        "--skip-bad-lines", action="store_true", help="skip malformed lines and report how many, instead of stopping"
    )
    criteo.add_argument("--overwrite", action="store_true", help="replace existing output files")
    criteo.add_argument("--no-progress", action="store_true", help="no progress bar")
    criteo.add_argument("--impl", choices=IMPLS, default="auto", help="parser (default: native if it builds)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``dlac preprocess criteo --output DIR INPUT...``; returns the exit status (an error is logged as one line,
    status 1). Output goes through the ``lightning_dlac.preprocess`` logger (to stderr unless logging is set up)."""
    args = _build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        results = preprocess_criteo(
            args.inputs,
            args.output,
            workers=args.workers,
            skip_bad_lines=args.skip_bad_lines,
            progress=not args.no_progress,
            overwrite=args.overwrite,
            impl=args.impl,
        )
    except (CriteoFormatError, FileNotFoundError, FileExistsError, ValueError) as e:
        log.error(f"dlac preprocess: error: {e}")
        return 1
    for r in results:
        skipped = f", skipped {r.bad_lines} malformed line(s) (first: {r.first_bad_line})" if r.bad_lines else ""
        log.info(
            f"{r.input} -> {r.paths[0].parent}/{r.stem}_{{dense,sparse,labels}}.npy: {r.rows} rows in"
            f" {r.seconds:.1f} s ({r.rows_per_second / 1e6:.2f}M rows/s){skipped}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
