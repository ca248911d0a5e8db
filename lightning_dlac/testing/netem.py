"""A lossy, jittery network between ranks on one machine, in user space: what ``tc qdisc ... netem loss 1% delay``
would do, where the kernel has no ``sch_netem`` (this project's CI machines lack it; ``tc`` answers "Specified qdisc
kind is unknown").

Each rank gets a network namespace of its own (``ip netns``) holding only ``lo`` and a TUN device ``tun0`` with the
address :meth:`LossyNetwork.address` gives it. A forwarder thread in the launching process holds every TUN device:
it reads each IP packet a namespace sends, drops it with probability ``loss``, and otherwise writes it into the
destination's namespace after a delay drawn uniformly from ``delay_ms`` for that packet alone. Packets are delayed
independently, so later ones may overtake earlier ones (netem's ``delay`` with jitter reorders the same way). TCP in
the namespaces sees real loss, retransmits, and reordering, as on a bad network; nothing above the socket knows.

A rank enters its namespace with :func:`enter_namespace` before it opens any socket (before the process group is
made), and reaches the others at their :meth:`~LossyNetwork.address`. Needs root, ``ip`` and ``/dev/net/tun``
(:func:`unavailable` says what is missing). Standard library only.
"""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import itertools
import os
import random
import select
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/var/run/netns"
_SUBNET = "10.77.{node}.{host}"

__all__ = ["LinkCounts", "LossyNetwork", "enter_namespace", "unavailable"]


def unavailable() -> str | None:
    """Why a :class:`LossyNetwork` cannot be made here (not root, no ``ip``, no ``/dev/net/tun``), ``None`` if it can.

    Returns:
        The reason, or ``None``.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces and TUN devices need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TUN support)"
    return None


def _setns(path: str) -> None:
    """Move the calling thread into the network namespace at ``path`` (``os.setns`` arrived only in Python 3.12)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def enter_namespace(name: str) -> None:
    """Move this process's calling thread, and every thread and socket it makes from now on, into the network
    namespace ``name`` (a :class:`LossyNetwork`'s :meth:`~LossyNetwork.namespace`).

    Call it first thing in a rank, before the process group (its store and gloo's sockets and threads) exists.

    Args:
        name: The namespace.

    Raises:
        OSError: If the namespace does not exist or this process may not enter it.
    """
    _setns(os.path.join(_NETNS_DIR, name))


@dataclass
class LinkCounts:
    """What the forwarder did: packets forwarded and dropped, and bytes forwarded."""

    forwarded: int = 0
    dropped: int = 0
    bytes: int = 0


class LossyNetwork:
    """Namespaces joined by a lossy, jittery link for ``ranks`` ranks; a context manager.

    Args:
        ranks: How many namespaces (one per rank).
        loss: Probability that a packet is dropped.
        delay_ms: The range each packet's delay is drawn from, uniformly, in milliseconds.
        seed: Seed of the drops and the delays.
        prefix: Start of the namespaces' names (the process id is added: concurrent tests keep apart).

    Attributes:
        counts: Packets forwarded and dropped so far (:class:`LinkCounts`).
    """

    def __init__(self, ranks: int = 2, loss: float = 0.01, delay_ms: tuple[float, float] = (5.0, 50.0),
                 seed: int = 0, prefix: str = "dlacnet") -> None:
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        if not 0 <= delay_ms[0] <= delay_ms[1]:
            raise ValueError(f"delay_ms must be (low, high) with 0 <= low <= high, got {delay_ms}")
        if not 1 <= ranks <= 250:
            raise ValueError(f"ranks must be 1 to 250, got {ranks}")
        self._ranks, self._loss, self._delay = ranks, loss, (delay_ms[0] / 1e3, delay_ms[1] / 1e3)
        self._random = random.Random(seed)
        self._names = [f"{prefix}{os.getpid()}r{r}" for r in range(ranks)]
        self._fds: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.counts = LinkCounts()

    def namespace(self, rank: int) -> str:
        """The network namespace of ``rank``.

        Args:
            rank: A rank.

        Returns:
            Its name, for :func:`enter_namespace`.
        """
        return self._names[rank]

    def address(self, rank: int) -> str:
        """The IPv4 address of ``rank`` (its ``tun0``), where the others reach it.

        Args:
            rank: A rank.

        Returns:
            The address.
        """
        return _SUBNET.format(node=0, host=rank + 1)

    def __enter__(self) -> LossyNetwork:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="lossy-network", daemon=True)
        try:
            self._thread.start()
            ready.wait(60)
            if self._error is not None:
                raise RuntimeError(f"the lossy network could not be set up: {self._error}") from self._error
            if not ready.is_set():
                raise RuntimeError("the lossy network was not set up within 60 s")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for fd in self._fds:
            os.close(fd)  # the TUN devices go with their last descriptor
        self._fds = []
        for name in self._names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def _setup(self) -> None:
        """Make each namespace with its TUN device, address and routes. Runs in the forwarder thread: opening a TUN
        device makes it in the opening thread's namespace, so the thread enters each namespace in turn."""
        for rank, name in enumerate(self._names):
            subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
            _setns(os.path.join(_NETNS_DIR, name))
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            self._fds.append(fd)
            fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", b"tun0", _IFF_TUN | _IFF_NO_PI))
            for command in (["link", "set", "lo", "up"],
                            ["addr", "add", f"{self.address(rank)}/24", "dev", "tun0"],
                            ["link", "set", "tun0", "up", "mtu", "1500"]):
                subprocess.run(["ip", "-n", name, *command], check=True, capture_output=True, text=True)

    def _run(self, ready: threading.Event) -> None:
        try:
            self._setup()
        except BaseException as err:  # noqa: BLE001 - reported by __enter__
            self._error = err
            ready.set()
            return
        ready.set()
        self._forward()

    def _forward(self) -> None:
        """Move packets between the TUN devices until stopped: drop each with probability ``loss``, deliver the
        rest after their own delay (a heap ordered by delivery time)."""
        by_address = {self.address(r): fd for r, fd in enumerate(self._fds)}
        pending: list[tuple[float, int, int, bytes]] = []
        order = itertools.count()
        while not self._stop.is_set():
            now = time.monotonic()
            while pending and pending[0][0] <= now:
                _, _, fd, packet = heapq.heappop(pending)
                try:
                    os.write(fd, packet)
                except OSError:
                    pass  # the device is gone (shutting down), or its queue is full: a drop like any other
            wait = min(0.05, max(0.0, pending[0][0] - now)) if pending else 0.05
            readable, _, _ = select.select(self._fds, [], [], wait)
            for fd in readable:
                for _ in range(64):  # a burst at most per device per turn
                    try:
                        packet = os.read(fd, 65535)
                    except BlockingIOError:
                        break
                    target = _destination(packet, by_address)
                    if target is None:
                        continue
                    if self._random.random() < self._loss:
                        self.counts.dropped += 1
                        continue
                    self.counts.forwarded += 1
                    self.counts.bytes += len(packet)
                    due = time.monotonic() + self._random.uniform(*self._delay)
                    heapq.heappush(pending, (due, next(order), target, packet))


def _destination(packet: bytes, by_address: dict[str, int]) -> int | None:
    """The TUN device of an IPv4 packet's destination address; ``None`` for anything else (IPv6 router
    solicitations and the like)."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    return by_address.get(".".join(str(b) for b in packet[16:20]))

