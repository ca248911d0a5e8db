"""The uncompressed fallback (``CompressionConfig(auto_fallback=True)``): send an exchange uncompressed (TorchRec's
float32 all-to-all, forward and gradients) while that is faster (a fast link, a slow codec).

The module (:class:`~lightning_dlac.comm.CompressedPooledEmbeddingsAllToAll`) asks for a decision at each forward
launch and times a call as every phase of it, the gradient exchange of its backward included (both directions go
the same way), so a call's time is read at the next launch.

A check (one call of the way not taken) costs the gap between the two ways' times, so checks are spread further
apart the larger the measured gap (the slower way's time over the faster's, ``r``). A decision that a check
changed, or the first one, is checked again after ``check_every`` calls; each check that confirms it doubles the
interval, up to the gap's (a single noisy time that picks the wrong way is undone within ``check_every`` calls):

| quantity | formula |
|---|---|
| calls to the next check, at most | ``check_every * min(max(r, 1), max_stretch)``, rounded down (``check_interval``) |
| calls to the next check | ``check_every`` after a changed decision, else ``min(2 * previous, at most)`` |
| a check's extra time | ``(r - 1) * t_fast`` |
| extra time per call, amortized, once doubled up | ``(r - 1) / r * t_fast / check_every`` (r below the cap) |
| the same, r above the cap | ``(r - 1) / (max_stretch * check_every) * t_fast`` |

On a slow link (compression 3x faster, say) the uncompressed way is tried a third as often as on a link where the
two are close, and up to a gap of ``max_stretch`` the checks cost less than ``1 / check_every`` of the exchange time
per call. ``max_stretch`` bounds how stale a decision may get when the gap is huge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from lightning_dlac.checks import check_count


class FallbackCall(NamedTuple):
    """What the next forward exchange does: send ``uncompressed`` or not, and whether its time is ``timed`` (then
    the caller measures it and passes it to :meth:`UncompressedFallback.record`)."""

    uncompressed: bool
    timed: bool


def check_interval(check_every: int, seconds: Sequence[float], max_stretch: float) -> int:
    """Calls from one check to the next when the two ways took ``seconds`` (in either order): ``check_every`` times
    the ratio of the slower to the faster, capped at ``max_stretch`` times ``check_every``."""
    slow, fast = max(seconds), min(seconds)
    ratio = slow / fast if fast > 0 else math.inf
    # (the small tolerance keeps a ratio like 0.16 / 0.01 = 15.999... from losing a whole call to rounding down)
    return max(check_every, int(check_every * min(max(ratio, 1.0), max_stretch) + 1e-9))


class UncompressedFallback:
    """Decides, call by call, whether the exchange goes uncompressed.

    Calls 0 and 1 are compressed (call 0 carries one-time set-up costs, so only call 1 is timed); call 2 goes
    uncompressed and is timed; from then on the faster way is used, and the way not taken is tried once (a *check*)
    ``check_every`` calls after a decision changes, then at intervals doubling with each confirming check up to
    :func:`check_interval` calls: ``check_every`` while the two ways' times are close, up to ``max_stretch`` times
    that as the gap grows (the module docstring has the formulas). Only calls whose times are used are timed:
    each check, and the call of the way in use just before it; so on a GPU only those calls wait for the device.
    Each way's time is the mean of its last two timed calls (an exponential average of weight 1/2). A decision
    compares the slowest rank's times (``slowest`` is one all-reduce MAX), so every rank takes the same way at the
    same call and schedules the same next check, as the collectives require.

    Args:
        check_every: Calls between checks of the way not taken while the two ways' times are close.
        slowest: Maps this rank's ``[compressed_s, uncompressed_s]`` to the maximum over ranks.
        max_stretch: The most the interval between checks grows with the gap (a multiple of ``check_every``).
    """

    def __init__(self, check_every: int, slowest: Callable[[Sequence[float]], Sequence[float]],
                 max_stretch: float = 16.0) -> None:
        self._every = check_count(check_every, "check_every", 1)
        if not (math.isfinite(max_stretch) and max_stretch >= 1):
            raise ValueError(f"max_stretch={max_stretch!r} must be a finite number >= 1 (1: check every check_every"
                             " calls whatever the gap).")
        self._stretch = float(max_stretch)
        self._slowest = slowest
        self._calls = 0
        self._seconds: dict[bool, float | None] = {False: None, True: None}  # keyed by "uncompressed"
        self._uncompressed = False  # the way in use
        self._checking = False
        self._next_check = 2
        self._interval = self._every
        self._decided = False  # no check has decided yet

    @property
    def calls(self) -> int:
        """Forward calls decided so far."""
        return self._calls

    @property
    def interval(self) -> int:
        """Calls from the last check to the next one."""
        return self._interval

    def next_call(self) -> FallbackCall:
        """The decision for the next forward exchange."""
        k = self._calls
        self._calls += 1
        self._checking = k == self._next_check
        if k < 2:
            uncompressed = False  # warm-up: the compressed way, whose first call includes one-time costs
        elif k == 2:
            uncompressed = True
        else:
            uncompressed = not self._uncompressed if self._checking else self._uncompressed
        timed = self._checking or k == 1 or k == self._next_check - 1
        return FallbackCall(uncompressed, timed)

    def record(self, uncompressed: bool, seconds: float) -> None:
        """The time of the call just made (one that :meth:`next_call` marked ``timed``); after a check, decide and
        schedule the next check."""
        prev = self._seconds[uncompressed]
        self._seconds[uncompressed] = seconds if prev is None else 0.5 * (prev + seconds)
        compressed_s, uncompressed_s = self._seconds[False], self._seconds[True]
        if self._checking and compressed_s is not None and uncompressed_s is not None:
            compressed_s, uncompressed_s = self._slowest([compressed_s, uncompressed_s])
            confirmed = self._decided and (uncompressed_s < compressed_s) == self._uncompressed
            self._uncompressed = uncompressed_s < compressed_s
            at_most = check_interval(self._every, [compressed_s, uncompressed_s], self._stretch)
            self._interval = min(at_most, 2 * self._interval) if confirmed else self._every
            self._decided = True
            self._next_check = self._calls - 1 + self._interval
            self._checking = False
