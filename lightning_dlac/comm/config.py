"""Settings, per-table bounds and statistics shared by the compressed all-to-all and whoever drives it."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

import torch

from lightning_dlac.adaptive.bounds import check_count, check_relative_bound


class BackwardCompression(str, Enum):
    """How the gradient all-to-all (backward of the pooled-embedding exchange) is sent."""

    FP32 = "fp32"  # uncompressed, exactly TorchRec's backward
    BF16 = "bf16"  # fixed-size cast, as TorchRec's qcomm BF16 codec
    FP16 = "fp16"  # fixed-size cast, as TorchRec's qcomm FP16 codec
    DLAC = "dlac"  # error-bounded DLAC codec with its own bound

    def __str__(self) -> str:
        return self.value


@dataclass
class CompressionConfig:
    """How the pooled-embedding all-to-all is compressed.

    The forward exchange's bounds are not here: they live in :class:`ErrorBounds`, which the policy updates.

    Args:
        backward: Gradient exchange: ``fp32``, ``bf16``, ``fp16`` or ``dlac``.
        backward_eps: Relative error bound of the gradient exchange when ``backward="dlac"``.
        error_every: Measure the observed max error / bound every this many calls (one extra decode on the sender);
            0 turns the measurement off.
        impl: Codec implementation: ``auto`` (native kernels, falling back to the reference), ``native`` or ``ref``.
        skip_when_slower: Time the compressed and the uncompressed forward exchange and send uncompressed while
            that is faster (a fast link, a slow codec); re-check every ``probe_every`` calls.
        probe_every: Calls between re-checks of the way not taken.
    """

    backward: BackwardCompression | str = BackwardCompression.BF16  # gradient exchange encoding
    backward_eps: float = 0.01  # relative bound of the gradient exchange with backward="dlac"
    error_every: int = 10  # observed-error measurement period, in calls (0 = never)
    impl: str = "auto"  # codec implementation: auto | native | ref
    skip_when_slower: bool = False  # send uncompressed while that is faster
    probe_every: int = 64  # calls between re-checks of the way not taken

    def __post_init__(self) -> None:
        self.backward_eps = check_relative_bound(self.backward_eps, "backward_eps")
        try:
            self.backward = BackwardCompression(self.backward)
        except ValueError:
            accepted = ", ".join(repr(b.value) for b in BackwardCompression)
            raise ValueError(f"backward={self.backward!r} is not supported; choose one of {accepted}.") from None
        if self.error_every < 0:
            raise ValueError(f"error_every={self.error_every} must be >= 0 (0 disables the measurement).")
        self.probe_every = check_count(self.probe_every, "probe_every", 1)
        if self.impl not in ("auto", "native", "ref"):
            raise ValueError(f"impl={self.impl!r} is not supported; choose 'auto', 'native' or 'ref'.")


class ErrorBounds:
    """The per-table relative error bounds that every compressed all-to-all reads at each call.

    This is the one interface between the policy (``DLACCallback``) and the communication layer: the policy sets
    table bounds and the iteration multiplier ``m(t)``; the exchange encodes table ``t`` with
    ``min(bound[t] * multiplier, max_eps)``. For calibration, :meth:`probe` temporarily replaces every bound: the
    named tables get the given bound, all others are sent exactly, and the exchange records no statistics.

    Args:
        default_eps: Bound of every table that has not been set.
        max_eps: Upper clamp of the effective bound.
    """

    def __init__(self, default_eps: float = 0.01, max_eps: float = 0.5) -> None:
        self._default = check_relative_bound(default_eps, "default_eps")
        self._max = check_relative_bound(max_eps, "max_eps")
        self._table: dict[str, float] = {}
        self._multiplier = 1.0
        self._probe: dict[str, float] | None = None
        self._lock = threading.Lock()

    @property
    def default_eps(self) -> float:
        """Bound of tables the policy has not set."""
        return self._default

    @property
    def max_eps(self) -> float:
        """Upper clamp of every effective bound."""
        return self._max

    @property
    def multiplier(self) -> float:
        """The iteration-wise multiplier m(t) applied to every table's bound."""
        return self._multiplier

    def set_multiplier(self, value: float) -> None:
        """Set m(t); must be positive and finite."""
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"multiplier={value!r} must be a positive finite number.")
        self._multiplier = float(value)

    def set_table_bounds(self, bounds: Mapping[str, float]) -> None:
        """Set the base bound of some tables (others keep theirs)."""
        checked = {name: check_relative_bound(eps, f"bound of table {name!r}") for name, eps in bounds.items()}
        with self._lock:
            self._table.update(checked)

    def clear_table_bounds(self) -> None:
        """Forget every table bound set so far (tables fall back to ``default_eps``)."""
        with self._lock:
            self._table.clear()

    def table_bounds(self) -> dict[str, float]:
        """The base bounds set so far (without the multiplier)."""
        return dict(self._table)

    @property
    def probing(self) -> bool:
        """Whether a :meth:`probe` is active (the exchange then records no statistics)."""
        return self._probe is not None

    @contextlib.contextmanager
    def probe(self, bounds: Mapping[str, float]) -> Iterator[None]:
        """Within the block, encode the tables in ``bounds`` with exactly those bounds (no multiplier) and every
        other table exactly (bound 0: sent raw). Used by calibration to measure one table's sensitivity."""
        checked = {name: check_relative_bound(eps, f"probe bound of table {name!r}") for name, eps in bounds.items()}
        if self._probe is not None:
            raise RuntimeError("ErrorBounds.probe blocks cannot be nested.")
        self._probe = checked
        try:
            yield
        finally:
            self._probe = None

    def effective(self, table: str) -> float:
        """The bound that table ``table`` is encoded with now (0 means sent exactly, during a probe)."""
        if self._probe is not None:
            return self._probe.get(table, 0.0)
        return min(self._table.get(table, self._default) * self._multiplier, self._max)

    def effective_many(self, tables: Iterable[str]) -> torch.Tensor:
        """Effective bounds of several tables, as the float32 tensor the codec takes."""
        return torch.tensor([self.effective(t) for t in tables], dtype=torch.float32)


@dataclass
class CommStats:
    """Counters of the compressed exchanges since the last :meth:`reset`, per rank.

    Byte counts are traffic to other ranks: the block a rank keeps for itself is neither encoded nor sent (it is
    passed on exactly), so it counts in neither the raw nor the sent bytes, and ratios are those of the codec on
    what crosses the network.
    """

    calls: int = 0
    uncompressed_calls: int = 0  # forward calls sent uncompressed by skip_when_slower
    raw_bytes: int = 0  # float32 bytes the forward exchange would have sent to other ranks
    sent_bytes: int = 0  # bytes it did send (payloads + size exchange)
    table_raw_bytes: dict[str, int] = field(default_factory=dict)
    table_sent_bytes: dict[str, int] = field(default_factory=dict)
    table_max_error_ratio: dict[str, float] = field(default_factory=dict)  # observed max |x - x_hat| / bound
    encode_s: float = 0.0
    exchange_s: float = 0.0
    decode_s: float = 0.0
    backward_calls: int = 0
    backward_raw_bytes: int = 0
    backward_sent_bytes: int = 0
    backward_s: float = 0.0
    non_finite_tables: set[str] = field(default_factory=set)  # tables whose payload held NaN/Inf (sent exactly)

    @property
    def ratio(self) -> float:
        """Forward compression ratio (raw / sent); 1.0 before any call."""
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else 1.0

    def table_ratio(self) -> dict[str, float]:
        """Forward compression ratio per table."""
        return {t: self.table_raw_bytes[t] / max(self.table_sent_bytes.get(t, 0), 1) for t in self.table_raw_bytes}

    def merge(self, other: CommStats) -> None:
        """Add ``other``'s counters into this one (e.g. several sharded modules)."""
        self.calls += other.calls
        self.uncompressed_calls += other.uncompressed_calls
        self.raw_bytes += other.raw_bytes
        self.sent_bytes += other.sent_bytes
        for t, v in other.table_raw_bytes.items():
            self.table_raw_bytes[t] = self.table_raw_bytes.get(t, 0) + v
        for t, v in other.table_sent_bytes.items():
            self.table_sent_bytes[t] = self.table_sent_bytes.get(t, 0) + v
        for t, v in other.table_max_error_ratio.items():
            self.table_max_error_ratio[t] = max(self.table_max_error_ratio.get(t, 0.0), v)
        self.encode_s += other.encode_s
        self.exchange_s += other.exchange_s
        self.decode_s += other.decode_s
        self.backward_calls += other.backward_calls
        self.backward_raw_bytes += other.backward_raw_bytes
        self.backward_sent_bytes += other.backward_sent_bytes
        self.backward_s += other.backward_s
        self.non_finite_tables |= other.non_finite_tables

    def reset(self) -> None:
        """Zero every counter."""
        fresh = CommStats()
        self.__dict__.update(fresh.__dict__)
