"""Accuracy and traffic of the dual-level adaptive policy against an uncompressed run and a constant bound.

Every variant is its own 2-rank gloo launch of the example DLRM through Lightning and DLACStrategy, with the same
seeds and the same data order; only the compression changes:

- ``uncompressed``: ``DLACStrategy(compression=CompressionOptions(enabled=False))``, TorchRec's fp32 all-to-all;
- ``constant 0.01``: every table at eps 0.01 for the whole run (``DLACCallback(mode="off", c=1)``, for metrics);
- ``DLAC default``: ``DLACCallback()`` with no argument, what a user gets (its default mode and schedule, sized from
  the run's length);
- ``DLAC gradient``: the gradient mode with this benchmark's calibration settings (below), as the next two;
- ``DLAC homogenization``: the paper's policy, classes tight/base/loose = 0.01/0.03/0.05 by homogenization index,
  step schedule c=2 over the first half of training;
- ``DLAC sensitivity``: bounds chosen by the loss-sensitivity probe (``--sensitivity-batches`` probe batches),
  same schedule;
- ``DLAC both directions``: the homogenization policy forward plus DLAC-compressed gradients at ``backward_eps``
  (``--backward-eps``, default 0.01), what the end-to-end speedup figures use;
- ``constant 0.05``: every table at the loosest class bound (the all-loose run calibration must beat on accuracy);
  any other ``constant X`` (0 < X < 1) is every table at eps X the same way (``constant 0.002``, ...);
- ``qcomm INT8/FP16``: TorchRec's practical baseline, DLAC's exchange off and the sharders given
  TorchRec's qcomm codecs (INT8 row-wise forward, FP16 backward; benchmarks/lib/qcomm.py's registry); any other qcomm
  label of the end-to-end VARIANTS (benchmarks/lib/e2e.py) runs the same way (``qcomm FP16/FP16``, ``qcomm FP8/FP8``,
  ``qcomm MX4/MX4``, TorchRec's 4-bit codec). A codec TorchRec cannot run here (FP8 on CPU) is recorded in the results
  file under ``failed`` with its error and not launched again for later seeds.

With constant bounds and qcomm variants among those launched, the results file also holds ``frontier``, issue 33 item
3's accuracy-bytes frontier (benchmarks/lib/frontier.py, its definitions in FRONTIER_DEFINITIONS): per variant the AUROC
difference from the uncompressed run and the forward and total bytes per step, per qcomm point the DLAC points that
dominate it within noise, and whether the default is on or near the frontier (docs/adaptive.md renders it):

    V="uncompressed,constant 0.002,constant 0.005,constant 0.01,constant 0.03,constant 0.05,DLAC default"
    python -m benchmarks.adaptive_accuracy --datasets criteo --seeds 0,1,2,3,4 --criteo-epochs 2 \
        --variants "$V,qcomm FP16/FP16,qcomm INT8/FP16,qcomm FP8/FP8,qcomm MX4/MX4" \
        --json-out benchmarks/results/adaptive_frontier_criteo.json

The policy variants other than ``DLAC default`` take ``--calibration-batches``, ``--calibration-start`` (a share of
training), ``--sensitivity-batches`` and, with ``--callback KEY=VALUE`` (repeatable), any other ``DLACCallback``
argument (``--callback index=value --callback gradient_tolerance=0.2``); their schedule is the step schedule with
c=2 over the first half of training unless ``--callback`` says otherwise.

The other variants send gradients in bf16 (DLACStrategy's default). Datasets: ``criteo``
(../shared/data/criteo_kaggle_head10k.tsv, 80/20 split), ``synthetic`` (the demo's Criteo-like data),
``planted`` (examples/planted.py: sensitive, noise and repeated tables) and ``synthetic_v2`` (MLPerf DLRM v2:
DLRM_DCN, dim 128, multi-hot synthetic data with MLPerf's pooling factors). ``--seeds 0,1,2`` repeats every launch
per seed (model initialisation, data order and, for the synthetic sets, the data); the summary reports per variant the
mean and spread (sample standard deviation) over seeds of the AUROC difference from the uncompressed run of the
same seed. Prints tables and writes JSON; ``python -m benchmarks.render`` puts the figures into docs/benchmarks.md
and docs/adaptive.md. ``--from-json FILE ...`` prints the tables of stored results files again.

The full matrix of issue 16 is the suite's full depth (benchmarks/lib/plan.py): one results file per dataset, each
run with its own settings, rendered together.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import yaml

from benchmarks.lib.accuracy import (
    DATASETS,
    FRONTIER_QCOMM,
    VARIANTS,
    TrafficMeter,
    constant_bound,
    known_variant,
    launch_table,
    load_rows,
    over_seeds,
    qcomm_variant,
    seed_table,
)
from benchmarks.lib.frontier import frontier, frontier_lines
from benchmarks.lib.launch import error_line, run_ranks
from benchmarks.lib.paths import CRITEO_SAMPLE, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.qcomm import codecs_registry
from benchmarks.lib.results import start_run, write_results


def _datamodule(dataset: str, cfg: dict[str, Any]):
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule
    from lightning_dlac.examples.tsv import CriteoTSVDataModule

    seed = cfg.get("seed", 0)
    if dataset == "planted":
        from lightning_dlac.examples.planted import PlantedSensitivityDataModule

        return PlantedSensitivityDataModule(batch_size=cfg["synthetic_batch"],
                                            num_train_batches=cfg["synthetic_batches"], num_val_batches=8, seed=seed)
    if dataset == "criteo":
        return CriteoTSVDataModule(str(cfg["criteo_path"]), max_rows=cfg["max_rows"], batch_size=cfg["criteo_batch"],
                                   val_fraction=0.2, seed=seed)
    if dataset == "synthetic_v2":  # MLPerf DLRM v2's multi-hot features: its pooling factors, bags per id
        from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

        return SyntheticCriteoDataModule(max_rows=cfg["max_rows"], batch_size=cfg["synthetic_batch"],
                                         num_train_batches=cfg["synthetic_batches"], num_val_batches=8,
                                         zipf_alpha=1.05, multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES),
                                         seed=cfg.get("seed", 0))
    return SyntheticCriteoDataModule(max_rows=cfg["max_rows"], batch_size=cfg["synthetic_batch"],
                                     num_train_batches=cfg["synthetic_batches"], num_val_batches=8, zipf_alpha=1.05,
                                     seed=seed)


def _dlrm(dataset: str, dm: Any, cfg: dict[str, Any], seed: int) -> Any:
    """The example DLRM for ``dataset``: ``synthetic_v2`` gets MLPerf's DLRM v2 (DLRM_DCN, dim 128, 3 cross layers
    of rank 512, MLPerf's MLPs; dense Adagrad at 0.002, at which its DCN does not diverge), the others the small
    dot-interaction DLRM of width ``cfg["dim"]``."""
    from lightning_dlac.examples.dlrm import DLRMModule

    if dataset == "synthetic_v2":
        return DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, embedding_dim=128,
                          dense_arch_layer_sizes=[512, 256, 128], over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
                          interaction="dcn", dcn_num_layers=3, dcn_low_rank_dim=512, learning_rate=0.002,
                          optimizer="adagrad", seed=seed)
    return DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, embedding_dim=cfg["dim"],
                      dense_arch_layer_sizes=[256, cfg["dim"]], over_arch_layer_sizes=[256, 128, 1],
                      learning_rate=0.01, optimizer="adagrad", seed=seed)


def _callback(variant: str, total_steps: int, cfg: dict[str, Any]):
    from lightning_dlac import DLACCallback

    common = dict(log_every_n_steps=10_000, prog_bar=False)
    if constant_bound(variant) is not None:
        return DLACCallback(mode="off", c=1.0, **common)
    if variant == "DLAC default":
        return DLACCallback(**common)
    T = max(total_steps // 2, 1)
    start = int(total_steps * cfg["calibration_start"])
    mode = {"DLAC sensitivity": "sensitivity", "DLAC gradient": "gradient"}.get(variant, "homogenization")
    probes = cfg.get("sensitivity_batches", 1) if mode == "sensitivity" else 1
    options = dict(mode=mode, calibration_batches=cfg["calibration_batches"], calibration_start=start,
                   sensitivity_batches=min(probes, cfg["calibration_batches"]), schedule="step", c=2.0, T=T)
    return DLACCallback(**{**options, **cfg.get("callback", {}), **common})


def _strategy(variant: str, cfg: dict[str, Any]):
    """The variant's DLACStrategy, and for a qcomm variant the byte-counting codecs (forward, backward) TorchRec
    uses (given to its sharders, DLAC's exchange off)."""
    from lightning_dlac import CompressionOptions, DLACStrategy, ShardingOptions

    tables = dict(embedding_optimizer="adagrad", embedding_lr=0.02)
    if variant == "uncompressed":
        return DLACStrategy(sharding=ShardingOptions(**tables), compression=CompressionOptions(enabled=False)), None
    qcomm = qcomm_variant(variant)
    if qcomm is not None:
        registry, fwd, bwd = codecs_registry(qcomm)
        return DLACStrategy(sharding=ShardingOptions(**tables, qcomm_codecs_registry=registry),
                            compression=CompressionOptions(enabled=False)), (fwd, bwd)
    eps = constant_bound(variant) or 0.01
    if variant == "DLAC both directions":
        compression = CompressionOptions(eps=eps, backward="dlac", backward_eps=cfg["backward_eps"])
    else:
        backward = {"backward": cfg["backward_compression"]} if cfg.get("backward_compression") else {}
        compression = CompressionOptions(eps=eps, **backward)
    return DLACStrategy(sharding=ShardingOptions(**tables), compression=compression), None


def _run(rank: int, world_size: int, dataset: str, variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    seed = cfg.get("seed", 0)
    pl.seed_everything(seed, verbose=False)
    dm = _datamodule(dataset, cfg)
    dm.set_rank(rank, world_size)  # the same sharding the trainer would give it; known before fit for T
    dm.setup("fit")
    model = _dlrm(dataset, dm, cfg, seed)
    epochs = cfg["criteo_epochs"] if dataset == "criteo" else 1
    steps = len(dm.train_dataloader()) * epochs
    strategy, qcomm_codecs = _strategy(variant, cfg)
    compress = strategy.compress
    dims = {c.name: c.embedding_dim for c in model.embedding_bag_collection.embedding_bag_configs()}
    meter = TrafficMeter(qcomm_codecs, None if compress or qcomm_codecs else dims)
    callbacks: list = [meter]
    dlac = _callback(variant, steps, cfg) if compress else None
    if dlac is not None:
        callbacks.insert(0, dlac)
    trainer = pl.Trainer(accelerator="cpu", devices=world_size, strategy=strategy, max_epochs=epochs,
                         callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - start
    m = trainer.callback_metrics
    out = {
        "dataset": dataset, "variant": variant, "seed": seed, "steps": meter.steps, "seconds": seconds,
        "val_auroc": float(m["val/auroc"]), "val_loss": float(m["val/loss"]), "train_loss": float(m["train/loss"]),
        "fwd_raw_bytes": meter.raw, "fwd_sent_bytes": meter.sent, "bwd_raw_bytes": meter.bwd_raw,
        "bwd_sent_bytes": meter.bwd_sent, "byte_accounting": "remote",
    }
    if dlac is not None and dlac.table_stats:
        out["calibration"] = dlac.calibration_report()
        out["table_rows"] = dict(zip([f"t_{f}" for f in dm.feature_names], dm.num_embeddings_per_feature))
    return out


def _summarize(by_rank: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = dict(by_rank[0])
    # Both ranks log the same (synced) validation metrics; traffic is summed over ranks.
    r0["fwd_raw_bytes"] = sum(r["fwd_raw_bytes"] for r in by_rank)
    r0["fwd_sent_bytes"] = sum(r["fwd_sent_bytes"] for r in by_rank)
    r0["bwd_raw_bytes"] = sum(r.get("bwd_raw_bytes", 0) for r in by_rank)
    r0["bwd_sent_bytes"] = sum(r.get("bwd_sent_bytes", 0) for r in by_rank)
    return r0


def _reprint(paths: list[Path]) -> None:
    """The tables of stored results files (``--from-json``)."""
    rows, _, _ = load_rows(paths)
    print("\n".join(launch_table(rows)))
    print()
    print("\n".join(seed_table(over_seeds(rows))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {list(DATASETS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--criteo-path", type=Path, default=CRITEO_SAMPLE)
    parser.add_argument("--criteo-epochs", type=int, default=1, help="more overfits the 8,000-row sample")
    parser.add_argument("--criteo-batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--synthetic-batches", type=int, default=192, help="training batches per rank")
    parser.add_argument("--synthetic-batch", type=int, default=512, help="samples per rank per step")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows")
    parser.add_argument("--dim", type=int, default=64, help="embedding dimension")
    parser.add_argument("--calibration-batches", type=int, default=8)
    parser.add_argument("--calibration-start", type=float, default=0.25,
                        help="fraction of training after which calibration starts")
    parser.add_argument("--sensitivity-batches", type=int, default=4,
                        help="probe batches of the sensitivity variant (at most --calibration-batches)")
    parser.add_argument("--callback", action="append", default=[], metavar="KEY=VALUE",
                        help="any other DLACCallback argument of the policy variants but DLAC default (repeatable;"
                        " the value is parsed as YAML: 0.2, true, value, [0.01, 0.05])")
    parser.add_argument("--backward-eps", type=float, default=0.01, help="gradient bound of DLAC both directions")
    parser.add_argument("--backward-compression", default=None, choices=("fp32", "bf16", "fp16"),
                        help="gradient exchange of the compressed variants but DLAC both directions (default: the"
                        " library's, bf16)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; every launch is repeated per seed")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="run nothing: print the tables of these results files again")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "adaptive_accuracy.json")
    args = parser.parse_args()
    if args.from_json:
        _reprint(args.from_json)
        return
    metadata = start_run(__spec__.name, vars(args))

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown:
        parser.error(f"unknown dataset(s) {unknown}; choose from {list(DATASETS)}")
    unknown = [v for v in variants if not known_variant(v)]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}, any `constant X` (0 < X < 1) or"
                     f" {list(FRONTIER_QCOMM)}")
    if "criteo" in datasets and not args.criteo_path.is_file():
        parser.error(f"{args.criteo_path} does not exist; pass --criteo-path or --datasets synthetic")
    if not 0 <= args.calibration_start < 1:
        parser.error("--calibration-start must be a fraction in [0, 1)")
    try:
        seeds = [int(v) for v in args.seeds.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} must be comma-separated integers, e.g. 0,1,2")
    if not seeds:
        parser.error("--seeds needs at least one seed")
    callback = {}
    for item in args.callback:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--callback {item!r} must be KEY=VALUE, e.g. --callback gradient_tolerance=0.2")
        callback[key.strip()] = yaml.safe_load(value)
    import inspect

    from lightning_dlac import DLACCallback

    unknown = sorted(set(callback) - set(inspect.signature(DLACCallback).parameters))
    if unknown:
        parser.error(f"--callback: DLACCallback has no argument {unknown}")
    cfg = dict(callback=callback, criteo_path=str(args.criteo_path), criteo_epochs=args.criteo_epochs,
               criteo_batch=args.criteo_batch,
               synthetic_batches=args.synthetic_batches, synthetic_batch=args.synthetic_batch, max_rows=args.max_rows,
               dim=args.dim, calibration_batches=args.calibration_batches, calibration_start=args.calibration_start,
               sensitivity_batches=args.sensitivity_batches, backward_eps=args.backward_eps,
               backward_compression=args.backward_compression, seeds=seeds,
               load=f"{os.getloadavg()[0]:.1f}")

    from lightning_dlac.codec import native_available

    if not native_available():
        print("warning: the native DLAC codec did not build; the compressed variants run the reference codec.")
    from lightning_dlac.testing import RanksFailed

    rows: list[dict[str, Any]] = []
    failed: dict[tuple[str, str], dict[str, Any]] = {}  # (dataset, variant) -> its first launch's error
    for dataset in datasets:
        for seed in seeds:  # variants of one seed back to back: they share the machine's load most closely
            for variant in variants:
                if (dataset, variant) in failed:  # TorchRec cannot run it here: its error is the platform's
                    failed[(dataset, variant)]["seeds_not_launched"].append(seed)
                    continue
                print(f"{dataset} / seed {seed} / {variant} ...", flush=True)
                launch = dict(cfg, seed=seed)
                try:
                    rows.append(_summarize(run_ranks(_run, 2, dataset, variant, launch, timeout=args.timeout)))
                except RanksFailed as err:
                    if qcomm_variant(variant) is None:  # only TorchRec's codecs may be unable to run here
                        raise
                    failed[(dataset, variant)] = dict(dataset=dataset, variant=variant, seed=seed,
                                                      error=error_line(str(err)),
                                                      traceback_tail=str(err)[-3000:], seeds_not_launched=[])
                    print(f"  FAILED: {failed[(dataset, variant)]['error']}", flush=True)
                    continue
                r = rows[-1]
                print(f"  val AUROC {r['val_auroc']:.4f}, forward bytes/step {r['fwd_sent_bytes'] / r['steps']:.0f},"
                      f" {r['seconds']:.0f} s", flush=True)
    print()
    print("\n".join(launch_table(rows)))
    print()
    print("\n".join(seed_table(over_seeds(rows))))
    extra = {}
    if any(constant_bound(v) is not None for v in variants) and any(qcomm_variant(v) for v in variants):
        extra["frontier"] = frontier(rows)
        print()
        print("\n".join(frontier_lines(extra["frontier"], list(failed.values()))))
    write_results(args.json_out, metadata, cfg, rows, failed=list(failed.values()), **extra)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
