"""The ``dlac/*`` metrics of a training run and the figures its report is made from.

:class:`CompressionMonitor` turns an :class:`~lightning_dlac.comm.ExchangeGroup`'s counters (which only grow) into
per-interval metrics: it keeps the snapshot it took at the previous write, all-reduces the difference over ranks,
and adds it to the run's totals. It also times the training batches, to give the all-to-all's share of them: it
marks each batch on the group (``set_in_step``), which reads no time, so nothing waits for the device per batch;
the exchanges' times are read when a write needs them. It does not decide anything; ``DLACCallback`` calls it from
its hooks, as Lightning keeps ``LearningRateMonitor`` apart from the loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_dlac.adaptive.calibrator import AllReduce
from lightning_dlac.comm import CommStats, ExchangeGroup

# Figures that only make sense per training batch: left out of a write that followed no training batch.
_PER_STEP = ("ratio", "raw_bytes_per_step", "sent_bytes_per_step", "encode_ms", "exchange_ms", "decode_ms",
             "backward_ms", "a2a_share")
# The training batches' wall times are counted in fixed bins, 2% wide from 10 us to beyond 10^4 s, so that ranks sum
# them with the interval's other counters (one fixed-size all-reduce) and the run's median step (dlac_run.json's
# step_ms) costs a fixed few kB however long the run: the median is read within 1% (half a bin).
_STEP_BIN_BASE_S, _STEP_BIN_GROWTH, _STEP_BINS = 1e-5, 1.02, 1047


def _step_bin(seconds: float) -> int:
    k = math.floor(math.log(max(seconds, _STEP_BIN_BASE_S) / _STEP_BIN_BASE_S) / math.log(_STEP_BIN_GROWTH))
    return min(max(k, 0), _STEP_BINS - 1)


def median_step_s(counts: Mapping[int, int]) -> float | None:
    """The median of the batch times counted in ``counts`` (bin -> batches), as its bin's geometric centre; ``None``
    without any."""
    total = sum(counts.values())
    if not total:
        return None
    seen = 0
    for k in sorted(counts):
        seen += counts[k]
        if 2 * seen >= total:
            return _STEP_BIN_BASE_S * _STEP_BIN_GROWTH ** (k + 0.5)
    raise AssertionError("unreachable: the counts sum to total")


class CompressionMonitor:
    """Per-interval compression metrics of one rank's exchanges, combined over ranks.

    Args:
        per_table: Also report ratio, bound and max error / bound of every table.
        all_reduce: Combines a tensor over ranks (``"sum"`` / ``"max"``).
        clock: Wall clock of the training batches (tests inject a fake one).
    """

    def __init__(self, per_table: bool, all_reduce: AllReduce,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.per_table = per_table
        self._all_reduce = all_reduce
        self._clock = clock
        self._last = CommStats()  # this rank's counters at the previous write
        self.totals = CommStats()  # every rank, every write: the report's figures
        self.batches = 0
        self.train_s = 0.0  # training-batch wall time, summed over ranks
        self.a2a_s = 0.0  # of which in the all-to-all
        self.history: list[dict[str, Any]] = []  # every write, with the module's scalar metrics at that point
        self.step_counts: dict[int, int] = {}  # training batches per wall-time bin, every rank (median_step_s)
        self.non_finite_reported: set[str] = set()
        self.last_ratio: float | None = None
        self._interval_s = 0.0  # this rank's training-batch seconds since the last write
        self._interval_batches = 0
        self._interval_steps = torch.zeros(_STEP_BINS, dtype=torch.float64)  # this rank's batches per time bin
        self._batch_start = 0.0

    # ------------------------------------------------------------------ per batch (no time of the exchanges is read)

    def batch_started(self, group: ExchangeGroup) -> None:
        """A training batch starts: its exchanges count as the step's (``CommStats.in_step_s``).

        Args:
            group: The exchanges the step runs.
        """
        self._batch_start = self._clock()
        group.set_in_step(True)

    def batch_ended(self, group: ExchangeGroup, excluded_s: float = 0.0) -> None:
        """The training batch ended: count its wall time.

        Args:
            group: The exchanges the step ran.
            excluded_s: Seconds of its wall time that were not training (calibration probes).
        """
        group.set_in_step(False)
        seconds = self._clock() - self._batch_start - excluded_s
        self._interval_s += seconds
        self._interval_batches += 1
        self._interval_steps[_step_bin(seconds)] += 1

    def pending(self, group: ExchangeGroup) -> bool:
        """Whether a training batch or an exchange happened since the last write.

        Args:
            group: The exchanges.

        Returns:
            True if there is something to write.
        """
        return bool(self._interval_batches) or group.stats().calls > self._last.calls

    # ------------------------------------------------------------------ writes

    def write(self, group: ExchangeGroup, world_size: int, effective_bound: Callable[[str], float],
              multiplier: float) -> dict[str, float]:
        """Combine the interval's figures over ranks, add them to the totals and return the metrics.

        Every rank must call it at the same point.

        Args:
            group: The exchanges (their counters are read: on a GPU, this waits for the device).
            world_size: The number of ranks.
            effective_bound: A table's bound now (``ErrorBounds.effective``), for the per-table metrics.
            multiplier: The schedule's multiplier now.

        Returns:
            The ``dlac/*`` metrics of the interval (per table too with ``per_table``).
        """
        tables = group.all_compressed_tables
        now = group.stats()  # reads the exchanges' times (on a GPU, waits for the device)
        tensors = (now - self._last).to_tensors(tables)
        # The interval's training time and batch-time bins travel with the counters' sums: one all-reduce for all.
        n = tensors["sum"].numel()
        sums = self._all_reduce(torch.cat([tensors["sum"], torch.tensor([self._interval_s], dtype=torch.float64),
                                           self._interval_steps]), "sum")
        interval = CommStats.from_tensors(tables, {"sum": sums[:n], "max": self._all_reduce(tensors["max"], "max")})
        step_s, a2a_s = float(sums[n]), interval.in_step_s  # a2a_s: the exchanges within training batches
        for k in sums[n + 1:].nonzero().flatten().tolist():
            self.step_counts[k] = self.step_counts.get(k, 0) + int(round(float(sums[n + 1 + k])))
        self._interval_steps.zero_()
        self._last = now
        self.totals = self.totals + interval
        batches = self._interval_batches
        self.batches += batches
        self.train_s += step_s
        self.a2a_s += a2a_s
        self._interval_s, self._interval_batches = 0.0, 0

        bad = sorted(interval.non_finite_tables)
        self._warn_non_finite(bad)
        # The training steps' traffic, apart from the validation exchanges that fell between them.
        step_raw, step_sent = interval.in_step_raw_bytes, interval.in_step_sent_bytes
        step_ratio = step_raw / step_sent if step_sent else 1.0
        self.last_ratio = step_ratio
        per_step = 1.0 / max(batches, 1)
        ms = 1000.0 * per_step / world_size  # seconds summed over ranks -> ms per step and rank
        errors = interval.table_max_error_ratio
        metrics = {
            "dlac/ratio": step_ratio,
            "dlac/raw_bytes_per_step": step_raw * per_step,
            "dlac/sent_bytes_per_step": step_sent * per_step,
            "dlac/bytes_saved": float(self.totals.raw_bytes - self.totals.sent_bytes),  # cumulative
            "dlac/backward_ratio": interval.backward_ratio,
            "dlac/multiplier": multiplier,
            "dlac/encode_ms": interval.encode_s * ms,
            "dlac/exchange_ms": interval.exchange_s * ms,
            "dlac/decode_ms": interval.decode_s * ms,
            "dlac/backward_ms": interval.backward_s * ms,
            "dlac/a2a_share": a2a_s / step_s if step_s > 0 else 0.0,
            "dlac/max_err_over_bound": max(errors.values(), default=0.0),
            "dlac/non_finite_tables": float(len(bad)),
            "dlac/uncompressed_share": interval.uncompressed_calls / interval.calls if interval.calls else 0.0,
        }
        if interval.calls > interval.in_step_calls:  # validation exchanges in this interval
            metrics["dlac/val_raw_bytes"] = float(interval.raw_bytes - step_raw)
            metrics["dlac/val_sent_bytes"] = float(interval.sent_bytes - step_sent)
        if not batches:  # only validation traffic since the last write (the flush at the end of training)
            for key in _PER_STEP:
                metrics.pop(f"dlac/{key}")
        if self.per_table:
            for n in tables:
                raw, sent = interval.table_raw_bytes.get(n, 0), interval.table_sent_bytes.get(n, 0)
                metrics[f"dlac/ratio/{n}"] = raw / sent if sent else 1.0
                metrics[f"dlac/eps/{n}"] = effective_bound(n)
                metrics[f"dlac/max_err_over_bound/{n}"] = errors.get(n, 0.0)
        return metrics

    def _warn_non_finite(self, tables: list[str]) -> None:
        new = [t for t in tables if t not in self.non_finite_reported]
        if new:
            self.non_finite_reported.update(new)
            rank_zero_warn(
                f"DLACCallback: the pooled embeddings of table(s) {new} held NaN or Inf; those chunks were sent"
                " exactly (uncompressed), so the values reached the model unchanged. Check the table's inputs and"
                " learning rate. (Reported once per table; the count per interval is logged as"
                " dlac/non_finite_tables.)"
            )

    # ------------------------------------------------------------------ the report's figures and checkpoints

    def validated(self, batch: int, step: int, metrics: Mapping[str, float]) -> None:
        """A validation loop ended: its metrics join the history at that batch only.

        The plots draw them where they were measured.

        Args:
            batch: The training batches run before it.
            step: The trainer's global step.
            metrics: The validation loop's metrics (nothing is added without any).
        """
        if metrics:
            self.history.append({"batch": batch, "step": step, "validation": True, **metrics})

    def summary(self, world_size: int) -> dict[str, Any]:
        """The whole run's traffic and time.

        Args:
            world_size: The number of ranks.

        Returns:
            The ``summary`` of ``dlac_run.json``: bytes (by direction, link class and table), seconds, per-step
            milliseconds and the median step.
        """
        t = self.totals
        ms = 1000.0 / (max(self.batches, 1) * world_size)
        median = median_step_s(self.step_counts)
        return {
            "world_size": world_size,
            "batches": self.batches,
            "raw_bytes": t.raw_bytes,
            "sent_bytes": t.sent_bytes,
            "table_raw_bytes": dict(t.table_raw_bytes),
            "table_sent_bytes": dict(t.table_sent_bytes),
            # Both directions' payloads by link class, and those sent as they are (compress_peers)
            "same_node_sent_bytes": t.same_node_sent_bytes,
            "other_nodes_sent_bytes": t.other_nodes_sent_bytes,
            "passed_bytes": t.passed_bytes,
            "forward_passed_bytes": sum(t.table_passed_bytes.values()),  # of raw_bytes / sent_bytes: not encoded
            # The gradient exchange's bytes (raw float32, sent: payload and size exchange, and of both those sent as
            # they are), so that `dlac estimate --from-run` costs the backward at its own ratio; its time is
            # backward_ms (one phase: CommStats does not time the gradient codec apart from its exchange)
            "backward_raw_bytes": t.backward_raw_bytes,
            "backward_sent_bytes": t.backward_sent_bytes,
            "backward_passed_bytes": sum(t.table_backward_passed_bytes.values()),
            "train_s": self.train_s,
            "a2a_s": self.a2a_s,
            "encode_ms": t.encode_s * ms,
            "exchange_ms": t.exchange_s * ms,
            "decode_ms": t.decode_s * ms,
            "backward_ms": t.backward_s * ms,
            # The median training batch's wall time over ranks and batches (within 1%): the typical step, where
            # train_s / (batches * world_size) is the mean one that a few slow steps pull up
            "step_ms": None if median is None else median * 1e3,
        }

    def state_dict(self) -> dict[str, Any]:
        """The monitor's totals and history, for a checkpoint (a resumed run's report covers the whole run).

        Returns:
            Plain data that :meth:`load_state_dict` restores.
        """
        totals = {"batches": self.batches, "train_s": self.train_s, "a2a_s": self.a2a_s, **self.totals.as_dict()}
        return {"totals": totals, "history": list(self.history), "non_finite_tables": sorted(self.non_finite_reported),
                "step_counts": sorted(self.step_counts.items())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Args:
            state: What :meth:`state_dict` returned (also the ``totals`` / ``history`` of checkpoints written before
                it existed).
        """
        totals = dict(state["totals"])
        self.batches = int(totals.pop("batches", 0))
        self.train_s = float(totals.pop("train_s", 0.0))
        self.a2a_s = float(totals.pop("a2a_s", 0.0))
        self.totals = CommStats.from_dict(totals)
        self.history = list(state["history"])
        self.non_finite_reported = set(state.get("non_finite_tables", []))
        self.step_counts = {int(k): int(n) for k, n in state.get("step_counts", [])}  # none before they were kept


def scalar_metrics(trainer: pl.Trainer, validation: bool | None = None) -> dict[str, float]:
    """The trainer's scalar metrics other than the ``dlac/*`` ones: all of them, or (``validation``) only those a
    validation loop logs (``val/...``, ``val_...``), or only the others."""
    out = {}
    for key, value in trainer.callback_metrics.items():
        if key.startswith("dlac/") or (validation is not None and key.startswith("val") != validation):
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value)
        elif isinstance(value, (int, float)):
            out[key] = float(value)
    return out


def run_directory(trainer: pl.Trainer) -> Path | None:
    """The logger's run directory (``None`` without a logger; a logger without a directory: its ``save_dir``, else
    the Trainer's ``default_root_dir``). ``logger.log_dir``, not ``trainer.log_dir``, which is a collective."""
    logger = trainer.logger
    if logger is None:
        return None
    return Path(getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or trainer.default_root_dir)
