"""lightning-dlac: error-bounded, dual-level adaptive compression of TorchRec's embedding all-to-all for Lightning.

Importing the package registers ``Trainer(strategy="dlac")`` and imports neither Lightning nor TorchRec: the
exports below load on first use (PEP 562), so ``import lightning_dlac.codec`` works on a machine that has only
torch (a GPU image without TorchRec, the codec benchmarks). The strategy alias is registered with Lightning's
``StrategyRegistry`` as soon as ``lightning.pytorch.strategies`` is imported (now, if it already is), as a factory
that imports :class:`DLACStrategy`, and with it TorchRec, only when a Trainer asks for ``strategy="dlac"``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_dlac.callback import DLACCallback
    from lightning_dlac.strategy import DLACStrategy, EmbeddingOptimizer, dense_parameters

__version__ = "0.1.0"
__all__ = ["DLACCallback", "DLACStrategy", "EmbeddingOptimizer", "dense_parameters"]

_EXPORTS = {
    "DLACCallback": "lightning_dlac.callback",
    "DLACStrategy": "lightning_dlac.strategy",
    "EmbeddingOptimizer": "lightning_dlac.strategy",
    "dense_parameters": "lightning_dlac.strategy",
}
_STRATEGY_NAME = "dlac"
_REGISTRY_MODULE = "lightning.pytorch.strategies"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dlac' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])


def _dlac_strategy(**init_params: Any) -> DLACStrategy:
    """What ``Trainer(strategy="dlac")`` builds: a default DLACStrategy (TorchRec is imported here, not earlier)."""
    from lightning_dlac.strategy import DLACStrategy

    return DLACStrategy(**init_params)


def _register_alias(registry: Any) -> None:
    # DLACStrategy.register_strategies (run when lightning_dlac.strategy is imported) returns early once the name is
    # present, so whichever of the two runs first wins and both build the same strategy.
    if _STRATEGY_NAME not in registry:
        registry.register(
            _STRATEGY_NAME, _dlac_strategy, description="TorchRec-sharded embeddings with DLAC-compressed all-to-all"
        )


class _RegisterWhenLightningLoads(importlib.abc.MetaPathFinder):
    """Registers the alias right after ``lightning.pytorch.strategies`` is executed, then steps out of the way.

    It finds the module's spec with the other finders and wraps that spec's loader, so the module loads exactly as
    it would have; only the registration is added after it.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _REGISTRY_MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:  # an old-style loader: leave it alone (the alias then comes with DLACStrategy)
            return spec

        def exec_and_register(module: Any) -> None:
            exec_module(module)
            _register_alias(module.StrategyRegistry)

        loader.exec_module = exec_and_register
        return spec


def _install_registration() -> None:
    if _REGISTRY_MODULE in sys.modules:
        _register_alias(sys.modules[_REGISTRY_MODULE].StrategyRegistry)
        return
    try:
        lightning_installed = importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        lightning_installed = False
    if lightning_installed and not any(isinstance(f, _RegisterWhenLightningLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenLightningLoads())


_install_registration()
