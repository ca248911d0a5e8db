"""Run a function on N real CPU ranks (gloo), the way TorchRec's multi-process tests do.

Rendezvous without a port race: the parent starts the TCPStore itself on port 0 (the kernel picks a free port and
the store keeps it bound) and hands the port to the ranks, which join that store as clients
(``TORCHELASTIC_USE_AGENT_STORE=True``, the way torchrun's agent hosts the store for its workers). So nothing binds,
closes and re-binds a port. The ranks still see the usual MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE /
LOCAL_RANK, so both ``dist.init_process_group("gloo")`` and a Lightning Trainer built in each rank (which then
treats the processes as externally launched) join the same group. One ``init_process_group`` per rank process: the
store is not re-keyed between groups.

Ranks start warm: they are forked from a server process (multiprocessing's ``forkserver``) that imported torch,
NumPy, Lightning and TorchRec once (:data:`PRELOAD`), instead of each importing them anew as a ``spawn``-ed
interpreter would (seconds of CPU per rank, paid by every launch of a test suite; the server lives as long as
the calling process). Each rank then takes what a spawned one would have had at launch time, not at the server's
start: the caller's current environment variables, working directory and standard output and error (passed as
file descriptors, so pytest's capture still sees what ranks print). What the preloaded libraries read from the
environment at import is the server's, fixed when the first launch started it: a caller that changes such a
variable between launches (torch's threading or allocator settings, say) gets ``spawn`` with ``preload=False``.

Results are read while the ranks run, before joining: a result larger than the pipe buffer would otherwise block
its rank in ``put`` while the parent waits in ``join``.

Fail fast: the moment one rank reports an exception, or exits with a code the caller did not expect, the other ranks
are killed and the call raises with that rank's traceback. A rank waiting for a dead or failed peer (asleep, or
blocked in a collective until its timeout) would otherwise hold the test until ``timeout``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from multiprocessing import reduction
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

# Imported once by the server the ranks are forked from (absent ones are skipped: a machine with torch alone still
# launches). Only third-party libraries: lightning_dlac's own modules (and its native builds) load in each rank, so a
# test that changes the codec's build environment between launches still sees the change.
PRELOAD = ("torch", "torch.distributed", "numpy", "lightning.pytorch", "torchrec", "torchrec.distributed")


class RanksFailed(AssertionError):
    """A rank raised, exited with a code the caller did not expect, or did not finish in time.

    The message holds the failing rank's traceback. An AssertionError, so a test that launches ranks fails as its own
    assertion would.
    """


_PARKED_S = 30.0  # how long a failed rank waits for the parent to stop it


class _Inherited:
    """File descriptor ``fd`` of the launching process, installed as the same descriptor number in the rank when the
    rank unpickles it (a forked server's ranks would otherwise write to the server's stdout and stderr)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        return _install_fd, (reduction.DupFd(self.fd), self.fd)


def _install_fd(dup: Any, fd: int) -> int:
    received = dup.detach()
    if received != fd:
        os.dup2(received, fd)
        os.close(received)
    return fd


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any,
           launch: tuple[dict[str, str], str, tuple] | None = None) -> None:
    if launch is not None:  # forked from the server: take the launching process's environment and directory
        environ, cwd, _stdio = launch
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
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
        TORCHELASTIC_USE_AGENT_STORE="True",  # the parent hosts the store on MASTER_PORT; rank 0 must not
    )
    import torch

    torch.set_num_threads(1)
    try:
        result = fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - report every failure to the parent, which raises it
        queue.put((rank, "error", traceback.format_exc()))
        # Stay until the parent, which reads the report within a poll (50 ms), stops every rank. Exiting at once
        # would close this rank's connections, and a peer blocked in a collective would fail with an error of its
        # own ("Connection closed by peer") before the parent could stop it: a report cluttered by consequences,
        # and peers that end by a race instead of by the parent. Bounded, should the parent be gone.
        time.sleep(_PARKED_S)
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
    preload: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes; return the results by rank.

    As soon as a rank raises or exits with an unexpected code the others are killed. Ranks still running after
    ``timeout`` seconds (or when the caller is interrupted, e.g. by pytest-timeout) are killed. A fixture that runs
    several fits passes a ``timeout`` of its own, sized for them, and its tests a matching ``pytest.mark.timeout``.

    Args:
        fn: The function every rank runs, ``fn(rank, world_size, *args)``; picklable (a module-level function).
        world_size: How many ranks.
        *args: Further arguments of ``fn``, the same on every rank.
        timeout: Seconds the ranks may take together (also the rendezvous store's timeout).
        expect_exit: ``{rank: exit code}`` of ranks that must die with that code (their result is ``None``); the
            others carry on.
        preload: Fork each rank from the server that preloaded torch, Lightning and TorchRec; ``False`` spawns each
            rank as a fresh interpreter (the module docstring says when that matters).

    Returns:
        What ``fn`` returned on each rank, by rank (``None`` for a rank in ``expect_exit``).

    Raises:
        RanksFailed: If a rank raised (with its traceback), exited with a code other than the expected one, or did
            not finish within ``timeout``.
    """
    expect_exit = dict(expect_exit or {})
    launch = None
    if preload and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))  # takes effect when the server starts: at this process's first launch
        sys.stdout.flush()
        sys.stderr.flush()
        launch = (dict(os.environ), os.getcwd(), (_Inherited(1), _Inherited(2)))
    else:
        ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    procs = [ctx.Process(target=_entry, args=(r, world_size, store.port, fn, args, queue, launch))
             for r in range(world_size)]
    results: dict[int, Any] = {}
    errors: list[str] = []

    def drain() -> None:
        while not queue.empty():
            rank, status, payload = queue.get()
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank} failed:\n{payload}")

    def unexpected_exits() -> list[str]:
        return [f"rank {r} exited with code {p.exitcode} (expected {expect_exit.get(r, 0)})"
                for r, p in enumerate(procs)
                if p.exitcode is not None and p.exitcode != expect_exit.get(r, 0)]

    stopped: list[int] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while True:
            drain()
            if errors:
                break  # a rank raised: its peers may wait for it forever, stop them now
            if unexpected_exits():
                drain()  # what it wrote before dying (a traceback) is still in the pipe
                errors.extend(unexpected_exits())
                break
            if all(p.exitcode is not None for p in procs):
                break
            if time.monotonic() > deadline:
                errors.append(f"a rank did not finish within {timeout}s")
                break
            time.sleep(0.05)
        drain()  # what the last ranks wrote before exiting is still in the pipe
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                stopped.append(r)
        for p in procs:
            p.join(10)
        del store  # keep the store bound until every rank is gone
    codes = [p.exitcode for p in procs]
    expected = [expect_exit.get(r, 0) for r in range(world_size)]
    note = f"; killed rank(s) {stopped} after the failure" if stopped and errors else ""
    if errors or codes != expected:
        raise RanksFailed(f"exit codes {codes}, expected {expected}{note}\n" + "\n".join(errors))
    return [results.get(r) for r in range(world_size)]


@contextlib.contextmanager
def hosted_store(timeout: float = 600.0) -> Iterator[dist.TCPStore]:
    """A TCPStore this process hosts on a port the kernel picks, bound until the block ends.

    Processes started here rendezvous through it as clients: ``TORCHELASTIC_USE_AGENT_STORE=True`` and
    ``MASTER_PORT=store.port`` for a Lightning or torch.distributed launch, ``--rdzv-endpoint`` with
    ``is_host=false`` for torchrun. One launch per store: its keys are not reset between launches.

    Args:
        timeout: The store's timeout, seconds.

    Yields:
        The store (its port: ``store.port``).
    """
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    try:
        yield store
    finally:
        del store


def _descendants(pid: int) -> list[int]:
    """Every living process descended from ``pid`` (from /proc), children before their children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def kill_session(pid: int) -> None:
    """SIGKILL a process started in a session of its own, its process group and every process descended from it.

    Descendants that made sessions of their own (torchrun starts each worker in one) are killed too, so that none is
    left running. Never signals this process's own group.

    Args:
        pid: The process, started with ``start_new_session=True``.
    """
    own = os.getpgrp()
    for target in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(target)
            if group != own:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pid != own:
            os.killpg(pid, signal.SIGKILL)  # what is left of its group after it exited


def run_session(command: Sequence[str], *, timeout: float, **popen: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` of ``command`` in a session of its own, killing everything it started at the end.

    At ``timeout``, or when the caller is interrupted (pytest-timeout, Ctrl-C), the command and every process it
    started are killed (:func:`kill_session`), not the command alone, and so is anything it left running when it
    exits.

    Args:
        command: The command and its arguments.
        timeout: Seconds the command may run.
        **popen: Passed to :class:`subprocess.Popen` (``cwd``, ``env``, ``stdout``, ``text``, ...).

    Returns:
        The finished process, with its return code and output (where captured).

    Raises:
        subprocess.TimeoutExpired: ``timeout`` passed (with the output so far).
    """
    proc = subprocess.Popen(command, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as interrupted:
        kill_session(proc.pid)
        out, err = proc.communicate()
        if isinstance(interrupted, subprocess.TimeoutExpired):
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        raise
    kill_session(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
