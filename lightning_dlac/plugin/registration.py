"""The one registration of ``Trainer(strategy="dlac")``, made without importing Lightning or TorchRec early.

:func:`register` adds the name to a Lightning ``StrategyRegistry`` as a factory that imports
:class:`~lightning_dlac.plugin.strategy.DLACStrategy` (and with it TorchRec) only when a Trainer asks for it. Importing
``lightning_dlac`` calls :func:`install`: it registers at once if ``lightning.pytorch.strategies`` is already
imported, else right after it is (an import hook that wraps that module's loader, then steps out of the way).
``DLACStrategy.register_strategies`` (Lightning's hook for a strategy class) registers the class itself under the
same name (:mod:`lightning_dlac.plugin._names`) where nothing has yet: this module imports the strategy (inside the
factory), never the other way round.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from lightning_dlac.plugin._names import DESCRIPTION, STRATEGY_NAME

if TYPE_CHECKING:
    from lightning_dlac.plugin.strategy import DLACStrategy

__all__ = ["DESCRIPTION", "STRATEGY_NAME", "install", "register"]

_REGISTRY_MODULE = "lightning.pytorch.strategies"


def _dlac_strategy(**init_params: Any) -> DLACStrategy:
    """What ``Trainer(strategy="dlac")`` builds: a DLACStrategy (TorchRec is imported here, not earlier)."""
    from lightning_dlac.plugin.strategy import DLACStrategy

    return DLACStrategy(**init_params)


def register(registry: Any) -> None:
    """Register ``"dlac"`` in a Lightning ``StrategyRegistry`` (once: a registry that has it is left alone)."""
    if STRATEGY_NAME not in registry:
        registry.register(STRATEGY_NAME, _dlac_strategy, description=DESCRIPTION)


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
            register(module.StrategyRegistry)

        loader.exec_module = exec_and_register
        return spec


def install() -> None:
    """Register ``"dlac"`` now if Lightning's strategy registry exists, else as soon as it is imported."""
    if _REGISTRY_MODULE in sys.modules:
        register(sys.modules[_REGISTRY_MODULE].StrategyRegistry)
        return
    try:
        lightning_installed = importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        lightning_installed = False
    if lightning_installed and not any(isinstance(f, _RegisterWhenLightningLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenLightningLoads())
