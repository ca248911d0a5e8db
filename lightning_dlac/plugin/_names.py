"""The name ``Trainer(strategy="dlac")`` resolves and its description, in a module of their own: the strategy
(:meth:`DLACStrategy.register_strategies <lightning_dlac.plugin.strategy.DLACStrategy.register_strategies>`) and the
lazy registration (:mod:`lightning_dlac.plugin.registration`, which imports the strategy only when a Trainer asks
for it) both read them, and neither imports the other for them."""

from __future__ import annotations

STRATEGY_NAME = "dlac"
DESCRIPTION = "TorchRec-sharded embeddings with DLAC-compressed all-to-all"
