"""ExchangeGroup: the one object the policy talks to, owning every compressed exchange installed in a model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from lightning_dlac.adaptive.bounds import BoundSource, ErrorBounds
from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll
from lightning_dlac.comm.recorder import GradientObserver
from lightning_dlac.comm.sequence import CompressedSequenceEmbeddingsAllToAll
from lightning_dlac.comm.stats import CommStats

# What the group holds: the pooled and the sequence exchanges, which share the interface the group uses
# (comm/base.py's RecordedExchange: tables, observer, off_the_record, stats, and their Recorder).
Exchange = CompressedPooledEmbeddingsAllToAll | CompressedSequenceEmbeddingsAllToAll


class ExchangeGroup(Sequence[Exchange]):
    """The compressed all-to-alls installed in one model, with their table layout, bounds, observer and statistics.

    :func:`~lightning_dlac.comm.install_compressed_all_to_all` returns it. A policy reads and writes the exchanges
    only through it: :attr:`bounds` (what the next exchanges encode with), :meth:`set_observer` (see every chunk
    this rank encodes), :meth:`off_the_record` (exchanges that measure rather than train), :meth:`set_in_step` (mark
    training steps without reading any time) and :meth:`stats` (counters that only grow; take differences of two
    snapshots for an interval). It is a sequence of the installed modules.

    Args:
        exchanges: The installed modules.
        bounds: The per-table bounds they all read.
    """

    def __init__(self, exchanges: Sequence[Exchange], bounds: ErrorBounds) -> None:
        self._exchanges = list(exchanges)
        self._bounds = bounds

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence protocol
        return self._exchanges[index]

    def __len__(self) -> int:
        return len(self._exchanges)

    @property
    def bounds(self) -> ErrorBounds:
        """The per-table bounds every exchange reads at each call."""
        return self._bounds

    @property
    def compressed_tables(self) -> list[str]:
        """Tables whose embeddings this rank sends compressed, sorted."""
        return sorted({t for a2a in self._exchanges for t in a2a.local_tables})

    @property
    def all_compressed_tables(self) -> list[str]:
        """Every table some rank sends compressed; the same sorted list on every rank."""
        return sorted({t for a2a in self._exchanges for tables in a2a.tables_per_rank for t in tables})

    def stats(self) -> CommStats:
        """This rank's counters summed over the exchanges, since they were installed.

        On a GPU this waits for the device (the phase times are read), so call it where a metric is written, not at
        every step.

        Returns:
            A snapshot; the counters only grow, so take differences of two snapshots for an interval.
        """
        total = CommStats()
        for a2a in self._exchanges:
            total = total + a2a.stats
        return total

    def set_in_step(self, in_step: bool) -> None:
        """Mark the start or the end of a training step.

        The phase seconds of exchanges within steps also count in ``CommStats.in_step_s``. Reads no time, so it costs
        nothing per step.

        Args:
            in_step: ``True`` at the start of a step, ``False`` at its end.
        """
        for a2a in self._exchanges:
            a2a.recorder.set_in_step(in_step)

    def set_observer(self, observer: Callable[[str, torch.Tensor], None] | None) -> None:
        """Show every chunk this rank encodes in a forward exchange on the record to ``observer``, from now on.

        Args:
            observer: Called as ``observer(table, chunk)``; ``None`` stops it.
        """
        for a2a in self._exchanges:
            a2a.observer = observer

    @contextlib.contextmanager
    def observing(self, observer: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
        """:meth:`set_observer` for the duration of the block.

        Args:
            observer: Called as ``observer(table, chunk)`` within the block.

        Yields:
            Nothing; the observer is removed when the block ends.
        """
        self.set_observer(observer)
        try:
            yield
        finally:
            self.set_observer(None)

    def set_gradient_observer(self, observer: GradientObserver | None) -> None:
        """Report the gradient of every pooled exchange on the record to ``observer``, once per table, from now on.

        Sequence exchanges do not report gradients.

        Args:
            observer: Called as ``observer(table, energy, rows)`` (see
                :attr:`~lightning_dlac.comm.recorder.Recorder.gradient_observer`); ``None`` stops it.
        """
        for a2a in self._exchanges:
            a2a.recorder.gradient_observer = observer

    @contextlib.contextmanager
    def off_the_record(self, bounds: BoundSource) -> Iterator[None]:
        """Run the block's forward exchanges off the record, encoding with other bounds.

        Within the block, forward exchanges encode with ``bounds`` instead of :attr:`bounds`, are always compressed,
        are not observed and count in no statistics (see :meth:`CompressedPooledEmbeddingsAllToAll.off_the_record`).

        Args:
            bounds: What the block's exchanges encode with (a probe's :class:`~lightning_dlac.adaptive.ProbeBounds`).

        Yields:
            Nothing; the exchanges are back on the record when the block ends.
        """
        with contextlib.ExitStack() as stack:
            for a2a in self._exchanges:
                stack.enter_context(a2a.off_the_record(bounds))
            yield
