"""Run a function on N real CPU ranks (gloo), the way TorchRec's multi-process tests do."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    # Lightning sees LOCAL_RANK and treats the processes as externally launched, so each rank builds its own Trainer
    # with devices=world_size and joins the same gloo group instead of re-launching the test.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        result = fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - report every failure to the parent, which raises it
        queue.put((rank, "error", traceback.format_exc()))
        raise
    queue.put((rank, "ok", result))
    # The rank's work is done and reported. Skip interpreter teardown: gloo's C++ threads occasionally abort the
    # process while being destroyed at exit ("terminate called without an active exception"), which would turn a
    # passed test into a flaky failure that says nothing about the code under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    *args: Any,
    timeout: float = 240.0,
    expect_exit: Mapping[int, int] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; return the results by rank.

    Raises AssertionError with the failing rank's traceback if any rank fails or exits non-zero, except the ranks
    in ``expect_exit`` ({rank: exit code}), which must die with that code (their result is ``None``).
    """
    expect_exit = dict(expect_exit or {})
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            errors.append(f"a rank did not finish within {timeout}s")
    while not queue.empty():
        rank, status, payload = queue.get()
        if status == "ok":
            results[rank] = payload
        else:
            errors.append(f"rank {rank} failed:\n{payload}")
    codes = [p.exitcode for p in procs]
    expected = [expect_exit.get(r, 0) for r in range(world_size)]
    assert not errors and codes == expected, f"exit codes {codes}, expected {expected}\n" + "\n".join(errors)
    return [results.get(r) for r in range(world_size)]
