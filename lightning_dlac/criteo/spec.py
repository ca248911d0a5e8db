"""The one definition of a valid Criteo TSV line, as a pure-Python reference parser, and the errors that name a bad one.

A line is the bytes before ``\\n`` (one trailing ``\\r`` is dropped): 40 tab-separated fields.

| field | valid | value |
|---|---|---|
| label | exactly ``0`` or ``1`` | int32 |
| 13 integers | empty, or ``[+-]?[0-9]+`` within int32 | int32, missing = 0 |
| 26 categoricals | empty, or ``[0-9a-fA-F]+`` below 2**63 | int64 (not hashed), missing = 0 |

Anything else (39 or 41 fields, a blank line, ``1.5``, `` 7``, ``-1f``, a 17-digit hex) is a bad line, reported
with :func:`describe_error` as the file, the line number, the field and its value. :func:`parse` is the
specification of the native parser in ``lightning_dlac/criteo/criteo_tsv.cpp``: same arguments, same result tuple, same
rows (tests/criteo/test_preprocess.py holds them to it on mutated lines). Everything that reads Criteo TSV, the
converter
(``dlac preprocess criteo``) and ``CriteoTSVDataModule`` alike, parses through one of the two
(:mod:`lightning_dlac.criteo.parser`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dlac.criteo.format import DENSE_COLUMNS, NUM_FIELDS, SPARSE_COLUMNS

__all__ = ["count_lines", "describe_error", "parse"]

# Error codes shared with lightning_dlac/criteo/criteo_tsv.cpp (enum Err).
ERR_FIELD_COUNT, ERR_LABEL, ERR_DENSE, ERR_DENSE_RANGE, ERR_HEX, ERR_HEX_RANGE = 1, 2, 3, 4, 5, 6
INT32_MIN, INT32_MAX, HEX_LIMIT = -(2**31), 2**31 - 1, 2**63

_DENSE_RE = re.compile(rb"[+-]?[0-9]+")
_HEX_RE = re.compile(rb"[0-9a-fA-F]+")
_LINE_RE = re.compile(rb"[01](?:\t(?:[+-]?[0-9]+)?){13}(?:\t[0-9a-fA-F]*){26}")


def check_line(line: bytes) -> tuple[int, int, int]:
    """(error code, field, field count) of a line without its newline; ``(0, -1, -1)`` if it is valid."""
    fields = line.split(b"\t")
    if len(fields) != NUM_FIELDS:
        return ERR_FIELD_COUNT, -1, len(fields)
    if fields[0] not in (b"0", b"1"):
        return ERR_LABEL, 0, -1
    for k in range(DENSE_COLUMNS):
        v = fields[1 + k]
        if v:
            if not _DENSE_RE.fullmatch(v):
                return ERR_DENSE, 1 + k, -1
            if not INT32_MIN <= int(v) <= INT32_MAX:
                return ERR_DENSE_RANGE, 1 + k, -1
    for k in range(SPARSE_COLUMNS):
        v = fields[1 + DENSE_COLUMNS + k]
        if v:
            if not _HEX_RE.fullmatch(v):
                return ERR_HEX, 1 + DENSE_COLUMNS + k, -1
            if int(v, 16) >= HEX_LIMIT:
                return ERR_HEX_RANGE, 1 + DENSE_COLUMNS + k, -1
    return 0, -1, -1


def parse(
    data: Any, length: int, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, skip_bad: bool, final: bool
) -> tuple[int, ...]:
    """Parse the lines in ``data[:length]`` into the row buffers, from row 0.

    Only lines ended by ``\\n`` are parsed unless ``final`` (then a last unterminated line counts too); parsing also
    stops when the buffers are full, and at the first bad line unless ``skip_bad`` (a bad line that stops it is not
    consumed).

    Args:
        data: The bytes (any buffer).
        length: How many bytes of ``data`` to parse.
        dense: int32 ``[capacity, 13]`` buffer for the integer features.
        sparse: int64 ``[capacity, 26]`` buffer for the categoricals.
        labels: int32 ``[capacity, 1]`` buffer for the labels.
        skip_bad: Skip bad lines (counted) instead of stopping at the first.
        final: ``data[:length]`` ends the input.

    Returns:
        ``(rows, lines, consumed_bytes, bad_lines, dense_min, err_code, err_line, err_field, err_nfields,
        err_offset, err_length)``: ``lines`` counts every line consumed, bad ones included; ``err_*`` describe the
        first bad line (``err_line`` its index among the lines, ``err_offset`` / ``err_length`` its bytes in
        ``data``), or are ``0`` / ``-1`` when there is none; ``dense_min`` is the smallest integer feature of the
        rows (INT32_MAX without rows).
    """
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
            if min(row_dense) < INT32_MIN or max(row_dense) > INT32_MAX or max(row_sparse) >= HEX_LIMIT:
                code, fld, nfields = check_line(line)
            else:
                l_rows.append(fields[0] == b"1")
                d_rows.append(row_dense)
                s_rows.append(row_sparse)
                rows += 1
        else:
            code, fld, nfields = check_line(line)
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
    dmin = int(dense[:rows].min()) if rows else INT32_MAX
    return (rows, lines, pos, bad, dmin, err[0], err[1], err[2], err[3], err[4], err[5])


def count_lines(data: Any, length: int) -> int:
    """Newlines in ``data[:length]`` (the native ``count_lines``'s specification)."""
    return bytes(memoryview(data)[:length]).count(b"\n")


def describe_error(path: str | Path, line_no: int, code: int, fld: int, nfields: int, text: bytes) -> str:
    """The message of a bad line: ``<path>, line <n>: <what is wrong, which field, its value>``.

    Args:
        path: The file.
        line_no: The line's 1-based number.
        code: :func:`check_line`'s (or the native parser's) error code.
        fld: The bad field's 0-based index (codes other than the field count).
        nfields: The line's field count (the field-count code).
        text: The line's bytes, without the newline.
    """
    where = f"{path}, line {line_no}"
    if code == ERR_FIELD_COUNT:
        hint = " (a blank line)" if not text.strip() else ""
        return (
            f"{where}: expected {NUM_FIELDS} tab-separated fields (label, {DENSE_COLUMNS} integer, {SPARSE_COLUMNS}"
            f" categorical), got {nfields}{hint}. Criteo's Kaggle test.txt has no label column and cannot be used."
        )
    fields = text.split(b"\t")
    value = fields[fld].decode("utf-8", "replace") if 0 <= fld < len(fields) else "?"
    if code == ERR_LABEL:
        return f"{where}: the label (field 1) must be 0 or 1, got {value!r}."
    if code in (ERR_DENSE, ERR_DENSE_RANGE):
        what = "is not an integer" if code == ERR_DENSE else "is outside the int32 range"
        return f"{where}: integer feature int_{fld - 1} (field {fld + 1}) {what}: {value!r}."
    what = "is not a hex string" if code == ERR_HEX else "is 2**63 or more"
    return f"{where}: categorical feature cat_{fld - 1 - DENSE_COLUMNS} (field {fld + 1}) {what}: {value!r}."
