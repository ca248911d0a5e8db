"""Process-group rendezvous that survives torchrun's restarts (``--max-restarts``); torch only, no Lightning.

Why a restarted worker group can die in rendezvous: torchrun's agent hosts one TCPStore for the whole job (its
``static`` rendezvous and the store ``c10d`` shares with its workers alike) and the workers join it as clients
(``TORCHELASTIC_USE_AGENT_STORE=True``). ``init_process_group`` keeps its keys there without a per-attempt prefix,
so after a restart the previous attempt's keys are still in the store: gloo's address of every rank among them. A
restarted rank that reaches ``init_process_group`` before its peer reads the peer's *dead* address and fails with
``Gloo connectFullMesh failed ... timed out connecting: Connection refused`` (or hangs); the attempt is lost, and
with it one of ``--max-restarts``.

On one node (one agent, ``GROUP_WORLD_SIZE=1``), ``TORCHELASTIC_RESTART_COUNT`` numbers the attempts alike on every
rank, so :func:`restart_store` puts a restarted attempt's keys under ``dlac/attempt_<n>/``, where nothing stale
is. Across nodes the agents' restart counts can differ (an agent restarts its workers without counting a retry
when another node rejoins), so there the fix is torch's own: ``--rdzv-backend=c10d`` with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which gives every attempt a fresh store (docs/multinode.md, "Surviving
failures"); :func:`shared_store_warning` says so.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["attempt", "init_restarted_process_group", "restart_store", "shared_store_warning"]


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def attempt() -> int:
    """This worker group's restart count under torchrun (0: the first attempt, or not under torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restart_store(timeout: timedelta) -> dist.Store | None:
    """The store a restarted one-node torchrun worker group should start its process group on, or ``None`` where
    torch's own ``env://`` rendezvous is right (the first attempt, no agent store, or several nodes).

    The store is a client of the agent's (``MASTER_ADDR:MASTER_PORT``) whose keys live under
    ``dlac/attempt_<n>/``, so keys the previous attempt left there are never read.

    Args:
        timeout: How long a store operation may wait (the process group's timeout).
    """
    if not _agent_store() or attempt() == 0 or int(os.environ.get("GROUP_WORLD_SIZE", "1")) != 1:
        return None
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
        is_master=False, timeout=timeout,
    )  # fmt: skip
    return dist.PrefixStore(f"dlac/attempt_{attempt()}", client)


def shared_store_warning() -> str | None:
    """A warning for a job on several nodes whose restarts would share one store (see the module docstring), or
    ``None``."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if not _agent_store() or restarts == 0 or int(os.environ.get("GROUP_WORLD_SIZE", "1")) == 1:
        return None
    return (
        f"torchrun restarts this job up to {restarts} time(s), and every attempt's workers share the agent's store,"
        " where the previous attempt's process-group keys remain: a restarted rank can read a dead peer's address"
        " and fail ('Gloo connectFullMesh failed ... Connection refused') or hang. Launch with"
        " `--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT` and the environment variable"
        " TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which gives every attempt a fresh store (docs/multinode.md,"
        " 'Surviving failures')."
    )


def init_restarted_process_group(backend: str, rank: int, world_size: int, timeout: timedelta,
                                 device: Any = None) -> bool:
    """Start the process group of a restarted one-node torchrun worker group on :func:`restart_store` (keys apart
    from the dead attempt's); return False, starting nothing, where torch's own ``env://`` rendezvous is right (a
    group already exists, the first attempt, no agent store, several nodes).

    Args:
        backend: ``"gloo"`` or ``"nccl"``.
        rank: This process's global rank.
        world_size: Ranks in the group.
        timeout: Of the store and the process group.
        device: The rank's accelerator (``device_id`` of :func:`torch.distributed.init_process_group`), or ``None``.
    """
    store = None if dist.is_initialized() else restart_store(timeout)
    if store is None:
        return False
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device)
    return True
