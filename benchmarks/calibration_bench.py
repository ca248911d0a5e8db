"""Does table-wise calibration find the tables that need a tight bound? A fair benchmark (issue 26).

On :mod:`calibration_data`'s data set every table has the same size and the same id distribution; tables differ
only in how the label depends on them (sensitive, robust, irrelevant; roles drawn at random per seed). Each variant
is a 2-rank gloo launch of the example DLRM through Lightning and DLACStrategy, with the same seed, model
initialisation and data order; only the compression changes:

- ``uncompressed``: ``DLACStrategy(compress=False)``, the reference every AUROC delta is taken against;
- ``all_tight`` / ``all_loose``: every table at 0.01 / 0.05 for the whole run (no callback). Before any calibrator
  is judged, these show the set tests something: all-loose must lose at least 0.005 AUROC (mean over seeds, and more
  than 3 standard deviations of the per-seed losses), all-tight less than 0.001;
- ``default``: ``DLACCallback()`` with no calibration argument, what a user gets;
- ``gradient``, ``homogenization``, ``homogenization_value``, ``sensitivity``: each mode with its defaults
  (``sensitivity`` with 4 probe batches), for the table of every mode in docs/adaptive.md (``--quick`` skips them).

Per calibrated variant: the precision and recall of "sensitive tables come out tight or base", the share of robust
and irrelevant tables put loose, the AUROC delta against uncompressed (negative = worse), the forward bytes against
the all-tight run's, and calibration's share of the run's time (the callback's own measure: observers, probes,
reductions). Prints tables and writes JSON::

    python benchmarks/calibration_bench.py --seeds 3 --json-out benchmarks/results/calibration_bench.json
    python benchmarks/calibration_bench.py --seeds 1 --quick --json-out /tmp/calibration_quick.json
    python benchmarks/calibration_bench.py --seeds 2 --trace --json-out benchmarks/results/calibration_trace.json

``--worlds dev|eval`` judges on the family of worlds of :mod:`calibration_data` instead (issue 33 item 2): per world,
``uncompressed``, ``all_tight``, ``all_loose``, ``default`` and ``noise`` (``DLACCallback(mode="noise")``); the
development worlds are for fitting constants, the evaluation worlds for judging (the split is fixed in
calibration_data.py). ``--quick`` runs the first 3 evaluation worlds, ``--count N`` the first N of the split::

    python benchmarks/calibration_bench.py --worlds eval --quick --json-out benchmarks/results/calibration_worlds.json

writes ``{"summary": {"worlds", "default_within_0001_of_all_tight", "worse_than_all_loose", "recall", "precision",
"bytes_vs_all_tight"}, "summary_noise": {...}, "per_world": [...]}`` beside the metadata. A table is *flagged* when
its bound is below the loose bound (0.05); recall and precision are of flagged against the planted sensitive tables,
pooled over worlds; bytes are the median over worlds of the variant's forward bytes over all-tight's; "worse than
all-loose" counts worlds where the variant's AUROC is more than WORLD_NOISE below all-loose's.

Every arm of a world runs under the same ``--train-seeds`` training seeds: a seed fixes the model's initial weights
and the draw and order of the training batches (validation batches are the world's own), so arms are paired per
seed, and a world's AUROC differences are means over seeds of same-seed differences. Each world records its noise
floor (:func:`noise_floor`: FLOOR_Z standard errors of such a mean, from the paired differences' spread pooled over
the arms) and, per judged difference, whether it is within it; the summary adds the issue's two AUROC judgements
with each world's margin widened to its floor where that is larger than WORLD_NOISE (``within_floor_of_all_tight``,
``worse_than_all_loose_beyond_floor``), the median floor and how many worlds' floors are within WORLD_NOISE.

The protocol (WORLD_FULL, WORLD_QUICK) was measured on development worlds only (0, 1 and 4), by repeating
uncompressed and all-tight under several training seeds. Runs are deterministic: an arm rerun under the same seed
gives the same AUROC to the last digit, so what moves a difference between arms is the training trajectory parting
once the codec perturbs it. At the former lr 0.05 the paired difference moved from seed to seed by several times
the issue's 0.001, at 400 and 1200 steps alike, and more validation batches did not narrow it: one seed per arm could
not tell a codec effect of 0.001 from chance. At lr 0.015 the spread fell by about 3-4x with no lower AUROC; longer
runs narrowed it on one world and widened it on another, and a lower lr learned too slowly. So lr 0.015 and several
paired seeds, the floor shrinking as one over the square root of their number: with the full run's 5 seeds it comes
near the 0.001 judged on some development worlds and stays above it on others, with the quick run's 2 above it on
most. Each world records its own, so a difference is read against the floor of its world. Pairing matters most:
some seeds leave a world's training in a far worse state for every arm alike (several hundredths of AUROC), which
unpaired seeds would count as a difference between arms.

``--baselines-from FILE`` (with ``--worlds``) takes the three baseline arms of every world FILE holds from that
earlier run of the same protocol and runs only the calibrated variants: a new default is judged on the evaluation
worlds at a quarter of the cost (every launch is deterministic, so the reused arm is the one the run would launch;
the metadata records the file's commit)::

    python benchmarks/calibration_bench.py --worlds eval --count 20 --train-seeds 2 --settle \
        --variants uncompressed,all_tight,all_loose,default \
        --baselines-from benchmarks/results/calibration_worlds_settled.json --json-out /tmp/new_default.json

``--worlds dev --drift`` runs only the default on development worlds 0-19 (one seed each) and records every one of
its calibrations: how the noise share's order and level move along the run, and which tables relative and absolute
budgets would flag at each calibration (:func:`drift_check`), the development evidence for the default's rule::

    python benchmarks/calibration_bench.py --worlds dev --drift --count 20 \
        --json-out benchmarks/results/calibration_drift_dev.json

``--worlds dev --fit`` runs the previous default (absolute budget, one calibration: ``noise_absolute``) on
development worlds and fits its budget (:func:`fit_noise_budget`, the p90 rule); the fitted value is
PREVIOUS_NOISE_BUDGET.

``--ablate WORLD`` runs every table of one world loose alone against all-tight, the issue's definition of a
sensitive table, with the default beside it, and checks the planted roles and the default's flags against it
(:func:`judge_ablation`); an evaluation world only to judge. With ``--settle`` every arm trains until it settles;
each arm is written as it ends and ``--resume`` runs only the arms the file lacks.
``--rejudge FILE`` judges a ``--worlds`` file again from the runs it holds (:func:`rejudge`), e.g. after a change to
the judgement (bytes per batch: settled arms stop after different numbers of batches).
``--perturb WORLD:SEED`` runs one training seed of one world with every table at all-tight's bound and one percent
either side of it (PERTURB_EPS): how far the trajectory alone moves the AUROC, what the worlds' floors are made of.

``--curves WORLD:SEED,...`` runs the arms of each world and training seed (``--variants``, default uncompressed and
all-tight) with the validation AUROC taken every ``--val-every`` batches: their learning curves, where along the run
arms part and whether they have settled when it ends. ``--settle`` (with ``--worlds``) trains every arm until its
validation AUROC has settled (SETTLE_EVERY, SETTLE_DELTA, SETTLE_MAX) instead of for a fixed number of batches, and
records beside each world's floor the floor its arms had at the fixed protocol's length, read off the same curves.

``--trace`` runs only the gradient mode, calibrating from a tenth of the run and again every fifth (``c=1``), and
records every table's gradient sensitivity at each calibration: how the statistic of each role moves as the model
trains, the evidence the default tolerance and start were chosen on.

The JSON holds ``{"default": {"precision", "recall", "robust_loose_share", "auroc_delta", "bytes_vs_all_tight",
"calibration_share"}, "all_loose": {"auroc_delta"}, "all_tight": {"auroc_delta"}, "<mode>": {...}, "seeds": [...],
"per_seed": [...]}`` (means over seeds; deltas against uncompressed), beside the run's metadata, configuration and
every launch's figures (``results``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from common import REPO, load_results, run_ranks, start_run, write_results

BASELINES = ("uncompressed", "all_tight", "all_loose")
MODES = ("gradient", "homogenization", "homogenization_value", "sensitivity")  # the default is the noise mode
QUICK = (*BASELINES, "default")
FULL = (*QUICK, *MODES)
TARGETS = dict(precision=0.9, recall=0.9, robust_loose_share=0.9, auroc_delta=-0.001, bytes_vs_all_tight=0.7,
               calibration_share=0.05, all_loose_loss=0.005, all_tight_loss=0.001)


def default_mode() -> str:
    """The mode ``DLACCallback()`` calibrates with: the ``default`` variant's, recorded in every results file."""
    from lightning_dlac import DLACCallback

    return DLACCallback().mode


def default_rule() -> str:
    """How ``DLACCallback()`` chooses its table-wise bounds, in words: recorded in every --worlds results file, so
    that runs of different defaults are never resumed into, or read as, one another."""
    from lightning_dlac import DLACCallback
    from lightning_dlac.adaptive.calibrator import RECALIBRATE_SHARE

    dlac = DLACCallback()
    s = dlac.settings
    if s.mode != "noise":
        return f"{s.mode} mode"
    budget = f"noise budget {s.noise_budget:g}" if s.noise_budget is not None else \
        f"{s.noise_fraction:g} of all-loose's noise"
    again = f"recalibrating every {RECALIBRATE_SHARE:g} of the run" if dlac.recalibrate_every is None else \
        f"recalibrating every {s.recalibrate_every} batches" if s.recalibrate_every else "calibrating once"
    return f"noise mode, {budget}, {again}"


# The default until the relative budget (issue 33): an absolute noise budget fitted on development worlds by the p90
# rule (calibration_worlds_fit.json), one calibration a tenth into the run. Kept as a variant to compare against.
PREVIOUS_NOISE_BUDGET = 0.0011


def _callback(variant: str, cfg: dict[str, Any]):
    from lightning_dlac import DLACCallback

    if variant == "default":
        return DLACCallback()
    if variant == "noise":
        return DLACCallback(mode="noise")
    if variant == "noise_recal":  # the noise mode measured again every fifth of the run (drift, issue 33 item 1)
        return DLACCallback(mode="noise", recalibrate_every=cfg["steps"] // 5)
    if variant == "noise_absolute":  # the previous default
        return DLACCallback(mode="noise", noise_budget=PREVIOUS_NOISE_BUDGET, recalibrate_every=0)
    if variant == "homogenization_value":
        return DLACCallback(mode="homogenization", index="value")
    if variant == "sensitivity":
        return DLACCallback(mode="sensitivity", sensitivity_batches=4)
    if variant == "trace":
        return DLACCallback(mode="gradient", calibration_start=cfg["steps"] // 10, recalibrate_every=cfg["steps"] // 5,
                            c=1.0, T=1)
    return DLACCallback(mode=variant)


def _just_calibrated(dlac) -> bool:  # noqa: ANN001
    """Whether ``dlac`` finished a calibration at the batch that just ended (read in ``on_train_batch_end``, after
    the callback's own)."""
    return dlac.calibrator.calibrated_at == dlac.step and bool(dlac.table_stats)


class _Trace(pl.Callback):
    """Every table's gradient sensitivity at the largest candidate, at each calibration of ``dlac``."""

    def __init__(self, dlac) -> None:  # noqa: ANN001
        self.dlac, self.points = dlac, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if _just_calibrated(self.dlac):
            rows = self.dlac.calibration_report()
            self.points.append({"batch": self.dlac.step, "sensitivity": {
                r["table"]: r["gradient_loss_change"][max(r["gradient_loss_change"], key=float)] for r in rows}})


def _run(rank: int, world_size: int, variant: str, cfg: dict[str, Any]) -> dict[str, Any]:  # noqa: C901
    from calibration_data import FairCalibrationDataModule
    from lightning_dlac.examples.dlrm import DLRMModule

    from lightning_dlac import DLACStrategy

    seed = cfg["seed"]
    pl.seed_everything(seed, verbose=False)
    dm = FairCalibrationDataModule(batch_size=cfg["batch_size"], num_train_batches=cfg["steps"] * world_size,
                                   num_val_batches=cfg["val_batches"], seed=seed, **cfg["data"])
    model = DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, feature_names=dm.feature_names,
                       num_dense_features=dm.num_dense_features, embedding_dim=cfg["dim"],
                       dense_arch_layer_sizes=[32, cfg["dim"]], over_arch_layer_sizes=[64, 1],
                       learning_rate=cfg["lr"], seed=seed)
    if variant == "uncompressed":
        strategy = DLACStrategy(compress=False, embedding_lr=cfg["lr"])
    else:
        eps = {"all_tight": 0.01, "all_loose": 0.05}.get(variant, 0.01)
        strategy = DLACStrategy(eps=eps, embedding_lr=cfg["lr"])
    dlac = _callback(variant, cfg) if variant not in BASELINES else None
    meter = _Bytes()
    trace = _Trace(dlac) if variant == "trace" else None
    callbacks = [meter] if dlac is None else [dlac, meter] if trace is None else [dlac, meter, trace]
    trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy, max_epochs=1, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - start
    out = {"variant": variant, "seed": seed, "val_auroc": float(trainer.callback_metrics["val/auroc"]),
           "steps": meter.steps, "seconds": seconds, "sent_bytes": meter.sent, "raw_bytes": meter.raw,
           "roles": dm.table_roles}
    if dlac is not None:
        out.update(classes={k: str(v) for k, v in dlac.classes.items()}, table_bounds=dlac.table_bounds,
                   calibration_s=dlac.calibration_seconds, calibrated_at=dlac.calibrator.calibrated_at,
                   T=dlac.schedule.T, calibration=dlac.calibration_report())
    if trace is not None:
        out["trace"] = trace.points
    return out


class _Bytes(pl.Callback):
    """Forward all-to-all bytes of the training batches (validation's excluded), from the strategy's counters."""

    def __init__(self) -> None:
        self.steps = self.raw = self.sent = 0
        self._start = (0, 0)

    def _now(self, trainer) -> tuple[int, int]:  # noqa: ANN001
        s = trainer.strategy.total_comm_stats()
        return s.raw_bytes, s.sent_bytes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self._start = self._now(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        raw, sent = self._now(trainer)
        self.steps += 1
        self.raw += raw - self._start[0]
        self.sent += sent - self._start[1]


class _Calibrations(pl.Callback):
    """Every calibration of ``dlac`` along the run: the batch it ended at, the bounds it chose and every table's
    statistics (:meth:`TableStats.as_dict`; a recalibrating variant has several: how they drift as the model
    learns)."""

    def __init__(self, dlac) -> None:  # noqa: ANN001
        self.dlac, self.points = dlac, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if _just_calibrated(self.dlac):
            self.points.append({"batch": self.dlac.step, "table_bounds": self.dlac.table_bounds,
                                "stats": {t: s.as_dict() for t, s in self.dlac.table_stats.items()}})


class _Curve(pl.Callback):
    """The validation AUROC at every validation of the run (``val_check_interval``): the learning curve of an arm."""

    def __init__(self) -> None:
        self.points: list[tuple[int, float]] = []

    def on_validation_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        if not trainer.sanity_checking and "val/auroc" in trainer.callback_metrics:
            self.points.append((trainer.global_step, float(trainer.callback_metrics["val/auroc"])))


class _LooseOne(pl.Callback):
    """One table at the loose bound for the whole run, every other at the strategy's eps (the ablation arm)."""

    def __init__(self, table: str) -> None:
        self.table = table

    def on_train_start(self, trainer, pl_module) -> None:  # noqa: ANN001
        trainer.strategy.error_bounds.set_table_bounds({self.table: LOOSE})


def trace_summary(point: dict[str, Any], roles: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Smallest and largest gradient sensitivity (at the largest candidate) of each role at one calibration."""
    out = {}
    for role in ("sensitive", "robust", "irrelevant"):
        values = [v for t, v in point["sensitivity"].items() if roles.get(t) == role]
        if values:
            out[role] = (round(min(values), 3), round(max(values), 3))
    return out


def _judge(runs: dict[str, dict[str, Any]], variant: str) -> dict[str, Any]:
    """One seed's figures of a calibrated ``variant`` against that seed's baselines."""
    from calibration_data import precision_recall

    r, ref, tight = runs[variant], runs["uncompressed"], runs["all_tight"]
    precision, recall, loose = precision_recall(r["classes"], r["roles"])
    return {"precision": precision, "recall": recall, "robust_loose_share": loose,
            "auroc_delta": r["val_auroc"] - ref["val_auroc"],
            "bytes_vs_all_tight": r["sent_bytes"] / tight["sent_bytes"] if tight["sent_bytes"] else None,
            "calibration_share": r["calibration_s"] / r["seconds"] if r["seconds"] else None,
            "counts": {c: sum(1 for v in r["classes"].values() if v == c) for c in ("tight", "base", "loose")},
            "calibrated_at": r["calibrated_at"], "T": r["T"]}


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(per_seed: list[dict[str, Any]], variants: tuple[str, ...]) -> dict[str, Any]:
    """Means over seeds of every judged figure, and the baselines' AUROC losses with their spread."""
    out: dict[str, Any] = {}
    for base in ("all_tight", "all_loose"):
        deltas = [s[base]["auroc_delta"] for s in per_seed]
        out[base] = {"auroc_delta": _mean(deltas), "sd": _sd(deltas), "per_seed": deltas}
    judged = {v: [s[v] for s in per_seed if v in s] for v in variants if v not in BASELINES}
    for v, rows in judged.items():
        keys = ("precision", "recall", "robust_loose_share", "auroc_delta", "bytes_vs_all_tight", "calibration_share")
        out[v] = {k: _mean([row[k] for row in rows]) for k in keys}
        out[v]["auroc_delta_sd"] = _sd([row["auroc_delta"] for row in rows])
    loose = out["all_loose"]
    out["set_is_informative"] = bool(
        -loose["auroc_delta"] >= TARGETS["all_loose_loss"] and -loose["auroc_delta"] > 3 * loose["sd"]
        and -out["all_tight"]["auroc_delta"] < TARGETS["all_tight_loss"])
    if "default" in out:
        d = out["default"]
        out["default_meets_targets"] = bool(
            d["precision"] >= TARGETS["precision"] and d["recall"] >= TARGETS["recall"]
            and d["robust_loose_share"] >= TARGETS["robust_loose_share"] and d["auroc_delta"] >= TARGETS["auroc_delta"]
            and d["bytes_vs_all_tight"] <= TARGETS["bytes_vs_all_tight"]
            and d["calibration_share"] <= TARGETS["calibration_share"])
    return out


def table(summary: dict[str, Any], variants: tuple[str, ...]) -> list[str]:
    """The summary as a markdown table (one row per calibrated variant, then the baselines)."""
    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["| variant | precision | recall | robust/irrelevant loose | AUROC delta (sd) | bytes vs all-tight |"
             " calibration share |", "|---|---|---|---|---|---|---|"]
    for v in variants:
        if v in BASELINES:
            continue
        s = summary[v]
        lines.append(f"| {v} | {f(s['precision'], '.2f')} | {f(s['recall'], '.2f')} |"
                     f" {f(s['robust_loose_share'], '.2f')} | {s['auroc_delta']:+.4f} ({s['auroc_delta_sd']:.4f}) |"
                     f" {f(s['bytes_vs_all_tight'], '.2f')} | {f(s['calibration_share'], '.1%')} |")
    for base in ("all_tight", "all_loose"):
        s = summary[base]
        lines.append(f"| {base} | | | | {s['auroc_delta']:+.4f} ({s['sd']:.4f}) | | |")
    return lines


# ------------------------------------------------------------------------------------------- the family of worlds

WORLD_VARIANTS = (*BASELINES, "default", "gradient", "noise", "noise_recal", "noise_absolute")
# The default (noise mode since issue 33) against the former default, the gradient mode; "noise" (the default's mode
# spelled out) and "noise_recal" on request (--variants).
DEFAULT_WORLD_VARIANTS = (*BASELINES, "default", "gradient")
WORLD_NOISE = 0.001  # AUROC: the within-tight margin of issue 33, and what "beyond noise" means for worse-than-loose
LOOSE = 0.05  # a table at a bound below it is flagged
# The protocol of a world (measured on development worlds, module docstring): training batches per rank, the learning
# rate and how many training seeds every arm runs under (paired). --quick's 2 seeds keep 3 worlds within 15 minutes.
WORLD_FULL = dict(steps=1000, lr=0.015, train_seeds=5)
WORLD_QUICK = dict(steps=400, lr=0.015, train_seeds=2)
# --settle: every arm trains until its validation AUROC has settled, not for a fixed number of steps. It is validated
# every SETTLE_EVERY batches and stops at the first validation that gains less than SETTLE_DELTA over the one before
# (Lightning's EarlyStopping, patience 1), or at SETTLE_MAX batches, where the arm counts as unsettled. SETTLE_DELTA is
# half the 0.001 judged, so that where an arm stops, a delay of a whole validation interval moves it by less than the
# margin; SETTLE_MAX bounds the cost (a world's arm is then a few minutes on two cores). Neither was fitted to results.
SETTLE_EVERY, SETTLE_DELTA, SETTLE_MAX = 500, 0.0005, 6000


def training_seed(world: int, train_seed: int) -> int:
    """The seed of the model's initial weights (and of Lightning's global seed) for one training seed of a world:
    the world's own seed for training seed 0 (the runs before training seeds existed), another per training seed."""
    from lightning_dlac.examples.base import stream_seed

    return world if train_seed == 0 else stream_seed(world, 3, train_seed) % (1 << 31)


def run_world(rank: int, world_size: int, variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from calibration_data import WorldDataModule, draw_world
    from lightning_dlac.examples.dlrm import DLRMModule

    from lightning_dlac import DLACStrategy

    world = draw_world(cfg["world"])
    train_seed = cfg.get("train_seed", 0)
    init = training_seed(world.seed, train_seed)
    pl.seed_everything(init, verbose=False)
    dm = WorldDataModule(world, num_train_batches=cfg["steps"] * world_size, num_val_batches=cfg["val_batches"],
                         train_seed=train_seed)
    model = DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, feature_names=dm.feature_names,
                       num_dense_features=dm.num_dense_features, embedding_dim=world.dim,
                       dense_arch_layer_sizes=[32, world.dim], over_arch_layer_sizes=[64, 1],
                       learning_rate=cfg["lr"], seed=init)
    qcomm = _qcomm_codecs(variant)  # TorchRec's codecs in its own sharder, counted (benchmarks/frontier_worlds.py)
    if variant == "uncompressed" or qcomm is not None:
        strategy = DLACStrategy(compress=False, embedding_lr=cfg["lr"])
    else:
        eps = float(variant.removeprefix(CONSTANT_PREFIX)) if variant.startswith(CONSTANT_PREFIX) else \
            {"all_tight": 0.01, "all_loose": LOOSE}.get(variant, 0.01)
        strategy = DLACStrategy(eps=eps, embedding_lr=cfg["lr"])
    ablated = variant.removeprefix(ABLATE_PREFIX) if variant.startswith(ABLATE_PREFIX) else None
    constant = variant in BASELINES or variant.startswith((CONSTANT_PREFIX, QCOMM_PREFIX))
    dlac = _callback(variant, cfg) if not constant and ablated is None else None
    meter, curve = _Bytes(), _Curve()
    calibrations = None if dlac is None else _Calibrations(dlac)
    callbacks = [meter, curve] + ([] if dlac is None else [dlac, calibrations]) + \
        ([] if ablated is None else [_LooseOne(ablated)])
    traffic = None
    if cfg.get("traffic"):  # both directions, in adaptive_accuracy's accounting, for the frontier against qcomm
        from adaptive_accuracy import TrafficMeter

        dims = {c.name: c.embedding_dim for c in model.embedding_bag_collection.embedding_bag_configs()}
        traffic = TrafficMeter(qcomm, dims if variant == "uncompressed" else None)
        callbacks.append(traffic)
    settle = None
    if cfg.get("settle"):
        from lightning.pytorch.callbacks import EarlyStopping

        settle = EarlyStopping(monitor="val/auroc", mode="max", min_delta=cfg.get("settle_delta", SETTLE_DELTA),
                               patience=1)
        callbacks.append(settle)
    trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy, max_epochs=1,
                         callbacks=callbacks, logger=False, val_check_interval=cfg.get("val_every"),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    out = {"variant": variant, "world": world.seed, "train_seed": train_seed,
           "val_auroc": float(trainer.callback_metrics["val/auroc"]), "steps": meter.steps,
           "seconds": time.perf_counter() - start, "sent_bytes": meter.sent,
           "raw_bytes": meter.raw, "roles": dm.table_roles}
    if traffic is not None:
        out.update(fwd_raw_bytes=traffic.raw, fwd_sent_bytes=traffic.sent, bwd_raw_bytes=traffic.bwd_raw,
                   bwd_sent_bytes=traffic.bwd_sent)
    if cfg.get("val_every"):
        out["curve"] = curve.points
    if settle is not None:
        out["settled"] = bool(trainer.should_stop) and meter.steps < cfg["steps"]
    if dlac is not None:
        out.update(table_bounds=dlac.table_bounds, calibrated_at=dlac.calibrator.calibrated_at,
                   calibration_s=dlac.calibration_seconds,
                   noise_share={r["table"]: r["noise_share"] for r in dlac.calibration_report()},
                   calibrations=calibrations.points)
    return out


def run_arms(cfg: dict[str, Any], world: int, variants: Sequence[str], train_seeds: Sequence[int],
             timeout: float, given: dict[int, dict[str, dict[str, Any]]] | None = None,
             after_each: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, dict[str, Any]]]:
    """Every arm (``variants``) of one world under each of ``train_seeds``, paired: per training seed, the result of
    each arm by its name, printed as it comes (and handed to ``after_each``). Arms in ``given[train_seed]`` (runs of
    an earlier file, see :func:`reused_baselines`) are taken from there instead of run."""
    by_seed = []
    for train_seed in train_seeds:
        by_variant = dict((given or {}).get(train_seed, {}))
        for variant in variants:
            if variant in by_variant:
                continue
            r = run_ranks(run_world, 2, variant, dict(cfg, world=world, train_seed=train_seed), timeout=timeout)[0]
            by_variant[variant] = r
            print(f"  seed {train_seed} {variant}: val AUROC {r['val_auroc']:.4f},"
                  f" {r['sent_bytes'] / max(r['steps'], 1):.0f} bytes/step, {r['seconds']:.0f} s", flush=True)
            if after_each is not None:
                after_each(r)
        by_seed.append(by_variant)
    return by_seed


# The per-table ablation (issue 33 item 2: "a table counts as sensitive when a loose bound on it alone costs >= 0.001
# AUROC"): arm "loose:<table>" runs that table at LOOSE and every other at 0.01, under the world's paired seeds.
ABLATE_PREFIX = "loose:"


def judge_ablation(by_seed: list[dict[str, dict[str, Any]]], roles: dict[str, str]) -> dict[str, Any]:
    """Per table, the mean paired AUROC difference of its ablation arm to all-tight, whether it costs at least
    WORLD_NOISE (sensitive by ablation) and whether that cost is beyond the world's floor (FLOOR_Z standard errors of
    a mean of paired differences, the spread pooled over every ablation arm and all-loose); then the planted roles
    against it: the tables where planted-sensitive and sensitive-by-ablation disagree."""
    arms = [v for v in by_seed[0] if v.startswith(ABLATE_PREFIX)] + ["all_loose"]
    diffs = {v: [runs[v]["val_auroc"] - runs["all_tight"]["val_auroc"] for runs in by_seed] for v in arms}
    squares = sum(sum((d - statistics.fmean(ds)) ** 2 for d in ds) for ds in diffs.values())
    dof = sum(len(ds) - 1 for ds in diffs.values())
    floor = FLOOR_Z * math.sqrt(squares / dof) / math.sqrt(len(by_seed)) if dof > 0 else None
    tables = []
    for v in arms[:-1]:
        table = v.removeprefix(ABLATE_PREFIX)
        cost = -statistics.fmean(diffs[v])
        tables.append({"table": table, "role": roles[table], "cost": cost, "per_seed": diffs[v],
                       "sensitive_by_ablation": cost >= WORLD_NOISE,
                       "beyond_floor": None if floor is None else cost > floor})
    disagree = [t["table"] for t in tables if (t["role"] == "sensitive") != t["sensitive_by_ablation"]]
    out = {"floor": floor, "train_seeds": len(by_seed), "all_loose_cost": -statistics.fmean(diffs["all_loose"]),
           "tables": tables, "disagreements": disagree}
    if all("default" in runs for runs in by_seed):
        out["default"] = judge_default_by_ablation(by_seed, tables)
    return out


def judge_default_by_ablation(by_seed: list[dict[str, dict[str, Any]]],
                              tables: list[dict[str, Any]]) -> dict[str, Any]:
    """The default's flags (bound below LOOSE) in the ablation's own runs, per seed, counted against both yardsticks:
    the tables the ablation finds sensitive (the issue's definition) and the planted sensitive ones; recall and
    precision pool over the seeds, as on the family."""
    by_ablation = {t["table"] for t in tables if t["sensitive_by_ablation"]}
    planted = {t["table"] for t in tables if t["role"] == "sensitive"}
    flags = [flagged_tables(runs["default"]) for runs in by_seed]

    def against(sensitive: set[str]) -> dict[str, Any]:
        hits = sum(len(f & sensitive) for f in flags)
        flagged, wanted = sum(len(f) for f in flags), len(sensitive) * len(flags)
        return {"recall": hits / wanted if wanted else None, "precision": hits / flagged if flagged else None}

    return {"flagged": [sorted(f) for f in flags], "ablation": against(by_ablation), "planted": against(planted),
            "auroc_vs_all_tight": statistics.fmean(runs["default"]["val_auroc"] - runs["all_tight"]["val_auroc"]
                                                   for runs in by_seed),
            "bytes_vs_all_tight": _mean_or_none(bytes_per_step_ratio(runs["default"], runs["all_tight"])
                                                for runs in by_seed)}


def _mean_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def main_ablation(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--ablate WORLD``: every table of one world loose alone, against all-tight and all-loose, and the default
    beside them, paired seeds. An evaluation world is ablated only to judge: the default's constants were fixed on
    development worlds before any evaluation world was run."""
    from calibration_data import DEV_WORLDS, EVAL_WORLDS, draw_world

    if args.ablate not in DEV_WORLDS and args.ablate not in EVAL_WORLDS:
        raise SystemExit(f"--ablate {args.ablate}: not a world of the family; give a development world"
                         f" ({DEV_WORLDS[0]}-{DEV_WORLDS[-1]}) or an evaluation world"
                         f" ({EVAL_WORLDS[0]}-{EVAL_WORLDS[-1]})")
    world = draw_world(args.ablate)
    tables = [f"t_f{i}" for i in range(len(world.tables))]
    cfg = dict(worlds="dev" if args.ablate in DEV_WORLDS else "eval", seeds=[args.ablate],
               steps=args.steps or WORLD_FULL["steps"], val_batches=args.val_batches, lr=args.lr or WORLD_FULL["lr"],
               train_seeds=args.train_seeds or 2, default_rule=default_rule(),
               variants=["all_tight", "all_loose", "default", *(ABLATE_PREFIX + t for t in tables)], floor_z=FLOOR_Z)
    if args.settle:  # every arm to its settled AUROC, as the evaluation worlds are judged
        cfg.update(settle=True, steps=args.steps or SETTLE_MAX, val_every=args.val_every or SETTLE_EVERY,
                   settle_delta=SETTLE_DELTA)
    print(f"world {args.ablate}: {world.summary()}", flush=True)
    # A settled ablation is tens of launches: every one is written as it ends (the file says it is incomplete), and
    # --resume runs only the arms such a file lacks.
    done: list[dict[str, Any]] = []
    if args.resume and args.json_out.exists():
        old = load_results(args.json_out)
        if old["config"] != json.loads(json.dumps(cfg, default=str)):
            raise SystemExit(f"--resume: {args.json_out} was written under another configuration; rerun with the"
                             " same options or choose another --json-out")
        done = list(old["results"])
        _record_resumed(metadata, old["metadata"])
        print(f"resuming: {len(done)} arm(s) already in {args.json_out}", flush=True)
    given: dict[int, dict[str, dict[str, Any]]] = {}
    for r in done:
        given.setdefault(r["train_seed"], {})[r["variant"]] = r

    def written(r: dict[str, Any]) -> None:
        done.append(r)
        write_results(args.json_out, metadata, cfg, done, incomplete=True, spec=world.summary())

    by_seed = run_arms(cfg, args.ablate, cfg["variants"], range(cfg["train_seeds"]), args.timeout, given=given,
                       after_each=written)
    runs = [r for by_variant in by_seed for r in by_variant.values()]
    ablation = judge_ablation(by_seed, runs[0]["roles"])
    for t in ablation["tables"]:
        print(f"  {t['table']} ({t['role']}): loose alone costs {t['cost']:+.4f} AUROC", flush=True)
    print(f"floor {ablation['floor']}; planted roles that disagree with the ablation: {ablation['disagreements']}")
    if "default" in ablation:
        d = ablation["default"]
        print(f"default: flagged {d['flagged']}; recall/precision against the ablation {d['ablation']},"
              f" against the planted roles {d['planted']}; {d['auroc_vs_all_tight']:+.4f} AUROC vs all-tight")
    write_results(args.json_out, metadata, cfg, runs, ablation=ablation, spec=world.summary())
    print(f"\nwrote {args.json_out}")


# How chaotic one world's training is (--perturb): arm "constant:<eps>" runs every table at that bound.
CONSTANT_PREFIX = "constant:"
PERTURB_EPS = (0.0099, 0.01, 0.0101)  # all-tight's bound and one percent either side
# Arm "qcomm:<label>" sends the forward and backward all-to-all through TorchRec's codecs of that label of
# benchmarks/e2e_bandwidth.py ("qcomm:INT8/FP16", ...), uncompressed by DLAC (benchmarks/frontier_worlds.py).
QCOMM_PREFIX = "qcomm:"


def _qcomm_codecs(variant: str) -> Any:
    """For a ``qcomm:<label>`` arm, install TorchRec's codecs of that label in this process's sharder and return
    their byte-counting wrappers (forward, backward); None for any other arm."""
    if not variant.startswith(QCOMM_PREFIX):
        return None
    from adaptive_accuracy import install_qcomm, qcomm_variant

    label = "qcomm " + variant.removeprefix(QCOMM_PREFIX)
    qcomm = qcomm_variant(label)
    if qcomm is None:
        raise ValueError(f"{variant}: {label!r} is not a qcomm variant of benchmarks/e2e_bandwidth.py")
    return install_qcomm(qcomm)


def main_perturb(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--perturb WORLD:SEED``: one training seed of one world, uncompressed and with every table at all-tight's
    bound and at one percent either side of it. A difference between arms that a one-percent change of a constant
    bound reproduces is the trajectory's, not the bound's: it measures what a world's floor is made of. It judges
    and chooses nothing, so it may run on any world of either split."""
    from calibration_data import DEV_WORLDS, draw_world

    world_seed, _, train_seed = args.perturb.partition(":")
    world, train_seed = int(world_seed), int(train_seed or 0)
    cfg = dict(worlds="dev" if world in DEV_WORLDS else "eval", seeds=[world], steps=args.steps or WORLD_FULL["steps"],
               val_batches=args.val_batches, lr=args.lr or WORLD_FULL["lr"], train_seed=train_seed,
               variants=["uncompressed", *(CONSTANT_PREFIX + f"{e:g}" for e in PERTURB_EPS)])
    print(f"world {world}, training seed {train_seed}: {draw_world(world).summary()}", flush=True)
    runs = list(run_arms(cfg, world, cfg["variants"], [train_seed], args.timeout)[0].values())
    constants = [{"eps": float(r["variant"].removeprefix(CONSTANT_PREFIX)), "val_auroc": r["val_auroc"]}
                 for r in runs if r["variant"].startswith(CONSTANT_PREFIX)]
    aurocs = [c["val_auroc"] for c in constants]
    perturb = {"world": world, "train_seed": train_seed, "uncompressed": runs[0]["val_auroc"],
               "constants": constants, "spread": max(aurocs) - min(aurocs)}
    print(f"spread of the constant bounds' AUROC: {perturb['spread']:.4f}")
    write_results(args.json_out, metadata, cfg, runs, perturb=perturb)
    print(f"\nwrote {args.json_out}")


CURVE_VARIANTS = ("uncompressed", "all_tight")


def curve_summary(by_variant: dict[str, dict[str, Any]], reference: str) -> dict[str, Any]:
    """The learning curves of one world's arms under one training seed: each arm's validation AUROC at every
    validation step they share, each arm's difference from ``reference`` there, and each arm's gain over the last
    tenth of the run (how far from settled it still was when the run ended)."""
    steps = sorted(set.intersection(*(set(s for s, _ in r["curve"]) for r in by_variant.values())))
    auroc = {v: [dict(r["curve"])[s] for s in steps] for v, r in by_variant.items()}
    ref = auroc[reference]
    late = next((i for i, s in enumerate(steps) if s >= 0.9 * steps[-1]), len(steps) - 1) if steps else 0
    return {"steps": steps, "auroc": auroc,
            "difference": {v: [a - b for a, b in zip(series, ref)] for v, series in auroc.items() if v != reference},
            "last_tenth_gain": {v: series[-1] - series[max(late - 1, 0)] for v, series in auroc.items() if series}}


def main_curves(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--curves WORLD:SEED,...``: the arms of each (world, training seed) with the validation AUROC taken every
    ``--val-every`` steps: where along the run the arms part and whether they have settled by its end. It judges and
    chooses nothing by itself; a protocol chosen from it is chosen on development worlds only."""
    from calibration_data import DEV_WORLDS, draw_world

    pairs = [tuple(int(x) for x in item.split(":")) if ":" in item else (int(item), 0)
             for item in args.curves.split(",")]
    variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else CURVE_VARIANTS
    unknown = [v for v in variants if v not in WORLD_VARIANTS and not v.startswith(CONSTANT_PREFIX)]
    if unknown:
        raise SystemExit(f"--variants {unknown} with --curves: choose from {list(WORLD_VARIANTS)} or"
                         f" '{CONSTANT_PREFIX}<eps>'")
    steps = args.steps or WORLD_FULL["steps"]
    cfg = dict(seeds=[w for w, _ in pairs], train_seeds_of=[t for _, t in pairs], steps=steps,
               val_batches=args.val_batches, lr=args.lr or WORLD_FULL["lr"],
               val_every=args.val_every or max(1, steps // 10), variants=list(variants))
    runs, curves = [], []
    for world, train_seed in pairs:
        split = "dev" if world in DEV_WORLDS else "eval"
        print(f"world {world} ({split}), training seed {train_seed}: {draw_world(world).summary()}", flush=True)
        by_variant = run_arms(cfg, world, variants, [train_seed], args.timeout)[0]
        runs += list(by_variant.values())
        summary = curve_summary(by_variant, variants[0])
        curves.append({"world": world, "split": split, "train_seed": train_seed, **summary})
        for v, series in summary["auroc"].items():
            print(f"  {v:>14}: " + " ".join(f"{a:.3f}" for a in series), flush=True)
        write_results(args.json_out, metadata, cfg, runs, reference=variants[0], curves=curves)
    print(f"\nwrote {args.json_out}")


FIT_QUANTILE = 0.9  # the p90 rule of fit_noise_budget


def fit_noise_budget(runs: list[dict[str, Any]], eps: str = "0.05") -> dict[str, Any]:
    """The noise budget from development worlds' noise-mode runs (the p90 rule): per world, the summed noise share
    at the loose bound ``eps`` of the tables whose label effect is not sensitive (robust and irrelevant); the budget
    is the FIT_QUANTILE quantile (nearest rank) of those sums over worlds, so that on that share of development
    worlds every such table fits loose in it, and a sensitive table's larger share does not."""
    per_world = []
    for r in runs:
        shares = {t: s[eps] for t, s in (r.get("noise_share") or {}).items() if s}
        by_role: dict[str, list[float]] = {}
        for t, v in shares.items():
            by_role.setdefault(r["roles"][t], []).append(v)
        per_world.append({"world": r["world"], "others_loose": sum(v for t, v in shares.items()
                                                                   if r["roles"][t] != "sensitive"),
                          "by_role": {k: sorted(v) for k, v in by_role.items()}})
    sums = sorted(w["others_loose"] for w in per_world)
    rank = max(0, min(len(sums) - 1, math.ceil(FIT_QUANTILE * len(sums)) - 1))
    return {"noise_budget": sums[rank] if sums else None, "quantile": FIT_QUANTILE, "at_eps": float(eps),
            "worlds": [r["world"] for r in runs], "per_world": per_world}


DRIFT_FRACTIONS = (0.05, 0.1, 0.2)  # the default's noise_fraction and either side of it


def _auc(positive: Sequence[float], negative: Sequence[float]) -> float | None:
    """The probability that a positive value exceeds a negative one (ties count half); None without both."""
    if not positive or not negative:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def drift_check(runs: list[dict[str, Any]], eps: float = LOOSE) -> dict[str, Any]:
    """What the default's calibrations see on development worlds (``--drift``: one run per world, every calibration
    recorded): per calibration (by its index along the run), how well the noise share at ``eps`` orders the planted
    sensitive tables above the others within each world (median AUC over worlds), how far the level of the other
    tables' summed shares moves from world to world (its median and ninth decile), and which tables a budget would
    flag there: relative ones (DRIFT_FRACTIONS of the all-loose noise) and the absolute one the previous default used
    (PREVIOUS_NOISE_BUDGET), with recall and precision pooled over worlds and the median bytes against every table at
    0.01. Development data: it shows what the default's rule does where it may be developed, not how it is judged."""
    from lightning_dlac.adaptive import TableStats, noise_table_bounds, relative_noise_budget

    budgets = {f"fraction {f:g}": f for f in DRIFT_FRACTIONS} | {f"absolute {PREVIOUS_NOISE_BUDGET:g}": None}
    count = min(len(r["calibrations"]) for r in runs)
    points = []
    for k in range(count):
        aucs, sums, tallies = [], [], {name: [0, 0, 0, []] for name in budgets}
        for r in runs:
            stats = {t: TableStats.from_dict(d) for t, d in r["calibrations"][k]["stats"].items()}
            shares = {t: s.noise_share() for t, s in stats.items()}
            sensitive = {t for t, role in r["roles"].items() if role == "sensitive"}
            aucs.append(_auc([v[eps] for t, v in shares.items() if v and t in sensitive],
                             [v[eps] for t, v in shares.items() if v and t not in sensitive]))
            sums.append(sum(v[eps] for t, v in shares.items() if v and t not in sensitive))
            at = {c: i for i, c in enumerate(next(iter(stats.values())).candidates)}
            tight = sum(s.encoded_bytes[at[0.01]] for s in stats.values())
            for name, fraction in budgets.items():
                budget = PREVIOUS_NOISE_BUDGET if fraction is None else relative_noise_budget(stats, fraction)
                bounds = noise_table_bounds(stats, budget) if budget else {}
                flagged = {t for t, b in bounds.items() if b < eps}
                tally = tallies[name]
                tally[0] += len(flagged & sensitive)
                tally[1] += len(flagged)
                tally[2] += len(sensitive)
                tally[3].append(sum(stats[t].encoded_bytes[at[b]] for t, b in bounds.items()) / tight)
        ordered = sorted(sums)
        known = [a for a in aucs if a is not None]
        points.append({"batch": statistics.median(r["calibrations"][k]["batch"] for r in runs),
                       "auc_median": statistics.median(known) if known else None,
                       "auc_min": min(known) if known else None,
                       "others_sum_median": statistics.median(ordered),
                       "others_sum_p90": ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)],
                       "budgets": {name: {"recall": tp / n if n else None, "precision": tp / f if f else None,
                                          "bytes_vs_tight": statistics.median(b)}
                                   for name, (tp, f, n, b) in tallies.items()}})
    return {"eps": eps, "worlds": [r["world"] for r in runs], "calibrations": points}


def bytes_per_step_ratio(r: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """``r``'s forward bytes per training batch over ``reference``'s: per batch, because settled arms (``--settle``)
    stop after different numbers of batches, and their totals would count the length as well as the bounds."""
    if not reference["sent_bytes"] or not r["steps"] or not reference["steps"]:
        return None
    return (r["sent_bytes"] / r["steps"]) / (reference["sent_bytes"] / reference["steps"])


def flagged_tables(run: dict[str, Any]) -> set[str]:
    """The tables a calibrated run flagged: those whose bound ended below LOOSE."""
    return {t for t, eps in (run.get("table_bounds") or {}).items() if eps < LOOSE}


def judge_world(runs: dict[str, dict[str, Any]], variant: str) -> dict[str, Any]:
    """One world's figures of a calibrated ``variant`` under one training seed: its AUROC against all-tight and
    all-loose, its bytes per batch against all-tight's, and its flagged tables (bound below LOOSE) against the
    planted sensitive ones."""
    r, tight, loose = runs[variant], runs["all_tight"], runs["all_loose"]
    flagged = flagged_tables(r)
    sensitive = {t for t, role in r["roles"].items() if role == "sensitive"}
    return {"auroc_vs_all_tight": r["val_auroc"] - tight["val_auroc"],
            "auroc_vs_all_loose": r["val_auroc"] - loose["val_auroc"],
            "auroc_vs_uncompressed": r["val_auroc"] - runs["uncompressed"]["val_auroc"],
            "bytes_vs_all_tight": bytes_per_step_ratio(r, tight),
            "flagged": sorted(flagged), "true_positives": len(flagged & sensitive), "flagged_count": len(flagged),
            "sensitive_count": len(sensitive), "calibrated": bool(r.get("table_bounds"))}


# The noise floor of a world (issue 33's "within noise"): every arm of a world runs under the same training seeds,
# each seed fixing the model's initial weights and the draw and order of the training batches, so an arm's AUROC
# difference to another is taken per seed (paired) and averaged over seeds. How far such a mean moves by chance is
# read from the spread of the paired differences themselves: the floor is FLOOR_Z standard errors of a mean of
# paired differences, the standard deviation pooled over the world's comparisons (every arm against all-tight),
# each about its own mean, so that a real difference between arms does not count as noise.
FLOOR_Z = 2.0
FLOOR_COMPARISONS = ("uncompressed", "all_loose", "default", "gradient", "noise")  # each against all-tight, per seed


def at_step(by_seed: list[dict[str, dict[str, Any]]], step: int) -> list[dict[str, dict[str, Any]]]:
    """``by_seed`` with every arm's AUROC read from its learning curve at ``step`` (where it stopped, if earlier: a
    settled arm has stopped moving): the same runs judged as a fixed run of ``step`` batches would be."""
    def read(r: dict[str, Any]) -> float:
        before = [a for s, a in r["curve"] if s <= step]
        return before[-1] if before else r["val_auroc"]

    return [{v: dict(r, val_auroc=read(r)) for v, r in runs.items()} for runs in by_seed]


def noise_floor(by_seed: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The noise floor of one world from its runs under several training seeds (``by_seed[k][variant]``, every
    variant under seed ``k``): the paired AUROC differences of every arm in FLOOR_COMPARISONS against all-tight per
    seed, their pooled standard deviation (each comparison about its own mean) and the floor, FLOOR_Z standard
    errors of a mean over the seeds. With one seed there is no spread to read: the floor is None."""
    diffs = {v: [runs[v]["val_auroc"] - runs["all_tight"]["val_auroc"] for runs in by_seed]
             for v in FLOOR_COMPARISONS if all(v in runs for runs in by_seed)}
    squares = sum(sum((d - statistics.fmean(ds)) ** 2 for d in ds) for ds in diffs.values())
    dof = sum(len(ds) - 1 for ds in diffs.values())
    sd = math.sqrt(squares / dof) if dof > 0 else None
    seeds = len(by_seed)
    return {"train_seeds": seeds, "paired_sd": sd, "floor": None if sd is None else FLOOR_Z * sd / math.sqrt(seeds),
            "z": FLOOR_Z, "paired_differences": diffs}


def judge_world_seeds(by_seed: list[dict[str, dict[str, Any]]], variant: str,
                      floor: float | None = None) -> dict[str, Any]:
    """A calibrated ``variant``'s figures on one world over its training seeds (``by_seed[k][variant]``): the AUROC
    differences are the means over seeds of the paired (same-seed) differences, the bytes the mean ratio; flagged
    tables are counted under every seed (so recall and precision pool over seeds too); the median of the paired
    differences to all-tight is kept beside their mean. ``within_noise`` says, per
    AUROC comparison, whether the mean difference is within the world's ``floor`` (None without one)."""
    per_seed = [judge_world(runs, variant) for runs in by_seed]
    out = {k: statistics.fmean(r[k] for r in per_seed)
           for k in ("auroc_vs_all_tight", "auroc_vs_all_loose", "auroc_vs_uncompressed")}
    out.update({"bytes_vs_all_tight": _mean_or_none(r["bytes_vs_all_tight"] for r in per_seed),
                "flagged": sorted({t for r in per_seed for t in r["flagged"]}),
                **{k: sum(r[k] for r in per_seed) for k in ("true_positives", "flagged_count", "sensitive_count")},
                "calibrated": all(r["calibrated"] for r in per_seed),
                "auroc_vs_all_tight_per_seed": [r["auroc_vs_all_tight"] for r in per_seed],
                # A seed whose arms part into different states moves the mean by far more than the median.
                "auroc_vs_all_tight_median": statistics.median(r["auroc_vs_all_tight"] for r in per_seed),
                "within_noise": None if floor is None else {
                    k: abs(out[k]) <= floor for k in ("auroc_vs_all_tight", "auroc_vs_all_loose",
                                                       "auroc_vs_uncompressed")}})
    return out


def summarize_worlds(per_world: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    """The issue's summary of ``variant`` over worlds (recall and precision pooled over worlds), and, where the
    worlds carry a noise floor, the same two AUROC judgements with each world's margin widened to its floor when
    that is larger than WORLD_NOISE, and how many worlds' floors are within WORLD_NOISE (where a 0.001 difference can
    be told from noise at all)."""
    rows = [w[variant] for w in per_world]
    tp, flagged, sensitive = (sum(r[k] for r in rows) for k in ("true_positives", "flagged_count", "sensitive_count"))
    ratios = [r["bytes_vs_all_tight"] for r in rows if r["bytes_vs_all_tight"] is not None]
    out = {"worlds": len(rows),
           "default_within_0001_of_all_tight": sum(r["auroc_vs_all_tight"] >= -WORLD_NOISE for r in rows) / len(rows),
           "worse_than_all_loose": sum(r["auroc_vs_all_loose"] < -WORLD_NOISE for r in rows),
           "recall": tp / sensitive if sensitive else None, "precision": tp / flagged if flagged else None,
           "bytes_vs_all_tight": statistics.median(ratios) if ratios else None}
    floors = [(w.get("noise_floor") or {}).get("floor") for w in per_world]
    if all(f is not None for f in floors):
        margins = [max(WORLD_NOISE, f) for f in floors]
        out.update({"noise_floor_median": statistics.median(floors),
                    "worlds_floor_within_0001": sum(f <= WORLD_NOISE for f in floors),
                    "within_floor_of_all_tight": sum(r["auroc_vs_all_tight"] >= -m
                                                     for r, m in zip(rows, margins)) / len(rows),
                    "worse_than_all_loose_beyond_floor": sum(r["auroc_vs_all_loose"] < -m
                                                             for r, m in zip(rows, margins))})
    return out


def _record_resumed(metadata: dict[str, Any], earlier: dict[str, Any], **part: Any) -> None:
    """Record under ``metadata["resumed_from"]`` the parts an earlier file's run (``earlier``: its metadata) was
    made of, then that run itself (its command, commit, dates, processor and ``part``)."""
    metadata["resumed_from"] = [*earlier.get("resumed_from", []),
                                {k: earlier.get(k) for k in ("command", "git_commit", "date", "finished", "wall_s",
                                                             "cpu")} | part]


def config_differs(old: dict[str, Any], cfg: dict[str, Any], may_grow: tuple[str, ...] = ()) -> list[str]:
    """The options an earlier run's configuration ``old`` holds otherwise than this run's ``cfg``, for ``--resume``:
    the worlds (``seeds``) may differ, and a count named in ``may_grow`` may be larger in this run (never smaller)."""
    grown = {k for k in may_grow if isinstance(old.get(k), int) and isinstance(cfg.get(k), int) and old[k] <= cfg[k]}
    return sorted(k for k in (set(cfg) | set(old)) - {"seeds", "seeds_planned", "train_seeds_planned", *grown}
                  if old.get(k) != cfg.get(k))


def resumed_worlds(path: Path, cfg: dict[str, Any], metadata: dict[str, Any],
                   may_grow: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The worlds (and their arms' runs) that an earlier run of the same protocol wrote to ``path``, for ``--resume``:
    a run of many hours continues where it stopped instead of starting again. The earlier file must hold the same
    configuration but for its worlds, and only worlds this run plans; ``metadata`` records each earlier part's
    command, commit and dates under ``resumed_from``. A count named in ``may_grow`` (``train_seeds``) may be larger
    in this run than in the file: the caller runs what the file lacks (never smaller: runs would be dropped)."""
    if not path.exists():
        return [], []
    old = load_results(path)
    differ = config_differs(old["config"], cfg, may_grow)
    if differ:
        raise SystemExit(f"--resume: {path} was written under another configuration ({', '.join(differ)} differ);"
                         " rerun with the same options or choose another --json-out")
    per_world = old.get("per_world") or []
    foreign = sorted({w["world"] for w in per_world} - set(cfg["seeds"]))
    if foreign:
        raise SystemExit(f"--resume: {path} holds worlds {foreign} this run does not plan; widen --first/--count")
    _record_resumed(metadata, old["metadata"], worlds=[w["world"] for w in per_world],
                    **{k: old["config"][k] for k in ("train_seeds", "train_seeds_planned") if k in old["config"]})
    print(f"resuming: {len(per_world)} world(s) already in {path}: {[w['world'] for w in per_world]}", flush=True)
    return per_world, list(old["results"])


def reused_baselines(path: Path, cfg: dict[str, Any],
                     metadata: dict[str, Any]) -> dict[int, dict[int, dict[str, dict[str, Any]]]]:
    """The baseline arms (BASELINES) of every world and training seed that an earlier ``--worlds`` run of the same
    protocol wrote to ``path``, for ``--baselines-from``: judging a new calibrated variant then runs only that
    variant, a quarter of a world's arms. Every launch is deterministic given its world, training seed and options
    (the same seed gives the same AUROC to the last digit), so a baseline arm of the earlier run is the arm this run
    would launch, as long as nothing that the baselines run has changed since (the file's commit, recorded here under
    ``baselines_from``, says where they were run). The protocol must match but for the worlds, variants and default
    mode; returns ``{world: {train_seed: {variant: run}}}`` for worlds whose every training seed has every baseline.

    Deterministic means on one kind of processor: the same arm run on an AMD EPYC and on an Intel Xeon parts (the
    floating-point sums differ and training amplifies them, development world 20's all-tight arm by 0.002 AUROC), so
    a part of the file run on another processor than this run's is refused, and a part whose processor was not
    recorded (resumed parts before it was) is spot-checked by :func:`spot_check_baselines` before any arm runs
    (a part that fails it is run here in full)."""
    old = load_results(path)
    keys = (set(cfg) | set(old["config"])) - {"seeds", "seeds_planned", "variants", "default_mode", "default_rule"}
    differ = sorted(k for k in keys if old["config"].get(k) != cfg.get(k))
    if differ:
        raise SystemExit(f"--baselines-from: {path} was run under another protocol ({', '.join(differ)} differ);"
                         " give the options it was run with")
    other = sorted({str(p["cpu"]) for p in _parts(old) if p["cpu"] is not None and p["cpu"] != metadata.get("cpu")})
    if other:
        raise SystemExit(f"--baselines-from: parts of {path} ran on {other}, this run on {metadata.get('cpu')!r}:"
                         " runs repeat to the last digit on one kind of processor only, so those baselines cannot"
                         " pair with this run's arms; run every arm here (leave out --baselines-from)")
    found: dict[int, dict[int, dict[str, dict[str, Any]]]] = {}
    for r in old["results"]:
        if r.get("variant") in BASELINES:
            r = dict(r, reused_from=r.get("reused_from") or old["metadata"].get("git_commit"))
            found.setdefault(r["world"], {}).setdefault(r["train_seed"], {})[r["variant"]] = r
    complete = {w: seeds for w, seeds in found.items()
                if sorted(seeds) == list(range(cfg["train_seeds"])) and all(set(BASELINES) <= set(v)
                                                                          for v in seeds.values())}
    metadata["baselines_from"] = {"path": str(path), **{k: old["metadata"].get(k) for k in
                                                        ("command", "git_commit", "date", "cpu")},
                                  "worlds": sorted(w for w in complete if w in cfg["seeds"]),
                                  "unrecorded_cpu_worlds": [p["worlds"] for p in _parts(old) if p["cpu"] is None]}
    print(f"--baselines-from: the baselines of {len(metadata['baselines_from']['worlds'])} world(s) come from"
          f" {path} (commit {old['metadata'].get('git_commit')})", flush=True)
    return complete


def _parts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a (possibly resumed) --worlds results file: per part, the processor it ran on (None where not
    recorded) and the worlds it added."""
    m, parts, seen = data["metadata"], [], set()
    for part in m.get("resumed_from", []) + [{"cpu": m.get("cpu"), "worlds": [w["world"] for w in
                                                                               data.get("per_world") or []]}]:
        added = [w for w in part.get("worlds") or [] if w not in seen]
        seen.update(added)
        parts.append({"cpu": part.get("cpu"), "worlds": added})
    return parts


def spot_check_baselines(cfg: dict[str, Any], reused: dict[int, dict[int, dict[str, dict[str, Any]]]],
                         metadata: dict[str, Any], timeout: float,
                         done: Sequence[int] = ()) -> dict[int, dict[int, dict[str, dict[str, Any]]]]:
    """Before reusing baselines from parts whose processor was not recorded, rerun one of each such part's baseline
    arms here (the uncompressed arm of the part's first reused world still to run, training seed 0; ``done``: the
    worlds a resumed file already holds) and require the same AUROC and length to the last digit. A part that fails
    ran elsewhere (or on other code): its worlds are dropped from the reuse and run every arm here. Returns the
    baselines still reused; records every check, and the dropped worlds, under ``baselines_from``."""
    checks, dropped = [], []
    for worlds in metadata["baselines_from"]["unrecorded_cpu_worlds"]:
        world = next((w for w in worlds if w in reused and w in cfg["seeds"] and w not in done), None)
        if world is None:
            continue
        old = reused[world][0]["uncompressed"]
        new = run_ranks(run_world, 2, "uncompressed", dict(cfg, world=world, train_seed=0), timeout=timeout)[0]
        same = (new["val_auroc"], new["steps"]) == (old["val_auroc"], old["steps"])
        checks.append({"world": world, "variant": "uncompressed", "train_seed": 0, "same": same,
                       "earlier": [old["val_auroc"], old["steps"]], "here": [new["val_auroc"], new["steps"]]})
        print(f"--baselines-from spot check, world {world}: {checks[-1]}", flush=True)
        if not same:
            dropped += [w for w in worlds if w in reused]
            print(f"--baselines-from: worlds {worlds} ran elsewhere; every arm of them runs here", flush=True)
    metadata["baselines_from"].update(spot_checks=checks, dropped_worlds=sorted(dropped),
                                      worlds=[w for w in metadata["baselines_from"]["worlds"] if w not in dropped])
    return {w: seeds for w, seeds in reused.items() if w not in dropped}


def judge_world_entry(world: int, by_seed: list[dict[str, dict[str, Any]]], variants: Sequence[str],
                      cfg: dict[str, Any], verbose: bool = False) -> dict[str, Any]:
    """A world's entry of ``per_world``: its noise floor (and, under ``--settle``, the floor read at the fixed
    protocol's length and where each arm stopped), each calibrated variant's judgement and the baselines' gaps."""
    from calibration_data import draw_world

    floor = noise_floor(by_seed)
    if verbose:
        print(f"  noise floor: {floor['floor']} (paired sd {floor['paired_sd']}, {floor['train_seeds']} seeds)",
              flush=True)
    settled = {}
    if cfg.get("settle"):
        fixed = noise_floor(at_step(by_seed, cfg["fixed_steps"]))
        settled = {"noise_floor_at_fixed_steps": fixed,
                   "unsettled": [f"{r['variant']}:{r['train_seed']}" for rs in by_seed for r in rs.values()
                                 if not r["settled"]],
                   "stopped_at": {v: [rs[v]["steps"] for rs in by_seed] for v in variants}}
        if verbose:
            print(f"  at {cfg['fixed_steps']} steps the floor was {fixed['floor']}; stopped at {settled['stopped_at']},"
                  f" unsettled {settled['unsettled']}", flush=True)
    return {"world": world, "spec": draw_world(world).summary(), "noise_floor": floor, **settled,
            **{v: judge_world_seeds(by_seed, v, floor["floor"]) for v in variants if v not in BASELINES},
            "all_loose_vs_all_tight": statistics.fmean(
                r["all_loose"]["val_auroc"] - r["all_tight"]["val_auroc"] for r in by_seed),
            "all_tight_vs_uncompressed": statistics.fmean(
                r["all_tight"]["val_auroc"] - r["uncompressed"]["val_auroc"] for r in by_seed)}


def worlds_summaries(per_world: list[dict[str, Any]], judged: Sequence[str]) -> dict[str, Any]:
    """The summary sections of a worlds results file: ``summary`` (the default's) and ``summary_<variant>``."""
    summaries = {v: summarize_worlds(per_world, v) for v in judged}
    extra = {"summary": summaries["default"]} if "default" in summaries else {}
    extra.update({f"summary_{v}": s for v, s in summaries.items() if v != "default"})
    return extra


def rejudge(path: Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """A ``--worlds`` results file judged again, from the runs it holds, by this code's judgement (``--rejudge``):
    every world's entry and the summaries are recomputed, the runs and the metadata of the run that made them are
    kept, and ``rejudged`` records when and by which commit. Returns the new file's content."""
    data = load_results(path)
    cfg = data["config"]
    if "per_world" not in data:
        raise SystemExit(f"--rejudge {path}: not a --worlds results file (it has no per_world)")
    variants = cfg["variants"]
    by_world: dict[int, dict[int, dict[str, dict[str, Any]]]] = {}
    for r in data["results"]:
        by_world.setdefault(r["world"], {}).setdefault(r.get("train_seed", 0), {})[r["variant"]] = r
    per_world = [judge_world_entry(w["world"], [runs for _, runs in sorted(by_world[w["world"]].items())], variants,
                                   cfg) for w in data["per_world"]]
    judged = [v for v in variants if v not in BASELINES]
    data = {k: v for k, v in data.items() if k not in ("per_world", "summary") and not k.startswith("summary_")}
    data.update(worlds_summaries(per_world, judged), per_world=per_world)
    data["rejudged"] = [*data.get("rejudged", []), {"commit": metadata.get("git_commit"),
                                                     "git_dirty": metadata.get("git_dirty"),
                                                     "date": metadata.get("date")}]
    return data


def main_worlds(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    from calibration_data import DEV_WORLDS, EVAL_WORLDS, QUICK_EVAL_WORLDS, draw_world

    seeds = DEV_WORLDS if args.worlds == "dev" else EVAL_WORLDS
    seeds = QUICK_EVAL_WORLDS if args.quick and args.worlds == "eval" else seeds[args.first: args.first + args.count]
    variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else DEFAULT_WORLD_VARIANTS
    if set(variants) - set(WORLD_VARIANTS) or set(BASELINES) - set(variants):
        raise SystemExit(f"--variants with --worlds: a subset of {list(WORLD_VARIANTS)} that keeps {list(BASELINES)}")
    variants = tuple(v for v in WORLD_VARIANTS if v in variants)
    protocol = WORLD_QUICK if args.quick else WORLD_FULL
    cfg = dict(worlds=args.worlds, seeds=list(seeds), steps=args.steps or protocol["steps"],
               val_batches=args.val_batches, lr=args.lr or protocol["lr"],
               train_seeds=args.train_seeds or protocol["train_seeds"], variants=list(variants), floor_z=FLOOR_Z,
               default_mode=default_mode(), default_rule=default_rule())
    if args.settle:  # every arm to its settled AUROC; the fixed protocol's step read from the curve beside it
        cfg.update(settle=True, steps=args.steps or SETTLE_MAX, val_every=args.val_every or SETTLE_EVERY,
                   settle_delta=SETTLE_DELTA,
                   fixed_steps=protocol["steps"])
    if args.fit or args.drift:  # one training seed per world, under the protocol's steps and lr
        cfg.update(train_seeds=1)
        if args.worlds != "dev":
            raise SystemExit("--fit and --drift look at development worlds only: use --worlds dev")
        # The previous default's absolute budget (calibration_worlds_fit.json was fitted with mode="noise" when that
        # meant it): the variant that still does.
        variant = "noise_absolute" if args.fit else "default"
        runs = []
        for seed in seeds:
            runs.append(run_ranks(run_world, 2, variant, dict(cfg, world=seed, variants=[variant], train_seed=0),
                                  timeout=args.timeout)[0])
            print(f"world {seed}: {runs[-1]['seconds']:.0f} s, calibrations at"
                  f" {[p['batch'] for p in runs[-1]['calibrations']]}", flush=True)
        if args.drift:
            check = drift_check(runs)
            for point in check["calibrations"]:
                print(f"  calibration at {point['batch']}: {point}", flush=True)
            write_results(args.json_out, metadata, dict(cfg, variants=[variant]), runs, drift=check)
        else:
            fit = fit_noise_budget(runs)
            print(f"\nfitted noise_budget (p{FIT_QUANTILE * 100:.0f} rule): {fit['noise_budget']}")
            write_results(args.json_out, metadata, dict(cfg, variants=[variant]), runs, fit=fit)
        print(f"\nwrote {args.json_out}")
        return
    per_world, runs = ([], []) if not args.resume else resumed_worlds(args.json_out, cfg, metadata)
    reused = {} if args.baselines_from is None else reused_baselines(args.baselines_from, cfg, metadata)
    if reused:
        reused = spot_check_baselines(cfg, reused, metadata, args.timeout, done=[w["world"] for w in per_world])
    judged = [v for v in variants if v not in BASELINES]
    for seed in seeds:
        if seed in {w["world"] for w in per_world}:
            continue
        print(f"world {seed}: {draw_world(seed).summary()}", flush=True)
        by_seed = run_arms(cfg, seed, variants, range(cfg["train_seeds"]), args.timeout, given=reused.get(seed))
        runs += [r for by_variant in by_seed for r in by_variant.values()]
        per_world.append(judge_world_entry(seed, by_seed, variants, cfg, verbose=True))
        # After every world, the worlds done so far: a long run stopped early keeps them (the file says which were
        # planned), and its summary is over those worlds only.
        done = [w["world"] for w in per_world]
        write_results(args.json_out, metadata, dict(cfg, seeds=done, **({"seeds_planned": list(seeds)}
                                                                          if done != list(seeds) else {})),
                      runs, **worlds_summaries(per_world, judged), per_world=per_world)
    summaries = {v: summarize_worlds(per_world, v) for v in judged}
    for v, summary in summaries.items():
        print(f"\n{v}: {summary}")
    floors = [w["noise_floor"]["floor"] for w in per_world]
    print(f"\nnoise floors per world: {floors}")
    print(f"\nwrote {args.json_out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (0, 1, ...); each draws new roles")
    parser.add_argument("--quick", action="store_true", help="baselines and the default only, fewer steps")
    parser.add_argument("--steps", type=int, default=None, help="training batches per rank (default 2000, quick 1000)")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per rank per step")
    parser.add_argument("--val-batches", type=int, default=128, help="validation batches over both ranks")
    parser.add_argument("--dim", type=int, default=16, help="embedding dimension")
    parser.add_argument("--lr", type=float, default=None,
                        help="Adagrad learning rate (dense and embeddings; default 0.05, with --worlds WORLD_FULL's)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a FairCalibrationDataModule argument other than its default (repeatable), e.g."
                        " --data sensitive=3")
    parser.add_argument("--trace", action="store_true",
                        help="only the gradient mode, recalibrating, recording every table's statistic each time")
    parser.add_argument("--variants", default=None, help=f"comma-separated subset of {list(FULL)} (with --worlds, of"
                        f" {list(WORLD_VARIANTS)}); the baselines stay")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--worlds", choices=("dev", "eval"), default=None,
                        help="judge on the family of worlds (development or evaluation seeds) instead of the one set")
    parser.add_argument("--count", type=int, default=20, help="with --worlds: how many worlds of the split")
    parser.add_argument("--first", type=int, default=0,
                        help="with --worlds (not --quick eval): the index in the split of the first world run")
    parser.add_argument("--train-seeds", type=int, default=None,
                        help="with --worlds: training seeds per arm, paired across arms (default: WORLD_FULL's or,"
                        " with --quick, WORLD_QUICK's); the noise floor needs at least 2")
    parser.add_argument("--fit", action="store_true",
                        help="with --worlds dev: run the previous default (noise_absolute) only and fit its"
                        " absolute budget (fit_noise_budget)")
    parser.add_argument("--drift", action="store_true",
                        help="with --worlds dev: run the default only, one seed per world, and report how its"
                        " statistic and bounds move from calibration to calibration (drift_check)")
    parser.add_argument("--ablate", type=int, default=None, metavar="WORLD",
                        help="every table of this world loose alone (the ablation that defines a sensitive"
                        " table), paired with all-tight, all-loose and the default under --train-seeds seeds"
                        " (default 2); an evaluation world only to judge, never to choose a constant")
    parser.add_argument("--perturb", default=None, metavar="WORLD:SEED",
                        help="one training seed of one world at all-tight's bound and one percent either side of it"
                        " (how far the trajectory alone moves the AUROC)")
    parser.add_argument("--settle", action="store_true",
                        help="with --worlds or --ablate: every arm until its validation AUROC settles (SETTLE_*"
                        " rule), at most --steps batches (default SETTLE_MAX)")
    parser.add_argument("--resume", action="store_true",
                        help="with --worlds: keep the worlds an earlier run of the same options wrote to --json-out"
                        " and run only the rest; with --ablate, the arms")
    parser.add_argument("--baselines-from", type=Path, default=None, metavar="FILE",
                        help="with --worlds: take the baseline arms (uncompressed, all-tight, all-loose) of every"
                        " world FILE holds from it, run under the same protocol, and run only the other variants")
    parser.add_argument("--curves", default=None, metavar="WORLD:SEED,...",
                        help="the arms of each world and training seed (--variants, default uncompressed,all_tight)"
                        " validated every --val-every steps: their learning curves")
    parser.add_argument("--val-every", type=int, default=None,
                        help="with --curves: training batches between validations (default a tenth of the run); with"
                        " --settle, SETTLE_EVERY's stand-in (smoke runs)")
    parser.add_argument("--rejudge", type=Path, default=None, metavar="FILE",
                        help="judge the runs of a --worlds results file again with this code's judgement and"
                        " rewrite FILE (its runs and their metadata kept; 'rejudged' says when)")
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks/results/calibration_bench.json")
    args = parser.parse_args()
    if args.settle and args.worlds is None and args.ablate is None:
        parser.error("--settle trains the arms of a world run or an ablation: give --worlds or --ablate")
    if args.curves is not None and args.worlds is not None:
        parser.error("--curves runs the worlds it names: leave out --worlds")
    if args.val_every is not None and args.curves is None and not args.settle:
        parser.error("--val-every applies to --curves and --settle runs only")
    if args.resume and ((args.worlds is None and args.ablate is None) or args.fit or args.drift):
        parser.error("--resume continues a --worlds run (not --fit or --drift) or an --ablate run: give --worlds"
                     " or --ablate")
    if args.baselines_from is not None and (args.worlds is None or args.fit or args.drift):
        parser.error("--baselines-from judges variants of a --worlds run (not --fit or --drift): give --worlds dev"
                     " or eval")
    if args.baselines_from is not None and args.baselines_from.resolve() == args.json_out.resolve():
        parser.error("--baselines-from FILE must not be --json-out: the run would overwrite the baselines it reads")
    metadata = start_run("benchmarks/calibration_bench.py", vars(args))
    if args.rejudge is not None:
        data = rejudge(args.rejudge, metadata)
        args.rejudge.write_text(json.dumps(data, indent=1, default=str) + "\n")
        print(f"rejudged {args.rejudge}: {data.get('summary')}")
        return
    if args.ablate is not None:
        main_ablation(args, metadata)
        return
    if args.perturb is not None:
        main_perturb(args, metadata)
        return
    if args.curves is not None:
        main_curves(args, metadata)
        return
    if args.worlds is not None:
        main_worlds(args, metadata)
        return
    args.lr = 0.05 if args.lr is None else args.lr
    variants = tuple(v.strip() for v in args.variants.split(",")) if args.variants else (QUICK if args.quick else FULL)
    unknown = sorted(set(variants) - set(FULL)) if not args.trace else []
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(FULL)}")
    missing = [b for b in BASELINES if b not in variants]
    if args.trace:
        variants, missing = ("trace",), []
    if missing:
        parser.error(f"the baselines {missing} are needed to judge the others; keep them in --variants")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    steps = args.steps or (1000 if args.quick else 2000)
    data: dict[str, Any] = {}
    for item in args.data:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--data {item!r} must be KEY=VALUE")
        data[key.strip()] = float(value) if "." in value or "e" in value else int(value)
    cfg = dict(steps=steps, data=data, batch_size=args.batch_size, val_batches=args.val_batches, dim=args.dim,
               lr=args.lr, variants=list(variants), default_mode=default_mode(),
               default_rule=default_rule())


    per_seed, runs = [], []
    if args.trace:
        for seed in range(args.seeds):
            print(f"seed {seed} / trace ...", flush=True)
            runs.append(run_ranks(_run, 2, "trace", dict(cfg, seed=seed), timeout=args.timeout)[0])
            for point in runs[-1]["trace"]:
                print(f"  batch {point['batch']}: {trace_summary(point, runs[-1]['roles'])}", flush=True)
        write_results(args.json_out, metadata, cfg, runs, seeds=list(range(args.seeds)))
        print(f"\nwrote {args.json_out}")
        return
    for seed in range(args.seeds):
        by_variant = {}
        for variant in variants:
            print(f"seed {seed} / {variant} ...", flush=True)
            r = run_ranks(_run, 2, variant, dict(cfg, seed=seed), timeout=args.timeout)[0]
            by_variant[variant] = r
            runs.append(r)
            extra = f", classes {_judge({**by_variant, variant: r}, variant)['counts']}" if "classes" in r and \
                all(b in by_variant for b in ("uncompressed", "all_tight")) else ""
            print(f"  val AUROC {r['val_auroc']:.4f}, {r['sent_bytes'] / max(r['steps'], 1):.0f} bytes/step,"
                  f" {r['seconds']:.0f} s{extra}", flush=True)
        judged = {v: _judge(by_variant, v) for v in variants if v not in BASELINES}
        for base in ("all_tight", "all_loose"):
            judged[base] = {"auroc_delta": by_variant[base]["val_auroc"] - by_variant["uncompressed"]["val_auroc"]}
        per_seed.append(judged)
    summary = summarize(per_seed, variants)
    print()
    print("\n".join(table(summary, variants)))
    print("\nset informative (all-loose loses >= 0.005 and > 3 sd; all-tight < 0.001):",
          summary["set_is_informative"])
    if "default_meets_targets" in summary:
        print(f"default meets its targets: {summary['default_meets_targets']}")
    write_results(args.json_out, metadata, cfg, runs, **summary, seeds=list(range(args.seeds)), per_seed=per_seed,
                  targets=TARGETS)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
