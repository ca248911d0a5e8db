"""lightning_dlac/testing/launch.py fails fast: when one rank fails, its peers are killed and the call raises with
that rank's
traceback at once, whatever the peers are doing (asleep, or blocked in a collective waiting for the failed rank).

Each case makes the peer wait far longer (600 s) than the test may run (its pytest timeout, 60 s), and orders the
failure after the peer has started waiting (the peer leaves a marker file first). So the case passes only if the
failure interrupted the wait; nothing is timed."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_dlac.testing import run_ranks

PEER_WAIT_S = 600.0  # how long the healthy rank would wait: ten times the test's own limit


def _wait_for(path: Path) -> None:
    """Block until ``path`` exists (the other rank's marker); the test's timeout bounds the wait."""
    while not path.exists():
        time.sleep(0.01)


def _sleeping_peer(rank: int, world_size: int, workdir: str, how: str) -> str:
    """Rank 0 marks that it is waiting, then waits ``PEER_WAIT_S`` (asleep or in a collective); rank 1 fails once
    rank 0 waits: it raises, or exits with an unexpected code without a word."""
    import torch
    import torch.distributed as dist

    marker, woke = Path(workdir) / "waiting", Path(workdir) / "woke"
    if how == "collective":
        dist.init_process_group("gloo", timeout=timedelta(seconds=PEER_WAIT_S))
    if rank == 0:
        marker.touch()
        if how == "collective":
            dist.all_reduce(torch.ones(1))  # rank 1 never joins
        else:
            time.sleep(PEER_WAIT_S)
        woke.touch()  # reached only if nothing stopped the wait
        return "rank 0 finished waiting"
    _wait_for(marker)
    if how == "exits":
        os._exit(3)  # dies without reporting anything, as a segfault or an abort would
    raise RuntimeError(f"rank 1 gives up ({how})")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["sleep", "collective", "exits"])
def test_a_failing_rank_ends_the_run_while_its_peer_still_waits(tmp_path: Path, how: str) -> None:
    with pytest.raises(AssertionError) as failure:
        run_ranks(_sleeping_peer, 2, str(tmp_path), how, timeout=PEER_WAIT_S)
    message = str(failure.value)
    assert (tmp_path / "waiting").exists(), "rank 1 failed before rank 0 started waiting: the case proves nothing"
    assert not (tmp_path / "woke").exists(), "rank 0's wait ran to its end: the failure did not stop it"
    # Rank 0 was still waiting when the run ended (rank 1 may still have been unwinding its error).
    assert re.search(r"killed rank\(s\) \[0(, 1)?\] after the failure", message), message
    if how == "exits":
        assert "rank 1 exited with code 3 (expected 0)" in message, message
    else:
        # The failing rank's own traceback, naming where it raised.
        assert "rank 1 failed:" in message and f"RuntimeError: rank 1 gives up ({how})" in message, message
        assert "in _sleeping_peer" in message, message


def _expected_death(rank: int, world_size: int, workdir: str) -> str:
    """Rank 1 leaves its pid and dies with exit code 7; rank 0 waits until that process is gone, then returns: the
    call can only succeed if the expected death left rank 0 running."""
    pid_file = Path(workdir) / "rank1.pid"
    if rank == 1:
        pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
        pid_file.with_suffix(".tmp").rename(pid_file)  # rank 0 never reads a half-written file
        os._exit(7)
    _wait_for(pid_file)
    pid = int(pid_file.read_text())
    while _alive(pid):
        time.sleep(0.01)
    return "rank 0 outlived rank 1"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_expected_exit_does_not_stop_the_other_ranks(tmp_path: Path) -> None:
    assert run_ranks(_expected_death, 2, str(tmp_path), expect_exit={1: 7}) == ["rank 0 outlived rank 1", None]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited, its parent has not reaped it yet
    except (FileNotFoundError, IndexError):
        return False


LAUNCHER = """
import subprocess, sys, time
# A worker in a session of its own, as torchrun starts its workers: killing the launcher's group alone misses it.
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(worker.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_command_past_its_timeout_is_killed_with_every_process_it_started() -> None:
    import subprocess
    import sys

    from lightning_dlac.testing import run_session

    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_session([sys.executable, "-c", LAUNCHER], timeout=5, stdout=subprocess.PIPE, text=True)
    worker = int(timed_out.value.output.split()[0])
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), "the launcher's worker outlived it"


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for a parent that is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _where_am_i(rank: int, world_size: int, tag: str) -> tuple[str | None, str, str]:
    print(f"rank {rank} says {tag}", flush=True)
    import sys

    return os.environ.get("DLAC_LAUNCH_PROBE"), os.getcwd(), sys.modules["torch"].__name__


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("preload", [True, False])
def test_ranks_see_the_launching_process_as_it_is_at_each_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, preload: bool
) -> None:
    # Forked from a server started at an earlier launch, a rank must still see this launch's environment, directory
    # and standard output, as a freshly spawned one does.
    for i, where in enumerate([tmp_path / "a", tmp_path / "b"]):
        where.mkdir()
        monkeypatch.chdir(where)
        monkeypatch.setenv("DLAC_LAUNCH_PROBE", f"launch {i}")
        assert run_ranks(_where_am_i, 2, f"tag {i}", preload=preload) == [(f"launch {i}", str(where), "torch")] * 2
        out = capfd.readouterr().out
        assert f"rank 0 says tag {i}" in out and f"rank 1 says tag {i}" in out
