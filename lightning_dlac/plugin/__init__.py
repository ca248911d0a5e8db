"""The Lightning plugin: :class:`DLACStrategy`, :class:`DLACCallback`, their metrics and the end-of-run report.

| module | job |
|---|---|
| ``strategy`` | ``DLACStrategy``: Lightning's hooks around the engine (sharding, checkpoints, the train pipeline) |
| ``callback`` | ``DLACCallback``: Lightning's hooks that drive the adaptive policy and the metrics |
| ``metrics`` | ``CompressionMonitor``: ``dlac/*`` metrics from the exchanges' counters |
| ``report`` | the end-of-run report (``dlac_run.json``, ``dlac_report.md``, plots) |
| ``registration`` | ``Trainer(strategy="dlac")`` |

The only layer besides the commands that imports Lightning. Exports resolve lazily (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DLACCallback": "callback",
    "DLACStrategy": "strategy",
    "CompressionMonitor": "metrics",
}
__all__ = [
    "CompressionMonitor",
    "DLACCallback",
    "DLACStrategy",
]

if TYPE_CHECKING:
    from lightning_dlac.plugin.callback import DLACCallback
    from lightning_dlac.plugin.metrics import CompressionMonitor
    from lightning_dlac.plugin.strategy import DLACStrategy


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
