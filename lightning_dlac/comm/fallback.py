"""The uncompressed fallback of ``DLACStrategy(compress="auto")``: send a forward exchange uncompressed while that is
faster (a fast link, a slow codec)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from lightning_dlac.adaptive.bounds import check_count


class FallbackCall(NamedTuple):
    """What the next forward exchange does: send ``uncompressed`` or not, and whether its time is ``timed`` (then
    the caller measures it and passes it to :meth:`UncompressedFallback.record`)."""

    uncompressed: bool
    timed: bool


class UncompressedFallback:
    """Decides, call by call, whether the forward exchange goes uncompressed.

    Calls 0 and 1 are compressed (call 0 carries one-time set-up costs, so only call 1 is timed); call 2 goes
    uncompressed and is timed; from then on the faster way is used, and every ``check_every`` calls the way not
    taken is tried once (a *check*). Only calls whose times are used are timed: each check, and the call of the way
    in use just before it; so on a GPU only those calls wait for the device. Each way's time is the mean of its last
    two timed calls (an exponential average of weight 1/2). A decision compares the slowest rank's times (``slowest``
    is one all-reduce MAX), so every rank takes the same way at the same call, as the collectives require.

    Args:
        check_every: Calls between checks of the way not taken.
        slowest: Maps this rank's ``[compressed_s, uncompressed_s]`` to the maximum over ranks.
    """

    def __init__(self, check_every: int, slowest: Callable[[Sequence[float]], Sequence[float]]) -> None:
        self._every = check_count(check_every, "check_every", 1)
        self._slowest = slowest
        self._calls = 0
        self._seconds: dict[bool, float | None] = {False: None, True: None}  # keyed by "uncompressed"
        self._uncompressed = False  # the way in use
        self._checking = False

    @property
    def calls(self) -> int:
        """Forward calls decided so far."""
        return self._calls

    def next_call(self) -> FallbackCall:
        """The decision for the next forward exchange."""
        k = self._calls
        self._calls += 1
        self._checking = k == 2 or (k > 2 and (k - 2) % self._every == 0)
        if k < 2:
            uncompressed = False  # warm-up: the compressed way, whose first call includes one-time costs
        elif k == 2:
            uncompressed = True
        else:
            uncompressed = not self._uncompressed if self._checking else self._uncompressed
        timed = self._checking or (k >= 1 and (k - 1) % self._every == 0)
        return FallbackCall(uncompressed, timed)

    def record(self, uncompressed: bool, seconds: float) -> None:
        """The time of the call just made (one that :meth:`next_call` marked ``timed``); after a check, decide."""
        prev = self._seconds[uncompressed]
        self._seconds[uncompressed] = seconds if prev is None else 0.5 * (prev + seconds)
        compressed_s, uncompressed_s = self._seconds[False], self._seconds[True]
        if self._checking and compressed_s is not None and uncompressed_s is not None:
            compressed_s, uncompressed_s = self._slowest([compressed_s, uncompressed_s])
            self._uncompressed = uncompressed_s < compressed_s
            self._checking = False
