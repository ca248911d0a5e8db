"""Timing of exchange phases that stays right on a GPU.

On the CPU a phase's time is the wall time around it. On a GPU, ``time.perf_counter`` around a phase measures how
long the host took to *launch* its kernels; the work itself ends later. :class:`PhaseTimer` records a CUDA event on
the current stream at each phase boundary instead, and turns the pairs into seconds only when asked
(:meth:`PhaseTimer.collect`), so measuring adds no synchronisation to the exchange; a caller that must decide from a
time (the uncompressed fallback) asks for it, and only that call waits for the device.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
from torch.autograd.profiler import record_function


class PhaseTimer:
    """Accumulates named phase durations of work on ``device``.

    Args:
        device: Where the timed work runs (CUDA: events on the current stream; otherwise wall time).
        clock: Wall clock for non-CUDA devices (tests inject a fake one).
    """

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> None:
        self._cuda = device.type == "cuda"
        self._clock = clock
        self._pending: list[tuple[str, object, object]] = []

    def _mark(self) -> object:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._clock()

    @contextlib.contextmanager
    def phase(self, name: str, label: str | None = None) -> Iterator[None]:
        """Time the block as phase ``name``; ``label`` also names it in profiler traces (``## label ##``)."""
        with record_function(f"## {label} ##") if label else contextlib.nullcontext():
            start = self._mark()
            yield
            self._pending.append((name, start, self._mark()))

    def collect(self) -> dict[str, float]:
        """Seconds per phase name since the last collect (waits for the device only if CUDA events are pending)."""
        out: dict[str, float] = {}
        for name, start, end in self._pending:
            if self._cuda:
                end.synchronize()  # type: ignore[attr-defined]
                seconds = start.elapsed_time(end) / 1000.0  # type: ignore[attr-defined]
            else:
                seconds = end - start  # type: ignore[operator]
            out[name] = out.get(name, 0.0) + seconds
        self._pending.clear()
        return out
