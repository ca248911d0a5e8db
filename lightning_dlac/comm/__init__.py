"""Compressed all-to-all for TorchRec's sharded pooled-embedding communication (no Lightning here)."""

from lightning_dlac.comm.all_to_all import CompressedExchangeError, CompressedPooledEmbeddingsAllToAll
from lightning_dlac.comm.config import BackwardCompression, CommStats, CompressionConfig, ErrorBounds
from lightning_dlac.comm.inject import install_compressed_all_to_all

__all__ = [
    "BackwardCompression",
    "CommStats",
    "CompressedExchangeError",
    "CompressedPooledEmbeddingsAllToAll",
    "CompressionConfig",
    "ErrorBounds",
    "install_compressed_all_to_all",
]
