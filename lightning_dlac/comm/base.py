"""What the pooled and the sequence exchange both derive from, so it lives in neither of their modules.

| class | what | subclasses |
|---|---|---|
| :class:`TableLayout` | each rank's tables, this rank's place, the peer plan | ``Layout``, ``SequenceLayout`` |
| :class:`RecordedExchange` | the module: process group, tables, peer plan, ``Recorder`` | both all-to-alls |
| :class:`Ready` | an awaitable whose tensor is already there (an exchange that finished when called) | |

A pooled layout (:class:`~lightning_dlac.comm.pooled.Layout`) chunks by column blocks, a sequence layout
(:class:`~lightning_dlac.comm.sequence.SequenceLayout`) by features. The :class:`~lightning_dlac.comm.ExchangeGroup`
talks to both all-to-alls through what :class:`RecordedExchange` offers, and nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.types import Awaitable

from lightning_dlac.adaptive.bounds import BoundSource
from lightning_dlac.comm.config import CompressionConfig
from lightning_dlac.comm.liveness import Progress, progress_of
from lightning_dlac.comm.peers import PeerPlan, backend_of, discover_nodes
from lightning_dlac.comm.recorder import Observer, Recorder
from lightning_dlac.comm.stats import CommStats


@dataclass(frozen=True)
class TableLayout:
    """Which tables each rank sends chunks of, and this rank's place among the ranks.

    Args:
        rank: This rank.
        tables_per_rank: Table name of each chunk column (a column block, a feature), per rank, in the order of
            that rank's ``local_embs`` (the key of its error bound). A rank may have none.
    """

    rank: int
    tables_per_rank: tuple[tuple[str, ...], ...]
    peers: PeerPlan | None = field(default=None, kw_only=True)  # None: every payload compressed (PeerPlan.everyone)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside the layout's {self.world} ranks.")
        if self.peers is not None and self.peers.world != self.world:
            raise ValueError(f"a peer plan of {self.peers.world} ranks for a layout of {self.world}.")

    @cached_property
    def plan(self) -> PeerPlan:
        """Which payloads are DLAC-encoded (:class:`~lightning_dlac.comm.peers.PeerPlan`)."""
        return self.peers if self.peers is not None else PeerPlan.everyone(self.world)

    @cached_property
    def compress_to(self) -> tuple[bool, ...]:
        """Per destination, whether this rank's forward payload for it is compressed (its own: ``False``)."""
        return self.plan.to(self.rank)

    @cached_property
    def compress_from(self) -> tuple[bool, ...]:
        """Per source, whether its forward payload for this rank comes compressed. A gradient goes back as its
        embeddings came: this rank's gradient for owner ``r`` is compressed where ``compress_from[r]`` is."""
        return self.plan.source(self.rank)

    @cached_property
    def mixed(self) -> bool:
        """Whether some peer of this rank gets (or sends it) a payload as is, in either direction."""
        others = self.other_ranks
        return not all(self.compress_to[r] and self.compress_from[r] for r in others)

    @property
    def world(self) -> int:
        return len(self.tables_per_rank)

    @property
    def local_tables(self) -> tuple[str, ...]:
        """Tables whose embeddings this rank sends."""
        return self.tables_per_rank[self.rank]

    @property
    def chunk_counts(self) -> list[int]:
        """Chunk columns per rank (chunks each rank sends to every destination)."""
        return [len(t) for t in self.tables_per_rank]

    @property
    def other_ranks(self) -> list[int]:
        """Every rank but this one, in rank order: whom this rank exchanges with."""
        return [r for r in range(self.world) if r != self.rank]


class Ready(Awaitable[torch.Tensor]):
    """An awaitable whose tensor is already there (an exchange that finished when it was called)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor


class RecordedExchange(nn.Module):
    """What the pooled and the sequence exchange modules share: a process group, a table layout and a
    :class:`Recorder`, and the interface :class:`~lightning_dlac.comm.ExchangeGroup` drives them through.

    Args:
        pg: Process group of the exchange.
        tables_per_rank: Table name of each chunk column (pooled: column block; sequence: feature), per rank.
        config: Compression settings.
        bounds: Per-table bounds, read at every call.
        peers: Which payloads are compressed; ``None``: the plan of ``config.compress_peers`` on the nodes every
            rank reads from its launcher (:func:`~lightning_dlac.comm.peers.discover_nodes`, a collective: every
            rank builds its exchanges together).
    """

    def __init__(self, pg: dist.ProcessGroup, tables_per_rank: Sequence[Sequence[str]], config: CompressionConfig,
                 bounds: BoundSource, peers: PeerPlan | None = None) -> None:
        super().__init__()
        if len(tables_per_rank) != pg.size():
            raise ValueError(f"tables_per_rank needs one entry per rank ({pg.size()}), got {len(tables_per_rank)}.")
        self._pg = pg
        self._config = config
        self._tables_per_rank = tuple(tuple(t) for t in tables_per_rank)
        self.peers = peers if peers is not None else PeerPlan.from_policy(config.compress_peers, discover_nodes(pg),
                                                                          backend_of(pg))
        if self.peers.world != pg.size():
            raise ValueError(f"a peer plan of {self.peers.world} ranks for a process group of {pg.size()}.")
        self.recorder = Recorder(config, bounds)
        self._calls = 0  # forward calls so far: the number a silent peer's error names

    @cached_property
    def _progress(self) -> Progress:
        """This rank's progress marks on the exchange's group, which name a silent peer on a timeout."""
        return progress_of(self._pg)

    def _enter(self, exchange: str, call: int) -> contextlib.AbstractContextManager[None]:
        """Mark that this rank enters the ``call``-th ``exchange`` (``"forward"``, ``"backward"``) in the group's
        store, and watch the block: a collective in it that times out raises
        :class:`~lightning_dlac.comm.liveness.PeerTimeoutError` naming the silent rank."""
        return self._progress.watch(exchange=exchange, call=call, mark=f"{exchange} exchange, call {call}")

    def _watch(self, exchange: str, call: int) -> contextlib.AbstractContextManager[None]:
        """Watch the block as :meth:`_enter` does, without a new mark (the second half of a launched exchange)."""
        return self._progress.watch(exchange=exchange, call=call)

    def count_links(self, send_bytes: Sequence[int], compressed_to: Sequence[bool]) -> None:
        """Count a payload's bytes to each destination by link class (same node / other nodes), and those sent as
        they are (not compressed) apart."""
        rank = dist.get_rank(self._pg)
        self.recorder.count_links({d: (self.peers.link(rank, d), n, not compressed_to[d])
                                   for d, n in enumerate(send_bytes) if d != rank})

    @property
    def local_tables(self) -> list[str]:
        """Tables whose embeddings this rank sends (one entry per local column block or feature)."""
        return list(self._tables_per_rank[dist.get_rank(self._pg)])

    @property
    def tables_per_rank(self) -> list[list[str]]:
        """Table names per rank (every rank's tables, not only this one's)."""
        return [list(t) for t in self._tables_per_rank]

    @property
    def stats(self) -> CommStats:
        """A snapshot of this exchange's counters since it was installed (they only grow)."""
        return self.recorder.stats()

    @property
    def observer(self) -> Observer | None:
        """See :attr:`Recorder.observer`."""
        return self.recorder.observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self.recorder.observer = observer

    def off_the_record(self, bounds: BoundSource) -> contextlib.AbstractContextManager[None]:
        """Within the block, forward exchanges read ``bounds``, are not observed and count in no statistics:
        exchanges that measure something (a calibration probe) rather than train."""
        return self.recorder.off_the_record(bounds)
