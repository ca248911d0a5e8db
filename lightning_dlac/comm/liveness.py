"""Which peer went silent: progress marks in the process group's store, read when a collective times out.

A collective that times out on gloo says only that it waited ("Timed out waiting 30000ms for send operation to
complete"), not for whom. So every rank marks, in the store its process group was made with (the c10d TCPStore the
ranks met at), the points it passes: each exchange direction it enters (:class:`~lightning_dlac.comm.base.
RecordedExchange`), and the start of each training step's forward and backward where the strategy marks them. A mark
is a count that grows by one per mark, and a label. The ranks pass the same points in the same order,
so when a collective times out the marks tell the ranks apart:

| the other rank's count | what it means |
|---|---|
| behind this rank's | it never reached the point this rank waits at: it is the silent one |
| equal (no rank behind) | it reached the same point; the silent ones are those among these whose heartbeat stopped |
| ahead | it went on past this point: not silent (it waits for this rank somewhere later) |
| unreadable | the store's host (rank 0 under Lightning's launcher) is stopped, or the network is down |

A mark costs the step no store round trip: the step only notes it, and a thread of its own puts the newest one in
the store, with a heartbeat count that it advances at least every second, so a stopped process (its heartbeat still)
is told from one alive but waiting. The watch around the collectives costs nothing until one fails. The exchanges
raise :class:`PeerTimeoutError` naming the silent ranks; the strategy adds the training step and where to resume.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

# How long reading the other ranks' marks may take once a collective has timed out: the store answers at once
# unless its host is itself stopped.
READ_TIMEOUT = timedelta(seconds=5)
# The writer thread looks for a new mark this often and puts the newest in the store, so marks cost the steps no store
# round trip; a collective timeout is seconds, far longer.
WRITE_INTERVAL_S = 0.05
# And writes it at least this often, a heartbeat: a rank whose heartbeat does not move is stopped, not waiting.
HEARTBEAT_S = 1.0
_KEY = "dlac/progress/{group}/{rank}"
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)\s*ms")

__all__ = ["PeerTimeoutError", "Progress", "is_timeout", "peer_timeout", "progress_of"]


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a collective that timed out (gloo's "Timed out waiting ..." and its kin).

    Args:
        error: What the collective raised.

    Returns:
        True for a timeout; False for anything else (a peer whose process is gone fails with "Connection reset").
    """
    return isinstance(error, RuntimeError) and "timed out" in str(error).lower()


class PeerTimeoutError(RuntimeError):
    """A collective timed out: a peer stopped answering.

    Its message is one line naming the silent rank(s), where this rank waited (the exchange and its call, or the part
    of the step), the training step (where the strategy knows it) and how to resume (where the run has a
    checkpoint). The collective's own error is the ``__cause__``.

    Args:
        rank: The rank that waited (the one raising this).
        collective: What timed out: ``"sizes"`` (an exchange's size records), ``"payload"`` (its embeddings or
            gradients), or a description of another collective (``"TorchRec's input all-to-all"``).
        detail: The collective's own message.

    Attributes:
        rank: The rank that waited.
        collective: What timed out.
        exchange: ``"forward"`` or ``"backward"`` where a compressed exchange timed out, else ``None``.
        call: That exchange's call number on this rank (1 for its first), else ``None``.
        phase: The part of the training step it waited in (``"forward"``, ``"backward"``), where the strategy
            watched it; ``None`` otherwise.
        silent: The ranks that stopped answering; empty where the store could not be read.
        last_seen: The last mark of each silent rank in the store (``"backward exchange, call 11"``): a stopped
            rank's newest, or one it made shortly before it stopped.
        frozen: The other ranks whose heartbeat stopped (their process is stopped or their machine frozen); a rank
            alive but not answering is not among them.
        stopped_inside: The silent ranks reached the point this rank waits at and went silent after it (no rank
            was behind this one).
        store_unreachable: The marks could not be read: the store's host or the network is down.
        timeout_s: The collective timeout, where the collective's message gives it.
        step: The training step (``trainer.global_step``), set by the strategy; ``None`` if unknown.
        stage: What the trainer was doing (``"train"``, ``"validate"``, ...), set with ``step``.
        resume: How to resume (a command, or where the last checkpoint is), set by the strategy or the ``dlac``
            command; ``None`` when the run has no checkpoint.
    """

    def __init__(self, rank: int, collective: str, detail: str = "") -> None:
        super().__init__(detail)
        self.rank = rank
        self.collective = collective
        self.detail = detail
        found = _GLOO_TIMEOUT.search(detail)
        self.timeout_s: float | None = int(found.group(1)) / 1000 if found else None
        self.exchange: str | None = None
        self.call: int | None = None
        self.phase: str | None = None
        self.silent: tuple[int, ...] = ()
        self.last_seen: dict[int, str] = {}
        self.frozen: tuple[int, ...] = ()
        self.stopped_inside = False
        self.store_unreachable = False
        self.step: int | None = None
        self.stage: str | None = None
        self.resume: str | None = None

    def where(self) -> str:
        """Where this rank waited, e.g. ``the forward exchange (payload), call 12, at step 11``.

        Returns:
            The phrase, as the message uses it.
        """
        if self.exchange is not None:
            what = f"the {self.exchange} exchange ({self.collective})"
            what += f", call {self.call}" if self.call is not None else ""
        elif self.phase is not None:
            what = f"the {phase_name(self.phase)} ({self.collective})"
        else:
            what = self.collective
        if self.step is not None:
            what += f", at step {self.step}" if self.stage in (None, "train") else \
                f", in {self.stage} after step {self.step}"
        return what

    def __str__(self) -> str:
        waited = f"{self.timeout_s:g} s" if self.timeout_s is not None else "the collective timeout"
        if self.store_unreachable:
            line = (f"a peer stopped answering and the store cannot be read: rank 0 (the store host) or the network"
                    f" is unreachable; rank {self.rank} waited {waited} in {self.where()}")
        elif self.silent:
            who = f"rank{'s' if len(self.silent) > 1 else ''} {', '.join(map(str, self.silent))}"
            if self.stopped_inside and len(self.silent) > 1 and not set(self.silent) <= set(self.frozen):
                who = f"one of {who}"  # alive and at the same point: the marks cannot tell which
            line = f"{who} stopped answering: rank {self.rank} waited {waited} in {self.where()}"
            seen = ", ".join(f"rank {r}: {self.last_seen.get(r, 'nothing yet')}" for r in self.silent)
            line += f" (reached it too, then went silent; last mark: {seen})" if self.stopped_inside else \
                f" (last mark: {seen})"
        else:
            line = f"a peer stopped answering: rank {self.rank} waited {waited} in {self.where()}"
        return line + (f"; resume: {self.resume}" if self.resume else "")


def phase_name(phase: str) -> str:
    """``"forward"`` -> ``"forward pass"``: the part of a step a label names."""
    return f"{phase} pass" if phase in ("forward", "backward") else phase


class Progress:
    """This rank's progress marks in a process group's store, and the silent ranks they reveal on a timeout.

    One per process group (:func:`progress_of`): the exchanges on one group and the strategy share its count, which
    every rank advances in the same order.

    Args:
        pg: The process group.
        store: Where the marks go; ``None``: the default process group's store (the c10d store the ranks met at).
    """

    def __init__(self, pg: dist.ProcessGroup, store: dist.Store | None = None) -> None:
        try:
            self._ranks = dist.get_process_group_ranks(pg)  # global ranks, in the group's order
            self._me = dist.get_rank()
        except (RuntimeError, ValueError, KeyError):  # not a group torch.distributed made (a stand-in): no marks
            self._ranks, self._me = [0], 0
        self._group = _group_name(pg)
        self._store = store if store is not None else _default_store()
        self._count = 0
        self._marking = self._store is not None and len(self._ranks) > 1
        self._latest = ""  # the newest mark, which the writer thread puts in the store
        self._writer: threading.Thread | None = None

    @property
    def count(self) -> int:
        """How many marks this rank has made on this group."""
        return self._count

    def mark(self, label: str) -> None:
        """Record that this rank reaches the point ``label`` names (``"forward exchange, call 3"``).

        The step only notes the mark: a thread of its own puts the newest one in the store, looking every
        :data:`WRITE_INTERVAL_S`, so no step waits for a store round trip or wakes a thread. By the time a collective
        times out, every live rank's newest mark is in the store; a stopped rank's is its newest or an earlier one
        (it reads as behind all the same).

        Args:
            label: What the point is, as a silent rank's error names its last one.
        """
        self._count += 1
        if not self._marking:
            return
        self._latest = f"{self._count} {label}"
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="dlac-progress-marks", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        """The writer thread: every :data:`WRITE_INTERVAL_S`, put the newest mark in the store if it changed, and at
        least every :data:`HEARTBEAT_S` in any case, with a heartbeat count that grows at each write: a process that
        is alive, even one blocked in a collective, keeps it growing; a stopped one does not. A store that stops
        answering (its host stopped) leaves the thread waiting; the collectives then time out and say so."""
        key, written, beat, beaten = self._key(self._me), "", 0, time.monotonic()
        while True:
            latest, now = self._latest, time.monotonic()
            if latest != written or now - beaten >= HEARTBEAT_S:
                beat += 1
                count, _, label = latest.partition(" ")
                try:
                    self._store.set(key, f"{count} {beat} {label}")
                except (RuntimeError, OSError):  # the store is gone (the run is ending): nothing left to mark
                    return
                written, beaten = latest, now
            time.sleep(WRITE_INTERVAL_S)

    def _read(self, rank: int) -> str | None:
        key = self._key(rank)
        return self._store.get(key).decode() if self._store.check([key]) else None

    def _key(self, rank: int) -> str:
        return _KEY.format(group=self._group, rank=rank)

    def marks(self) -> dict[int, tuple[int, int, str] | None] | None:
        """Every other rank's last mark (count, heartbeat, label), ``None`` for a rank that has made none; ``None``
        altogether where the store does not answer within :data:`READ_TIMEOUT`.

        Returns:
            The marks by global rank.
        """
        if self._store is None:
            return None
        found: list[dict[int, tuple[int, int, str] | None] | None] = []
        # In a thread of its own: a request to a store whose host is stopped can wait for ever (a TCPStore client's
        # `check` has no timeout); left waiting, the thread ends with the process.
        reader = threading.Thread(target=lambda: found.append(self._read_marks()), name="dlac-read-marks",
                                  daemon=True)
        reader.start()
        reader.join(READ_TIMEOUT.total_seconds())
        return found[0] if found else None

    def _read_marks(self) -> dict[int, tuple[int, int, str] | None] | None:
        out: dict[int, tuple[int, int, str] | None] = {}
        try:
            self._store.set_timeout(READ_TIMEOUT)  # the store's own timeout is the run's: long, and already spent
            for rank in self._ranks:
                if rank == self._me:
                    continue
                value = self._read(rank)
                if value is None:
                    out[rank] = None
                    continue
                count, beat, label = value.split(" ", 2)
                out[rank] = (int(count), int(beat), label)
        except (RuntimeError, OSError):  # the store's host is stopped or gone, or the network is down
            return None
        return out

    def locate(self, error: PeerTimeoutError) -> PeerTimeoutError:
        """Fill in ``error``'s silent ranks from the other ranks' marks, read twice :data:`HEARTBEAT_S` and a half
        apart: a rank whose heartbeat did not move in between is stopped (or its machine frozen).

        A rank behind this one is silent. Where none is, the ranks at the same point whose heartbeat stopped are;
        where none of those is either (they are alive but do not answer), every rank at the same point is named.

        Args:
            error: The timeout this rank raised.

        Returns:
            ``error``.
        """
        if not self._marking or error.store_unreachable:
            return error
        first = self.marks()
        self._pause(1.5 * HEARTBEAT_S)
        marks = self.marks() if first is not None else None
        if marks is None:
            error.store_unreachable = True
            return error
        error.frozen = tuple(r for r, m in marks.items() if m is not None and first.get(r) is not None and
                             first[r][1] == m[1])
        silent = tuple(r for r, m in marks.items() if m is None or m[0] < self._count)
        if not silent:
            level = tuple(r for r, m in marks.items() if m is not None and m[0] == self._count)
            silent = tuple(r for r in level if r in error.frozen) or level
            error.stopped_inside = bool(silent)
        error.silent = silent
        error.last_seen = {r: marks[r][2] for r in silent if marks[r] is not None}
        return error

    def _pause(self, seconds: float) -> None:
        """Wait between the two reads of the marks (a test replaces it)."""
        time.sleep(seconds)

    @contextlib.contextmanager
    def watch(self, *, exchange: str | None = None, call: int | None = None, phase: str | None = None,
              collective: str = "a collective", mark: str | None = None) -> Iterator[None]:
        """Turn a timeout of the collectives in the block into a :class:`PeerTimeoutError` naming the silent ranks;
        a :class:`PeerTimeoutError` from within keeps where it was raised and only gains what it lacks.

        Args:
            exchange: The exchange direction the block runs (``"forward"``, ``"backward"``), if it is one.
            call: That exchange's call number.
            phase: The part of the training step the block is (``"forward"``, ``"backward"``).
            collective: What timed out, where the collective does not say (a raw timeout from the block).
            mark: :meth:`mark` this label first.

        Yields:
            Nothing.

        Raises:
            PeerTimeoutError: A collective in the block timed out.
        """
        try:
            if mark is not None:
                self.mark(mark)
            yield
        except PeerTimeoutError as error:
            if error.exchange is None and error.phase is None:
                error.exchange, error.call, error.phase = exchange, call, phase
                self.locate(error)
            raise
        except RuntimeError as error:
            if not is_timeout(error):
                raise
            timeout = PeerTimeoutError(self._me, collective, str(error))
            timeout.exchange, timeout.call, timeout.phase = exchange, call, phase
            raise self.locate(timeout) from error


def peer_timeout(error: BaseException | None) -> PeerTimeoutError | None:
    """The :class:`PeerTimeoutError` that ``error`` is, or was raised from (its causes and contexts), if any.

    Args:
        error: What ended a run.

    Returns:
        The timeout, or ``None``.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, PeerTimeoutError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


_PROGRESS: dict[str, tuple[dist.ProcessGroup, Progress]] = {}


def progress_of(pg: dist.ProcessGroup | None = None) -> Progress:
    """The :class:`Progress` of ``pg`` in this process (made at the first call), shared by every user of the group.

    Args:
        pg: A process group; ``None``: the default one.

    Returns:
        Its progress marks.
    """
    if pg is None:
        pg = dist.group.WORLD
    name = _group_name(pg)
    held = _PROGRESS.get(name)
    if held is None or held[0] is not pg:  # a new group under an old name (a second fit in one process)
        held = _PROGRESS[name] = (pg, Progress(pg))
    return held[1]


def _group_name(pg: dist.ProcessGroup) -> str:
    """The group's name, the same on every rank (the key its marks are stored under)."""
    return str(getattr(pg, "group_name", "") or "0")


def _default_store() -> dist.Store | None:
    """The default process group's store, ``None`` where there is none."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (RuntimeError, ValueError, AttributeError, ImportError):
        return None
