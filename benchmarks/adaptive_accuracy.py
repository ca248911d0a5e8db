"""Accuracy and traffic of the dual-level adaptive policy against an uncompressed run and a constant bound.

Every variant is its own 2-rank gloo launch of the example DLRM through Lightning and DLACStrategy, with the same
seeds and the same data order; only the compression changes:

- ``uncompressed``: ``DLACStrategy(compress=False)``, TorchRec's fp32 all-to-all;
- ``constant 0.01``: every table at eps 0.01 for the whole run (``DLACCallback(mode="off", c=1)``, for metrics);
- ``DLAC homogenization``: the paper's policy, classes tight/base/loose = 0.01/0.03/0.05 by homogenization index,
  step schedule c=2 over the first half of training;
- ``DLAC sensitivity``: bounds chosen by the loss-sensitivity probe, same schedule.

Datasets: ``criteo`` (../shared/data/criteo_kaggle_head10k.tsv, 80/20 split) and ``synthetic`` (the demo's
Criteo-like data). Prints a table, writes JSON, and with ``--markdown-out`` fills the "Adaptive error bounds"
section of docs/benchmarks.md (the accuracy table and the per-table calibration of the Criteo run).

    python benchmarks/adaptive_accuracy.py --markdown-out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests._launch (the project's rank launcher) lives at the repository root
    sys.path.insert(0, str(REPO))

from _report import write_generated_block, write_results  # noqa: E402 - beside this script

CRITEO = REPO.parent / "shared" / "data" / "criteo_kaggle_head10k.tsv"
SECTION = "## Adaptive error bounds: accuracy and traffic"
BEGIN, END = "<!-- adaptive_accuracy:begin -->", "<!-- adaptive_accuracy:end -->"
VARIANTS = ("uncompressed", "constant 0.01", "DLAC homogenization", "DLAC sensitivity")
DATASETS = ("criteo", "synthetic", "synthetic_v2")


def _datamodule(dataset: str, cfg: dict[str, Any]):
    from lightning_dlac.examples.data import CriteoTSVDataModule, SyntheticCriteoDataModule

    if dataset == "criteo":
        return CriteoTSVDataModule(str(cfg["criteo_path"]), max_rows=cfg["max_rows"], batch_size=cfg["criteo_batch"],
                                   val_fraction=0.2, seed=0)
    if dataset == "synthetic_v2":  # MLPerf DLRM v2's multi-hot features: its pooling factors, bags per id
        from lightning_dlac.examples.data import MLPERF_MULTI_HOT_SIZES

        return SyntheticCriteoDataModule(max_rows=cfg["max_rows"], batch_size=cfg["synthetic_batch"],
                                         num_train_batches=cfg["synthetic_batches"], num_val_batches=8,
                                         zipf_alpha=1.05, multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES),
                                         seed=cfg.get("seed", 0))
    return SyntheticCriteoDataModule(max_rows=cfg["max_rows"], batch_size=cfg["synthetic_batch"],
                                     num_train_batches=cfg["synthetic_batches"], num_val_batches=8, zipf_alpha=1.05,
                                     seed=0)


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
    if variant == "constant 0.01":
        return DLACCallback(mode="off", c=1.0, **common)
    T = max(total_steps // 2, 1)
    start = int(total_steps * cfg["calibration_start"])
    mode = "homogenization" if variant == "DLAC homogenization" else "sensitivity"
    return DLACCallback(mode=mode, calibration_batches=cfg["calibration_batches"], calibration_start=start,
                        sensitivity_batches=1, schedule="step", c=2.0, T=T, **common)


def _run(rank: int, world_size: int, dataset: str, variant: str, cfg: dict[str, Any]) -> dict[str, Any]:
    from lightning_dlac import DLACStrategy

    pl.seed_everything(0, verbose=False)
    dm = _datamodule(dataset, cfg)
    dm._set_rank(rank, world_size)  # the same sharding the trainer would give it; known before fit for T
    dm.setup("fit")
    model = _dlrm(dataset, dm, cfg, 0)
    epochs = cfg["criteo_epochs"] if dataset == "criteo" else 1
    steps = len(dm.train_dataloader()) * epochs
    compress = variant != "uncompressed"
    strategy = DLACStrategy(compress=compress, eps=0.01, embedding_optimizer="adagrad", embedding_lr=0.02)
    meter = _TrafficMeter()
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
        "dataset": dataset, "variant": variant, "steps": meter.steps, "seconds": seconds,
        "val_auroc": float(m["val/auroc"]), "val_loss": float(m["val/loss"]), "train_loss": float(m["train/loss"]),
        "fwd_raw_bytes": meter.raw, "fwd_sent_bytes": meter.sent,
    }
    if dlac is not None and dlac.table_stats:
        out["calibration"] = dlac.calibration_report()
        out["table_rows"] = dict(zip([f"t_{f}" for f in dm.feature_names], dm.num_embeddings_per_feature))
    return out


class _TrafficMeter(pl.Callback):
    """Forward all-to-all bytes of the training batches only (not validation), from the strategy's counters."""

    def __init__(self) -> None:
        self.steps = self.raw = self.sent = 0
        self._raw0 = self._sent0 = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        s = trainer.strategy.total_comm_stats()
        self._raw0, self._sent0 = s.raw_bytes, s.sent_bytes

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        s = trainer.strategy.total_comm_stats()
        self.steps += 1
        self.raw += s.raw_bytes - self._raw0
        self.sent += s.sent_bytes - self._sent0


def _summarize(by_rank: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = dict(by_rank[0])
    # Both ranks log the same (synced) validation metrics; traffic is summed over ranks.
    r0["fwd_raw_bytes"] = sum(r["fwd_raw_bytes"] for r in by_rank)
    r0["fwd_sent_bytes"] = sum(r["fwd_sent_bytes"] for r in by_rank)
    return r0


def _table(rows: list[dict[str, Any]]) -> list[str]:
    raw_by_dataset = {r["dataset"]: r["fwd_raw_bytes"] / r["steps"] for r in rows if r["fwd_raw_bytes"]}
    base = {r["dataset"]: r for r in rows if r["variant"] == "uncompressed"}
    const = {r["dataset"]: r for r in rows if r["variant"] == "constant 0.01"}
    lines = [
        "| dataset | variant | val AUROC | vs uncompressed | val loss | fwd KiB/step (both ranks) | ratio |"
        " vs constant 0.01 | s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = r["dataset"]
        per_step = (r["fwd_sent_bytes"] / r["steps"]) if r["fwd_sent_bytes"] else raw_by_dataset.get(d, 0.0)
        ratio = raw_by_dataset.get(d, 0.0) / per_step if per_step else 1.0
        delta = r["val_auroc"] - base[d]["val_auroc"] if d in base else float("nan")
        c = const.get(d)
        vs_const = per_step / (c["fwd_sent_bytes"] / c["steps"]) if c and c["fwd_sent_bytes"] else float("nan")
        lines.append(
            f"| {d} | {r['variant']} | {r['val_auroc']:.4f} | {delta:+.4f} | {r['val_loss']:.4f} |"
            f" {f'{per_step / 1024:.1f}' if per_step else '-'} | {ratio:.1f}x |"
            f" {'-' if vs_const != vs_const else f'{vs_const:.2f}'} | {r['seconds']:.0f} |"
        )
    return lines


def _calibration_table(row: dict[str, Any]) -> list[str]:
    cands = list(row["calibration"][0]["ratio"])
    lines = [
        "| table | rows | distinct vectors / chunk | homogenization index | class | eps | "
        + " | ".join(f"ratio @ {c}" for c in cands) + " | " + " | ".join(f"loss change @ {c}" for c in cands) + " |",
        "|---|---:|---:|---:|---|---:|" + "---:|" * (2 * len(cands)),
    ]
    order = sorted(row["calibration"], key=lambda r: int(r["table"].rsplit("_", 1)[1]))
    for t in order:
        ratios = " | ".join(f"{t['ratio'][c]:.1f}" for c in cands)
        changes = " | ".join(
            "-" if t["loss_change"] is None else f"{t['loss_change'][c]:+.1e}" for c in cands
        )
        lines.append(
            f"| {t['table']} | {row['table_rows'].get(t['table'], '')} | {t['distinct_per_chunk']:.1f} |"
            f" {t['homogenization_index']:.3f} | {t['class']} | {t['eps']} | {ratios} | {changes} |"
        )
    return lines


def _write_markdown(path: Path, rows: list[dict[str, Any]], command: str, cfg: dict[str, Any]) -> None:
    parts = [
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), 2 gloo ranks;"
        f" torch {torch.__version__}. DLRM dim {cfg['dim']}, tables capped at {cfg['max_rows']} rows, fused Adagrad"
        f" (lr 0.02) for the tables, dense Adagrad (lr 0.01). Criteo: {cfg['criteo_epochs']} epoch(s), batch"
        f" {cfg['criteo_batch']} per rank. Synthetic: {cfg['synthetic_batches']} batches of"
        f" {cfg['synthetic_batch']} per rank. Calibration: {cfg['calibration_batches']} batches starting at"
        f" {cfg['calibration_start']:.0%} of training; schedule step, c=2, T = half of training. Forward all-to-all"
        " bytes of the training batches, summed over both ranks; AUROC of the final validation.",
        "",
        *_table(rows),
    ]
    for r in rows:
        if r["variant"] == "DLAC homogenization" and r.get("calibration"):
            parts += ["", f"Per-table calibration of the {r['dataset']} run (homogenization policy):", "",
                      *_calibration_table(r)]
    write_generated_block(path, SECTION, BEGIN, END, parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {list(DATASETS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--criteo-path", type=Path, default=CRITEO)
    parser.add_argument("--criteo-epochs", type=int, default=1, help="more overfits the 8,000-row sample")
    parser.add_argument("--criteo-batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--synthetic-batches", type=int, default=192, help="training batches per rank")
    parser.add_argument("--synthetic-batch", type=int, default=512, help="samples per rank per step")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows")
    parser.add_argument("--dim", type=int, default=64, help="embedding dimension")
    parser.add_argument("--calibration-batches", type=int, default=8)
    parser.add_argument("--calibration-start", type=float, default=0.25,
                        help="fraction of training after which calibration starts")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks/results/adaptive_accuracy.json")
    parser.add_argument("--markdown-out", type=Path, default=None)
    args = parser.parse_args()

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for given, known, what in ((datasets, DATASETS, "dataset"), (variants, VARIANTS, "variant")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; choose from {list(known)}")
    if "criteo" in datasets and not args.criteo_path.is_file():
        parser.error(f"{args.criteo_path} does not exist; pass --criteo-path or --datasets synthetic")
    if not 0 <= args.calibration_start < 1:
        parser.error("--calibration-start must be a fraction in [0, 1)")
    cfg = dict(criteo_path=str(args.criteo_path), criteo_epochs=args.criteo_epochs, criteo_batch=args.criteo_batch,
               synthetic_batches=args.synthetic_batches, synthetic_batch=args.synthetic_batch, max_rows=args.max_rows,
               dim=args.dim, calibration_batches=args.calibration_batches, calibration_start=args.calibration_start)

    from lightning_dlac.codec import native_available
    from tests._launch import run_ranks

    if not native_available():
        print("warning: the native DLAC codec did not build; the compressed variants run the reference codec.")
    command = "python benchmarks/adaptive_accuracy.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows = []
    for dataset in datasets:
        for variant in variants:
            print(f"{dataset} / {variant} ...", flush=True)
            rows.append(_summarize(run_ranks(_run, 2, dataset, variant, cfg, timeout=args.timeout)))
            r = rows[-1]
            print(f"  val AUROC {r['val_auroc']:.4f}, forward bytes/step {r['fwd_sent_bytes'] / r['steps']:.0f},"
                  f" {r['seconds']:.0f} s", flush=True)
    print()
    print("\n".join(_table(rows)))
    write_results(args.json_out, command, cfg, rows)
    print(f"\nwrote {args.json_out}")
    if args.markdown_out is not None:
        _write_markdown(args.markdown_out, rows, command, cfg)
        print(f"wrote the tables into {args.markdown_out}")


if __name__ == "__main__":
    main()
