"""What a compressed exchange records around the pure wire functions, once for the pooled and the sequence exchange.

:class:`Recorder` holds one exchange module's statistics (:class:`~lightning_dlac.comm.CommStats`, counters that
only grow), its phase timer (:class:`~lightning_dlac.comm.timing.PhaseTimer`, right on a GPU), the record switch
(:meth:`Recorder.off_the_record`: exchanges that measure rather than train), the chunk observer that calibration
measures through, the non-finite chunk counts and the error sampling. The module both exchanges are, which holds
their recorder, is :class:`~lightning_dlac.comm.base.RecordedExchange`.

A call's recording follows one order in both modules: at launch, the observer sees every chunk (outside any timed
phase: what it computes is not exchange time); encode and size exchange are timed; while the payload is on its way,
:meth:`Recorder.count_forward` and :meth:`Recorder.check` run; waiting and decoding are timed. Calls off the record
are timed on a timer nobody reads and add nothing.

Times are read (:meth:`Recorder.fold_times`) only when somebody asks for the statistics: on a GPU that waits for the
device, so per-batch bookkeeping marks steps (:meth:`Recorder.set_in_step`) instead of reading times; the seconds
of phases timed within a step are counted apart (``CommStats.in_step_s``).
"""

from __future__ import annotations

import contextlib
import importlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from lightning_dlac.adaptive.bounds import BoundSource
from lightning_dlac.codec import decode_grid
from lightning_dlac.codec.format import HEADER_SIZE
from lightning_dlac.comm.config import CompressionConfig
from lightning_dlac.comm.exchange import Grid
from lightning_dlac.comm.stats import CommStats
from lightning_dlac.comm.timing import PhaseTimer

Observer = Callable[[str, torch.Tensor], None]
# gradient_observer(table, energy, rows): see Recorder.gradient_observer.
GradientObserver = Callable[[str, float, int], None]


class Recorder:
    """Statistics, timing, record switch, observer and checks of one exchange module.

    Args:
        config: Compression settings (``error_every`` and ``impl`` are read here).
        bounds: The bounds exchanges on the record encode with.
        clock: Wall clock of the phase timers on non-CUDA devices (tests inject a fake one).

    Attributes:
        observer: If set, called as ``observer(table, chunk)`` with every (destination rank, local table) chunk of a
            forward exchange on the record, this rank's own included (see :meth:`observe`).
        gradient_observer: If set, called as ``gradient_observer(table, energy, rows)`` once per table and call on
            the record whose gradient comes back through this exchange (pooled exchanges): ``rows`` is the number of
            samples of this rank's batch and ``energy`` the sum over the table's column blocks of (the value range
            of the chunk that brought the block) squared times the sum of the block's squared loss-gradient entries.
            With the codec's error uniform within ``eps x range``, ``eps**2 / 3 x energy`` is the variance of the
            first-order change of the loss that the table's error causes (see
            :meth:`lightning_dlac.adaptive.TableStats.gradient_sensitivity`).
        timer: The timer of calls on the record outside a step (made at the first such call, on its device; a test
            may put a scripted one here).
    """

    def __init__(self, config: CompressionConfig, bounds: BoundSource,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._config = config
        self._clock = clock
        self._bounds = bounds
        self._on_record = True
        self._stats = CommStats()
        self._in_step = False
        self._step_timer: PhaseTimer | None = None
        self._interval_s = 0.0
        self.timer: PhaseTimer | None = None
        self.observer: Observer | None = None
        self.gradient_observer: GradientObserver | None = None

    # ------------------------------------------------------------------ the record switch

    @property
    def bounds(self) -> BoundSource:
        """The bounds a call launched now encodes with."""
        return self._bounds

    @property
    def on_record(self) -> bool:
        """Whether a call launched now counts (statistics, observer)."""
        return self._on_record

    @contextlib.contextmanager
    def off_the_record(self, bounds: BoundSource) -> Iterator[None]:
        """Within the block, forward exchanges read ``bounds``, are not observed and count in no statistics."""
        saved = self._bounds, self._on_record
        self._bounds, self._on_record = bounds, False
        try:
            yield
        finally:
            self._bounds, self._on_record = saved

    # ------------------------------------------------------------------ timing

    def call_timer(self, device: torch.device, on_record: bool) -> PhaseTimer:
        """The timer of a call launched now on ``device``: a throwaway one off the record."""
        if not on_record:
            return PhaseTimer(device)
        if self._in_step:
            if self._step_timer is None:
                self._step_timer = PhaseTimer(device, self._clock)
            return self._step_timer
        if self.timer is None:
            self.timer = PhaseTimer(device, self._clock)
        return self.timer

    def set_in_step(self, in_step: bool) -> None:
        """From now on, calls are (or are no longer) within a step: their phase seconds also count in ``in_step_s``.
        Reads no time."""
        self._in_step = bool(in_step)

    def fold_times(self) -> dict[str, float]:
        """Move the finished phases' seconds into the statistics (on a GPU this waits for the device); return them."""
        times: dict[str, float] = {}
        for timer in (self.timer, self._step_timer):
            collected = timer.collect() if timer is not None else {}
            for name, seconds in collected.items():
                times[name] = times.get(name, 0.0) + seconds
            if timer is self._step_timer:
                self._stats.in_step_s += sum(collected.values())
        for name, seconds in times.items():
            setattr(self._stats, name, getattr(self._stats, name) + seconds)
        self._interval_s += sum(times.values())
        return times

    def start_interval(self) -> None:
        """Start summing phase seconds afresh (what :meth:`interval_s` reads)."""
        self.fold_times()
        self._interval_s = 0.0

    def interval_s(self) -> float:
        """Seconds of every phase on the record since :meth:`start_interval` (reads the times)."""
        self.fold_times()
        return self._interval_s

    def stats(self) -> CommStats:
        """A snapshot of the counters (reads the times)."""
        self.fold_times()
        return self._stats.copy()

    # ------------------------------------------------------------------ what a call on the record adds

    def observe(self, chunks: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Show the observer every ``(table, chunk)`` (nothing happens without one)."""
        if self.observer is not None:
            for name, chunk in chunks:
                self.observer(name, chunk)

    def observe_gradients(self, tables: Sequence[str], ranges: torch.Tensor, grad: torch.Tensor,
                          col_splits: Sequence[int]) -> None:
        """Show the gradient observer, per table, the energy of ``grad`` ([rows, columns]: the loss gradient of a
        call's output, whose column block ``i`` spans ``col_splits[i]:col_splits[i + 1]`` and belongs to
        ``tables[i]``) weighted by the squared value range of each block's chunk (``ranges``, one per block). A
        table with several blocks (column-wise shards) is shown once, their energies summed. Nothing happens without
        an observer; with one, this reads the device (calibration batches only)."""
        if self.gradient_observer is None or not tables:
            return
        grad = grad.detach().float()
        squares = torch.stack([grad[:, a:b].square().sum() for a, b in zip(col_splits[:-1], col_splits[1:])])
        energies = (squares * ranges.to(squares.device).double().square().to(squares.dtype)).tolist()
        per_table: dict[str, float] = {}
        for name, energy in zip(tables, energies):
            per_table[name] = per_table.get(name, 0.0) + energy
        for name, energy in per_table.items():
            self.gradient_observer(name, energy, grad.size(0))

    def count_forward(self, tables: Sequence[str], table_raw: Sequence[int], table_sent: Sequence[int], sent: int,
                      uncompressed: bool = False, table_passed: Sequence[int] | None = None) -> None:
        """Count one forward call: per local table the float32 bytes it stands for and the payload bytes it sent to
        other ranks (``table_passed``: of those, the bytes sent as they are to peers the plan does not compress), and
        ``sent`` bytes in all (payload and size exchange)."""
        s = self._stats
        s.calls += 1
        s.uncompressed_calls += int(uncompressed)
        s.raw_bytes += sum(table_raw)
        s.sent_bytes += int(sent)
        if self._in_step:
            s.in_step_calls += 1
            s.in_step_raw_bytes += sum(table_raw)
            s.in_step_sent_bytes += int(sent)
        for name, raw, table in zip(tables, table_raw, table_sent):
            s.table_raw_bytes[name] = s.table_raw_bytes.get(name, 0) + int(raw)
            s.table_sent_bytes[name] = s.table_sent_bytes.get(name, 0) + int(table)
        for name, n in zip(tables, table_passed or ()):
            s.table_passed_bytes[name] = s.table_passed_bytes.get(name, 0) + int(n)

    def count_links(self, per_destination: Mapping[int, tuple[str, int, bool]]) -> None:
        """Count payload bytes by link class: ``{destination: (link class, bytes, sent as is)}``."""
        s = self._stats
        for link, n, passed in per_destination.values():
            if link == "same_node":
                s.same_node_sent_bytes += int(n)
            else:
                s.other_nodes_sent_bytes += int(n)
            if passed:
                s.passed_bytes += int(n)

    def count_backward(self, raw: int, sent: int, table_sent: Mapping[str, int] | None = None,
                       table_passed: Mapping[str, int] | None = None) -> None:
        """Count one gradient exchange: ``raw`` float32 bytes stood for, ``sent`` bytes sent to other ranks (payload
        and size exchange), and per table the payload bytes sent for it (``table_sent``, where known; of those,
        ``table_passed`` went as they are to peers the plan does not compress)."""
        s = self._stats
        s.backward_calls += 1
        s.backward_raw_bytes += int(raw)
        s.backward_sent_bytes += int(sent)
        for name, n in (table_sent or {}).items():
            s.table_backward_sent_bytes[name] = s.table_backward_sent_bytes.get(name, 0) + int(n)
        for name, n in (table_passed or {}).items():
            s.table_backward_passed_bytes[name] = s.table_backward_passed_bytes.get(name, 0) + int(n)

    def check(self, grids: Sequence[Grid], eps: Mapping[str, float]) -> None:
        """After :meth:`count_forward`: count the chunks of ``grids`` that held NaN/Inf and, every ``error_every``
        calls, record max |x - x_hat| / bound per table (``eps``: each table's relative bound)."""
        self._note_non_finite(grids)
        every = self._config.error_every
        if every and eps and (self._stats.calls - 1) % every == 0:
            self._sample_error(grids, eps)

    def _note_non_finite(self, grids: Sequence[Grid]) -> None:
        """The codec sends a chunk holding NaN/Inf raw (exactly), so only chunks whose size is exactly a raw chunk's
        are scanned: nothing is scanned on the usual, compressed path."""
        counts = self._stats.table_non_finite_chunks
        for grid in grids:
            sizes = grid.sizes.tolist()
            for name, chunk, k in grid.chunks():
                if chunk.numel() and sizes[k] == HEADER_SIZE + chunk.numel() * 4 and not bool(chunk.isfinite().all()):
                    counts[name] = counts.get(name, 0) + 1

    def _sample_error(self, grids: Sequence[Grid], eps: Mapping[str, float]) -> None:
        """Decode our own payload and record max |x - x_hat| / bound per table (the bound is a guarantee; this
        makes it visible)."""
        worst = dict.fromkeys(eps, 0.0)
        for grid in grids:
            if not grid.payload.numel():
                continue
            x_hat = decode_grid(grid.payload, grid.sizes, grid.row_splits, grid.col_splits, impl=self._config.impl)
            sent = Grid(x_hat.cpu(), grid.row_splits, grid.col_splits, grid.payload, grid.sizes, grid.tables)
            for (name, chunk, _), (_, chunk_hat, _) in zip(grid.chunks(), sent.chunks()):
                chunk = chunk.cpu()
                if chunk.numel() == 0 or not torch.isfinite(chunk).all():
                    continue  # nothing sent, or sent raw, exactly (and counted by _note_non_finite)
                bound = eps[name] * float(chunk.max() - chunk.min())
                err = float((chunk - chunk_hat).abs().max())
                ratio = err / bound if bound > 0 else (0.0 if err == 0 else float("inf"))
                worst[name] = max(worst[name], ratio)
        observed = self._stats.table_max_error_ratio
        for name, w in worst.items():
            observed[name] = max(observed.get(name, 0.0), w)


# Ready and RecordedExchange were defined here until they moved to comm/base.py (issue 52), which imports this module:
# imported from here they still work, for one release, with a DeprecationWarning that names their new home. The new
# home is looked up by name on first use, so that this module imports nothing above it.
_MOVED = ("Ready", "RecordedExchange")


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"lightning_dlac.comm.recorder.{name} is deprecated: it moved to lightning_dlac.comm.base.{name};"
                  " import it from there", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("lightning_dlac.comm.base"), name)
