"""Running the arms of a calibration benchmark's world (``python -m benchmarks.calibration_bench``,
``python -m benchmarks.frontier_worlds``): the arm names (baselines, constant bounds, qcomm codecs, one table loose),
the protocol constants (steps, learning rate, training seeds, the settle rule), the ``DLACCallback`` each calibrated
arm gets, the callbacks that measure a launch (forward bytes, learning curve, every calibration), one rank of an arm
(:func:`run_world`) and every arm of a world under paired training seeds (:func:`run_arms`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl

from benchmarks.lib.accuracy import TrafficMeter, qcomm_variant
from benchmarks.lib.calibration_data import WorldDataModule, draw_world
from benchmarks.lib.launch import run_ranks
from benchmarks.lib.qcomm import codecs_registry

BASELINES = ("uncompressed", "all_tight", "all_loose")


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


def calibration_callback(variant: str, cfg: dict[str, Any]):
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


def just_calibrated(dlac) -> bool:  # noqa: ANN001
    """Whether ``dlac`` finished a calibration at the batch that just ended (read in ``on_train_batch_end``, after
    the callback's own)."""
    return dlac.calibrator.calibrated_at == dlac.step and bool(dlac.table_stats)


class ForwardBytes(pl.Callback):
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
        if just_calibrated(self.dlac):
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


WORLD_VARIANTS = (*BASELINES, "default", "gradient", "noise", "noise_recal", "noise_absolute")


# The default (noise mode since issue 33) against the former default, the gradient mode; "noise" (the default's mode
# spelled out) and "noise_recal" on request (--variants).
DEFAULT_WORLD_VARIANTS = (*BASELINES, "default", "gradient")


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
    from lightning_dlac.examples.dlrm import DLRMModule

    from lightning_dlac import CompressionOptions, DLACStrategy, ShardingOptions

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
    registry, qcomm = _qcomm_codecs(variant)  # TorchRec's codecs in its sharders, counted (benchmarks.frontier_worlds)
    sharding = ShardingOptions(embedding_lr=cfg["lr"], qcomm_codecs_registry=registry)
    if variant == "uncompressed" or qcomm is not None:
        strategy = DLACStrategy(sharding=sharding, compression=CompressionOptions(enabled=False))
    else:
        eps = float(variant.removeprefix(CONSTANT_PREFIX)) if variant.startswith(CONSTANT_PREFIX) else \
            {"all_tight": 0.01, "all_loose": LOOSE}.get(variant, 0.01)
        strategy = DLACStrategy(sharding=sharding, compression=CompressionOptions(eps=eps))
    ablated = variant.removeprefix(ABLATE_PREFIX) if variant.startswith(ABLATE_PREFIX) else None
    constant = variant in BASELINES or variant.startswith((CONSTANT_PREFIX, QCOMM_PREFIX))
    dlac = calibration_callback(variant, cfg) if not constant and ablated is None else None
    meter, curve = ForwardBytes(), _Curve()
    calibrations = None if dlac is None else _Calibrations(dlac)
    callbacks = [meter, curve] + ([] if dlac is None else [dlac, calibrations]) + \
        ([] if ablated is None else [_LooseOne(ablated)])
    traffic = None
    if cfg.get("traffic"):  # both directions, in the accuracy benchmark's accounting, for the frontier against qcomm
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


# How chaotic one world's training is (--perturb): arm "constant:<eps>" runs every table at that bound.
CONSTANT_PREFIX = "constant:"


# Arm "qcomm:<label>" sends the forward and backward all-to-all through TorchRec's codecs of that label of
# benchmarks/lib/e2e.py ("qcomm:INT8/FP16", ...), uncompressed by DLAC (benchmarks.frontier_worlds).
QCOMM_PREFIX = "qcomm:"


def _qcomm_codecs(variant: str) -> tuple[dict[str, Any] | None, tuple[Any, Any] | None]:
    """For a ``qcomm:<label>`` arm, TorchRec's codecs of that label as a registry for the sharders, and their
    byte-counting wrappers (forward, backward); ``(None, None)`` for any other arm."""
    if not variant.startswith(QCOMM_PREFIX):
        return None, None
    label = "qcomm " + variant.removeprefix(QCOMM_PREFIX)
    qcomm = qcomm_variant(label)
    if qcomm is None:
        raise ValueError(f"{variant}: {label!r} is not a qcomm variant of benchmarks/lib/e2e.py")
    registry, fwd, bwd = codecs_registry(qcomm)
    return registry, (fwd, bwd)
