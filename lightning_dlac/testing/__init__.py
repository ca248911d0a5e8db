"""Multi-process test utilities: run a function on N real CPU ranks (gloo), as TorchRec ships its own.

The project's tests and benchmarks both launch ranks through :func:`run_ranks`; a plain training loop or a user's
own tests can too. Commands that launch ranks themselves (``dlac fit``, ``torchrun``) run through
:func:`run_session`, which kills every process they started when they time out, with a rendezvous port held by
:func:`hosted_store`. :mod:`lightning_dlac.testing.netem` puts ranks on an emulated network with packet loss and
jitter (network namespaces joined by TUN devices; root only). torch and the standard library only: it imports
nothing else of ``lightning_dlac``.
"""

from lightning_dlac.testing.launch import RanksFailed, hosted_store, kill_session, run_ranks, run_session

__all__ = ["RanksFailed", "hosted_store", "kill_session", "run_ranks", "run_session"]
