"""The DLAC buffer format: header layout, modes, limits and header validation (docs/codec.md is the full spec).

Every encoded chunk is one self-describing buffer: a fixed 48-byte little-endian header followed by up to two
sections. Both implementations (reference.py and cuda_ext/dlac_codec.h) follow this module's constants; change one,
change both, and bump ``VERSION``.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import zlib

MAGIC = b"DLAC"
VERSION = 1
HEADER = struct.Struct("<4sBBBBB3sIIfffIIII")
HEADER_SIZE = HEADER.size  # 48
CRC_OFFSET = 44

# Quantization codes are at most 2**23 (the largest pre-rounding value accepted is 2**23 - 1, repair may add one),
# so codes fit in 24 bits and the float32 round-half-even "magic number" trick is exact.
MAX_QVALUE = 8388607.0
MAX_CODE_BITS = 24
# Quantization step = float32(abs_eb * k) for the first k here with which every element verifies within abs_eb.
# k = 2 is the ideal grid; the smaller ones leave slack for float32 rounding of min + q * step when the bound is
# only a few hundred ulps of the values (otherwise values next to a cell midpoint can miss by one rounding).
STEP_FACTORS = (2.0, 1.9921875, 1.5, 1.0)
# At most 2**28 elements per chunk keeps every section size and every Huffman bit offset inside a uint32.
MAX_CHUNK_ELEMENTS = 1 << 28

# Huffman: length-limited canonical code, symbols coded in independent blocks so decoding can run in parallel.
HUFF_MAX_LEN = 12
HUFF_MAX_ALPHABET = 1 << HUFF_MAX_LEN
HUFF_BLOCK = 4096
HUFF_SECTION_HEADER = 8  # u32 alphabet size, u32 number of blocks

FLAG_SEC0_HUFF = 1
FLAG_SEC1_HUFF = 2


class Mode(enum.IntEnum):
    """How a chunk's body is stored."""

    CONST = 0  # header only: every element equals ``min`` (or the chunk is empty)
    RAW = 1  # float32 passthrough, bit exact
    PACK = 2  # fixed-width bit packing of the quantization codes
    HUFF = 3  # blocked canonical Huffman of the quantization codes
    DEDUP = 4  # unique code rows (PACK or HUFF) + per-row index (PACK or HUFF)

    def __str__(self) -> str:
        return self.name


class CodecError(ValueError):
    """A buffer is corrupted, truncated or not a DLAC buffer."""


@dataclasses.dataclass(frozen=True)
class Header:
    """The decoded fixed header of one chunk."""

    mode: Mode
    flags: int
    width0: int
    width1: int
    rows: int
    dim: int
    min: float
    abs_eb: float
    step: float
    nuniq: int
    sec0: int
    sec1: int
    crc: int

    @property
    def total_size(self) -> int:
        return HEADER_SIZE + self.sec0 + self.sec1


def pack_header(h: Header) -> bytes:
    """Serialize a header (the crc field is written as given)."""
    return HEADER.pack(
        MAGIC, VERSION, int(h.mode), h.flags, h.width0, h.width1, b"\0\0\0",
        h.rows, h.dim, h.min, h.abs_eb, h.step, h.nuniq, h.sec0, h.sec1, h.crc,
    )


def buffer_crc(buf: bytes | bytearray | memoryview) -> int:
    """CRC-32 (zlib polynomial) of the whole buffer with the header's crc field taken as zero."""
    crc = zlib.crc32(bytes(buf[:CRC_OFFSET]))
    crc = zlib.crc32(b"\0\0\0\0", crc)
    return zlib.crc32(bytes(buf[CRC_OFFSET + 4:]), crc)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def parse_header(buf: bytes | bytearray | memoryview, where: str = "buffer") -> Header:
    """Parse and validate the header of a complete chunk buffer (size, checksum and per-mode consistency).

    Raises:
        CodecError: if anything does not add up; ``where`` names the chunk in the message.
    """
    n = len(buf)
    if n < HEADER_SIZE:
        raise CodecError(f"{where}: {n} bytes is shorter than the {HEADER_SIZE}-byte DLAC header (truncated?)")
    magic, version, mode, flags, w0, w1, reserved, rows, dim, mn, eb, step, nuniq, sec0, sec1, crc = HEADER.unpack_from(
        bytes(buf[:HEADER_SIZE])
    )
    if magic != MAGIC:
        raise CodecError(f"{where}: not a DLAC buffer (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise CodecError(f"{where}: format version {version} is not supported (this build reads {VERSION})")
    if mode > Mode.DEDUP:
        raise CodecError(f"{where}: unknown mode {mode}")
    if reserved != b"\0\0\0":
        raise CodecError(f"{where}: reserved header bytes are not zero")
    total = HEADER_SIZE + sec0 + sec1
    if total != n:
        raise CodecError(f"{where}: header announces {total} bytes but the buffer holds {n} (truncated or padded?)")
    if buffer_crc(buf) != crc:
        raise CodecError(f"{where}: checksum mismatch (corrupted buffer)")
    h = Header(Mode(mode), flags, w0, w1, rows, dim, mn, eb, step, nuniq, sec0, sec1, crc)
    validate_header(h, where)
    return h


def _fail(where: str, what: str) -> CodecError:
    return CodecError(f"{where}: inconsistent {what}")


def validate_header(h: Header, where: str) -> None:
    """Per-mode consistency rules shared by every decoder (docs/codec.md, "Validation")."""
    import math

    n = h.rows * h.dim
    if n > MAX_CHUNK_ELEMENTS:
        raise CodecError(f"{where}: {h.rows}x{h.dim} exceeds the {MAX_CHUNK_ELEMENTS}-element chunk limit")
    quantized = h.mode in (Mode.PACK, Mode.HUFF, Mode.DEDUP)
    if h.mode == Mode.CONST:
        if (
            h.flags or h.width0 or h.width1 or h.nuniq or h.sec0 or h.sec1
            or not math.isfinite(h.min) or h.abs_eb or h.step
        ):
            raise _fail(where, "CONST header")
    elif h.mode == Mode.RAW:
        if h.flags or h.width0 or h.width1 or h.nuniq or h.sec1 or h.sec0 != 4 * n or h.min or h.abs_eb or h.step:
            raise _fail(where, "RAW header")
    if quantized:
        if n == 0 or not math.isfinite(h.min) or not (math.isfinite(h.abs_eb) and h.abs_eb > 0):
            raise _fail(where, "quantization parameters")
        if not (math.isfinite(h.step) and 0 < h.step <= 2.0 * h.abs_eb) or h.width0 > MAX_CODE_BITS:
            raise _fail(where, "quantization parameters")
    if h.mode == Mode.PACK:
        if h.flags or h.width1 or h.nuniq or h.sec1 or h.sec0 != ceil_div(n * h.width0, 8):
            raise _fail(where, "PACK header")
    elif h.mode == Mode.HUFF:
        if h.flags != FLAG_SEC0_HUFF or h.width0 or h.width1 or h.nuniq or h.sec1:
            raise _fail(where, "HUFF header")
    elif h.mode == Mode.DEDUP:
        if h.flags & ~3 or not (1 <= h.nuniq <= h.rows) or h.width1 > MAX_CODE_BITS:
            raise _fail(where, "DEDUP header")
        if h.flags & FLAG_SEC0_HUFF:
            if h.width0:
                raise _fail(where, "DEDUP header")
        elif h.sec0 != ceil_div(h.nuniq * h.dim * h.width0, 8):
            raise _fail(where, "DEDUP header")
        if h.flags & FLAG_SEC1_HUFF:
            if h.width1:
                raise _fail(where, "DEDUP header")
        elif h.sec1 != ceil_div(h.rows * h.width1, 8):
            raise _fail(where, "DEDUP header")


def bits_for(vmax: int) -> int:
    """Bit width of a PACK stream whose largest value is ``vmax`` (0 for an all-zero stream)."""
    return int(vmax).bit_length()
