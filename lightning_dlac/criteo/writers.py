"""Writing the binary layouts at offsets: ``.npy`` headers, positioned writes, and stored ``.zip`` (``.npz``) files.

The converter and the multi-hot materialisation fill their outputs out of order from several threads, each row or
block at its final offset (``os.pwrite``), so the headers are computed up front: :func:`npy_header` (the one ``.npy``
header writer, optionally padded to a fixed length so it can be rewritten in place with the final row count) and
:class:`StoredZipWriter` (the layout ``np.savez`` writes, member sizes known in advance).
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ZIP_DATE_TIME", "StoredZipWriter", "npy_header", "pwrite_all"]

# zipfile's limits: past them a size or an offset goes to a ZIP64 extra field (zipfile.ZIP64_LIMIT is 2**31 - 1).
_ZIP64_LIMIT = (1 << 31) - 1
_ZIP_FILECOUNT_LIMIT = (1 << 16) - 1
_ZIP_LOCAL = struct.Struct("<4s2B4HL2L2H")
_ZIP_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_ZIP_END64 = struct.Struct("<4sQ2H2L4Q")
_ZIP_END64_LOCATOR = struct.Struct("<4sLQL")
_ZIP_END = struct.Struct("<4s4H2LH")
# The members' timestamp: numpy 2's np.savez writes this fixed one, so equal arrays give equal files.
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)


def npy_header(dtype: np.dtype, shape: tuple[int, ...], length: int | None = None) -> bytes:
    """The .npy (version 1.0) header of a C-order array of ``dtype`` and ``shape``.

    Args:
        dtype: The array's dtype.
        shape: The array's shape.
        length: ``None``: exactly the header ``np.save`` writes. Else the header padded to ``length`` bytes (numpy
            accepts the spaces before the final newline as padding), so it can be rewritten in place once the final
            row count is known.
    """
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    header = out.getvalue()
    if length is None:
        return header
    if len(header) > length:
        raise RuntimeError(f"a .npy header for shape {shape} needs {len(header)} bytes, more than {length}")
    # magic (6) + version (2) + header length (2), then the text, re-padded to end exactly at `length`.
    text = header[10:].rstrip(b"\n")
    text = text.ljust(length - 10 - 1) + b"\n"
    return header[:8] + len(text).to_bytes(2, "little") + text


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset``: a short write is continued, writing nothing (disk full) raises."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"could not write the output at byte {offset} (disk full?)")
        view, offset = view[n:], offset + n


def _dos_time(date_time: tuple[int, ...]) -> tuple[int, int]:
    """(time, date) in the zip format's MS-DOS encoding, as zipfile writes them."""
    y, mo, d, h, mi, s = date_time
    return h << 11 | mi << 5 | (s // 2), (y - 1980) << 9 | mo << 5 | d


class StoredZipWriter:
    """Writes an uncompressed .zip whose member sizes are known up front, members filled at their offsets in any
    order: the layout ``np.savez`` writes (zipfile's ``open(name, "w", force_zip64=True)``: a ZIP64 extra field in
    every local header; ZIP64 fields in the central directory only where a size or offset needs them), so MLPerf's
    readers, which find a member's bytes from its local header, read it like an ``np.savez`` file.

    ``member_offset(k)`` is where member ``k``'s bytes start; write them with :func:`pwrite_all` in order within a
    member while feeding the same bytes to ``update_crc(k, data)``; :meth:`finish` writes the headers and the
    central directory.

    Args:
        fd: The output file, open for writing.
        names: The members' names, in order.
        sizes: The members' sizes in bytes.
        date_time: The members' timestamp (:data:`ZIP_DATE_TIME` as ``np.savez``).
    """

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
        """Byte offset of member ``k``'s data."""
        return self.data_offsets[k]

    def update_crc(self, k: int, data: Any) -> None:
        """Fold the next bytes of member ``k`` into its CRC (in order within the member)."""
        self.crcs[k] = zlib.crc32(data, self.crcs[k])

    def finish(self) -> int:
        """Write the local headers, central directory and end records; return the file's length."""
        for k, (name, size) in enumerate(zip(self.names, self.sizes)):
            extra = struct.pack("<HHQQ", 1, 16, size, size)
            header = _ZIP_LOCAL.pack(
                b"PK\x03\x04", 45, 0, 0, 0, self.time, self.date, self.crcs[k], 0xFFFFFFFF, 0xFFFFFFFF,
                len(name), len(extra),
            )  # fmt: skip
            pwrite_all(self.fd, header + name + extra, self.header_offsets[k])
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
        pwrite_all(self.fd, bytes(end), start)
        return start + len(end)
