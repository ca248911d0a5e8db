"""The statistics record of the compressed exchanges: counters that only grow.

Nobody resets a :class:`CommStats`. A reader that wants the figures of an interval keeps the snapshot it took at
the start and subtracts it from a later one (``later - earlier``); ranks combine their records with two all-reduces
(:meth:`CommStats.to_tensors` / :meth:`CommStats.from_tensors`). Every field is declared once, here, and sums,
differences, reductions and the plain-data form are all derived from the declarations: adding a counter is one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

# How a per-table field combines: "sum" (a counter) or "max" (a running maximum).
_REDUCE = "reduce"


def _per_table(reduce: str = "sum") -> Any:
    return field(default_factory=dict, metadata={_REDUCE: reduce})


@dataclass
class CommStats:
    """Counters of one rank's compressed exchanges since setup.

    Byte counts are traffic to other ranks: the block a rank keeps for itself is neither encoded nor sent (it is
    passed on exactly), so it counts in neither the raw nor the sent bytes, and ratios are those of the codec on
    what crosses the network. Seconds are device time where the exchange runs on a GPU (CUDA events), wall time on
    the CPU. ``in_step_s`` is the part of the four phase times (``a2a_s``) that fell within a step, and ``in_step_*``
    the forward traffic within one: the policy marks its training steps, so validation exchanges count in the totals
    but not in them. ``table_max_error_ratio`` is a running maximum, not a counter: a difference of two snapshots
    keeps the later one's value.

    Args:
        calls: Forward exchanges.
        uncompressed_calls: Of which the uncompressed fallback (``auto_fallback``) sent uncompressed.
        raw_bytes: Float32 bytes the forward exchanges stand for.
        sent_bytes: Bytes they did send (payloads + size exchange).
        encode_s: Seconds encoding forward payloads.
        exchange_s: Seconds in the forward size and payload exchanges.
        decode_s: Seconds decoding forward payloads.
        backward_calls: Gradient exchanges.
        backward_raw_bytes: Float32 bytes the gradient exchanges stand for.
        backward_sent_bytes: Bytes they did send (payloads + size exchange).
        backward_s: Seconds in the gradient exchanges, codec included (one phase).
        in_step_s: Of the seconds above, those timed within a step (``ExchangeGroup.set_in_step``).
        in_step_calls: Of the forward exchanges, those within a step: the rest is validation (or prediction).
        in_step_raw_bytes: Their raw bytes.
        in_step_sent_bytes: Their sent bytes.
        same_node_sent_bytes: Payload bytes (both directions) to peers on this rank's node.
        other_nodes_sent_bytes: Payload bytes (both directions) to peers on other nodes.
        passed_bytes: Of those payload bytes, the ones the peer plan sent as they are (float32, uncompressed:
            ``compress_peers``, :mod:`lightning_dlac.comm.peers`).
        table_raw_bytes: Per local table, the float32 bytes its forward payloads stand for.
        table_sent_bytes: Per local table, the forward payload bytes sent for it.
        table_backward_sent_bytes: Gradient payload bytes this rank sent per table (other ranks' tables: it sends
            their gradients; pooled only).
        table_passed_bytes: Of ``table_sent_bytes``, the bytes sent as they are to peers the plan does not compress.
        table_backward_passed_bytes: The same of ``table_backward_sent_bytes``.
        table_non_finite_chunks: Chunks that held NaN/Inf, per table (the codec sent them exactly).
        table_max_error_ratio: Largest observed ``|x - x_hat| / bound`` per table (sampled every ``error_every``
            calls).
    """

    calls: int = 0  # forward exchanges
    uncompressed_calls: int = 0  # of which the uncompressed fallback (auto_fallback) sent uncompressed
    raw_bytes: int = 0  # float32 bytes the forward exchanges stand for
    sent_bytes: int = 0  # bytes they did send (payloads + size exchange)
    encode_s: float = 0.0
    exchange_s: float = 0.0
    decode_s: float = 0.0
    backward_calls: int = 0
    backward_raw_bytes: int = 0
    backward_sent_bytes: int = 0
    backward_s: float = 0.0
    in_step_s: float = 0.0  # of the seconds above, those timed within a step (ExchangeGroup.set_in_step)
    in_step_calls: int = 0  # of the forward exchanges, those within a step: the rest is validation (or prediction)
    in_step_raw_bytes: int = 0  # their raw bytes
    in_step_sent_bytes: int = 0  # their sent bytes
    # Payload bytes (both directions) to peers on this rank's node and on other nodes, and of all of them those the
    # peer plan sent as they are (float32, uncompressed: compress_peers, lightning_dlac/comm/peers.py)
    same_node_sent_bytes: int = 0
    other_nodes_sent_bytes: int = 0
    passed_bytes: int = 0
    table_raw_bytes: dict[str, int] = _per_table()
    table_sent_bytes: dict[str, int] = _per_table()
    # Gradient payload bytes this rank sent per table (other ranks' tables: it sends their gradients; pooled only)
    table_backward_sent_bytes: dict[str, int] = _per_table()
    # Of table_sent_bytes / table_backward_sent_bytes, the bytes sent as they are to peers the plan does not compress
    table_passed_bytes: dict[str, int] = _per_table()
    table_backward_passed_bytes: dict[str, int] = _per_table()
    table_non_finite_chunks: dict[str, int] = _per_table()  # chunks that held NaN/Inf (the codec sent them exactly)
    table_max_error_ratio: dict[str, float] = _per_table("max")  # largest observed |x - x_hat| / bound

    # ------------------------------------------------------------------ read-outs

    @property
    def ratio(self) -> float:
        """Forward compression ratio (raw / sent); 1.0 before any call."""
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    @property
    def backward_ratio(self) -> float:
        """Gradient exchange ratio (raw / sent); 1.0 before any call."""
        return self.backward_raw_bytes / self.backward_sent_bytes if self.backward_sent_bytes else 1.0

    @property
    def a2a_s(self) -> float:
        """Seconds spent in the all-to-all, both directions."""
        return self.encode_s + self.exchange_s + self.decode_s + self.backward_s

    @property
    def non_finite_tables(self) -> set[str]:
        """Tables whose payload held NaN/Inf at least once."""
        return {t for t, n in self.table_non_finite_chunks.items() if n}

    @property
    def tables(self) -> list[str]:
        """Every table with a per-table figure, sorted."""
        return sorted({t for f in _TABLE_FIELDS for t in getattr(self, f)})

    # ------------------------------------------------------------------ arithmetic

    def __add__(self, other: CommStats) -> CommStats:
        """Both records' counters (e.g. two installed exchanges)."""
        return _combine(self, other, subtract=False)

    def __sub__(self, earlier: CommStats) -> CommStats:
        """The counters accumulated since ``earlier``, a snapshot of the same record."""
        return _combine(self, earlier, subtract=True)

    def copy(self) -> CommStats:
        """An independent snapshot.

        Returns:
            A copy whose counters do not move with this record's.
        """
        return self + CommStats()

    # ------------------------------------------------------------------ reduction over ranks and plain data

    def to_tensors(self, tables: Sequence[str]) -> dict[str, torch.Tensor]:
        """This record as two float64 tensors to all-reduce, one with SUM and one with MAX.

        Args:
            tables: The tables whose per-table figures to include, in that order; every rank must pass the same.

        Returns:
            ``{"sum": ..., "max": ...}``; :meth:`from_tensors` reads them back.
        """
        sums = [float(getattr(self, f)) for f in _SCALAR_FIELDS]
        maxes: list[float] = []
        for f in _TABLE_FIELDS:
            values = getattr(self, f)
            target = maxes if _reduce_of(f) == "max" else sums
            target.extend(float(values.get(t, 0)) for t in tables)
        return {"sum": torch.tensor(sums, dtype=torch.float64), "max": torch.tensor(maxes, dtype=torch.float64)}

    @classmethod
    def from_tensors(cls, tables: Sequence[str], tensors: Mapping[str, torch.Tensor]) -> CommStats:
        """Rebuild a record from :meth:`to_tensors`'s tensors, after the all-reduce: every rank's figures combined.

        Args:
            tables: The tables given to :meth:`to_tensors`.
            tensors: The tensors it returned, reduced across ranks.

        Returns:
            The combined record.
        """
        streams = {key: iter(tensors[key].detach().cpu().double().tolist()) for key in ("sum", "max")}
        out = cls()
        for f in _SCALAR_FIELDS:
            setattr(out, f, _cast(f, next(streams["sum"])))
        for f in _TABLE_FIELDS:
            stream = streams[_reduce_of(f)]
            setattr(out, f, {t: _cast(f, next(stream)) for t in tables})
        return out

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data, for checkpoints and ``dlac_run.json``.

        Returns:
            ``{field: value}``, per-table fields as dicts; :meth:`from_dict` reads it back.
        """
        return {f.name: dict(getattr(self, f.name)) if f.name in _TABLE_FIELDS else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommStats:
        """Rebuild a record from :meth:`as_dict`'s plain data.

        Args:
            data: What :meth:`as_dict` returned; fields it lacks start at zero (records written by older versions),
                and names it does not know are ignored.

        Returns:
            The record.
        """
        known = {f.name for f in fields(cls)}
        return cls(**{k: dict(v) if k in _TABLE_FIELDS else v for k, v in data.items() if k in known})


_SCALAR_FIELDS = tuple(f.name for f in fields(CommStats) if _REDUCE not in f.metadata)
_TABLE_FIELDS = tuple(f.name for f in fields(CommStats) if _REDUCE in f.metadata)
_INT_FIELDS = frozenset(f.name for f in fields(CommStats) if f.type in ("int", "dict[str, int]"))


def _reduce_of(name: str) -> str:
    return CommStats.__dataclass_fields__[name].metadata[_REDUCE]


def _cast(name: str, value: float) -> int | float:
    return int(round(value)) if name in _INT_FIELDS else float(value)


def _combine(a: CommStats, b: CommStats, subtract: bool) -> CommStats:
    sign = -1 if subtract else 1
    out = CommStats()
    for f in _SCALAR_FIELDS:
        setattr(out, f, getattr(a, f) + sign * getattr(b, f))
    for f in _TABLE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if _reduce_of(f) == "sum":
            merged = {t: x.get(t, 0) + sign * y.get(t, 0) for t in {*x, *y}}
        elif subtract:
            merged = dict(x)  # a running maximum: the interval keeps the later snapshot's value
        else:
            merged = {t: max(x.get(t, 0.0), y.get(t, 0.0)) for t in {*x, *y}}
        setattr(out, f, merged)
    return out
