"""Compressed all-to-all for TorchRec's sharded pooled-embedding communication (no Lightning here).

Its per-table bounds come from the layer below, :class:`lightning_dlac.adaptive.ErrorBounds`.

| module | job |
|---|---|
| ``exchange`` | the pure wire functions both exchanges are built from (encode, size exchange, payload, decode) |
| ``pooled`` | the pooled layout on them: the start / finish functions of the pooled exchange, both directions |
| ``all_to_all`` | :class:`CompressedPooledEmbeddingsAllToAll`, the module around ``pooled`` |
| ``sequence`` | ``CompressedSequenceEmbeddingsAllToAll``: the sequence layout and its module |
| ``base`` | what both derive from: ``TableLayout``, ``RecordedExchange`` |
| ``recorder`` | the ``Recorder``: statistics, timing, the record switch, the observer, error sampling |
| ``pieces`` | a pooled exchange sent in pieces; ``buffers``: result tensors whose memory is reused |
| ``peers`` | which peers a rank compresses for (``compress_peers``) |
| ``group``, ``inject`` | the :class:`ExchangeGroup`; installing the exchanges into a sharded model |
| ``liveness`` | progress marks in the store, and :class:`PeerTimeoutError` naming a peer that stopped answering |
| ``config``, ``stats``, ``timing`` | the settings, the counters that only grow, the phase timers |
| ``fallback``, ``collectives``, ``null_codec`` | the uncompressed fallback, the collectives, a stand-in codec |

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
    "PeerTimeoutError": "liveness",
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
    "PeerTimeoutError",
    "install_compressed_all_to_all",
]

if TYPE_CHECKING:
    from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll
    from lightning_dlac.comm.config import BackwardCompression, CompressionConfig, CompressionOptions
    from lightning_dlac.comm.exchange import CompressedExchangeError
    from lightning_dlac.comm.group import ExchangeGroup
    from lightning_dlac.comm.inject import install_compressed_all_to_all
    from lightning_dlac.comm.liveness import PeerTimeoutError
    from lightning_dlac.comm.stats import CommStats


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
