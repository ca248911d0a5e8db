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

With ``--multi-hot-sizes`` (:func:`materialize_multi_hot`) each day's one-hot ids then become MLPerf DLRM v2's
multi-hot bags, ``<stem>_sparse_multi_hot.npz`` (one int32 ``[N, P_t]`` array per feature, members ``"0"`` ..
``"25"``, stored uncompressed as ``np.savez`` stores them), streamed in blocks; :func:`check_criteo_multi_hot` is the
loader's check of those files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import re
import shutil
import struct
import sys
import threading
import time
import warnings
import zlib
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
    "MultiHotMaterialization",
    "MultiHotMember",
    "SPARSE_COLUMNS",
    "binary_paths",
    "check_criteo_binary",
    "check_criteo_multi_hot",
    "main",
    "materialize_multi_hot",
    "multi_hot_path",
    "preprocess_criteo",
    "read_multi_hot_layout",
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
# Multi-hot: MLPerf DLRM v2's `<stem>_sparse_multi_hot.npz`, materialised from the one-hot `<stem>_sparse.npy`.

MULTI_HOT_SUFFIX = "sparse_multi_hot"
# The extra member naming the table sizes the bags were drawn for; MLPerf's readers load members "0".."25" by name
# and ignore it, this package's loader checks it against its num_embeddings_per_feature.
MULTI_HOT_TABLES_MEMBER = "num_embeddings_per_feature"
# Rows materialised per block: about 215 ids per row with MLPerf's pooling factors, so a block's ids and the hash's
# temporaries (one table at a time) stay well under 100 MiB per worker.
MULTI_HOT_BLOCK_ROWS = 8192
# zipfile's limits: past them a size or an offset goes to a ZIP64 extra field (zipfile.ZIP64_LIMIT is 2**31 - 1).
_ZIP64_LIMIT = (1 << 31) - 1
_ZIP_FILECOUNT_LIMIT = (1 << 16) - 1
_ZIP_LOCAL = struct.Struct("<4s2B4HL2L2H")
_ZIP_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_ZIP_END64 = struct.Struct("<4sQ2H2L4Q")
_ZIP_END64_LOCATOR = struct.Struct("<4sLQL")
_ZIP_END = struct.Struct("<4s4H2LH")
# The members' timestamp: numpy 2's np.savez writes this fixed one, so equal arrays give equal files.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def multi_hot_path(directory: str | os.PathLike, stem: str) -> Path:
    """``<directory>/<stem>_sparse_multi_hot.npz``: MLPerf DLRM v2's multi-hot ids of ``stem``."""
    return Path(directory) / f"{stem}_{MULTI_HOT_SUFFIX}.npz"


@dataclass(frozen=True)
class MultiHotMember:
    """Where one feature's ``[rows, cols]`` ids lie inside a ``_sparse_multi_hot.npz`` (a stored, uncompressed
    member, so the bytes at ``offset`` are the C-order array itself and can be read or memory-mapped in place)."""

    # The member's name, "0.npy" .. "25.npy".
    name: str
    # Byte offset of the array's first element in the .npz file.
    offset: int
    rows: int
    cols: int
    dtype: np.dtype


@dataclass(frozen=True)
class MultiHotMaterialization:
    """What :func:`materialize_multi_hot` wrote for one day."""

    # The one-hot ``<stem>_sparse.npy`` read.
    source: Path
    stem: str
    rows: int
    # Wall time, seconds.
    seconds: float
    # The ``<stem>_sparse_multi_hot.npz`` written.
    path: Path

    @property
    def rows_per_second(self) -> float:
        """Rows materialised per second."""
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def _dos_time(date_time: tuple[int, ...]) -> tuple[int, int]:
    """(time, date) in the zip format's MS-DOS encoding, as zipfile writes them."""
    y, mo, d, h, mi, s = date_time
    return h << 11 | mi << 5 | (s // 2), (y - 1980) << 9 | mo << 5 | d


class _StoredZipWriter:
    """Writes an uncompressed .zip whose member sizes are known up front, members filled at their offsets in any
    order: the layout ``np.savez`` writes (zipfile's ``open(name, "w", force_zip64=True)``: a ZIP64 extra field in
    every local header; ZIP64 fields in the central directory only where a size or offset needs them), so MLPerf's
    readers, which find a member's bytes from its local header, read it like an ``np.savez`` file.

    ``member_offset(k)`` is where member ``k``'s bytes start; write them with :func:`_pwrite_all` in order within a
    member while feeding the same bytes to ``update_crc(k, data)``; :meth:`finish` writes the headers and the
    central directory."""

    def __init__(self, fd: int, names: Sequence[str], sizes: Sequence[int], date_time: tuple[int, ...]) -> None:
        self.fd = fd
        self.names = [n.encode("ascii") for n in names]
        self.sizes = list(sizes)
        self.crcs = [0] * len(names)
        self.time, self.date = _dos_time(date_time)
        self.header_offsets: list[int] = []
        self.data_offsets: list[int] = []
        offset = 0
        for name, size in zip(self.names, self.sizes):
            self.header_offsets.append(offset)
            offset += _ZIP_LOCAL.size + len(name) + 20  # 20: the ZIP64 extra field (id, length, two sizes)
            self.data_offsets.append(offset)
            offset += size
        self.end_of_data = offset

    def member_offset(self, k: int) -> int:
        return self.data_offsets[k]

    def update_crc(self, k: int, data: Any) -> None:
        self.crcs[k] = zlib.crc32(data, self.crcs[k])

    def finish(self) -> int:
        """Write the local headers, central directory and end records; return the file's length."""
        for k, (name, size) in enumerate(zip(self.names, self.sizes)):
            extra = struct.pack("<HHQQ", 1, 16, size, size)
            header = _ZIP_LOCAL.pack(
                b"PK\x03\x04", 45, 0, 0, 0, self.time, self.date, self.crcs[k], 0xFFFFFFFF, 0xFFFFFFFF,
                len(name), len(extra),
            )  # fmt: skip
            _pwrite_all(self.fd, header + name + extra, self.header_offsets[k])
        central = bytearray()
        for k, (name, size) in enumerate(zip(self.names, self.sizes)):
            fields: list[int] = []
            file_size = compress_size = size
            if size > _ZIP64_LIMIT:
                fields += [size, size]
                file_size = compress_size = 0xFFFFFFFF
            header_offset = self.header_offsets[k]
            if header_offset > _ZIP64_LIMIT:
                fields.append(header_offset)
                header_offset = 0xFFFFFFFF
            extra = struct.pack("<HH" + "Q" * len(fields), 1, 8 * len(fields), *fields) if fields else b""
            central += _ZIP_CENTRAL.pack(
                b"PK\x01\x02", 45, 3, 45, 0, 0, 0, self.time, self.date, self.crcs[k], compress_size, file_size,
                len(name), len(extra), 0, 0, 0, 0o600 << 16, header_offset,
            ) + name + extra  # fmt: skip
        start, count = self.end_of_data, len(self.names)
        end = bytearray(central)
        if count > _ZIP_FILECOUNT_LIMIT or start > _ZIP64_LIMIT or len(central) > _ZIP64_LIMIT:
            end += _ZIP_END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(central), start)
            end += _ZIP_END64_LOCATOR.pack(b"PK\x06\x07", 0, start + len(central), 1)
        end += _ZIP_END.pack(
            b"PK\x05\x06", 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), min(len(central), 0xFFFFFFFF),
            min(start, 0xFFFFFFFF), 0,
        )  # fmt: skip
        _pwrite_all(self.fd, bytes(end), start)
        return start + len(end)


def _npy_header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header ``np.save`` writes for a C-order array of ``dtype`` and ``shape``."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _sizes_for_tables(values: Sequence[int], what: str) -> list[int]:
    sizes = [int(v) for v in values]
    if len(sizes) != SPARSE_COLUMNS:
        raise ValueError(f"{what} needs one value per categorical feature ({SPARSE_COLUMNS}), got {len(sizes)}.")
    if min(sizes) < 1:
        raise ValueError(f"{what} must all be at least 1, got {sizes}.")
    return sizes


def _materialize_one(
    source_dir: Path,
    stem: str,
    output_dir: Path,
    sizes: list[int],
    tables: list[int],
    workers: int,
    block_rows: int,
    overwrite: bool,
    progress: bool,
) -> MultiHotMaterialization:
    import torch

    from lightning_dlac.examples.data import multi_hot_from_one_hot

    t0 = time.perf_counter()
    rows = check_criteo_binary(source_dir, stem)
    sparse_path = binary_paths(source_dir, stem)[1]
    final = multi_hot_path(output_dir, stem)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists; pass --overwrite (overwrite=True) to replace it.")
    if output_dir.resolve() != source_dir.resolve():
        _place_dense_and_labels(source_dir, output_dir, stem, overwrite)
    names = [f"{t}.npy" for t in range(SPARSE_COLUMNS)] + [f"{MULTI_HOT_TABLES_MEMBER}.npy"]
    int32, int64 = np.dtype("<i4"), np.dtype("<i8")
    headers = [_npy_header_bytes(int32, (rows, p)) for p in sizes]
    meta = np.asarray(tables, dtype=int64)
    headers.append(_npy_header_bytes(int64, meta.shape))
    member_sizes = [len(h) + rows * p * 4 for h, p in zip(headers, sizes)] + [len(headers[-1]) + meta.nbytes]
    partial = final.with_name(final.name + ".partial")
    fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    src = os.open(sparse_path, os.O_RDONLY)
    try:
        src_start = _npy_data_offset(sparse_path)
        zw = _StoredZipWriter(fd, names, member_sizes, _ZIP_DATE_TIME)
        os.ftruncate(fd, zw.end_of_data)
        for k, header in enumerate(headers):
            _pwrite_all(fd, header, zw.member_offset(k))
            zw.update_crc(k, header)
        _pwrite_all(fd, meta.tobytes(), zw.member_offset(len(names) - 1) + len(headers[-1]))
        zw.update_crc(len(names) - 1, meta.tobytes())
        hashes = np.asarray(tables, dtype=np.int64)
        row_bytes = SPARSE_COLUMNS * 8

        def block(lo: int) -> list[np.ndarray]:
            n = min(block_rows, rows - lo)
            data = os.pread(src, n * row_bytes, src_start + lo * row_bytes)
            if len(data) != n * row_bytes:
                raise OSError(f"short read from {sparse_path} at row {lo}: the file changed while reading?")
            one_hot = np.frombuffer(data, dtype=np.int64).reshape(n, SPARSE_COLUMNS) % hashes
            ids = torch.from_numpy(np.ascontiguousarray(one_hot.T))
            values = multi_hot_from_one_hot(ids, sizes, tables).to(torch.int32).numpy()
            parts = np.split(values, np.cumsum([p * n for p in sizes])[:-1])  # feature t: its [n, P_t] ids
            for t, part in enumerate(parts):
                _pwrite_all(fd, part, zw.member_offset(t) + len(headers[t]) + lo * sizes[t] * 4)
            return parts

        from tqdm import tqdm

        bar = tqdm(total=rows, unit="rows", unit_scale=True, desc=f"{stem} multi-hot", disable=not progress,
                   file=sys.stderr, smoothing=0.1, mininterval=0.5)  # fmt: skip
        starts = list(range(0, rows, block_rows))
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                # A bounded window of blocks in flight; their CRCs are folded in row order as they complete.
                pending: list[Any] = []
                nxt = 0
                try:
                    while nxt < len(starts) or pending:
                        while nxt < len(starts) and len(pending) < 2 * workers:
                            pending.append((starts[nxt], pool.submit(block, starts[nxt])))
                            nxt += 1
                        lo, fut = pending.pop(0)
                        for t, part in enumerate(fut.result()):
                            zw.update_crc(t, part)
                        bar.update(min(block_rows, rows - lo))
                except BaseException:
                    for _, fut in pending:  # a failed block or Ctrl-C: start no more; the pool waits for the rest
                        fut.cancel()
                    raise
        finally:
            bar.close()
        length = zw.finish()
        os.ftruncate(fd, length)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(partial, final)
    finally:
        os.close(src)
        if fd >= 0:
            os.close(fd)
        if partial.exists():
            partial.unlink()
    return MultiHotMaterialization(sparse_path, stem, rows, time.perf_counter() - t0, final)


def _place_dense_and_labels(source_dir: Path, output_dir: Path, stem: str, overwrite: bool) -> None:
    """Hard-link (or copy, across file systems) ``<stem>_{dense,labels}.npy`` next to the .npz: the loader reads a
    day's three files from one directory."""
    src_dense, _, src_labels = binary_paths(source_dir, stem)
    dst_dense, _, dst_labels = binary_paths(output_dir, stem)
    for src, dst in ((src_dense, dst_dense), (src_labels, dst_labels)):
        if dst.exists():
            if dst.samefile(src):
                continue
            if not overwrite:
                raise FileExistsError(f"{dst} already exists; pass --overwrite (overwrite=True) to replace it.")
            dst.unlink()
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)


def materialize_multi_hot(
    sparse_files: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    multi_hot_sizes: Sequence[int],
    num_embeddings_per_feature: Sequence[int],
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    block_rows: int = MULTI_HOT_BLOCK_ROWS,
) -> list[MultiHotMaterialization]:
    """MLPerf DLRM v2's multi-hot ids from one-hot Criteo days: ``<stem>_sparse.npy`` to
    ``<stem>_sparse_multi_hot.npz``.

    As MLPerf's ``materialize_synthetic_multihot_dataset.py`` (torchrec_dlrm) does, feature ``t``'s one-hot id ``i``
    (taken modulo ``num_embeddings_per_feature[t]``) becomes the bag ``[i, e_1, ..., e_{P-1}]`` of
    ``P = multi_hot_sizes[t]`` ids, a fixed function of ``i`` whose extra ids are uniform over the table, and the
    file holds one int32 ``[rows, P]`` array per feature, members ``"0"`` .. ``"25"``, stored uncompressed as
    ``np.savez`` stores them (MLPerf's readers memory-map them in place). The bags come from
    ``examples.data.multi_hot_from_one_hot`` (a hash: no ``rows x P`` lookup table, 31 GB for MLPerf's largest),
    so they are the same distribution as MLPerf's files but not the same ids. One more member,
    ``num_embeddings_per_feature``, records the table sizes, which ``CriteoBinaryDataModule`` checks.

    The day is read and written in blocks of ``block_rows`` rows (``workers`` at a time), so memory stays near
    ``workers x 100 MiB`` whatever the day's size; the output is written as ``<name>.partial``, flushed and renamed.
    When ``output_dir`` is not the input's directory the day's dense and labels files are hard-linked (or copied)
    there too, so the directory holds everything the loader reads.

    Args:
        sparse_files: One-hot ``<stem>_sparse.npy`` files written by :func:`preprocess_criteo` (or TorchRec's
            converter); the day's dense and labels files must sit beside each.
        output_dir: Directory for the ``.npz`` files (created if missing).
        multi_hot_sizes: Ids per bag of each of the 26 features (MLPerf: ``examples.data.MLPERF_MULTI_HOT_SIZES``).
        num_embeddings_per_feature: Rows of each table (MLPerf: ``examples.data.MLPERF_NUM_EMBEDDINGS_PER_FEATURE``).
        workers: Threads, each materialising its own blocks.
        overwrite: Replace existing outputs instead of refusing.
        progress: Show a progress bar on stderr.
        block_rows: Rows per block.

    Returns:
        One :class:`MultiHotMaterialization` per input, in order.
    """
    sizes = _sizes_for_tables(multi_hot_sizes, "multi_hot_sizes")
    tables = _sizes_for_tables(num_embeddings_per_feature, "num_embeddings_per_feature")
    if max(tables) > 2**31 - 1:
        raise ValueError(f"num_embeddings_per_feature above 2**31 - 1 do not fit the int32 ids; got {max(tables)}.")
    if workers < 1 or block_rows < 1:
        raise ValueError(f"workers and block_rows must be at least 1, got {workers} and {block_rows}.")
    paths = [Path(p).expanduser() for p in sparse_files]
    if not paths:
        raise ValueError("no input files given.")
    stems = []
    for p in paths:
        if not p.name.endswith("_sparse.npy"):
            raise ValueError(f"{p} is not a one-hot <stem>_sparse.npy file (from `dlac preprocess criteo`).")
        stems.append(p.name[: -len("_sparse.npy")])
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    if dupes:
        raise ValueError(f"several inputs share the stem {dupes[0]!r}; materialise them into different --output.")
    out = Path(output_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    return [
        _materialize_one(p.parent, stem, out, sizes, tables, workers, block_rows, overwrite, progress)
        for p, stem in zip(paths, stems)
    ]


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


def _npy_data_offset(path: Path) -> int:
    """Byte offset of a .npy file's first element."""
    with path.open("rb") as f:
        version = np.lib.format.read_magic(f)
        (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
        return f.tell()


def read_multi_hot_layout(path: str | os.PathLike) -> tuple[list[MultiHotMember], list[int] | None]:
    """The features' arrays in a ``<stem>_sparse_multi_hot.npz`` (members ``"0"`` .. ``"25"``, in feature order) and
    the table sizes it was materialised for (``None`` when it does not say, as in MLPerf's own files), from the zip
    directory and the members' headers only.

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Not a zip, a member missing or compressed (``np.savez_compressed``), not a C-order 2-D int32 or
            int64 array, or shorter than its header says.
    """
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found.")
    fix = "re-create it with `dlac preprocess criteo --multi-hot-sizes ...` (docs/data.md)"
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is not a valid .npz (zip) file ({e}); {fix}.") from e
    members: list[MultiHotMember] = []
    tables: list[int] | None = None
    with zf, path.open("rb") as f:
        for t in [*range(SPARSE_COLUMNS), MULTI_HOT_TABLES_MEMBER]:
            name = f"{t}.npy"
            try:
                info = zf.getinfo(name)
            except KeyError:
                if t == MULTI_HOT_TABLES_MEMBER:
                    continue
                raise ValueError(
                    f"{path} has no member {name!r} (the ids of feature cat_{t}); a multi-hot .npz holds one array per"
                    f" feature, named '0' .. '{SPARSE_COLUMNS - 1}' as MLPerf's materialisation writes them; {fix}."
                ) from None
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(
                    f"{path}: member {name!r} is compressed (np.savez_compressed?); its arrays must be stored"
                    f" uncompressed (np.savez) to be read in place; {fix}."
                )
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"{path}: member {name!r} has no valid local header; {fix}.")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            try:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
            except (ValueError, OSError, EOFError) as e:
                raise ValueError(f"{path}: member {name!r} is not a .npy array ({e}); {fix}.") from e
            offset = f.tell()
            if t == MULTI_HOT_TABLES_MEMBER:
                f.seek(offset)
                tables = np.frombuffer(f.read(8 * SPARSE_COLUMNS), dtype="<i8").tolist()
                if shape != (SPARSE_COLUMNS,) or dtype != np.dtype("<i8") or len(tables) != SPARSE_COLUMNS:
                    raise ValueError(f"{path}: member {name!r} is not {SPARSE_COLUMNS} int64 table sizes; {fix}.")
                continue
            if dtype not in (np.dtype("<i4"), np.dtype("<i8")) or len(shape) != 2 or fortran:
                raise ValueError(
                    f"{path}: member {name!r} holds {dtype} {list(shape)}{' (Fortran order)' if fortran else ''};"
                    f" expected C-order [rows, ids per row] int32 (MLPerf's) or int64; {fix}."
                )
            expected = offset - start + shape[0] * shape[1] * dtype.itemsize
            if info.file_size != expected or start + info.file_size > path.stat().st_size:
                raise ValueError(
                    f"{path}: member {name!r} is {info.file_size} bytes, {expected} expected for {list(shape)}"
                    f" {dtype} (a truncated file?); {fix}."
                )
            members.append(MultiHotMember(name, offset, int(shape[0]), int(shape[1]), dtype))
    return members, tables


def check_criteo_multi_hot(
    directory: str | os.PathLike,
    stem: str,
    multi_hot_sizes: Sequence[int],
    num_embeddings_per_feature: Sequence[int],
) -> tuple[int, list[MultiHotMember]]:
    """Validate ``<stem>_{dense,labels}.npy`` and ``<stem>_sparse_multi_hot.npz`` in ``directory`` (headers only)
    against the expected pooling factors and table sizes; return the row count and the features' arrays.

    Raises:
        FileNotFoundError: A file is missing (the message says how to create the .npz).
        ValueError: A bad file, row counts that differ, ids per row other than ``multi_hot_sizes``, or a file
            materialised for other table sizes than ``num_embeddings_per_feature``.
    """
    dense, sparse, labels = binary_paths(directory, stem)
    npz = multi_hot_path(directory, stem)
    sizes = ",".join(str(int(p)) for p in multi_hot_sizes)
    tables = ",".join(str(int(n)) for n in num_embeddings_per_feature)
    create = (
        f"dlac preprocess criteo --output {Path(directory)} --multi-hot-sizes {sizes}"
        f" --num-embeddings-per-feature {tables} {sparse}"
    )
    if not npz.is_file():
        raise FileNotFoundError(
            f"{npz} not found: with multi_hot_sizes set, the multi-hot ids of {stem!r} are read from"
            f" <stem>_{MULTI_HOT_SUFFIX}.npz (MLPerf DLRM v2's layout). Materialise it from the one-hot day with"
            f" `{create}`, or leave multi_hot_sizes unset to read the one-hot {sparse.name}."
        )
    rows = [_npy_shape(p, dtype, cols) for p, (_, dtype, cols) in zip((dense, labels), (_OUTPUTS[0], _OUTPUTS[2]))]
    members, file_tables = read_multi_hot_layout(npz)
    counts = {dense.name: rows[0], labels.name: rows[1], **{f"{npz.name}:{m.name}": m.rows for m in members}}
    if len(set(counts.values())) != 1:
        names = ", ".join(f"{k}: {v}" for k, v in counts.items() if v != rows[0] or k == dense.name)
        raise ValueError(f"{stem}: the dense, labels and multi-hot files disagree on the row count ({names}).")
    file_sizes = [m.cols for m in members]
    if file_sizes != [int(p) for p in multi_hot_sizes]:
        bad = [(f"cat_{t}", want, got) for t, (want, got) in enumerate(zip(multi_hot_sizes, file_sizes)) if want != got]
        raise ValueError(
            f"{npz} holds {file_sizes} ids per row, but multi_hot_sizes is {[int(p) for p in multi_hot_sizes]}"
            f" ((feature, multi_hot_sizes, file): {bad}). Set multi_hot_sizes to the file's (on the command line:"
            f" --data.multi_hot_sizes=[{','.join(map(str, file_sizes))}]), or re-materialise with `{create}`."
        )
    if file_tables is not None and file_tables != [int(n) for n in num_embeddings_per_feature]:
        raise ValueError(
            f"{npz} was materialised for tables of {file_tables} rows, but num_embeddings_per_feature is"
            f" {[int(n) for n in num_embeddings_per_feature]}: its ids would not index these tables as drawn. Set"
            " num_embeddings_per_feature to the file's"
            f" (--data.num_embeddings_per_feature=[{','.join(map(str, file_tables))}])"
            f" or re-materialise with `{create} --overwrite`."
        )
    return rows[0], members


# --------------------------------------------------------------------------------------------------------------------
# Command line.


def _int_list(text: str, named: dict[str, Callable[[], Sequence[int]]], option: str) -> list[int]:
    """A comma-separated list of integers, or one of the ``named`` shorthands."""
    key = text.strip().lower()
    if key in named:
        return [int(v) for v in named[key]()]
    try:
        return [int(v) for v in text.replace(" ", "").strip("[]").split(",")]
    except ValueError:
        shorthands = " or ".join(repr(k) for k in named)
        raise argparse.ArgumentTypeError(
            f"{option} takes {SPARSE_COLUMNS} comma-separated integers or {shorthands}, got {text!r}."
        ) from None


def _mlperf_multi_hot_sizes() -> Sequence[int]:
    from lightning_dlac.examples.data import MLPERF_MULTI_HOT_SIZES

    return MLPERF_MULTI_HOT_SIZES


def _mlperf_tables() -> Sequence[int]:
    from lightning_dlac.examples.data import MLPERF_NUM_EMBEDDINGS_PER_FEATURE

    return MLPERF_NUM_EMBEDDINGS_PER_FEATURE


def _kaggle_tables() -> Sequence[int]:
    from lightning_dlac.examples.data import CRITEO_KAGGLE_CARDINALITIES

    return CRITEO_KAGGLE_CARDINALITIES


def _table_sizes_option(text: str) -> list[int]:
    return _int_list(text, {"mlperf": _mlperf_tables, "kaggle": _kaggle_tables}, "--num-embeddings-per-feature")


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
        " <stem>_dense.npy float32 [N,13], <stem>_sparse.npy int64 [N,26], <stem>_labels.npy int32 [N,1]. With"
        " --multi-hot-sizes, also MLPerf DLRM v2's multi-hot ids <stem>_sparse_multi_hot.npz (one int32 [N, P]"
        " array per feature), from the TSV files or from <stem>_sparse.npy files converted before.",
    )
    criteo.add_argument(
        "inputs", nargs="+", metavar="INPUT",
        help="Criteo TSV files (decompressed), or with --multi-hot-sizes also <stem>_sparse.npy files converted before",
    )  # fmt: skip
    criteo.add_argument("--output", "-o", required=True, help="output directory (created if missing)")
    criteo.add_argument("--workers", "-j", type=int, default=1, help="threads per file (default 1)")
    criteo.add_argument(
        "--skip-bad-lines", action="store_true", help="skip malformed lines and report how many, instead of stopping"
    )
    criteo.add_argument("--overwrite", action="store_true", help="replace existing output files")
    criteo.add_argument("--no-progress", action="store_true", help="no progress bar")
    criteo.add_argument("--impl", choices=IMPLS, default="auto", help="parser (default: native if it builds)")
    criteo.add_argument(
        "--multi-hot-sizes", metavar="P0,...,P25|mlperf",
        type=lambda t: _int_list(t, {"mlperf": _mlperf_multi_hot_sizes}, "--multi-hot-sizes"),
        help="also write <stem>_sparse_multi_hot.npz with these ids per row for each feature; 'mlperf' is MLPerf DLRM"
        " v2's 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1",
    )  # fmt: skip
    criteo.add_argument(
        "--num-embeddings-per-feature", metavar="N0,...,N25|mlperf|kaggle",
        type=_table_sizes_option,
        help="table sizes the multi-hot ids are drawn for (required with --multi-hot-sizes; train with the same):"
        " 'mlperf' is MLPerf's Criteo 1TB sizes (40M-row cap), 'kaggle' Criteo Kaggle's cardinalities",
    )  # fmt: skip
    criteo.add_argument(
        "--max-rows", type=int, default=None,
        help="cap every table size at this many rows (CriteoBinaryDataModule's max_rows for the same tables)",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``dlac preprocess criteo --output DIR [--multi-hot-sizes ...] INPUT...``; returns the exit status (an error is
    logged as one line, status 1). Output goes through the ``lightning_dlac.preprocess`` logger (to stderr unless
    logging is set up)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if log.level == logging.NOTSET:
        # An import (torchrec's) may already have given the root logger a handler at WARNING: the per-file summary
        # lines are INFO and would not be seen.
        log.setLevel(logging.INFO)
    multi_hot = args.multi_hot_sizes is not None
    tables = args.num_embeddings_per_feature
    if multi_hot and tables is None:
        parser.error(
            "--multi-hot-sizes needs --num-embeddings-per-feature (the table sizes the extra ids are drawn from; train"
            " with the same): a list, 'mlperf' or 'kaggle'."
        )
    if not multi_hot and (tables is not None or args.max_rows is not None):
        parser.error("--num-embeddings-per-feature and --max-rows only apply with --multi-hot-sizes.")
    if args.max_rows is not None:
        if args.max_rows < 1:
            parser.error(f"--max-rows must be at least 1, got {args.max_rows}.")
        tables = [min(n, args.max_rows) for n in tables]
    npys = [p for p in args.inputs if p.endswith("_sparse.npy")]
    tsvs = [p for p in args.inputs if not p.endswith("_sparse.npy")]
    if npys and not multi_hot:
        parser.error(f"{npys[0]} is already converted; pass --multi-hot-sizes to materialise its multi-hot ids.")
    try:
        results = []
        if tsvs:
            results = preprocess_criteo(
                tsvs,
                args.output,
                workers=args.workers,
                skip_bad_lines=args.skip_bad_lines,
                progress=not args.no_progress,
                overwrite=args.overwrite,
                impl=args.impl,
            )
        for r in results:
            skipped = f", skipped {r.bad_lines} malformed line(s) (first: {r.first_bad_line})" if r.bad_lines else ""
            log.info(
                f"{r.input} -> {r.paths[0].parent}/{r.stem}_{{dense,sparse,labels}}.npy: {r.rows} rows in"
                f" {r.seconds:.1f} s ({r.rows_per_second / 1e6:.2f}M rows/s){skipped}"
            )
        if multi_hot:
            sources = [r.paths[1] for r in results] + [Path(p) for p in npys]
            for m in materialize_multi_hot(
                sources, args.output, args.multi_hot_sizes, tables, workers=args.workers, overwrite=args.overwrite,
                progress=not args.no_progress,
            ):  # fmt: skip
                log.info(
                    f"{m.source} -> {m.path}: {m.rows} rows in {m.seconds:.1f} s"
                    f" ({m.rows_per_second / 1e6:.2f}M rows/s)"
                )
    except (CriteoFormatError, FileNotFoundError, FileExistsError, ValueError) as e:
        log.error(f"dlac preprocess: error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
