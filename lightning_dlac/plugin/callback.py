"""DLACCallback: the dual-level adaptive error-bound policy, driven from the Lightning training loop."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_dlac.adaptive import (
    CalibrationSettings,
    Calibrator,
    ClassBounds,
    DecaySchedule,
    HomogenizationThresholds,
    ProbeBounds,
    TableClass,
    TableStats,
)
from lightning_dlac.adaptive.calibrator import GRADIENT_TOLERANCE, RECALIBRATE_SHARE, default_candidates
from lightning_dlac.checks import check_count
from lightning_dlac.comm.collectives import all_gather_object, all_reduce, rank_and_world
from lightning_dlac.plugin._forward import loss_of, loss_or_none, side_forward
from lightning_dlac.plugin._run import (  # noqa: F401 - run_training_batches: importable from here too
    DEFAULT_RUN_SHARE,
    PAPER_T,
    batches_run,
    loss_scale,
    run_training_batches,
    warn_if_past_the_end,
    warn_never_calibrated,
)
from lightning_dlac.plugin.metrics import CompressionMonitor, run_directory, scalar_metrics
from lightning_dlac.plugin.strategy import DLACStrategy

_STATE_VERSION = 1


class DLACCallback(Callback):
    """Dual-level adaptive error bounds for :class:`~lightning_dlac.DLACStrategy`'s compressed all-to-all.

    **Table-wise level** (:class:`~lightning_dlac.adaptive.Calibrator`). Over ``calibration_batches`` training
    batches from ``calibration_start`` (or the batches of ``calibration_dataloader``, before training starts) every
    table is measured on the real payload it sends and on the loss gradient that comes back for it: value range,
    homogenization index at ``index_eps``, compressed size at each candidate bound, the *gradient sensitivity* (the
    expected RMS change of a sample's loss that the codec's error at each candidate bound causes, relative to the mean
    loss: free, computed from the gradient the backward exchange carries) and, on the first ``sensitivity_batches``
    of them, the root mean square of the change of the training loss when only that table carries the codec's error
    (a *probe*, extra forward passes; see :mod:`lightning_dlac.adaptive.calibration`). The statistics are
    all-reduced, so every rank picks the same bound per table: ``mode="noise"`` (the default) keeps the variance the
    codec's error adds to a batch's loss, all tables together, within ``noise_fraction`` (a tenth) of what every
    table at its loosest candidate would add, or within an absolute ``noise_budget`` of the loss's minibatch
    variance, at the fewest bytes (scale-free rules: docs/adaptive.md derives them), and measures again every fifth
    of the run, as the model learns to read tables it could not at first; ``mode="gradient"`` takes the
    largest candidate whose gradient sensitivity is within ``gradient_tolerance`` of the mean loss;
    ``mode="homogenization"`` (the paper) puts index ``< tight_below`` *tight*, index ``>= loose_from`` *loose*, the
    rest *base*; ``mode="sensitivity"`` takes the largest candidate whose probed RMS loss change is within
    ``sensitivity_tolerance``; ``mode="off"`` keeps ``eps``, as every table does until calibration ends. By default
    calibration starts a tenth into the run (when the Trainer knows its length; else after 1000 batches), once the
    tables have trained: docs/adaptive.md has the evidence.

    **Iteration-wise level.** Every bound is multiplied by ``m(t)`` (:class:`~lightning_dlac.adaptive.DecaySchedule`)
    which decays from ``c`` to 1 over the first ``T`` training batches (by default a tenth of the run, at most the
    paper's 1000: the early stage ends when the default calibration starts).

    **Metrics** (:class:`~lightning_dlac.plugin.metrics.CompressionMonitor`), every ``log_every_n_steps`` batches,
    to every logger under ``dlac/``: ratio overall and per table, bound per table, observed max error / bound, bytes
    sent and saved, encode / exchange / decode / backward time per step, the all-to-all share of the step time.

    **Checkpoints.** Its state (calibrated bounds, classes, statistics, schedule position, byte totals, and every
    rank's part of a calibration in progress) is saved with the checkpoint; a resumed run continues the same schedule
    and calibration (on another world size, a calibration in progress starts over).

    A probe calls ``training_step`` under ``torch.no_grad()`` with ``self.log`` muted and the random state replayed,
    once per (table, candidate) plus once exactly, with its exchanges off the record (not counted as traffic); so
    ``training_step`` must return the loss (a tensor or a dict with ``"loss"``) and have no other side effects.

    Args:
        mode: ``"noise"`` (the default), ``"gradient"``, ``"homogenization"``, ``"sensitivity"`` or ``"off"`` (no
            table-wise level).
        tight_eps: Relative bound of tight tables.
        base_eps: Relative bound of base tables.
        loose_eps: Relative bound of loose tables.
        tight_below: Homogenization index below which a table is tight.
        loose_from: Homogenization index from which a table is loose.
        index_eps: Bound at which the homogenization index is measured (default ``base_eps``).
        index: Which homogenization index classifies: ``"vector"`` (the paper's: distinct quantized / distinct raw
            vectors) or ``"value"`` (the same per coordinate, which also sees tables whose vectors all stay distinct;
            more tables come out tight). See docs/adaptive.md for when each can be trusted.
        candidates: Bounds whose ratio and sensitivity are measured (default the three class bounds; finer in noise
            mode).
        sensitivity_tolerance: Largest relative change of the loss a table's bound may cause in sensitivity mode.
        gradient_tolerance: Largest expected RMS change of a sample's loss, relative to the mean loss, a table's
            bound may cause in gradient mode.
        noise_budget: In noise mode, an absolute budget: the share of the loss's minibatch variance the codec may
            add, all tables together (candidates default to 0.002, 0.005, 0.01, 0.02, 0.05 there; docs/adaptive.md).
            Give it or ``noise_fraction``, not both.
        noise_fraction: In noise mode, the budget as a fraction of the noise every table at its loosest candidate
            would add (default ``None``: 0.1 unless ``noise_budget`` is given). To first order the AUROC a bound
            costs follows the noise it adds, so the default costs about a tenth of what every table loose costs.
        calibration_batches: Number of batches calibration measures.
        calibration_start: Training batch at which calibration begins (default ``None``: a tenth of the run's
            training batches when the Trainer knows them from ``max_steps`` / ``max_epochs``, else 1000). Freshly
            initialised tables all look alike, to every mode: starting after some training measures the embeddings,
            and the model, the run will send through.
        sensitivity_batches: Of those, how many also run the probe (0 skips it; needs >= 1 in sensitivity mode;
            default ``None``: 1 in sensitivity mode, else 0). Each costs ``1 + tables x candidates`` extra forward
            passes.
        recalibrate_every: Calibrate again this many training batches after each calibration takes effect (0:
            never); each calibration measures ``calibration_batches`` batches with the current bounds in force.
            Default ``None``: in noise mode a fifth of the run's training batches when the Trainer knows them as
            training starts (from ``max_steps`` or ``max_epochs``; else 2000), so with the default start calibrations
            fall at a tenth, three tenths, ... of the run; in the other modes never.
        calibration_dataloader: Batches to calibrate on before training (default: the first training batches).
            Every rank must provide its own batches; the smallest count across ranks is used. They only run
            forward, so ``mode="noise"`` (the default) and ``mode="gradient"``, which read the backward pass's
            gradients, refuse them: use ``mode="sensitivity"`` or ``"homogenization"`` with them.
        schedule: ``"step"``, ``"linear"``, ``"log"`` or ``"constant"``.
        c: Initial multiplier m(0) (>= 1; 1 turns the iteration-wise level off).
        T: Length of the early stage, in training batches (default ``None``: a tenth of the run's training batches
            when the Trainer knows them, at most 1000, the paper's; else 1000).
        stages: Plateaus of the ``step`` schedule.
        log_every_n_steps: Metrics period in training batches.
        per_table_metrics: Also log ratio, bound and max error / bound of every table.
        prog_bar: Show the compression ratio on the progress bar.
        report: At the end of fit, write ``dlac_run.json``, ``dlac_report.md`` and PNG plots into the logger's
            directory (rank 0) and log the report's headline (see :mod:`lightning_dlac.plugin.report`).
    """

    def __init__(self, mode: str = "noise", tight_eps: float = 0.01, base_eps: float = 0.03,
                 loose_eps: float = 0.05, tight_below: float = 0.9, loose_from: float = 0.99,
                 index_eps: float | None = None, index: str = "vector", candidates: Sequence[float] | None = None,
                 sensitivity_tolerance: float = 1e-3, gradient_tolerance: float = GRADIENT_TOLERANCE,
                 noise_budget: float | None = None, noise_fraction: float | None = None,
                 calibration_batches: int = 8, calibration_start: int | None = None,
                 sensitivity_batches: int | None = None, recalibrate_every: int | None = None,
                 calibration_dataloader: Iterable[Any] | None = None, schedule: str = "step", c: float = 2.0,
                 T: int | None = None, stages: int = 10, log_every_n_steps: int = 50, per_table_metrics: bool = True,
                 prog_bar: bool = True, report: bool = True) -> None:
        super().__init__()
        self.class_bounds = ClassBounds(tight_eps, base_eps, loose_eps)
        if sensitivity_batches is None:
            sensitivity_batches = 1 if mode == "sensitivity" else 0
        self.settings = CalibrationSettings(
            mode=mode, class_bounds=self.class_bounds, thresholds=HomogenizationThresholds(tight_below, loose_from),
            index_eps=base_eps if index_eps is None else index_eps, index=index,
            candidates=default_candidates(mode, self.class_bounds) if candidates is None else tuple(candidates),
            sensitivity_tolerance=sensitivity_tolerance, gradient_tolerance=gradient_tolerance,
            noise_budget=noise_budget, noise_fraction=noise_fraction, batches=calibration_batches,
            start=calibration_start or 0, sensitivity_batches=sensitivity_batches,
            recalibrate_every=recalibrate_every or 0, before_training=calibration_dataloader is not None,
        )
        # recalibrate_every=None in noise mode follows the run's length, known once training starts.
        self.recalibrate_every = recalibrate_every
        self._default_recalibration = recalibrate_every is None and mode == "noise" and \
            calibration_dataloader is None
        self.mode, self.calibration_batches, self.gradient_tolerance = mode, calibration_batches, gradient_tolerance
        self.calibration_start, self.sensitivity_batches = calibration_start, sensitivity_batches
        self.calibration_dataloader = calibration_dataloader
        # T=None and calibration_start=None follow the run's length, known once training starts.
        self._schedule_args = (schedule, c, T, stages)
        self._restored_schedule: tuple[str, dict[str, Any], int] | None = None  # (mode, schedule, step) loaded
        self.schedule = DecaySchedule(schedule, c, PAPER_T if T is None else T, stages)
        self.log_every_n_steps = check_count(log_every_n_steps, "log_every_n_steps", 1)
        self.prog_bar, self.report = bool(prog_bar), bool(report)
        self._calibrator = Calibrator(self.settings, all_reduce, all_gather_object)
        self._monitor = CompressionMonitor(bool(per_table_metrics), all_reduce)
        self._strategy: DLACStrategy | None = None
        self._step = 0  # training batches seen: the schedule's t
        self._probe_s = 0.0  # probe time within the current batch (not training time)
        self._trainer: pl.Trainer | None = None
        self._calibration_s = 0.0  # this rank's seconds in calibration: observers, probes, reductions
        self._probed_s = 0.0  # this rank's seconds in probes over the run (training batches exclude them)

    # ------------------------------------------------------------------ read-outs

    @property
    def active(self) -> bool:
        """Whether the callback drives a compressed DLACStrategy in this run."""
        return self._strategy is not None

    @property
    def calibrator(self) -> Calibrator:
        """The table-wise level's state."""
        return self._calibrator

    @property
    def calibrated(self) -> bool:
        """Whether the table-wise bounds have been chosen."""
        return self._calibrator.calibrated

    @property
    def step(self) -> int:
        """Training batches seen so far (the schedule's iteration ``t``)."""
        return self._step

    @property
    def table_bounds(self) -> dict[str, float]:
        """Calibrated base bound of every table (before the multiplier)."""
        return self._calibrator.table_bounds

    @property
    def classes(self) -> dict[str, TableClass]:
        """Class of every table chosen by calibration."""
        return self._calibrator.classes

    @property
    def table_stats(self) -> dict[str, TableStats]:
        """The (cross-rank reduced) calibration statistics of every table."""
        return self._calibrator.table_stats

    def calibration_report(self) -> list[dict[str, Any]]:
        """The latest calibration, one row per table.

        Returns:
            One dict per table: class, bound, index, distinct vectors, value range, ratio and loss change
            (:meth:`~lightning_dlac.adaptive.Calibrator.report`).
        """
        return self._calibrator.report()

    # ------------------------------------------------------------------ hooks

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        self._strategy = None
        self._trainer = trainer  # state_dict() writes the metrics in progress with it
        if not isinstance(strategy, DLACStrategy):
            rank_zero_warn(
                f"DLACCallback does nothing: the trainer's strategy is {type(strategy).__name__}, not DLACStrategy."
                " Use Trainer(strategy=DLACStrategy()) or strategy='dlac' to compress the embedding all-to-all."
            )
        elif not strategy.compress:
            rank_zero_warn("DLACCallback does nothing: DLACStrategy(compression=CompressionOptions(enabled=False))"
                           " sends the all-to-all uncompressed.")
        else:
            self._strategy = strategy

    def _fit_defaults_to_the_run(self, trainer: pl.Trainer) -> None:
        """Resolve ``T=None``, ``calibration_start=None`` and the noise mode's ``recalibrate_every=None`` from the
        run's length in training batches, when the Trainer knows it (a tenth of it, the early stage at most the
        paper's 1000; recalibration every fifth), and warn when the first calibration on training batches cannot
        complete within that length. Called as training starts: the fit loop has set the training loader up, so
        reading the length sets nothing up early (in ``setup()`` it would run before the strategy wraps the loader
        for its pipeline, and before a resumed run restores the loader's position)."""
        schedule, c, T, stages = self._schedule_args
        default_start = self.calibration_start is None and self.calibration_dataloader is None
        batches = run_training_batches(trainer)
        share = max(1, round(batches * DEFAULT_RUN_SHARE)) if batches is not None else PAPER_T
        if batches is None and (T is None or default_start):
            unset = [name for name, value in (("calibration_start", self.calibration_start), ("T", T))
                     if value is None and not (name == "calibration_start" and self.calibration_dataloader)]
            rank_zero_info(f"DLACCallback: the Trainer cannot tell the run's length (no max_steps, and a training"
                           f" loader without a length), so {' and '.join(unset)}"
                           f" {'defaults' if len(unset) == 1 else 'default'} to the paper's {PAPER_T}"
                           f" batches; set them (or max_steps) for a shorter run.")
        if T is None:
            self.schedule = DecaySchedule(schedule, c, min(share, PAPER_T), stages)
        if default_start:
            self._calibrator.settings = self.settings = replace(self.settings, start=share)
            if self._restored_schedule is None:  # a restored checkpoint keeps the measurement it had scheduled
                self._calibrator.reschedule(share)
        if self._default_recalibration:
            every = max(1, round(batches * RECALIBRATE_SHARE)) if batches is not None else 2 * PAPER_T
            self._calibrator.settings = self.settings = replace(self.settings, recalibrate_every=every)
        # A recalibration whose bounds would apply to no batch is skipped. The end is in the callback's batches,
        # which go on across fit() calls (a checkpoint restores both counts; a second fit() counts its own from 0).
        self._calibrator.end_at(None if batches is None else self._step + max(0, batches - batches_run(trainer)))
        if self.mode != "off" and self.calibration_dataloader is None:
            warn_if_past_the_end(self.settings.start, self.calibration_batches, batches)
        if self._restored_schedule is not None:
            mode, saved, step = self._restored_schedule
            self._restored_schedule = None  # read once: a later fit() on this callback goes on from its own state
            current = self.schedule.as_dict()
            if saved != current or mode != self.mode:
                rank_zero_warn(
                    f"DLACCallback: the checkpoint was written with mode={mode!r}, schedule {saved}; this run uses"
                    f" mode={self.mode!r}, schedule {current}. Continuing at iteration {step} with the checkpoint's"
                    " table bounds and this run's schedule."
                )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is None:
            return
        if not self._strategy.exchanges:
            rank_zero_warn("DLACCallback does nothing: no table is sent through a compressed all-to-all (only"
                           " table-wise and column-wise shardings are compressed).")
            self._strategy = None
            return
        self._fit_defaults_to_the_run(trainer)
        self._strategy.error_bounds.set_multiplier(self.schedule(self._step))
        self._calibrator.begin(self._step)
        self._apply_bounds()  # restored from a checkpoint, or mode="off"
        if self.calibration_dataloader is not None and not self._calibrator.calibrated:
            self._calibrate_before_training(trainer, pl_module)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._strategy is None:
            return
        self._monitor.batch_started(self._strategy.exchange_group)
        self._strategy.error_bounds.set_multiplier(self.schedule(self._step))
        t = time.perf_counter()
        if self._calibrator.measuring(self._step) and self._calibrator.wants_probe:
            self._probe(pl_module, batch, batch_idx)
        self._probe_s = time.perf_counter() - t
        self._calibration_s += self._probe_s
        self._probed_s += self._probe_s
        if self._calibrator.measuring(self._step):
            group = self._strategy.exchange_group
            self._calibrator.set_gradient_scale(loss_scale(trainer))  # a GradScaler's gradients are scaled
            group.set_observer(self._timed(self._calibrator.observe))
            group.set_gradient_observer(self._timed(self._calibrator.observe_gradient))

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._strategy is None:
            return
        group = self._strategy.exchange_group
        if self._calibrator.measuring(self._step):
            group.set_observer(None)
            group.set_gradient_observer(None)
            loss = loss_or_none(outputs)
            if loss is not None:
                self._calibrator.observe_loss(loss)
            self._calibrator.batch_measured()
            if self._calibrator.complete:
                self._finish_calibration(first_batch=self._step + 1)
        self._monitor.batch_ended(group, excluded_s=self._probe_s)
        self._step += 1
        if self._step % self.log_every_n_steps == 0:
            self._write_metrics(trainer)
        if self.prog_bar and self._monitor.last_ratio is not None:
            pl_module.log("dlac/ratio", self._monitor.last_ratio, prog_bar=True, logger=False, on_step=True,
                          on_epoch=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is not None:
            self._strategy.exchange_group.set_observer(None)
            self._strategy.exchange_group.set_gradient_observer(None)
            if self._monitor.pending(self._strategy.exchange_group):
                self._write_metrics(trainer)  # the rest, e.g. the validation traffic after the last write
            warn_never_calibrated(self._calibrator.status(self._step), self._strategy.error_bounds.default_eps)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is not None and not trainer.sanity_checking and trainer.state.fn == "fit":
            self._monitor.validated(self._step, trainer.global_step, scalar_metrics(trainer, validation=True))

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._strategy is None or not self.report or not trainer.is_global_zero:
            return
        from lightning_dlac.plugin.report import headline, save_run

        run = self.run_summary(trainer)
        for line in headline(run):
            rank_zero_info(f"dlac: {line}")
        log_dir = run_directory(trainer)
        if log_dir is None:  # the user asked for no run directory, so nothing is written (not even into the cwd)
            rank_zero_info("dlac: no logger, so no report files; attach one (e.g. CSVLogger) to get dlac_report.md")
            return
        rank_zero_info(f"dlac: report in {save_run(run, log_dir)}")

    def rule(self) -> str | None:
        """How the table-wise level chooses, in words, as the report says it.

        Returns:
            The rule (e.g. "at most 0.1 of the noise every table loose would add"); ``None`` with ``mode="off"``.
        """
        s = self.settings
        if s.mode == "noise":
            rule = (f"a noise budget of {s.noise_budget:g} of the loss's minibatch variance"
                    if s.noise_budget is not None else
                    f"at most {s.noise_fraction:g} of the noise every table loose would add")
        elif s.mode == "gradient":
            rule = f"a gradient tolerance of {s.gradient_tolerance:g}"
        elif s.mode == "sensitivity":
            rule = f"a sensitivity tolerance of {s.sensitivity_tolerance:g}"
        elif s.mode == "homogenization":
            rule = f"the {s.index} homogenization index at eps {s.index_eps:g}"
        else:
            return None
        return rule + (f", measured again every {s.recalibrate_every} batches" if s.recalibrate_every else "")

    def run_summary(self, trainer: pl.Trainer) -> dict[str, Any]:
        """Everything the report is made from, as plain data.

        Args:
            trainer: The trainer of the run (its world size and final metrics).

        Returns:
            What ``dlac_run.json`` holds: the policy, the bounds, the calibrations, the traffic summary and the
            metrics history.
        """
        cal, bounds = self._calibrator, self._strategy.error_bounds if self._strategy is not None else None
        return {
            "mode": self.mode, "rule": self.rule(), "schedule": self.schedule.as_dict(),
            "table_bounds": cal.table_bounds,
            "classes": {k: str(v) for k, v in cal.classes.items()}, "calibrated_at": cal.calibrated_at,
            "calibrations": cal.calibrations, "bounds_status": cal.status(self._step),
            "default_eps": bounds.default_eps if bounds else None,
            "max_eps": bounds.max_eps if bounds else None,
            "final_effective_bounds": {n: bounds.effective(n) for n in self._monitor.totals.table_raw_bytes}
            if bounds else {},
            "calibration": cal.report(), "summary": self._monitor.summary(trainer.world_size),
            "non_finite_tables": sorted(self._monitor.non_finite_reported),
            "final_metrics": scalar_metrics(trainer), "history": list(self._monitor.history),
            "calibration_s": self._calibration_s, "calibration_share": self._calibration_share(trainer.world_size),
        }

    def _calibration_share(self, world_size: int) -> float | None:
        """This rank's calibration time over its training time (its share of the training batches' wall time,
        summed over ranks by the monitor, and the probes run beside them)."""
        total = self._monitor.train_s / max(world_size, 1) + self._probed_s
        return self._calibration_s / total if total > 0 else None

    # ------------------------------------------------------------------ calibration

    def _calibrate_before_training(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = list(itertools.islice(self.calibration_dataloader, self.calibration_batches))
        count = self._calibrator.agreed_batches(len(batches))
        if count == 0:
            raise ValueError("DLACCallback: calibration_dataloader yielded no batch on some rank; give it batches.")
        group = self._strategy.exchange_group
        for i, batch in enumerate(batches[:count]):
            batch = trainer.strategy.batch_to_device(batch)
            if self._calibrator.wants_probe:
                self._probe(pl_module, batch, i)
            with group.observing(self._calibrator.observe), side_forward(pl_module):
                loss_of(pl_module.training_step(batch, i))
            self._calibrator.batch_measured()
        self._finish_calibration(first_batch=self._step)

    def _probe(self, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        group = self._strategy.exchange_group
        with side_forward(pl_module) as replay:

            def loss_at(bounds: ProbeBounds) -> float:
                replay()
                with group.off_the_record(bounds):
                    return loss_of(pl_module.training_step(batch, batch_idx))

            self._calibrator.probe(group.all_compressed_tables, loss_at)

    def _timed(self, observer: Callable[..., None]) -> Callable[..., None]:
        """``observer``, its time counted as calibration time."""

        def timed(*args: Any) -> None:
            t = time.perf_counter()
            observer(*args)
            self._calibration_s += time.perf_counter() - t

        return timed

    @property
    def calibration_seconds(self) -> float:
        """This rank's seconds in calibration so far.

        They are the observers' work on the measured batches (statistics, compressed sizes), the sensitivity probes
        and the statistics' reduction.
        """
        return self._calibration_s

    def _finish_calibration(self, first_batch: int) -> None:
        t = time.perf_counter()
        result = self._calibrator.finish(first_batch, self._strategy.all_compressed_tables)
        self._calibration_s += time.perf_counter() - t
        self._apply_bounds()
        n = result.counts
        kept = len(set(self._strategy.all_compressed_tables) - set(self._calibrator.table_bounds))
        rank_zero_info(
            f"DLACCallback: {'re' if result.again else ''}calibrated {sum(n.values())} tables on {result.batches}"
            f" batch(es) ({self.mode}): {n['tight']} tight, {n['base']} base, {n['loose']} loose"
            + (f"; {kept} without a measured loss gradient (sequence features) keep the strategy's eps." if kept
               else ".")
        )

    def _apply_bounds(self) -> None:
        bounds = self._strategy.error_bounds
        bounds.clear_table_bounds()
        bounds.set_table_bounds(self._calibrator.table_bounds)

    # ------------------------------------------------------------------ metrics

    def _write_metrics(self, trainer: pl.Trainer) -> None:
        bounds = self._strategy.error_bounds
        metrics = self._monitor.write(self._strategy.exchange_group, trainer.world_size, bounds.effective,
                                      bounds.multiplier)
        self._monitor.history.append({"batch": self._step, "step": trainer.global_step, **metrics,
                                      **scalar_metrics(trainer, validation=False)})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------ checkpoint state

    @override
    def state_dict(self) -> dict[str, Any]:
        # The metrics of the interval in progress join the totals first: the exchanges' counters restart with the
        # process, so a run resumed from this checkpoint could never count them.
        if self._strategy is not None and self._trainer is not None \
                and self._monitor.pending(self._strategy.exchange_group):
            self._write_metrics(self._trainer)
        # Only rank 0's state is written (meta.pt), but a calibration in progress is each rank's own until it is
        # reduced: the calibrator gathers every rank's part (every rank dumps the checkpoint: the gather is matched,
        # as is the write's all-reduce above).
        return {"version": _STATE_VERSION, "mode": self.mode, "schedule": self.schedule.as_dict(), "step": self._step,
                "calibration_s": self._calibration_s, "probed_s": self._probed_s,
                **self._calibrator.shared_state_dict(), **self._monitor.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        version = state_dict.get("version")
        if version != _STATE_VERSION:
            raise ValueError(
                f"DLACCallback state version {version!r} is not {_STATE_VERSION}: the checkpoint was written by an"
                " incompatible lightning-dlac. Resume without it (the callback calibrates again) or use that version."
            )
        # Compared with this run's schedule once training starts, where its defaults are resolved.
        self._restored_schedule = (state_dict["mode"], state_dict["schedule"], int(state_dict["step"]))
        self._step = int(state_dict["step"])
        self._calibration_s = float(state_dict.get("calibration_s", 0.0))
        self._probed_s = float(state_dict.get("probed_s", 0.0))
        rank, world = rank_and_world()
        if not self._calibrator.load_shared_state_dict(state_dict, rank, world):
            rank_zero_warn(
                f"DLACCallback: the checkpoint was saved during a calibration on {len(state_dict['measurements'])}"
                f" rank(s) and is resumed on {world}; each rank's part of it cannot be given back, so that"
                " calibration starts over."
            )
        self._monitor.load_state_dict(state_dict)
