"""The silent-peer error without processes: which ranks the progress marks name, and the one-line message in each
case (behind, stopped after the same point, the store unreachable), and how the ``dlac`` command writes the resume
command. The 2-rank runs that raise it are in tests/comm/test_reliability.py and tests/comm/test_comm.py."""

from __future__ import annotations

import time

import torch.distributed as dist

from lightning_dlac.comm import PeerTimeoutError
from lightning_dlac.comm.liveness import Progress, is_timeout, peer_timeout

GLOO = "[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 30000ms for send operation to complete"


class _Group:
    """A stand-in for a process group torch.distributed did not make (the progress of one rank, 0)."""

    group_name = "0"


def _progress(marks: dict[int, str], count: int, store: object | None = None, alive: tuple[int, ...] = (1, 2)
              ) -> Progress:
    """Rank 0's progress on a 3-rank group at ``count`` marks, the other ranks' marks (``"count label"``) in a hash
    store; between the two reads of a timeout, the heartbeat of the ranks in ``alive`` moves on."""
    progress = Progress(_Group(), store if store is not None else dist.HashStore())
    progress._ranks, progress._marking, progress._count = [0, 1, 2], True, count

    def write(beat: int) -> None:
        for rank, value in marks.items():
            mark_count, _, label = value.partition(" ")
            progress._store.set(progress._key(rank), f"{mark_count} {beat if rank in alive else 1} {label}")

    write(1)
    progress._pause = lambda seconds: write(2)
    return progress


def test_a_rank_behind_is_named_with_its_last_mark() -> None:
    error = PeerTimeoutError(0, "sizes", GLOO)
    error.exchange, error.call, error.step = "forward", 12, 11
    _progress({1: "8 backward exchange, call 11", 2: "9 forward exchange, call 12"}, 9).locate(error)
    assert error.silent == (1,) and error.timeout_s == 30
    assert str(error) == ("rank 1 stopped answering: rank 0 waited 30 s in the forward exchange (sizes), call 12, at"
                          " step 11 (last mark: rank 1: backward exchange, call 11)")


def test_a_rank_with_no_mark_yet_is_behind() -> None:
    error = _progress({2: "3 forward exchange, call 2"}, 3).locate(PeerTimeoutError(0, "payload", GLOO))
    assert error.silent == (1,) and "rank 1: nothing yet" in str(error)


def test_with_no_rank_behind_those_at_the_same_point_are_named() -> None:
    error = PeerTimeoutError(0, "TorchRec's input all-to-all", GLOO)
    error.phase, error.step = "forward", 4
    _progress({1: "9 train step 4, forward pass", 2: "10 forward exchange, call 5"}, 9, alive=(2,)).locate(error)
    assert error.silent == (1,) and error.stopped_inside and error.frozen == (1,)
    assert str(error) == ("rank 1 stopped answering: rank 0 waited 30 s in the forward pass (TorchRec's input"
                          " all-to-all), at step 4 (reached it too, then went silent; last mark: rank 1: train step 4,"
                          " forward pass)")


class _StoppedStore:
    """A store whose host does not answer (stopped): every request times out."""

    def set_timeout(self, timeout: object) -> None:
        pass

    def set(self, key: str, value: str) -> None:
        pass

    def check(self, keys: list[str]) -> bool:
        raise RuntimeError("Socket Timeout")


def test_at_the_same_point_the_rank_whose_heartbeat_stopped_is_the_silent_one() -> None:
    """Three ranks at the same mark, rank 2 stopped inside the collective: its heartbeat is still, rank 1's moves
    (alive, waiting as rank 0 does): rank 2 is named, not rank 1. Where both are alive, both are named, as "one of"."""
    level = {1: "9 forward exchange, call 5", 2: "9 forward exchange, call 5"}
    error = _progress(level, 9, alive=(1,)).locate(PeerTimeoutError(0, "payload", GLOO))
    assert error.silent == (2,) and error.frozen == (2,) and str(error).startswith("rank 2 stopped answering")
    error = PeerTimeoutError(0, "payload", GLOO)
    error.exchange, error.call = "forward", 5
    _progress(level, 9, alive=(1, 2)).locate(error)
    assert error.silent == (1, 2) and error.frozen == ()
    assert str(error).startswith("one of ranks 1, 2 stopped answering: rank 0 waited 30 s in the forward exchange"
                                 " (payload), call 5")


def test_an_unreachable_store_is_said_to_be_one() -> None:
    error = PeerTimeoutError(1, "payload", GLOO)
    error.exchange, error.call, error.step, error.stage = "forward", 3, 7, "validate"
    _progress({}, 5, store=_StoppedStore()).locate(error)
    assert error.store_unreachable and not error.silent
    assert str(error) == ("a peer stopped answering and the store cannot be read: rank 0 (the store host) or the"
                          " network is unreachable; rank 1 waited 30 s in the forward exchange (payload), call 3, in"
                          " validate after step 7")


def test_the_watch_turns_a_timeout_into_the_error_and_lets_other_errors_through() -> None:
    progress = _progress({1: "1 forward exchange, call 1", 2: "2 forward exchange, call 2"}, 2)
    try:
        with progress.watch(exchange="forward", call=2):
            raise RuntimeError(GLOO)
    except PeerTimeoutError as error:
        assert error.silent == (1,) and error.exchange == "forward" and isinstance(error.__cause__, RuntimeError)
    try:
        with progress.watch(exchange="forward", call=2):
            raise RuntimeError("Connection reset by peer")
    except RuntimeError as error:
        assert not isinstance(error, PeerTimeoutError)
    assert is_timeout(RuntimeError(GLOO)) and not is_timeout(ValueError(GLOO))
    wrapped = RuntimeError("fit failed")
    wrapped.__cause__ = PeerTimeoutError(0, "sizes", GLOO)
    assert peer_timeout(wrapped) is wrapped.__cause__ and peer_timeout(RuntimeError("x")) is None


def test_the_resume_message_and_the_resume_command() -> None:
    from lightning_dlac.commands.cli import _resume_command

    error = PeerTimeoutError(0, "sizes", GLOO)
    error.silent, error.resume = (1,), "dlac fit --config run.yaml --ckpt_path=last"
    assert str(error).endswith("; resume: dlac fit --config run.yaml --ckpt_path=last")
    assert _resume_command(["fit", "--config", "my run.yaml", "--ckpt_path", "old.ckpt", "--trainer.max_steps=9"]) \
        == "dlac fit --config 'my run.yaml' --trainer.max_steps=9 --ckpt_path=last"
    assert _resume_command(["fit", "--ckpt_path=old.ckpt"]) == "dlac fit --ckpt_path=last"


def test_marks_reach_the_store_from_a_thread_of_their_own_the_newest_last() -> None:
    progress = _progress({}, 0)
    for call in range(1, 201):
        progress.mark(f"forward exchange, call {call}")
    assert progress.count == 200
    deadline = time.monotonic() + 10
    while not (progress._read(0) or "").startswith("200 ") and time.monotonic() < deadline:
        time.sleep(0.01)
    count, beat, label = progress._read(0).split(" ", 2)
    assert (count, label) == ("200", "forward exchange, call 200") and int(beat) >= 1
    # the heartbeat moves on with no new mark
    while progress._read(0).split(" ", 2)[1] == beat and time.monotonic() < deadline:
        time.sleep(0.05)
    assert progress._read(0).split(" ", 2)[1] != beat
