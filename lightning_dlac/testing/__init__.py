"""Multi-process test utilities: run a function on N real CPU ranks (gloo), as TorchRec ships its own.

The project's tests and benchmarks both launch ranks through :func:`run_ranks`; a plain training loop or a user's
own tests can too. torch only: it imports nothing else of ``lightning_dlac``.
"""

from lightning_dlac.testing.launch import RanksFailed, hosted_store, run_ranks

__all__ = ["RanksFailed", "hosted_store", "run_ranks"]
