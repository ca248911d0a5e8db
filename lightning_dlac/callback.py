"""DLACCallback: the dual-level adaptive error-bound policy, driven from the Lightning training loop."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_dlac.adaptive import (
    CalibrationStats,
    ClassBounds,
    DecaySchedule,
    HomogenizationThresholds,
    TableClass,
    TableStats,
    class_table_bounds,
    classify,
    sensitivity_classes,
    sensitivity_table_bounds,
)
from lightning_dlac.adaptive.bounds import check_count, check_relative_bound
from lightning_dlac.adaptive.policy import check_tolerance
from lightning_dlac.strategy import DLACStrategy

log = logging.getLogger(__name__)

MODES = ("homogenization", "sensitivity", "off")
_STATE_VERSION = 1


class DLACCallback(Callback):
    """Dual-level adaptive error bounds for :class:`~lightning_dlac.DLACStrategy`'s compressed all-to-all.

    **Table-wise level.** Over the first ``calibration_batches`` training batches (or the batches of
    ``calibration_dataloader``, before training starts) the callback measures every table on the real payload it
    sends: value range, homogenization index at ``probe_eps``, compressed size at each candidate bound and, on the
    first ``sensitivity_batches`` of them, the change of the training loss when only that table carries the codec's
    error. The statistics are all-reduced, so every rank picks the same bound per table:

    - ``mode="homogenization"`` (the paper): index ``< tight_below`` is *tight* (``tight_eps``), index
      ``>= loose_from`` is *loose* (``loose_eps``), the rest *base* (``base_eps``);
    - ``mode="sensitivity"``: the largest candidate bound whose relative loss change is within
      ``sensitivity_tolerance``;
    - ``mode="off"``: every table keeps the strategy's ``eps``.

    Until calibration ends, tables use the strategy's ``eps``.

    **Iteration-wise level.** Every bound is multiplied by ``m(t)`` (:class:`~lightning_dlac.adaptive.DecaySchedule`)
    which decays from ``c`` to 1 over the first ``T`` training batches.

    **Metrics.** Every ``log_every_n_steps`` batches it writes to every logger (keys under ``dlac/``): compression
    ratio overall and per table, bound per table, observed max error / bound, bytes sent and saved, encode /
    exchange / decode / backward time per step and the all-to-all share of the step time; the ratio is also shown on
    the progress bar.

    **Checkpoints.** Its state (calibrated bounds, classes, statistics, schedule position, byte totals) is saved
    with the checkpoint; a resumed run continues the same schedule. A run saved during calibration calibrates again.

    The sensitivity probe calls ``training_step`` under ``torch.no_grad()`` with ``self.log`` muted and the random
    state replayed, once per (table, candidate) plus once exactly, so ``training_step`` must return the loss (a
    tensor or a dict with ``"loss"``) and should have no side effects other than logging.

    Args:
        mode: ``"homogenization"``, ``"sensitivity"`` or ``"off"`` (no table-wise level).
        tight_eps: Relative bound of tight tables.
        base_eps: Relative bound of base tables.
        loose_eps: Relative bound of loose tables.
        tight_below: Homogenization index below which a table is tight.
        loose_from: Homogenization index from which a table is loose.
        probe_eps: Bound at which the homogenization index is measured (default ``base_eps``).
        candidates: Bounds whose ratio and sensitivity are measured (default the three class bounds).
        sensitivity_tolerance: Largest relative change of the loss a table's bound may cause in sensitivity mode.
        calibration_batches: Number of batches calibration measures.
        calibration_start: Training batch at which calibration begins (tables use the strategy's ``eps`` until it
            ends). Freshly initialised tables all look alike to the homogenization index; starting after some
            training measures the embeddings the run will actually send.
        sensitivity_batches: Of those, how many also run the sensitivity probe (0 skips it; needs >= 1 in
            sensitivity mode). Each costs ``1 + tables x candidates`` extra forward passes.
        recalibrate_every: Calibrate again this many training batches after each calibration takes effect (0:
            never). Tables change as they train; each calibration measures ``calibration_batches`` training batches
            with the current bounds in force and replaces them when done.
        calibration_dataloader: Batches to calibrate on before training (default: the first training batches).
            Every rank must provide its own batches; the smallest count across ranks is used.
        schedule: ``"step"``, ``"linear"``, ``"log"`` or ``"constant"``.
        c: Initial multiplier m(0) (>= 1; 1 turns the iteration-wise level off).
        T: Length of the early stage, in training batches.
        stages: Plateaus of the ``step`` schedule.
        log_every_n_steps: Metrics period in training batches.
        per_table_metrics: Also log ratio, bound and max error / bound of every table.
        prog_bar: Show the compression ratio on the progress bar.
        report: At the end of fit, write ``dlac_run.json``, ``dlac_report.md`` and PNG plots into the logger's
            directory (rank 0) and print the report's headline (see :mod:`lightning_dlac.report`). Without a
            logger only the headline is printed.
    """

    def __init__(
        self,
        mode: str = "homogenization",
        tight_eps: float = 0.01,
        base_eps: float = 0.03,
        loose_eps: float = 0.05,
        tight_below: float = 0.9,
        loose_from: float = 0.99,
        probe_eps: float | None = None,
        candidates: Sequence[float] | None = None,
        sensitivity_tolerance: float = 1e-3,
        calibration_batches: int = 8,
        calibration_start: int = 0,
        sensitivity_batches: int = 1,
        recalibrate_every: int = 0,
        calibration_dataloader: Iterable[Any] | None = None,
        schedule: str = "step",
        c: float = 2.0,
        T: int = 1000,
        stages: int = 10,
        log_every_n_steps: int = 50,
        per_table_metrics: bool = True,
        prog_bar: bool = True,
        report: bool = True,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not supported; choose one of {', '.join(map(repr, MODES))}.")
        self.mode = mode
        self.class_bounds = ClassBounds(tight_eps, base_eps, loose_eps)
        self.thresholds = HomogenizationThresholds(tight_below, loose_from)
        self.probe_eps = check_relative_bound(base_eps if probe_eps is None else probe_eps, "probe_eps")
        if candidates is None:
            self.candidates = self.class_bounds.candidates()
        else:
            checked = [check_relative_bound(v, "candidates") for v in candidates]
            if not checked or checked != sorted(set(checked)):
                raise ValueError(f"candidates={list(candidates)} must be a non-empty, strictly increasing list.")
            self.candidates = tuple(checked)
        self.sensitivity_tolerance = check_tolerance(sensitivity_tolerance)
        self.calibration_batches = check_count(calibration_batches, "calibration_batches", 1)
        self.calibration_start = check_count(calibration_start, "calibration_start", 0)
        if calibration_dataloader is not None and calibration_start:
            raise ValueError(
                "calibration_start applies to calibration on training batches; with a calibration_dataloader"
                " calibration runs before training. Set one of them."
            )
        self.sensitivity_batches = check_count(sensitivity_batches, "sensitivity_batches", 0)
        self.recalibrate_every = check_count(recalibrate_every, "recalibrate_every", 0)
        if self.recalibrate_every and mode == "off":
            raise ValueError("recalibrate_every needs a calibration: it does nothing with mode='off'.")
        if self.sensitivity_batches > self.calibration_batches:
            raise ValueError(
                f"sensitivity_batches={sensitivity_batches} exceeds calibration_batches={calibration_batches}: the"
                " probe runs on calibration batches."
            )
        if mode == "sensitivity" and self.sensitivity_batches == 0:
            raise ValueError("mode='sensitivity' chooses bounds from the probe: set sensitivity_batches >= 1.")
        self.calibration_dataloader = calibration_dataloader
        self.schedule = DecaySchedule(schedule, c, T, stages)
        self.log_every_n_steps = check_count(log_every_n_steps, "log_every_n_steps", 1)
        self.per_table_metrics = bool(per_table_metrics)
        self.prog_bar = bool(prog_bar)
        self.report = bool(report)

        self._strategy: DLACStrategy | None = None
        self._step = 0  # training batches seen: the schedule's t
        self._calibrated = mode == "off"
        self._calibrated_at: int | None = 0 if mode == "off" else None  # first batch sent with calibrated bounds
        self._stats: CalibrationStats | None = None
        self._measure_from = self.calibration_start  # training batch from which the next calibration measures
        self._calibrations: list[dict[str, Any]] = []  # when each calibration took effect, and its classes
        self._calib_seen = 0
        self._probed = 0
        self._table_bounds: dict[str, float] = {}
        self._classes: dict[str, TableClass] = {}
        self._table_stats: dict[str, TableStats] = {}
        self._totals: dict[str, Any] = _empty_totals()  # all ranks, all metrics writes: the report's figures
        self._history: list[dict[str, Any]] = []  # every metrics write, plus the module's scalar metrics then
        self._non_finite_reported: set[str] = set()
        self._last_ratio: float | None = None
        self._interval_s = 0.0  # training-batch wall time since the last metrics write
        self._interval_batches = 0
        self._interval_a2a_s = 0.0  # of which in the all-to-all (encode, exchange, decode, backward)
        self._batch_t0 = 0.0
        self._batch_a2a0 = 0.0
        self._probe_s = 0.0

    # ------------------------------------------------------------------ public read-outs

    @property
    def active(self) -> bool:
        """Whether the callback drives a compressed DLACStrategy in this run."""
        return self._strategy is not None

    @property
    def calibrated(self) -> bool:
        """Whether the table-wise bounds have been chosen."""
        return self._calibrated

    @property
    def step(self) -> int:
        """Training batches seen so far (the schedule's iteration ``t``)."""
        return self._step

    @property
    def table_bounds(self) -> dict[str, float]:
        """Calibrated base bound of every table (before the multiplier)."""
        return dict(self._table_bounds)

    @property
    def classes(self) -> dict[str, TableClass]:
        """Class of every table chosen by calibration."""
        return dict(self._classes)

    @property
    def table_stats(self) -> dict[str, TableStats]:
        """The (cross-rank reduced) calibration statistics of every table."""
        return dict(self._table_stats)

    def calibration_report(self) -> list[dict[str, Any]]:
        """One row per table: class, bound, homogenization index, distinct vectors per chunk, value range, ratio and
        (if probed) relative loss change at each candidate bound."""
        rows = []
        for name in sorted(self._table_stats):
            s = self._table_stats[name]
            sens = s.sensitivity()
            rows.append(
                {
                    "table": name,
                    "class": str(self._classes[name]) if name in self._classes else None,
                    "eps": self._table_bounds.get(name),
                    "homogenization_index": s.homogenization_index,
                    "distinct_per_chunk": s.distinct_per_chunk,
                    "value_range": s.value_range,
                    "ratio": {str(k): v for k, v in s.ratios().items()},
                    "loss_change": None if sens is None else {str(k): v for k, v in sens.items()},
                }
            )
        return rows

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if not isinstance(strategy, DLACStrategy):
            rank_zero_warn(
                f"DLACCallback does nothing: the trainer's strategy is {type(strategy).__name__}, not DLACStrategy."
                " Use Trainer(strategy=DLACStrategy()) or strategy='dlac' to compress the embedding all-to-all."
            )
            self._strategy = None
            return
        if not strategy.compress:
            rank_zero_warn("DLACCallback does nothing: DLACStrategy(compress=False) sends the all-to-all uncompressed.")
            self._strategy = None
            return
        self._strategy = strategy

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = self._strategy
        if strategy is None:
            return
        if not strategy.exchanges:
            rank_zero_warn(
                "DLACCallback does nothing: no table is sent through a compressed all-to-all (only table-wise and"
                " column-wise shardings are compressed)."
            )
            self._strategy = None
            return
        strategy.error_bounds.set_multiplier(self.schedule(self._step))
        if self._calibrated:
            self._apply_bounds()  # restored from a checkpoint, or mode="off"
            if self.recalibrate_every:
                # Next calibration as scheduled (a measurement cut short by the checkpoint starts over).
                self._measure_from = max(self._measure_from, (self._calibrated_at or 0) + self.recalibrate_every)
                self._new_measurement()
            return
        self._new_measurement()
        if self.calibration_dataloader is not None:
            self._calibrate_before_training(trainer, pl_module)

    # ------------------------------------------------------------------ per batch

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        strategy = self._strategy
        if strategy is None:
            return
        self._batch_t0 = time.perf_counter()
        self._batch_a2a0 = self._a2a_seconds()
        self._probe_s = 0.0
        strategy.error_bounds.set_multiplier(self.schedule(self._step))
        if self._calibrating():
            if self._probed < self.sensitivity_batches:
                t = time.perf_counter()
                self._probe_sensitivity(pl_module, batch, batch_idx)
                self._probe_s = time.perf_counter() - t
            strategy.set_chunk_observer(self._stats.observe)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        strategy = self._strategy
        if strategy is None:
            return
        if self._calibrating():
            strategy.set_chunk_observer(None)
            self._calib_seen += 1
            if self._calib_seen >= self.calibration_batches:
                self._finish_calibration(first_batch=self._step + 1)
        self._interval_s += time.perf_counter() - self._batch_t0 - self._probe_s
        self._interval_a2a_s += self._a2a_seconds() - self._batch_a2a0
        self._interval_batches += 1
        self._step += 1
        if self._step % self.log_every_n_steps == 0:
            self._write_metrics(trainer)
        if self.prog_bar and self._last_ratio is not None:
            pl_module.log("dlac/ratio", self._last_ratio, prog_bar=True, logger=False, on_step=True, on_epoch=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is not None:
            self._strategy.set_chunk_observer(None)
            if self._interval_batches or self._strategy.comm_stats().calls:
                self._write_metrics(trainer)  # the rest, e.g. the validation traffic after the last write

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is None or not self.report or not trainer.is_global_zero:
            return
        from lightning_dlac.report import RUN_FILE, headline, write_report

        run = self.run_summary(trainer)
        for line in headline(run):
            print(f"dlac: {line}")
        log_dir = _log_dir(trainer)
        if log_dir is None:
            # No logger: the user asked for no run directory, so nothing is written (not even into the cwd).
            print("dlac: no logger, so no report files; attach one (e.g. CSVLogger) to get dlac_report.md and plots")
            return
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / RUN_FILE).write_text(json.dumps(run, indent=1))
        print(f"dlac: report in {write_report(log_dir)}")

    def run_summary(self, trainer: pl.Trainer) -> dict[str, Any]:
        """Everything the report is made from, as plain data (what ``dlac_run.json`` holds)."""
        t = self._totals
        batches = max(t["batches"], 1)
        ms = 1000.0 / (batches * trainer.world_size)
        bounds = self._strategy.error_bounds if self._strategy is not None else None
        return {
            "mode": self.mode,
            "schedule": self.schedule.as_dict(),
            "table_bounds": dict(self._table_bounds),
            "classes": {k: str(v) for k, v in self._classes.items()},
            "calibrated_at": self._calibrated_at,
            "calibrations": list(self._calibrations),
            "default_eps": bounds.default_eps if bounds else None,
            "max_eps": bounds.max_eps if bounds else None,
            "final_effective_bounds": {n: bounds.effective(n) for n in t["table_raw_bytes"]} if bounds else {},
            "calibration": self.calibration_report(),
            "summary": {
                "world_size": trainer.world_size,
                "batches": t["batches"],
                "raw_bytes": t["raw_bytes"],
                "sent_bytes": t["sent_bytes"],
                "table_raw_bytes": t["table_raw_bytes"],
                "table_sent_bytes": t["table_sent_bytes"],
                "train_s": t["train_s"],
                "a2a_s": t["a2a_s"],
                "encode_ms": t["encode_s"] * ms,
                "exchange_ms": t["exchange_s"] * ms,
                "decode_ms": t["decode_s"] * ms,
                "backward_ms": t["backward_s"] * ms,
            },
            "non_finite_tables": sorted(self._non_finite_reported),
            "final_metrics": _scalar_metrics(trainer, exclude_prefix="dlac/"),
            "history": list(self._history),
        }

    # ------------------------------------------------------------------ calibration

    def _calibrating(self) -> bool:
        return self._stats is not None and self._step >= self._measure_from

    def _new_measurement(self) -> None:
        assert self._strategy is not None
        self._stats = CalibrationStats(self.candidates, self.probe_eps, self._strategy.compression.impl)
        self._calib_seen = self._probed = 0

    def _calibrate_before_training(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self._strategy is not None and self._stats is not None
        batches = []
        for batch in self.calibration_dataloader:
            if len(batches) == self.calibration_batches:
                break
            batches.append(batch)
        count = int(self._all_reduce(torch.tensor([len(batches)], dtype=torch.float64), dist.ReduceOp.MIN)[0])
        if count == 0:
            raise ValueError("DLACCallback: calibration_dataloader yielded no batch on some rank; give it batches.")
        for i, batch in enumerate(batches[:count]):
            batch = trainer.strategy.batch_to_device(batch)
            if self._probed < self.sensitivity_batches:
                self._probe_sensitivity(pl_module, batch, i)
            self._strategy.set_chunk_observer(self._stats.observe)
            try:
                with torch.no_grad(), _random_state_kept(), _logging_muted(pl_module):
                    _loss_of(pl_module.training_step(batch, i))
            finally:
                self._strategy.set_chunk_observer(None)
            self._calib_seen += 1
        self._finish_calibration(first_batch=self._step)

    def _probe_sensitivity(self, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        """Loss with every table exact, then with one table at a time carrying the codec's error at each
        candidate bound; same random state for every forward."""
        assert self._strategy is not None and self._stats is not None
        bounds = self._strategy.error_bounds
        tables = self._strategy.all_compressed_tables
        with torch.no_grad(), _random_state_kept() as replay, _logging_muted(pl_module):

            def loss() -> float:
                replay()
                return _loss_of(pl_module.training_step(batch, batch_idx))

            with bounds.probe({}):
                base = loss()
            for name in tables:
                probed = []
                for eps in self.candidates:
                    with bounds.probe({name: eps}):
                        probed.append(loss())
                self._stats.record_loss(name, base, probed)
        self._probed += 1

    def _finish_calibration(self, first_batch: int) -> None:
        """Reduce the statistics, choose the bounds and apply them from training batch ``first_batch`` on."""
        assert self._strategy is not None and self._stats is not None
        names = self._strategy.all_compressed_tables
        tensors = self._stats.to_tensors(names)
        tensors["sum"] = self._all_reduce(tensors["sum"], dist.ReduceOp.SUM)
        tensors["min"] = self._all_reduce(tensors["min"], dist.ReduceOp.MIN)
        tensors["max"] = self._all_reduce(tensors["max"], dist.ReduceOp.MAX)
        self._stats.load_tensors(names, tensors)
        self._table_stats = {n: self._stats.tables[n] for n in names}
        if self.mode == "homogenization":
            self._classes = classify(self._table_stats, self.thresholds)
            self._table_bounds = class_table_bounds(self._classes, self.class_bounds)
        else:
            self._table_bounds = sensitivity_table_bounds(self._table_stats, self.sensitivity_tolerance)
            self._classes = sensitivity_classes(self._table_bounds, self.class_bounds)
        again = self._calibrated
        self._calibrated = True
        self._calibrated_at = first_batch
        self._apply_bounds()
        counts = {c.value: sum(1 for v in self._classes.values() if v is c) for c in TableClass}
        self._calibrations.append({"at": first_batch, **counts})
        rank_zero_info(
            f"DLACCallback: {'re' if again else ''}calibrated {len(names)} tables on {self._calib_seen} batch(es)"
            f" ({self.mode}): {counts['tight']} tight, {counts['base']} base, {counts['loose']} loose."
        )
        self._stats = None
        if self.recalibrate_every:
            self._measure_from = first_batch + self.recalibrate_every
            self._new_measurement()

    def _apply_bounds(self) -> None:
        assert self._strategy is not None
        bounds = self._strategy.error_bounds
        bounds.clear_table_bounds()
        bounds.set_table_bounds(self._table_bounds)

    # ------------------------------------------------------------------ metrics

    def _a2a_seconds(self) -> float:
        """All-to-all seconds so far (read twice per batch: summed directly, not through a merged CommStats)."""
        assert self._strategy is not None
        return sum(a.stats.encode_s + a.stats.exchange_s + a.stats.decode_s + a.stats.backward_s
                   for a in self._strategy.exchanges)

    def _write_metrics(self, trainer: pl.Trainer) -> None:
        assert self._strategy is not None
        strategy = self._strategy
        s = strategy.comm_stats(reset=True)
        names = strategy.all_compressed_tables
        world = trainer.world_size
        head = [
            s.raw_bytes, s.sent_bytes, s.encode_s, s.exchange_s, s.decode_s, s.backward_s,
            s.backward_raw_bytes, s.backward_sent_bytes, self._interval_s, self._interval_a2a_s, s.calls,
            s.uncompressed_calls,
        ]
        per_table = [s.table_raw_bytes.get(n, 0) for n in names] + [s.table_sent_bytes.get(n, 0) for n in names]
        per_table += [1.0 if n in s.non_finite_tables else 0.0 for n in names]
        sums = self._all_reduce(torch.tensor(head + per_table, dtype=torch.float64), dist.ReduceOp.SUM).tolist()
        errs = self._all_reduce(
            torch.tensor([s.table_max_error_ratio.get(n, 0.0) for n in names] or [0.0], dtype=torch.float64),
            dist.ReduceOp.MAX,
        ).tolist()
        raw, sent, enc, exch, dec, bwd, bwd_raw, bwd_sent, step_s, a2a_s, calls, plain_calls = sums[:12]
        k = len(names)
        t_raw, t_sent, t_bad = sums[12 : 12 + k], sums[12 + k : 12 + 2 * k], sums[12 + 2 * k :]
        bad = [n for n, flag in zip(names, t_bad) if flag > 0]
        self._report_non_finite(bad)
        t = self._totals
        t["batches"] += self._interval_batches
        for key, value in (("raw_bytes", raw), ("sent_bytes", sent), ("encode_s", enc), ("exchange_s", exch),
                           ("decode_s", dec), ("backward_s", bwd), ("train_s", step_s), ("a2a_s", a2a_s)):
            t[key] += value
        for n, r, sb in zip(names, t_raw, t_sent):
            t["table_raw_bytes"][n] = t["table_raw_bytes"].get(n, 0) + int(r)
            t["table_sent_bytes"][n] = t["table_sent_bytes"].get(n, 0) + int(sb)
        batches = max(self._interval_batches, 1)
        ratio = raw / sent if sent else 1.0
        self._last_ratio = ratio
        ms = 1000.0 / (batches * world)  # seconds summed over ranks -> ms per step per rank
        metrics = {
            "dlac/ratio": ratio,
            "dlac/raw_bytes_per_step": raw / batches,
            "dlac/sent_bytes_per_step": sent / batches,
            "dlac/bytes_saved": float(t["raw_bytes"] - t["sent_bytes"]),  # cumulative
            "dlac/backward_ratio": bwd_raw / bwd_sent if bwd_sent else 1.0,
            "dlac/multiplier": strategy.error_bounds.multiplier,
            "dlac/encode_ms": enc * ms,
            "dlac/exchange_ms": exch * ms,
            "dlac/decode_ms": dec * ms,
            "dlac/backward_ms": bwd * ms,
            "dlac/a2a_share": a2a_s / step_s if step_s > 0 else 0.0,
            "dlac/max_err_over_bound": max(errs),
            "dlac/non_finite_tables": float(len(bad)),
            "dlac/uncompressed_share": plain_calls / calls if calls else 0.0,
        }
        if not self._interval_batches:
            # Only validation traffic since the last write (the flush at the end of training): no per-step figures.
            for key in ("raw_bytes_per_step", "sent_bytes_per_step", "encode_ms", "exchange_ms", "decode_ms",
                        "backward_ms", "a2a_share"):
                metrics.pop(f"dlac/{key}")
        if self.per_table_metrics:
            for n, r, sb, e in zip(names, t_raw, t_sent, errs):
                metrics[f"dlac/ratio/{n}"] = r / sb if sb else 1.0
                metrics[f"dlac/eps/{n}"] = strategy.error_bounds.effective(n)
                metrics[f"dlac/max_err_over_bound/{n}"] = e
        self._history.append({"batch": self._step, "step": trainer.global_step, **metrics,
                              **_scalar_metrics(trainer, exclude_prefix="dlac/")})
        self._interval_s = self._interval_a2a_s = 0.0
        self._interval_batches = 0
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def _report_non_finite(self, tables: list[str]) -> None:
        new = [t for t in tables if t not in self._non_finite_reported]
        if new:
            self._non_finite_reported.update(new)
            rank_zero_warn(
                f"DLACCallback: the pooled embeddings of table(s) {new} held NaN or Inf by training batch {self._step};"
                " those chunks were sent exactly (uncompressed), so the values reached the model unchanged. Check"
                " the table's inputs and learning rate. (Reported once per table; the count per interval is logged"
                " as dlac/non_finite_tables.)"
            )

    def _all_reduce(self, t: torch.Tensor, op: Any) -> torch.Tensor:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return t
        assert self._strategy is not None
        device = self._strategy.root_device
        out = t.to(device)
        dist.all_reduce(out, op=op)
        return out.cpu()

    # ------------------------------------------------------------------ checkpoint state

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "mode": self.mode,
            "schedule": self.schedule.as_dict(),
            "step": self._step,
            "calibrated": self._calibrated,
            "calibrated_at": self._calibrated_at,
            "measure_from": self._measure_from,
            "calibrations": list(self._calibrations),
            "table_bounds": dict(self._table_bounds),
            "classes": {k: str(v) for k, v in self._classes.items()},
            "table_stats": {k: v.as_dict() for k, v in self._table_stats.items()},
            "totals": self._totals,
            "history": self._history,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        version = state_dict.get("version")
        if version != _STATE_VERSION:
            raise ValueError(
                f"DLACCallback state version {version!r} is not {_STATE_VERSION}: the checkpoint was written by an"
                " incompatible lightning-dlac. Resume without it (the callback calibrates again) or use that version."
            )
        saved = state_dict["schedule"]
        current = self.schedule.as_dict()
        if saved != current or state_dict["mode"] != self.mode:
            rank_zero_warn(
                f"DLACCallback: the checkpoint was written with mode={state_dict['mode']!r}, schedule {saved}; this run"
                f" uses mode={self.mode!r}, schedule {current}. Continuing at iteration {state_dict['step']} with the"
                " checkpoint's table bounds and this run's schedule."
            )
        self._step = int(state_dict["step"])
        self._calibrated = bool(state_dict["calibrated"])
        self._calibrated_at = state_dict["calibrated_at"]
        self._measure_from = int(state_dict.get("measure_from", self.calibration_start))
        self._calibrations = list(state_dict.get("calibrations", []))
        self._table_bounds = {k: float(v) for k, v in state_dict["table_bounds"].items()}
        self._classes = {k: TableClass(v) for k, v in state_dict["classes"].items()}
        self._table_stats = {k: TableStats.from_dict(v) for k, v in state_dict["table_stats"].items()}
        self._totals = state_dict["totals"]
        self._history = list(state_dict["history"])


def _empty_totals() -> dict[str, Any]:
    return {"batches": 0, "raw_bytes": 0, "sent_bytes": 0, "encode_s": 0.0, "exchange_s": 0.0, "decode_s": 0.0,
            "backward_s": 0.0, "train_s": 0.0, "a2a_s": 0.0, "table_raw_bytes": {}, "table_sent_bytes": {}}


def _scalar_metrics(trainer: pl.Trainer, exclude_prefix: str) -> dict[str, float]:
    out = {}
    for key, value in trainer.callback_metrics.items():
        if key.startswith(exclude_prefix):
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value)
        elif isinstance(value, (int, float)):
            out[key] = float(value)
    return out


def _log_dir(trainer: pl.Trainer) -> Path | None:
    """The logger's run directory (``None`` without a logger, or with one that has no directory: then its
    ``save_dir``, else the Trainer's ``default_root_dir``)."""
    # logger.log_dir, not trainer.log_dir: the latter broadcasts (a collective), and only rank 0 gets here.
    logger = trainer.logger
    if logger is None:
        return None
    log_dir = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    return Path(log_dir or trainer.default_root_dir)


def _loss_of(output: Any) -> float:
    if isinstance(output, dict):
        output = output.get("loss")
    if not isinstance(output, torch.Tensor) or output.numel() != 1:
        raise TypeError(
            "DLACCallback's calibration calls training_step and needs it to return the loss (a scalar tensor or a"
            f" dict with 'loss'), got {type(output).__name__}. Return the loss, or use mode='homogenization' with"
            " sensitivity_batches=0 and no calibration_dataloader."
        )
    return float(output.detach())


@contextlib.contextmanager
def _random_state_kept() -> Iterator[Callable[[], None]]:
    """Yield ``replay()``, which resets the CPU and CUDA random state to what it was on entry; on exit the state is
    reset too, so probes neither see different dropout masks nor shift what training draws next."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def replay() -> None:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    try:
        yield replay
    finally:
        replay()


@contextlib.contextmanager
def _logging_muted(module: pl.LightningModule) -> Iterator[None]:
    """Make ``module.log`` / ``module.log_dict`` no-ops within the block (calibration forwards are not steps)."""
    saved = {name: module.__dict__[name] for name in ("log", "log_dict") if name in module.__dict__}

    def _noop(*args: Any, **kwargs: Any) -> None:
        return None

    module.__dict__["log"] = _noop
    module.__dict__["log_dict"] = _noop
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            module.__dict__.pop(name, None)
        module.__dict__.update(saved)
