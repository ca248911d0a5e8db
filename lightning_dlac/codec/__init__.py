"""The DLAC codec: error-bounded quantization plus a lossless stage chosen per chunk (docs/codec.md)."""

from lightning_dlac.codec._loader import native_available
from lightning_dlac.codec.api import (
    ChunkInfo,
    cast_column_blocks,
    decode,
    decode_grid,
    encode,
    encode_grid,
    impl_calls,
    inspect,
    inspect_grid,
    max_error,
)
from lightning_dlac.codec.format import CodecError, Mode

__all__ = [
    "ChunkInfo",
    "CodecError",
    "Mode",
    "cast_column_blocks",
    "decode",
    "decode_grid",
    "encode",
    "encode_grid",
    "impl_calls",
    "inspect",
    "inspect_grid",
    "max_error",
    "native_available",
]
