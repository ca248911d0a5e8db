"""Does table-wise calibration find the tables that need a tight bound? A fair benchmark (issue 26).

On benchmarks/lib/calibration_data.py's data set every table has the same size and the same id distribution; tables
differ only in how the label depends on them (sensitive, robust, irrelevant; roles drawn at random per seed). Each
variant is a 2-rank gloo launch of the example DLRM through Lightning and DLACStrategy, with the same seed, model
initialisation and data order; only the compression changes:

- ``uncompressed``: DLAC's exchange off (``CompressionOptions(enabled=False)``), the reference every AUROC
  delta is taken against;
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

    python -m benchmarks.calibration_bench --seeds 3 --json-out benchmarks/results/calibration_bench.json
    python -m benchmarks.calibration_bench --seeds 1 --quick --json-out /tmp/calibration_quick.json
    python -m benchmarks.calibration_bench --seeds 2 --trace --json-out benchmarks/results/calibration_trace.json

``--worlds dev|eval`` judges on the family of worlds of benchmarks/lib/calibration_data.py instead (issue 33 item 2):
per world, ``uncompressed``, ``all_tight``, ``all_loose``, ``default`` and ``noise`` (``DLACCallback(mode="noise")``);
the development worlds are for fitting constants, the evaluation worlds for judging (the split is fixed in
benchmarks/lib/calibration_data.py). ``--quick`` runs the first 3 evaluation worlds, ``--count N`` the first N of the
split::

    python -m benchmarks.calibration_bench --worlds eval --quick --json-out benchmarks/results/calibration_worlds.json

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

    python -m benchmarks.calibration_bench --worlds eval --count 20 --train-seeds 2 --settle \
        --variants uncompressed,all_tight,all_loose,default \
        --baselines-from benchmarks/results/calibration_worlds_settled.json --json-out /tmp/new_default.json

``--worlds dev --drift`` runs only the default on development worlds 0-19 (one seed each) and records every one of
its calibrations: how the noise share's order and level move along the run, and which tables relative and absolute
budgets would flag at each calibration (:func:`drift_check`), the development evidence for the default's rule::

    python -m benchmarks.calibration_bench --worlds dev --drift --count 20 \
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

The arms, their judgement and the resume helpers are the library's (benchmarks/lib/calibration_arms.py,
calibration_judgement.py, calibration_resume.py), shared with ``python -m benchmarks.frontier_worlds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from benchmarks.lib.calibration_arms import (
    ABLATE_PREFIX,
    BASELINES,
    CONSTANT_PREFIX,
    DEFAULT_WORLD_VARIANTS,
    SETTLE_DELTA,
    SETTLE_EVERY,
    SETTLE_MAX,
    WORLD_FULL,
    WORLD_QUICK,
    WORLD_VARIANTS,
    ForwardBytes,
    calibration_callback,
    default_mode,
    default_rule,
    just_calibrated,
    run_arms,
    run_world,
)
from benchmarks.lib.calibration_data import (
    DEV_WORLDS,
    EVAL_WORLDS,
    QUICK_EVAL_WORLDS,
    FairCalibrationDataModule,
    draw_world,
    precision_recall,
)
from benchmarks.lib.calibration_judgement import (
    FIT_QUANTILE,
    FLOOR_Z,
    curve_summary,
    drift_check,
    fit_noise_budget,
    judge_ablation,
    judge_world_entry,
    rejudge,
    summarize_worlds,
    trace_summary,
    worlds_summaries,
)
from benchmarks.lib.calibration_resume import record_resumed, resumed_worlds, reused_baselines, spot_check_baselines
from benchmarks.lib.launch import run_ranks
from benchmarks.lib.paths import RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import load_results, start_run, write_results

MODES = ("gradient", "homogenization", "homogenization_value", "sensitivity")  # the default is the noise mode
QUICK = (*BASELINES, "default")
FULL = (*QUICK, *MODES)
TARGETS = dict(precision=0.9, recall=0.9, robust_loose_share=0.9, auroc_delta=-0.001, bytes_vs_all_tight=0.7,
               calibration_share=0.05, all_loose_loss=0.005, all_tight_loss=0.001)


class _Trace(pl.Callback):
    """Every table's gradient sensitivity at the largest candidate, at each calibration of ``dlac``."""

    def __init__(self, dlac) -> None:  # noqa: ANN001
        self.dlac, self.points = dlac, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        if just_calibrated(self.dlac):
            rows = self.dlac.calibration_report()
            self.points.append({"batch": self.dlac.step, "sensitivity": {
                r["table"]: r["gradient_loss_change"][max(r["gradient_loss_change"], key=float)] for r in rows}})


def _run(rank: int, world_size: int, variant: str, cfg: dict[str, Any]) -> dict[str, Any]:  # noqa: C901
    from lightning_dlac.examples.dlrm import DLRMModule

    from lightning_dlac import CompressionOptions, DLACStrategy, ShardingOptions

    seed = cfg["seed"]
    pl.seed_everything(seed, verbose=False)
    dm = FairCalibrationDataModule(batch_size=cfg["batch_size"], num_train_batches=cfg["steps"] * world_size,
                                   num_val_batches=cfg["val_batches"], seed=seed, **cfg["data"])
    model = DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, feature_names=dm.feature_names,
                       num_dense_features=dm.num_dense_features, embedding_dim=cfg["dim"],
                       dense_arch_layer_sizes=[32, cfg["dim"]], over_arch_layer_sizes=[64, 1],
                       learning_rate=cfg["lr"], seed=seed)
    sharding = ShardingOptions(embedding_lr=cfg["lr"])
    if variant == "uncompressed":
        strategy = DLACStrategy(sharding=sharding, compression=CompressionOptions(enabled=False))
    else:
        eps = {"all_tight": 0.01, "all_loose": 0.05}.get(variant, 0.01)
        strategy = DLACStrategy(sharding=sharding, compression=CompressionOptions(eps=eps))
    dlac = calibration_callback(variant, cfg) if variant not in BASELINES else None
    meter = ForwardBytes()
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


def _judge(runs: dict[str, dict[str, Any]], variant: str) -> dict[str, Any]:
    """One seed's figures of a calibrated ``variant`` against that seed's baselines."""
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


def main_ablation(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--ablate WORLD``: every table of one world loose alone, against all-tight and all-loose, and the default
    beside them, paired seeds. An evaluation world is ablated only to judge: the default's constants were fixed on
    development worlds before any evaluation world was run."""
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
        record_resumed(metadata, old["metadata"])
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


PERTURB_EPS = (0.0099, 0.01, 0.0101)  # all-tight's bound and one percent either side


def main_perturb(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--perturb WORLD:SEED``: one training seed of one world, uncompressed and with every table at all-tight's
    bound and at one percent either side of it. A difference between arms that a one-percent change of a constant
    bound reproduces is the trajectory's, not the bound's: it measures what a world's floor is made of. It judges
    and chooses nothing, so it may run on any world of either split."""
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


def main_curves(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
    """``--curves WORLD:SEED,...``: the arms of each (world, training seed) with the validation AUROC taken every
    ``--val-every`` steps: where along the run the arms part and whether they have settled by its end. It judges and
    chooses nothing by itself; a protocol chosen from it is chosen on development worlds only."""
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


def main_worlds(args: argparse.Namespace, metadata: dict[str, Any]) -> None:
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--json-out", type=Path, default=RESULTS / "calibration_bench.json")
    return parser


def main() -> None:
    parser = _parser()
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
    metadata = start_run(__spec__.name, vars(args))
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
    main_fair(args, metadata, parser)


def main_fair(args: argparse.Namespace, metadata: dict[str, Any], parser: argparse.ArgumentParser) -> None:
    """The fair set (no ``--worlds``, ``--ablate``, ``--perturb`` or ``--curves``): every variant under ``--seeds``
    seeds, each drawing new roles, judged against that seed's baselines; ``--trace`` runs the gradient mode only and
    records its statistic at every calibration."""
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
