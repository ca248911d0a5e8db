"""Compressed all-to-all for TorchRec's sharded pooled-embedding communication (no Lightning here).

Its per-table bounds come from the layer below, :class:`lightning_dlac.adaptive.ErrorBounds`.

Exports resolve lazily (PEP 562): ``lightning_dlac.comm.CommStats`` and the settings import without torchrec; the
exchange itself needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BackwardCompression": "config",
    "CompressionConfig": "config",
    "CompressionOptions": "config",
    "CommStats": "stats",
    "CompressedExchangeError": "exchange",
    "CompressedPooledEmbeddingsAllToAll": "all_to_all",
    "ExchangeGroup": "group",
    "install_compressed_all_to_all": "inject",
}
__all__ = [
    "BackwardCompression",
    "CommStats",
    "CompressedExchangeError",
    "CompressedPooledEmbeddingsAllToAll",
    "CompressionConfig",
    "CompressionOptions",
    "ExchangeGroup",
    "install_compressed_all_to_all",
]

if TYPE_CHECKING:
    from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll
    from lightning_dlac.comm.config import BackwardCompression, CompressionConfig, CompressionOptions
    from lightning_dlac.comm.exchange import CompressedExchangeError
    from lightning_dlac.comm.group import ExchangeGroup
    from lightning_dlac.comm.inject import install_compressed_all_to_all
    from lightning_dlac.comm.stats import CommStats


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
