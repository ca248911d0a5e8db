"""The table-wise level's state machine: when to measure, what to measure, and the bounds it leads to.

A :class:`Calibrator` knows nothing of Lightning or of how exchanges run; it is given the two collectives it needs
(an all-reduce of its statistics, an all-gather of its checkpoint state: plain functions, so ranks are simulated in
tests and a plain training loop passes ``lightning_dlac.comm.collectives``'), and its driver (``DLACCallback``, or a
plain loop) tells it where training is and hands it what it needs:

=====================  ===========================================================================================
driver calls           the calibrator
=====================  ===========================================================================================
``end_at(batches)``    (optional) the run's length: a recalibration that could not take effect before it is skipped
``begin()``            schedules the first measurement (or, restored from a checkpoint, goes on with the saved one)
``measuring(step)``    says whether this training batch is measured
``observe``            (the exchange's chunk observer) adds one chunk to the statistics
``observe_gradient``   (the exchange's gradient observer) adds one table's loss gradient of a measured batch
``observe_loss(loss)`` adds the training loss of a measured batch (after its backward)
``probe(...)``         on the first ``sensitivity_batches`` measured batches: the loss with every table exact, then
                       with one table at a time carrying the codec's error at each candidate bound
``batch_measured()``   counts a measured batch; ``complete`` once ``calibration_batches`` are in
``finish(...)``        reduces the statistics over ranks, classifies, sets the bounds and schedules the
                       recalibration after ``recalibrate_every`` batches, if any
=====================  ===========================================================================================

A probe's exchanges encode with :class:`ProbeBounds` (the probed table at a candidate bound, every other table
exactly) and must not count as traffic: the driver runs them off the record.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_dlac.adaptive.bounds import Calibration, ClassBounds, ProbeBounds, TableClass, check_relative_bound
from lightning_dlac.adaptive.calibration import CalibrationStats, TableStats
from lightning_dlac.adaptive.policy import (
    INDEX_KINDS,
    HomogenizationThresholds,
    check_fraction,
    check_tolerance,
    class_table_bounds,
    classify,
    gradient_table_bounds,
    noise_table_bounds,
    relative_noise_budget,
    sensitivity_classes,
    sensitivity_table_bounds,
)
from lightning_dlac.checks import check_count

# The default gradient_tolerance: see docs/adaptive.md for the evidence it was chosen on.
GRADIENT_TOLERANCE = 0.15
# The noise mode's default: the chosen bounds may add this fraction of the noise that every table at its loosest
# candidate would add (relative_noise_budget). Argued from issue 33's targets, not fitted: to first order a world's
# AUROC cost is proportional to the noise added, so a tenth of all-loose's noise keeps the default within 0.001 AUROC
# of exact wherever every table loose costs up to 0.01, twice the 0.005 at which the calibration set counts
# all-loose as clearly harmful. Checked on development worlds only (benchmarks/calibration_bench.py --worlds dev
# --drift; docs/adaptive.md).
NOISE_FRACTION = 0.1
# The noise mode calibrates again every this share of the run (when the Trainer knows its length): the statistic of a
# table the model learns late (a dot-interaction effect) grows tens to hundreds of times over a run, so one early
# calibration cannot see it (docs/adaptive.md, "The statistic drifts").
RECALIBRATE_SHARE = 0.2
# The noise mode's default candidates: finer than the paper's three class bounds, tighter and looser than 0.01 / 0.05.
NOISE_CANDIDATES = (0.002, 0.005, 0.01, 0.02, 0.05)
MODES = ("gradient", "homogenization", "sensitivity", "noise", "off")


def default_candidates(mode: str, class_bounds: ClassBounds) -> tuple[float, ...]:
    """The candidate bounds of ``mode`` when none are given: the class bounds, or :data:`NOISE_CANDIDATES` for the
    noise mode, which chooses per table rather than per class."""
    return NOISE_CANDIDATES if mode == "noise" else class_bounds.candidates()

# all_reduce(tensor, op) with op one of "sum", "min", "max": every rank gets the combined tensor.
AllReduce = Callable[[torch.Tensor, str], torch.Tensor]
# all_gather(obj): every rank's obj, by rank.
AllGather = Callable[[Any], list[Any]]


def _alone(tensor: torch.Tensor, op: str) -> torch.Tensor:
    return tensor


@dataclass(frozen=True)
class CalibrationSettings:
    """What the table-wise level measures and how it classifies.

    ``DLACCallback`` builds it from its options (docs/configuration.md says what each does; the names differ where
    noted).

    Args:
        mode: ``"noise"`` (``DLACCallback``'s default), ``"gradient"``, ``"homogenization"``, ``"sensitivity"`` or
            ``"off"``.
        class_bounds: The bound of each class (``tight_eps``, ``base_eps``, ``loose_eps``).
        thresholds: The class boundaries on the homogenization index (``tight_below``, ``loose_from``).
        index_eps: Bound at which the homogenization index is measured.
        index: Which index classifies: ``"vector"`` (the paper's) or ``"value"`` (per coordinate).
        candidates: Bounds whose ratio and sensitivity are measured, strictly increasing; ``None``: the mode's
            default (the class bounds, or :data:`NOISE_CANDIDATES` in the noise mode).
        sensitivity_tolerance: Largest relative loss change a bound may cause (sensitivity mode).
        gradient_tolerance: Largest expected RMS change of a sample's loss (gradient mode).
        noise_budget: Noise mode: the share of the loss's minibatch variance the codec may add, all tables together
            (an absolute budget); ``None``: ``noise_fraction`` decides.
        noise_fraction: Noise mode: the share of the noise every table at its loosest candidate would add that the
            chosen bounds may add; ``None``: :data:`NOISE_FRACTION`, unless ``noise_budget`` is given.
        batches: Batches one calibration measures (``calibration_batches``).
        start: Training batch from which the first calibration measures (``calibration_start``).
        sensitivity_batches: Of the measured batches, how many also run the sensitivity probe.
        recalibrate_every: Calibrate again this many batches after each calibration takes effect (0: never).
        codec_impl: The codec implementation that measures compressed sizes.
        before_training: The first calibration measures given batches before training, forwards only (a
            ``calibration_dataloader``).

    Raises:
        ValueError: If an option is out of range, or options contradict each other (the message says which and
            what to do).
    """

    mode: str = "noise"  # "noise" | "gradient" | "homogenization" | "sensitivity" | "off" (DLACCallback's default)
    class_bounds: ClassBounds = ClassBounds()  # bound of each class
    thresholds: HomogenizationThresholds = HomogenizationThresholds()  # class boundaries on the index
    index_eps: float = 0.03  # bound at which the homogenization index is measured
    index: str = "vector"  # which index classifies: "vector" (the paper's) or "value" (per coordinate)
    # Bounds whose ratio and sensitivity are measured (None: default_candidates of the mode).
    candidates: tuple[float, ...] | None = None
    sensitivity_tolerance: float = 1e-3  # largest relative loss change a bound may cause (sensitivity mode)
    gradient_tolerance: float = GRADIENT_TOLERANCE  # largest expected RMS change of a sample's loss (gradient mode)
    # Noise mode: the share of the loss's minibatch variance the codec may add, all tables together (an absolute
    # budget), or, when that is None, noise_fraction of the noise every table at its loosest candidate would add.
    noise_budget: float | None = None
    noise_fraction: float | None = None  # None: NOISE_FRACTION, unless noise_budget is given
    batches: int = 8  # batches one calibration measures
    start: int = 0  # training batch from which the first calibration measures
    sensitivity_batches: int = 1  # of the measured batches, how many also run the sensitivity probe
    recalibrate_every: int = 0  # calibrate again this many batches after each calibration takes effect (0: never)
    codec_impl: str = "auto"  # codec that measures compressed sizes
    before_training: bool = False  # the first calibration measures given batches before training (forwards only)

    def __post_init__(self) -> None:
        if self.index not in INDEX_KINDS:
            kinds = ", ".join(map(repr, INDEX_KINDS))
            raise ValueError(f"index={self.index!r} is not supported; choose one of {kinds}.")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not supported; choose one of {', '.join(map(repr, MODES))}.")
        check_relative_bound(self.index_eps, "index_eps")
        if self.candidates is None:
            object.__setattr__(self, "candidates", default_candidates(self.mode, self.class_bounds))
        checked = [check_relative_bound(v, "candidates") for v in self.candidates]
        if not checked or checked != sorted(set(checked)):
            raise ValueError(f"candidates={list(self.candidates)} must be a non-empty, strictly increasing list.")
        object.__setattr__(self, "candidates", tuple(checked))
        check_tolerance(self.sensitivity_tolerance)
        check_tolerance(self.gradient_tolerance, "gradient_tolerance")
        if self.noise_budget is not None and self.noise_fraction is not None:
            raise ValueError(
                f"noise_budget={self.noise_budget} and noise_fraction={self.noise_fraction} are two ways to set the"
                " noise mode's budget: give one (noise_budget: an absolute share of the minibatch noise;"
                " noise_fraction: a share of the noise every table loose would add)."
            )
        if self.noise_budget is not None:
            check_tolerance(self.noise_budget, "noise_budget")
        else:
            object.__setattr__(self, "noise_fraction", check_fraction(
                NOISE_FRACTION if self.noise_fraction is None else self.noise_fraction))
        check_count(self.batches, "calibration_batches", 1)
        check_count(self.start, "calibration_start", 0)
        check_count(self.sensitivity_batches, "sensitivity_batches", 0)
        check_count(self.recalibrate_every, "recalibrate_every", 0)
        if self.recalibrate_every and self.mode == "off":
            raise ValueError("recalibrate_every needs a calibration: it does nothing with mode='off'.")
        if self.sensitivity_batches > self.batches:
            raise ValueError(
                f"sensitivity_batches={self.sensitivity_batches} exceeds calibration_batches={self.batches}: the"
                " probe runs on calibration batches."
            )
        if self.mode == "sensitivity" and self.sensitivity_batches == 0:
            raise ValueError("mode='sensitivity' chooses bounds from the probe: set sensitivity_batches >= 1.")
        if self.before_training and self.start:
            raise ValueError(
                "calibration_start applies to calibration on training batches; with a calibration_dataloader"
                " calibration runs before training. Set one of them."
            )
        if self.before_training and self.mode in ("gradient", "noise"):
            # Batches measured before training only run forwards: no loss gradient comes back through the exchange,
            # so the gradient mode would see nothing and keep every table at the strategy's eps. A backward pass of
            # its own would not do either: the fused embedding optimizer updates the tables inside it.
            raise ValueError(
                f"mode={self.mode!r} measures the loss gradient that training's backward pass sends back"
                " through the exchange, and a calibration_dataloader is only run forward (before training): it would"
                " see no gradient. Calibrate on training batches (drop calibration_dataloader; calibration_start"
                " sets when), or use mode='sensitivity' or mode='homogenization' with the calibration_dataloader."
            )


class Calibrator:
    """Holds the table-wise level's state (see the module docstring for the protocol).

    Args:
        settings: What to measure and how to classify.
        all_reduce: Combines a tensor over ranks (default: one process, nothing to combine).
        all_gather: Every rank's object, by rank (default: one process).
    """

    def __init__(self, settings: CalibrationSettings, all_reduce: AllReduce | None = None,
                 all_gather: AllGather | None = None) -> None:
        self.settings = settings
        self._all_reduce = all_reduce or _alone
        self._all_gather = all_gather or (lambda obj: [obj])
        self._calibrated = settings.mode == "off"
        self._calibrated_at: int | None = 0 if self._calibrated else None  # first batch with calibrated bounds
        self._measure_from = settings.start  # training batch from which the next calibration measures
        self._end: int | None = None  # the run's length in training batches, where the driver knows it
        self._calibrations: list[dict[str, Any]] = []  # when each calibration took effect, and its classes
        self._table_bounds: dict[str, float] = {}
        self._classes: dict[str, TableClass] = {}
        self._table_stats: dict[str, TableStats] = {}
        self._stats: CalibrationStats | None = None  # the measurement in progress
        self._seen = 0
        self._probed = 0
        self._grad_tables: set[str] = set()  # tables whose gradient the batch being measured has shown
        self._gradient_scale = 1.0  # the loss scale of the gradients observed now (a GradScaler's), divided out

    # ------------------------------------------------------------------ read-outs

    @property
    def calibrated(self) -> bool:
        """Whether the table-wise bounds have been chosen."""
        return self._calibrated

    @property
    def calibrated_at(self) -> int | None:
        """Training batch from which the latest calibration's bounds apply."""
        return self._calibrated_at

    @property
    def calibrations(self) -> list[dict[str, Any]]:
        """Every calibration so far: ``{"at": batch, "tight": n, "base": n, "loose": n}``."""
        return [dict(c) for c in self._calibrations]

    @property
    def table_bounds(self) -> dict[str, float]:
        """Calibrated base bound of every table."""
        return dict(self._table_bounds)

    @property
    def classes(self) -> dict[str, TableClass]:
        """Class of every calibrated table."""
        return dict(self._classes)

    @property
    def table_stats(self) -> dict[str, TableStats]:
        """The cross-rank statistics of the latest calibration."""
        return dict(self._table_stats)

    @property
    def next_measurement(self) -> int | None:
        """Training batch from which the next (or the ongoing) measurement measures; ``None`` when none is due."""
        return self._measure_from if self._stats is not None else None

    @property
    def measured_batches(self) -> int:
        """Batches the measurement in progress has measured so far (0 between measurements)."""
        return self._seen if self._stats is not None else 0

    def status(self, batches_run: int) -> dict[str, Any]:
        """Which bounds the tables use and why.

        Args:
            batches_run: The training batches run so far.

        Returns:
            ``{"state": s, ...}`` with ``s`` one of ``"constant"`` (``mode="off"``: every table keeps the strategy's
            eps), ``"calibrated"`` (with ``"at"``, the first batch of the latest calibration's bounds, and
            ``"calibrations"``) or ``"never_calibrated"`` (with ``"due"``, the batch the first measurement was to
            start at, ``"measured"``, the batches it got, ``"needed"`` and ``"batches_run"``: every table kept the
            strategy's eps).
        """
        if self.settings.mode == "off":
            return {"state": "constant"}
        if self._calibrated:
            return {"state": "calibrated", "at": self._calibrated_at, "calibrations": len(self._calibrations)}
        return {"state": "never_calibrated", "due": self._measure_from, "measured": self.measured_batches,
                "needed": self.settings.batches, "batches_run": int(batches_run)}

    def set_gradient_scale(self, scale: float) -> None:
        """Set the loss scale of the gradients observed next, so that the statistic is that of the loss itself.

        The gradient energy is divided by the scale's square.

        Args:
            scale: The factor the loss was multiplied by before the backward pass whose gradients are observed next
                (a GradScaler's scale under mixed precision; 1 otherwise).

        Raises:
            ValueError: If ``scale`` is not a positive finite number.
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"gradient scale {scale!r} must be a positive finite number (a loss scale).")
        self._gradient_scale = float(scale)

    def report(self) -> list[dict[str, Any]]:
        """The latest calibration, one row per table.

        Returns:
            One dict per table, by name: class, bound, homogenization index (per column, and the paper's
            whole-vector one), distinct vectors per chunk, value range, ratio and (if probed) RMS relative loss
            change, gradient loss change and noise share at each candidate bound.
        """
        rows = []
        for name in sorted(self._table_stats):
            s = self._table_stats[name]
            sens, grad, noise = s.sensitivity(), s.gradient_sensitivity(), s.noise_share()
            rows.append(
                {
                    "table": name,
                    "class": str(self._classes[name]) if name in self._classes else None,
                    "eps": self._table_bounds.get(name),
                    "homogenization_index": s.homogenization_index,
                    "vector_homogenization_index": s.vector_homogenization_index,
                    "distinct_per_chunk": s.distinct_per_chunk,
                    "value_range": s.value_range,
                    "ratio": {str(k): v for k, v in s.ratios().items()},
                    "loss_change": None if sens is None else {str(k): v for k, v in sens.items()},
                    "gradient_loss_change": None if grad is None else {str(k): v for k, v in grad.items()},
                    "noise_share": None if noise is None else {str(k): v for k, v in noise.items()},
                }
            )
        return rows

    # ------------------------------------------------------------------ the protocol

    @property
    def end(self) -> int | None:
        """The training batch at which the run ends, as the driver gave it (:meth:`end_at`; ``None``: unknown)."""
        return self._end

    def end_at(self, batches: int | None) -> None:
        """Say at which training batch the run ends.

        A recalibration that could not complete before the end is not scheduled: its bounds would apply to no
        training batch. The first calibration is always scheduled (the driver says when it cannot complete: the run
        never calibrates).

        Args:
            batches: The run's length in training batches; ``None``: unknown.

        Raises:
            ValueError: If ``batches`` is not a count >= 0.
        """
        self._end = None if batches is None else check_count(batches, "batches", 0)

    def _takes_effect(self, measure_from: int) -> bool:
        """Whether a measurement from training batch ``measure_from`` completes before the run ends."""
        return self._end is None or measure_from + self.settings.batches < self._end

    def begin(self, step: int = 0) -> None:
        """Schedule the next measurement, if any, as training starts (fresh, or restored from a checkpoint).

        A measurement restored from a checkpoint goes on where it stopped; a recalibration not yet begun is scheduled
        again, from ``step`` at the earliest, against this run's end (:meth:`end_at`).

        Args:
            step: The training batch training starts at.
        """
        if self._stats is not None and not (self._calibrated and self._seen == 0):
            return
        if not self._calibrated:
            self._new_measurement()
        elif self.settings.recalibrate_every:
            after = (self._calibrated_at or 0) + self.settings.recalibrate_every
            self._measure_from = max(self._measure_from, after, step)  # one already due measures from here
            self._schedule_recalibration()

    def _schedule_recalibration(self) -> None:
        self._stats = None
        if self._takes_effect(self._measure_from):
            self._new_measurement()

    def reschedule(self, start: int) -> None:
        """Move the first measurement to another training batch, as long as it has not begun.

        A restored or finished calibration keeps its own schedule.

        Args:
            start: The training batch it measures from.
        """
        if not self._calibrated and self._seen == 0:
            self._measure_from = start

    def measuring(self, step: int) -> bool:
        """Whether a training batch is measured.

        Args:
            step: The training batch.

        Returns:
            True if a measurement is due and ``step`` is at or after its start.
        """
        return self._stats is not None and step >= self._measure_from

    @property
    def wants_probe(self) -> bool:
        """Whether the batch being measured should also run the sensitivity probe."""
        return self._stats is not None and self._probed < self.settings.sensitivity_batches

    def observe(self, table: str, chunk: torch.Tensor) -> None:
        """Add one chunk to the measurement (the exchange's chunk observer).

        The homogenization indices, which only ``mode="homogenization"`` chooses by, are counted on every batch there
        and on the first batch of each calibration in the other modes, which only report them.

        Args:
            table: The table.
            chunk: Its ``[rows, dim]`` pooled embeddings bound for one rank.
        """
        assert self._stats is not None, "observe() outside a measurement"
        self._stats.observe(table, chunk, index=self.settings.mode == "homogenization" or self._seen == 0)

    def observe_gradient(self, table: str, energy: float, rows: int) -> None:
        """Add one table's loss gradient of the batch being measured (the exchange's gradient observer).

        The energy is divided by the square of the loss scale in force (:meth:`set_gradient_scale`): the gradient of
        a scaled loss is the scale times the loss's.

        Args:
            table: The table.
            energy: As :meth:`CalibrationStats.observe_gradient` takes it.
            rows: The samples of the batch.
        """
        assert self._stats is not None, "observe_gradient() outside a measurement"
        self._stats.observe_gradient(table, energy / self._gradient_scale**2, rows)
        self._grad_tables.add(table)

    def observe_loss(self, loss: float) -> None:
        """Add the training loss of the batch being measured, once its gradients have been observed.

        It is what the gradient sensitivity is relative to.

        Args:
            loss: The batch's training loss.
        """
        assert self._stats is not None, "observe_loss() outside a measurement"
        self._stats.record_batch_loss(loss, sorted(self._grad_tables))
        self._grad_tables.clear()

    def probe(self, tables: Sequence[str], loss_at: Callable[[ProbeBounds], float]) -> None:
        """Measure the sensitivity of some tables on the current batch.

        Args:
            tables: The tables to probe, one at a time at each candidate bound.
            loss_at: ``loss_at(bounds)`` returns the loss of one forward pass whose exchanges encode with
                ``bounds`` (the same batch and random state every time).
        """
        assert self._stats is not None, "probe() outside a measurement"
        base = loss_at(ProbeBounds({}))
        for name in tables:
            probed = [loss_at(ProbeBounds({name: eps})) for eps in self.settings.candidates]
            self._stats.record_loss(name, base, probed)
        self._probed += 1

    def agreed_batches(self, available: int) -> int:
        """How many batches each rank measures when calibrating on batches of its own; every rank must call it.

        Args:
            available: The batches this rank has.

        Returns:
            The same number on every rank: the smallest ``available`` over ranks, at most ``calibration_batches``.
        """
        count = torch.tensor([min(available, self.settings.batches)], dtype=torch.float64)
        return int(self._all_reduce(count, "min")[0])

    def batch_measured(self) -> None:
        """One more batch measured."""
        self._seen += 1

    @property
    def complete(self) -> bool:
        """Whether the measurement in progress has all its batches."""
        return self._stats is not None and self._seen >= self.settings.batches

    def finish(self, first_batch: int, tables: Sequence[str]) -> Calibration:
        """Reduce the statistics over ranks, choose every table's bound and schedule the recalibration.

        Every rank must call it with the same ``tables``. In the gradient and noise modes it warns when no loss
        gradient reached it (every table then keeps the strategy's eps).

        Args:
            first_batch: The training batch from which the chosen bounds apply.
            tables: The tables measured, the same list on every rank.

        Returns:
            The finished calibration.
        """
        assert self._stats is not None, "finish() without a measurement"
        tensors = self._stats.to_tensors(tables)
        self._stats.load_tensors(tables, {op: self._all_reduce(t, op) for op, t in tensors.items()})
        self._table_stats = {n: self._stats.tables[n] for n in tables}
        s = self.settings
        if s.mode in ("gradient", "noise") and tables and not any(st.grad_rows for st in self._table_stats.values()):
            # No table saw a loss gradient: nothing fed observe_gradient (a loop driving the Calibrator without the
            # exchange's gradient observer, or forwards only), so every table would keep the strategy's eps.
            warnings.warn(
                f"Calibrator (mode={s.mode!r}) measured {len(tables)} table(s) but no loss gradient reached it, so"
                " every table keeps the strategy's eps (sequence features never carry one). Feed the backward"
                " exchange's gradients"
                " (ExchangeGroup.set_gradient_observer(calibrator.observe_gradient)) and the losses"
                " (calibrator.observe_loss), or use mode='homogenization', which needs only the forward chunks.",
                stacklevel=2,
            )
        if s.mode == "homogenization":
            self._classes = classify(self._table_stats, s.thresholds, s.index)
            self._table_bounds = class_table_bounds(self._classes, s.class_bounds)
        elif s.mode == "gradient":
            self._table_bounds = gradient_table_bounds(self._table_stats, s.gradient_tolerance)
            self._classes = sensitivity_classes(self._table_bounds, s.class_bounds)
        elif s.mode == "noise":
            budget = s.noise_budget if s.noise_budget is not None else \
                relative_noise_budget(self._table_stats, s.noise_fraction)
            # A zero budget means no table's error reaches the loss (every share 0): each may take its loosest bound.
            self._table_bounds = noise_table_bounds(self._table_stats, budget) if budget else {
                name: max(st.candidates) for name, st in self._table_stats.items() if st.noise_share() is not None}
            self._classes = sensitivity_classes(self._table_bounds, s.class_bounds)
        else:
            self._table_bounds = sensitivity_table_bounds(self._table_stats, s.sensitivity_tolerance)
            self._classes = sensitivity_classes(self._table_bounds, s.class_bounds)
        result = Calibration(
            at=first_batch,
            batches=self._seen,
            counts={c.value: sum(1 for v in self._classes.values() if v is c) for c in TableClass},
            again=self._calibrated,
        )
        self._calibrated, self._calibrated_at = True, first_batch
        self._calibrations.append({"at": first_batch, **result.counts})
        self._stats = None
        if s.recalibrate_every:
            self._measure_from = first_batch + s.recalibrate_every
            self._schedule_recalibration()
        return result

    def _new_measurement(self) -> None:
        s = self.settings
        self._stats = CalibrationStats(s.candidates, s.index_eps, s.codec_impl)
        self._seen = self._probed = 0
        self._grad_tables = set()

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        """The calibrator's state as plain data, for a checkpoint.

        The measurement is this rank's own until :meth:`finish` reduces it, so a driver that saves one state for
        every rank must collect each rank's ``"measurement"`` and give each rank its own back
        (:meth:`shared_state_dict` does).

        Returns:
            The chosen bounds, classes and statistics, where the schedule stands, and this rank's part of a
            measurement in progress (``"measurement"``; ``None`` between measurements).
        """
        measurement = None
        if self._stats is not None:
            measurement = {"seen": self._seen, "probed": self._probed,
                           "tables": {k: v.as_dict() for k, v in self._stats.tables.items()}}
        return {
            "measurement": measurement,
            "calibrated": self._calibrated,
            "calibrated_at": self._calibrated_at,
            "measure_from": self._measure_from,
            "calibrations": self.calibrations,
            "table_bounds": dict(self._table_bounds),
            "classes": {k: str(v) for k, v in self._classes.items()},
            "table_stats": {k: v.as_dict() for k, v in self._table_stats.items()},
        }

    def shared_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` for a checkpoint one rank writes for all; every rank must call it (it gathers).

        Returns:
            :meth:`state_dict` with ``"measurements"`` instead of ``"measurement"``: every rank's part of a
            measurement in progress, by rank (``None`` between measurements).
        """
        state = self.state_dict()
        measurement = state.pop("measurement")
        return {**state, "measurements": None if measurement is None else self._all_gather(measurement)}

    def load_shared_state_dict(self, state: Mapping[str, Any], rank: int, world: int) -> bool:
        """Restore :meth:`shared_state_dict` on one rank.

        Args:
            state: What :meth:`shared_state_dict` returned.
            rank: This rank.
            world: The number of ranks now.

        Returns:
            ``False`` when a measurement in progress was saved on another number of ranks: each rank's part cannot be
            given back, so it starts over; else ``True``.
        """
        measurements = state.get("measurements")
        mine = measurements[rank] if measurements is not None and len(measurements) == world else None
        self.load_state_dict({**{k: v for k, v in state.items() if k != "measurements"}, "measurement": mine})
        return measurements is None or mine is not None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Args:
            state: What :meth:`state_dict` returned, with this rank's ``"measurement"`` (``None`` to measure again).
        """
        self._calibrated = bool(state["calibrated"])
        self._calibrated_at = state["calibrated_at"]
        self._measure_from = int(state.get("measure_from", self.settings.start))
        self._calibrations = [dict(c) for c in state.get("calibrations", [])]
        self._table_bounds = {k: float(v) for k, v in state["table_bounds"].items()}
        self._classes = {k: TableClass(v) for k, v in state["classes"].items()}
        self._table_stats = {k: TableStats.from_dict(v) for k, v in state["table_stats"].items()}
        self._stats = None
        measurement = state.get("measurement")
        if measurement is not None:
            self._new_measurement()
            assert self._stats is not None
            self._stats.tables = {k: TableStats.from_dict(v) for k, v in measurement["tables"].items()}
            self._seen, self._probed = int(measurement["seen"]), int(measurement["probed"])
