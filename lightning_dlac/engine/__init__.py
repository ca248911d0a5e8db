"""The engine: TorchRec machinery that a plain training loop reuses without Lightning.

| module | job |
|---|---|
| ``sharding`` | :func:`shard_model`: planner options, their validation, the plan and its summary,
``dense_parameters`` |
| ``checkpoint`` | sharded checkpoint directories (torch.distributed.checkpoint), atomic verified saves, safe loads |
| ``rng`` | every rank's random number state, carried in a checkpoint |
| ``pipeline`` | :class:`SparseDistPipeline`: TorchRec's sparse-dist train pipeline, one step at a time |
| ``elastic`` | process-group rendezvous that survives torchrun's restarts |

It imports nothing of the package but the shared checkers (:mod:`lightning_dlac.checks`), and never Lightning: it
knows nothing of the codec, the bound policy or the compressed all-to-all (:mod:`lightning_dlac.comm`, which it
neither imports nor is imported by; ``DLACStrategy`` joins the two). Exports resolve lazily (PEP 562): ``from
lightning_dlac.engine import save_sharded`` does not import TorchRec.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "SHARDING_TYPES": "sharding",
    "EmbeddingOptimizer": "sharding",
    "NoEmbeddingTablesError": "sharding",
    "ShardingOptions": "sharding",
    "dense_parameters": "sharding",
    "fused_parameters": "sharding",
    "plan_summary": "sharding",
    "shard_model": "sharding",
    "CheckpointOptions": "checkpoint",
    "Checkpointer": "checkpoint",
    "IncompleteCheckpointError": "checkpoint",
    "check_directory": "checkpoint",
    "load_sharded": "checkpoint",
    "remove_checkpoint": "checkpoint",
    "save_sharded": "checkpoint",
    "Pipeline": "pipeline",
    "PipelineError": "pipeline",
    "SparseDistPipeline": "pipeline",
    "require_torchrec": "_torchrec",
}
__all__ = [
    "CheckpointOptions",
    "Checkpointer",
    "EmbeddingOptimizer",
    "IncompleteCheckpointError",
    "NoEmbeddingTablesError",
    "Pipeline",
    "PipelineError",
    "SHARDING_TYPES",
    "ShardingOptions",
    "SparseDistPipeline",
    "check_directory",
    "dense_parameters",
    "fused_parameters",
    "load_sharded",
    "plan_summary",
    "remove_checkpoint",
    "require_torchrec",
    "save_sharded",
    "shard_model",
]

if TYPE_CHECKING:
    from lightning_dlac.engine._torchrec import require_torchrec
    from lightning_dlac.engine.checkpoint import (
        Checkpointer,
        CheckpointOptions,
        IncompleteCheckpointError,
        check_directory,
        load_sharded,
        remove_checkpoint,
        save_sharded,
    )
    from lightning_dlac.engine.pipeline import Pipeline, PipelineError, SparseDistPipeline
    from lightning_dlac.engine.sharding import (
        SHARDING_TYPES,
        EmbeddingOptimizer,
        NoEmbeddingTablesError,
        ShardingOptions,
        dense_parameters,
        fused_parameters,
        plan_summary,
        shard_model,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
