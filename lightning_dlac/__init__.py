"""lightning-dlac: error-bounded, dual-level adaptive compression of TorchRec's embedding all-to-all for Lightning.

The package is layered, one layer per folder; a layer imports only layers on lower levels, never a sibling on its
own (tests/test_layers.py checks it against the imports, docs/strategy.md draws it):

| level | folder | job | needs |
|---|---|---|---|
| 5 | ``commands/`` | the ``dlac`` CLI, ``dlac estimate``, ``dlac preprocess``, ``dlac report`` | Lightning |
| 4 | ``plugin/`` | ``DLACStrategy``, ``DLACCallback``, metrics, the report: joins comm and engine | Lightning |
| 3 | ``comm/`` | the compressed all-to-all | TorchRec |
| 2 | ``adaptive/`` | error-bound policy and the bound types | torch |
| 1 | ``codec/`` | the codec | torch |
| 1 | ``criteo/`` | the Criteo format | NumPy |
| 1 | ``engine/`` | sharding, checkpoints, the train pipeline, elastic restarts | TorchRec |
| 0 | ``native/`` | the JIT build helper | |
| 0 | ``testing/`` | multi-process launcher | torch |
| 0 | ``checks/`` | the option checkers every layer shares | |

Importing the package registers ``Trainer(strategy="dlac")`` (:mod:`lightning_dlac.plugin.registration`) and imports
neither Lightning nor TorchRec: the exports below load on first use (PEP 562), so ``import lightning_dlac.codec``
works on a machine that has only torch (a GPU image without TorchRec, the codec benchmarks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_dlac.plugin import registration as _registration

if TYPE_CHECKING:
    from lightning_dlac.comm.config import BackwardCompression, CompressionOptions
    from lightning_dlac.engine.checkpoint import CheckpointOptions
    from lightning_dlac.engine.sharding import EmbeddingOptimizer, ShardingOptions, dense_parameters
    from lightning_dlac.plugin.callback import DLACCallback
    from lightning_dlac.plugin.strategy import DLACStrategy

__version__ = "0.1.0"
__all__ = [
    "BackwardCompression",
    "CheckpointOptions",
    "CompressionOptions",
    "DLACCallback",
    "DLACStrategy",
    "EmbeddingOptimizer",
    "ShardingOptions",
    "dense_parameters",
]

# Public name -> the module that defines it (docs/api.md lists them; tests/test_public_api.py pins them).
_EXPORTS = {
    "DLACCallback": "lightning_dlac.plugin.callback",
    "DLACStrategy": "lightning_dlac.plugin.strategy",
    # DLACStrategy's config objects (sharding=, compression=, checkpointing=) and the enums of their fields
    "ShardingOptions": "lightning_dlac.engine.sharding",
    "CompressionOptions": "lightning_dlac.comm.config",
    "CheckpointOptions": "lightning_dlac.engine.checkpoint",
    "EmbeddingOptimizer": "lightning_dlac.engine.sharding",
    "BackwardCompression": "lightning_dlac.comm.config",
    "dense_parameters": "lightning_dlac.engine.sharding",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dlac' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])


_registration.install()
