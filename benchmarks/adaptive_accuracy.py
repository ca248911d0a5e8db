"""Accuracy and traffic of the dual-level adaptive policy against an uncompressed run and a constant bound.

Every variant is its own 2-rank gloo launch of the example DLRM through Lightning and DLACStrategy, with the same
seeds and the same data order; only the compression changes:

- ``uncompressed``: ``DLACStrategy(compress=False)``, TorchRec's fp32 all-to-all;
- ``constant 0.01``: every table at eps 0.01 for the whole run (``DLACCallback(mode="off", c=1)``, for metrics);
- ``DLAC default``: ``DLACCallback()`` with no argument, what a user gets (the gradient mode, calibration and early
  stage sized from the run's length);
- ``DLAC gradient``: the gradient mode with this benchmark's calibration settings (below), as the next two;
- ``DLAC homogenization``: the paper's policy, classes tight/base/loose = 0.01/0.03/0.05 by homogenization index,
  step schedule c=2 over the first half of training;
- ``DLAC sensitivity``: bounds chosen by the loss-sensitivity probe (``--sensitivity-batches`` probe batches),
  same schedule;
- ``DLAC both directions``: the homogenization policy forward plus DLAC-compressed gradients at ``backward_eps``
  (``--backward-eps``, default 0.01), what the end-to-end speedup figures use;
- ``constant 0.05``: every table at the loosest class bound (the all-loose run calibration must beat on accuracy);
  any other ``constant X`` (0 < X < 1) is every table at eps X the same way (``constant 0.002``, ...);
- ``qcomm INT8/FP16``: TorchRec's practical baseline, ``DLACStrategy(compress=False)`` with the sharder given
  TorchRec's qcomm codecs (INT8 row-wise forward, FP16 backward; the registry of benchmarks/e2e_bandwidth.py); any
  other qcomm label of e2e_bandwidth's VARIANTS runs the same way (``qcomm FP16/FP16``, ``qcomm FP8/FP8``,
  ``qcomm MX4/MX4``, TorchRec's 4-bit codec). A codec TorchRec cannot run here (FP8 on CPU) is recorded in the
  results file under ``failed`` with its error and not launched again for later seeds.

With constant bounds and qcomm variants among those launched, the results file also holds ``frontier``, issue 33
item 3's accuracy-bytes frontier (:func:`frontier`, its definitions in FRONTIER_DEFINITIONS): per variant the AUROC
difference from the uncompressed run and the forward and total bytes per step, per qcomm point the DLAC points that
dominate it within noise, and whether the default is on or near the frontier (docs/adaptive.md renders it):

    V="uncompressed,constant 0.002,constant 0.005,constant 0.01,constant 0.03,constant 0.05,DLAC default"
    python benchmarks/adaptive_accuracy.py --datasets criteo --seeds 0,1,2,3,4 --criteo-epochs 2 \
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
same seed. Prints tables, writes JSON, and with ``--markdown-out`` fills the "Adaptive error bounds" section of
docs/benchmarks.md (the accuracy tables and the per-table calibration of each dataset's first seed).

    python benchmarks/adaptive_accuracy.py --markdown-out docs/benchmarks.md

The full matrix of issue 16 (several Criteo epochs, 2000 synthetic steps, 3 seeds; one results file per dataset,
then one markdown section from all of them):

    for d in criteo synthetic planted; do
      python benchmarks/adaptive_accuracy.py --datasets $d --seeds 0,1,2 --criteo-epochs 4 \
          --synthetic-batches 2000 --json-out benchmarks/results/adaptive_accuracy_$d.json
    done
    python benchmarks/adaptive_accuracy.py --markdown-out docs/benchmarks.md \
        --from-json benchmarks/results/adaptive_accuracy_{criteo,synthetic,planted}.json
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import yaml
from common import (
    CRITEO_SAMPLE,
    REPO,
    error_line,
    load_results,
    run_ranks,
    start_run,
    write_generated_block,
    write_results,
)

SECTION = "## Adaptive error bounds: accuracy and traffic"
# The block benchmarks/render.py renders from the committed results files (the same markers).
BEGIN, END = "<!-- BEGIN render:adaptive_accuracy -->", "<!-- END render:adaptive_accuracy -->"
VARIANTS = ("uncompressed", "constant 0.01", "DLAC default", "DLAC gradient", "DLAC homogenization", "DLAC sensitivity",
            "DLAC both directions",
            "constant 0.05", "qcomm INT8/FP16")
# Issue 33's accuracy-bytes frontier: the constant bounds and TorchRec's codecs it sets against each other (any
# ``constant X`` and any qcomm label of benchmarks/e2e_bandwidth.py's VARIANTS is accepted; these are the issue's).
FRONTIER_CONSTANTS = ("constant 0.002", "constant 0.005", "constant 0.01", "constant 0.03", "constant 0.05")
FRONTIER_QCOMM = ("qcomm FP16/FP16", "qcomm INT8/FP16", "qcomm FP8/FP8", "qcomm MX4/MX4")
DATASETS = ("criteo", "synthetic", "planted", "synthetic_v2")


def constant_bound(variant: str) -> float | None:
    """The bound of a ``constant X`` variant (every table at eps X for the whole run), else None."""
    name, _, value = variant.partition(" ")
    if name != "constant":
        return None
    try:
        eps = float(value)
    except ValueError:
        return None
    return eps if 0 < eps < 1 else None


def qcomm_variant(variant: str) -> Any:
    """benchmarks/e2e_bandwidth.py's ``Variant`` of TorchRec's codec labelled ``variant`` (``qcomm FP8/FP8``, ...),
    else None."""
    if not variant.startswith("qcomm "):
        return None
    from e2e_bandwidth import VARIANTS as E2E_VARIANTS

    return next((v for v in E2E_VARIANTS.values() if v.kind == "qcomm" and v.label == variant), None)


def known_variant(variant: str) -> bool:
    """Whether this script can launch ``variant``: a name of VARIANTS, any ``constant X`` or a qcomm label."""
    return variant in VARIANTS or constant_bound(variant) is not None or qcomm_variant(variant) is not None


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
    uses."""
    from lightning_dlac import DLACStrategy

    common = dict(embedding_optimizer="adagrad", embedding_lr=0.02)
    if variant == "uncompressed":
        return DLACStrategy(compress=False, **common), None
    qcomm = qcomm_variant(variant)
    if qcomm is not None:
        return DLACStrategy(compress=False, **common), install_qcomm(qcomm)
    eps = constant_bound(variant) or 0.01
    if variant == "DLAC both directions":
        return DLACStrategy(compress=True, eps=eps, backward_compression="dlac", backward_eps=cfg["backward_eps"],
                            **common), None
    backward = {"backward_compression": cfg["backward_compression"]} if cfg.get("backward_compression") else {}
    return DLACStrategy(compress=True, eps=eps, **common, **backward), None


def install_qcomm(qcomm: Any):
    """Make every EmbeddingBagCollectionSharder built in this process carry the TorchRec codecs of ``qcomm`` (an
    e2e_bandwidth ``Variant``; DLACStrategy has no qcomm option: with compress=False its sharder is TorchRec's own).
    The registry and its byte-counting wrappers are benchmarks/e2e_bandwidth.py's."""
    import torchrec.distributed.embeddingbag as ebc
    from e2e_bandwidth import codecs_registry

    registry, fwd, bwd = codecs_registry(qcomm)
    base = ebc.EmbeddingBagCollectionSharder

    class QCommSharder(base):  # noqa: D101 - a one-argument default
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            kwargs.setdefault("qcomm_codecs_registry", registry)
            super().__init__(*args, **kwargs)

    ebc.EmbeddingBagCollectionSharder = QCommSharder
    return fwd, bwd


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


class TrafficMeter(pl.Callback):
    """All-to-all bytes of the training batches only (not validation), forward and backward, counted as DLAC's
    counters count them: traffic to other ranks (the block a rank keeps for itself is a local copy). From the
    strategy's counters; for the qcomm baseline from the counting wrappers of TorchRec's codecs, which see the whole
    send buffer, every destination's equal share included (so (W - 1) / W of it); for the uncompressed run, the
    float32 bytes of this rank's tables' pooled embeddings for the other ranks' rows (``dims``: each table's
    dimension), its fp32 reference."""

    def __init__(self, qcomm_codecs: Any = None, dims: dict[str, int] | None = None) -> None:
        self.steps = self.raw = self.sent = self.bwd_raw = self.bwd_sent = 0
        self._start = (0, 0, 0, 0)
        self._qcomm = qcomm_codecs
        self._dims = dims
        self._local_dim: int | None = None

    def _counts(self, trainer) -> tuple[int, int, int, int]:  # noqa: ANN001
        if self._qcomm is not None:
            fwd, bwd = self._qcomm
            return fwd.raw_bytes, fwd.sent_bytes, bwd.raw_bytes, bwd.sent_bytes
        s = trainer.strategy.total_comm_stats()
        return s.raw_bytes, s.sent_bytes, s.backward_raw_bytes, s.backward_sent_bytes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self._start = self._counts(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        now = self._counts(trainer)
        delta = [b - a for a, b in zip(self._start, now)]
        world = trainer.world_size
        if self._qcomm is not None:
            delta = [d * (world - 1) // world for d in delta]
        elif self._dims is not None:  # uncompressed: float32 rows of every other rank's batch, this rank's tables
            if self._local_dim is None:
                rank = trainer.global_rank
                plan = trainer.strategy.sharding_plan.plan
                self._local_dim = sum(self._dims[t] for mp in plan.values() for t, spec in mp.items()
                                      if rank in (spec.ranks or []))
            fp32 = batch.labels.numel() * (world - 1) * self._local_dim * 4
            delta = [fp32] * 4
        self.steps += 1
        self.raw += delta[0]
        self.sent += delta[1]
        self.bwd_raw += delta[2]
        self.bwd_sent += delta[3]


def normalize_bytes(rows: list[dict[str, Any]], world_size: int = 2) -> list[dict[str, Any]]:
    """Rows of any results file in the remote-traffic accounting (``byte_accounting: "remote"``). Files written
    before it counted qcomm's bytes over the whole send buffer, a rank's own chunk included, and gave the
    uncompressed run no bytes: their qcomm rows are scaled by (W - 1) / W (exact: TorchRec sends every destination
    an equal share) and their uncompressed rows get the float32 bytes DLAC's rows of the same dataset and seed
    stood for (``fwd_raw_bytes``, the same by construction). Returns new row dicts."""
    fp32 = {(r["dataset"], r.get("seed", 0)): r["fwd_raw_bytes"] for r in rows
            if r["variant"] != "uncompressed" and not r["variant"].startswith("qcomm ") and r.get("fwd_raw_bytes")}
    out = []
    for r in rows:
        r = dict(r)
        if not str(r.get("byte_accounting", "")).startswith("remote"):
            if r["variant"].startswith("qcomm "):
                for key in ("fwd_raw_bytes", "fwd_sent_bytes", "bwd_raw_bytes", "bwd_sent_bytes"):
                    r[key] = r.get(key, 0) * (world_size - 1) // world_size
            elif r["variant"] == "uncompressed" and (r["dataset"], r.get("seed", 0)) in fp32:
                r["fwd_raw_bytes"] = r["fwd_sent_bytes"] = fp32[(r["dataset"], r.get("seed", 0))]
            r["byte_accounting"] = "remote (converted from a file written before issue 25's fix)"
        out.append(r)
    return out


def _summarize(by_rank: list[dict[str, Any]]) -> dict[str, Any]:
    r0 = dict(by_rank[0])
    # Both ranks log the same (synced) validation metrics; traffic is summed over ranks.
    r0["fwd_raw_bytes"] = sum(r["fwd_raw_bytes"] for r in by_rank)
    r0["fwd_sent_bytes"] = sum(r["fwd_sent_bytes"] for r in by_rank)
    r0["bwd_raw_bytes"] = sum(r.get("bwd_raw_bytes", 0) for r in by_rank)
    r0["bwd_sent_bytes"] = sum(r.get("bwd_sent_bytes", 0) for r in by_rank)
    return r0


def _over_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, variant): the mean and sample standard deviation over seeds of the AUROC difference from the
    uncompressed run of the same seed, the mean AUROC and the mean forward bytes per step (relative to the constant
    0.01 run of the same seed)."""
    base = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "uncompressed"}
    const = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "constant 0.01"}
    fp32 = _fp32_per_step(rows)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["variant"]), []).append(r)
    out = []
    for (dataset, variant), rs in groups.items():
        deltas = [r["val_auroc"] - base[(dataset, r.get("seed", 0))]["val_auroc"]
                  for r in rs if (dataset, r.get("seed", 0)) in base]
        vs_const = []
        for r in rs:
            c = const.get((dataset, r.get("seed", 0)))
            if c and c["fwd_sent_bytes"] and r["fwd_sent_bytes"]:
                vs_const.append((r["fwd_sent_bytes"] / r["steps"]) / (c["fwd_sent_bytes"] / c["steps"]))
        out.append({
            "dataset": dataset, "variant": variant, "seeds": [r.get("seed", 0) for r in rs], "steps": rs[0]["steps"],
            "val_auroc_mean": statistics.fmean(r["val_auroc"] for r in rs),
            "delta_mean": statistics.fmean(deltas) if deltas else float("nan"),
            "delta_sd": statistics.stdev(deltas) if len(deltas) > 1 else float("nan"),
            "vs_constant_mean": statistics.fmean(vs_const) if vs_const else float("nan"),
            "fwd_sent_per_step": statistics.fmean(r["fwd_sent_bytes"] / r["steps"] for r in rs),
            # float32 bytes over the bytes sent (the uncompressed run of the same seed is the reference)
            "fwd_ratio_mean": statistics.fmean(fp32[(dataset, r.get("seed", 0))] / (r["fwd_sent_bytes"] / r["steps"])
                                               for r in rs) if all((dataset, r.get("seed", 0)) in fp32
                                                                   and r["fwd_sent_bytes"] for r in rs) else None,
            "bwd_ratio": statistics.fmean(r["bwd_raw_bytes"] / r["bwd_sent_bytes"] for r in rs)
            if all(r.get("bwd_sent_bytes") for r in rs) else None,
        })
    return out


def _seed_table(summary: list[dict[str, Any]]) -> list[str]:
    def num(v: float, fmt: str) -> str:
        return "-" if v != v else format(v, fmt)

    lines = [
        "| dataset | variant | seeds | steps | mean val AUROC | AUROC vs uncompressed: mean | spread (sd) |"
        " fwd bytes vs constant 0.01 | fwd ratio vs fp32 | backward ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        bwd = "-" if s["bwd_ratio"] is None else f"{s['bwd_ratio']:.1f}x"
        fwd = "-" if s.get("fwd_ratio_mean") is None else f"{s['fwd_ratio_mean']:.1f}x"
        lines.append(
            f"| {s['dataset']} | {s['variant']} | {len(s['seeds'])} | {s['steps']} | {s['val_auroc_mean']:.4f} |"
            f" {num(s['delta_mean'], '+.4f')} | {num(s['delta_sd'], '.4f')} | {num(s['vs_constant_mean'], '.2f')} |"
            f" {fwd} | {bwd} |"
        )
    return lines


def _fp32_per_step(rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """The reference of every ratio: per (dataset, seed), the uncompressed run's float32 bytes per step."""
    return {(r["dataset"], r.get("seed", 0)): r["fwd_raw_bytes"] / r["steps"] for r in rows
            if r["variant"] == "uncompressed" and r.get("fwd_raw_bytes")}


def _table(rows: list[dict[str, Any]]) -> list[str]:
    fp32 = _fp32_per_step(rows)
    base = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "uncompressed"}
    const = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "constant 0.01"}
    lines = [
        "| dataset | seed | variant | val AUROC | vs uncompressed | val loss | fwd KiB/step (both ranks) | ratio |"
        " vs constant 0.01 | s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, key = r["dataset"], (r["dataset"], r.get("seed", 0))
        ref = fp32.get(key, 0.0)
        per_step = (r["fwd_sent_bytes"] / r["steps"]) if r["fwd_sent_bytes"] else ref
        ratio = ref / per_step if per_step else float("nan")
        delta = r["val_auroc"] - base[key]["val_auroc"] if key in base else float("nan")
        c = const.get(key)
        vs_const = per_step / (c["fwd_sent_bytes"] / c["steps"]) if c and c["fwd_sent_bytes"] else float("nan")
        lines.append(
            f"| {d} | {r.get('seed', 0)} | {r['variant']} | {r['val_auroc']:.4f} | {delta:+.4f} | {r['val_loss']:.4f} |"
            f" {f'{per_step / 1024:.1f}' if per_step else '-'} | {'-' if ratio != ratio else f'{ratio:.1f}x'} |"
            f" {'-' if vs_const != vs_const else f'{vs_const:.2f}'} | {r['seconds']:.0f} |"
        )
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# Issue 33 item 3: the accuracy-bytes frontier against TorchRec's codecs

FRONTIER_DEFINITIONS = (
    "A DLAC point (a constant bound or the default) *dominates a qcomm point within noise* when its mean forward"
    " bytes per step are no more than the qcomm point's and its mean AUROC difference from the uncompressed run is"
    " no worse than the qcomm point's minus the noise, 2 x the standard error over seeds of the paired per-seed"
    " difference of the two variants' AUROCs (0 with one seed). The default is *on the frontier* when no launched"
    " variant has no more forward bytes and a higher mean AUROC difference, and *near* it when no such variant is"
    " higher by more than the same noise (2 x the paired standard error against the default): being beaten only"
    " within noise counts as near. Forward bytes are compared because the table-wise bounds act on the forward"
    " exchange; the DLAC variants send gradients in bf16 and the qcomm variants in their own backward precision, so"
    " the total (forward + backward) bytes are reported beside them and each domination says whether it holds on"
    " total bytes too."
)


# The two targets of issue 33 item 3, by the names frontier() judges them under (frontier_worlds.py counts them).
FRONTIER_TARGETS = ("every qcomm point dominated within noise by a DLAC point", "the default on or near the frontier")


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Mean and standard error over the seeds both ran of ``a``'s AUROC minus ``b``'s (SE 0 with one seed)."""
    by_seed = {r.get("seed", 0): r["val_auroc"] for r in b}
    diffs = [r["val_auroc"] - by_seed[r.get("seed", 0)] for r in a if r.get("seed", 0) in by_seed]
    if not diffs:
        return float("nan"), float("nan"), 0
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs), se, len(diffs)


def frontier(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset: every variant's point (AUROC difference from the uncompressed run of the same seed, mean and
    sample standard deviation over seeds; forward and total bytes per step, summed over both ranks, mean over seeds),
    every qcomm point's dominating DLAC points, and the judged targets of issue 33 item 3 (FRONTIER_DEFINITIONS)."""
    out = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        rs = [r for r in rows if r["dataset"] == dataset]
        base = {r.get("seed", 0): r["val_auroc"] for r in rs if r["variant"] == "uncompressed"}
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            groups.setdefault(r["variant"], []).append(r)
        points = []
        for variant, runs in groups.items():
            deltas = [r["val_auroc"] - base[r.get("seed", 0)] for r in runs if r.get("seed", 0) in base]
            points.append(dict(
                variant=variant, seeds=[r.get("seed", 0) for r in runs],
                val_auroc_mean=statistics.fmean(r["val_auroc"] for r in runs),
                kind="qcomm" if variant.startswith("qcomm ") else "uncompressed" if variant == "uncompressed"
                else "dlac",
                delta_mean=statistics.fmean(deltas) if deltas else float("nan"),
                delta_sd=statistics.stdev(deltas) if len(deltas) > 1 else float("nan"),
                fwd_bytes_per_step=statistics.fmean(r["fwd_sent_bytes"] / r["steps"] for r in runs),
                total_bytes_per_step=statistics.fmean((r["fwd_sent_bytes"] + r["bwd_sent_bytes"]) / r["steps"]
                                                      for r in runs),
            ))
        by_name = {p["variant"]: p for p in points}
        dlac = [p for p in points if p["kind"] == "dlac" and (constant_bound(p["variant"]) is not None
                                                              or p["variant"] == "DLAC default")]
        pairs = []
        for q in [p for p in points if p["kind"] == "qcomm"]:
            candidates = []
            for d in dlac:
                diff, se, n = _paired(groups[d["variant"]], groups[q["variant"]])
                fewer = d["fwd_bytes_per_step"] <= q["fwd_bytes_per_step"]
                candidates.append(dict(dlac=d["variant"], auroc_diff=diff, noise=2 * se, seeds=n,
                                       no_more_fwd_bytes=fewer,
                                       no_more_total_bytes=d["total_bytes_per_step"] <= q["total_bytes_per_step"],
                                       dominates=fewer and n > 0 and diff >= -2 * se))
            pairs.append(dict(qcomm=q["variant"], candidates=candidates,
                              dominated_by=[c["dlac"] for c in candidates if c["dominates"]]))
        default = by_name.get("DLAC default")
        beaten = []
        if default is not None:
            for p in points:
                if p is default or p["fwd_bytes_per_step"] > default["fwd_bytes_per_step"]:
                    continue
                diff, se, n = _paired(groups[p["variant"]], groups["DLAC default"])
                if n and diff > 0:
                    beaten.append(dict(variant=p["variant"], auroc_diff=diff, noise=2 * se, seeds=n,
                                       beyond_noise=diff > 2 * se))
        targets = [dict(target=FRONTIER_TARGETS[0],
                        met=bool(pairs) and all(pr["dominated_by"] for pr in pairs),
                        judged=[pr["qcomm"] for pr in pairs],
                        not_dominated=[pr["qcomm"] for pr in pairs if not pr["dominated_by"]])]
        if default is not None:
            targets.append(dict(target=FRONTIER_TARGETS[1],
                                met=not any(b["beyond_noise"] for b in beaten),
                                on_frontier=not beaten, beaten_by=beaten))
        out.append(dict(dataset=dataset, points=points, pairs=pairs, targets=targets))
    return out


def frontier_lines(summary: list[dict[str, Any]], failed: list[dict[str, Any]]) -> list[str]:
    """The frontier tables and verdicts of :func:`frontier` and the codecs that could not run, as markdown."""
    def num(v: float, fmt: str) -> str:
        return "-" if v != v else format(v, fmt)

    lines = []
    for f in summary:
        ordered = sorted(f["points"], key=lambda p: p["fwd_bytes_per_step"])
        lines += [f"{f['dataset']}, sorted by forward bytes (AUROC difference from the uncompressed run of the same"
                  " seed; bytes per step to other ranks, both ranks summed, mean over seeds):", "",
                  "| variant | seeds | mean val AUROC | AUROC vs uncompressed: mean | sd | fwd KiB/step |"
                  " total (fwd+bwd) KiB/step |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for p in ordered:
            lines.append(f"| {p['variant']} | {len(p['seeds'])} | {num(p.get('val_auroc_mean', float('nan')), '.4f')} |"
                         f" {num(p['delta_mean'], '+.4f')} |"
                         f" {num(p['delta_sd'], '.4f')} | {p['fwd_bytes_per_step'] / 1024:.1f} |"
                         f" {p['total_bytes_per_step'] / 1024:.1f} |")
        lines += ["", "| qcomm point | DLAC points with no more forward bytes: AUROC difference from it"
                  " (paired mean, noise = 2 SE) | dominated within noise by | of them with no more total bytes |",
                  "|---|---|---|---|"]
        for pr in f["pairs"]:
            cheaper = [c for c in pr["candidates"] if c["no_more_fwd_bytes"]]
            cells = ", ".join(f"{c['dlac']} {num(c['auroc_diff'], '+.4f')} (noise {num(c['noise'], '.4f')})"
                              for c in cheaper) or "none"
            total = [c["dlac"] for c in pr["candidates"] if c["dominates"] and c["no_more_total_bytes"]]
            lines.append(f"| {pr['qcomm']} | {cells} | {', '.join(pr['dominated_by']) or '**none**'} |"
                         f" {', '.join(total) or 'none'} |")
        noise = [c["noise"] for pr in f["pairs"] for c in pr["candidates"] if c["no_more_fwd_bytes"] and c["seeds"]]
        if noise:
            lines += ["", f"The noise of these comparisons is {min(noise):.4f} to {max(noise):.4f} AUROC: a DLAC point"
                      " counts as no worse than a qcomm point while it is less than that much below it."]
        lines += ["", "Targets (issue 33 item 3):", ""]
        for t in f["targets"]:
            word = "met" if t["met"] else "not met"
            if "not_dominated" in t:
                why = (f"{len(t['judged']) - len(t['not_dominated'])} of {len(t['judged'])} qcomm points that ran"
                       " are dominated" + (f"; not: {', '.join(t['not_dominated'])}" if t["not_dominated"] else ""))
            else:
                beaten = ", ".join(f"{b['variant']} {b['auroc_diff']:+.4f} (noise {b['noise']:.4f})"
                                   for b in t["beaten_by"])
                why = ("on the frontier" if t["on_frontier"] else
                       f"off the frontier; higher with no more forward bytes: {beaten}")
            lines.append(f"- {f['dataset']}: {t['target']}: **{word}** ({why})")
    for e in failed:
        lines += ["", f"{e['dataset']}, {e['variant']}: TorchRec could not run it here (seed {e['seed']}; not"
                  f" launched again for seeds {', '.join(map(str, e['seeds_not_launched'])) or 'none'}):"
                  f" `{e['error']}`"]
    return lines


def _calibration_table(row: dict[str, Any]) -> list[str]:
    cands = list(row["calibration"][0]["ratio"])
    # The gradient statistic's columns appear where the run measured it (results from before it existed lack them).
    gradient = any(t.get("gradient_loss_change") for t in row["calibration"])
    heads = [f"ratio @ {c}" for c in cands] + [f"loss change @ {c}" for c in cands]
    heads += [f"gradient loss change @ {c}" for c in cands] if gradient else []
    lines = [
        "| table | rows | distinct vectors / chunk | homogenization index | vector index | class | eps | "
        + " | ".join(heads) + " |",
        "|---|---:|---:|---:|---:|---|---:|" + "---:|" * len(heads),
    ]
    order = sorted(row["calibration"], key=lambda r: int(r["table"].rsplit("_", 1)[1]))
    for t in order:
        cells = [f"{t['ratio'][c]:.1f}" for c in cands]
        cells += ["-" if t["loss_change"] is None else f"{t['loss_change'][c]:+.1e}" for c in cands]
        if gradient:
            grad = t.get("gradient_loss_change")
            cells += ["-" if grad is None else f"{grad[c]:.3f}" for c in cands]
        vector = f"{t['vector_homogenization_index']:.3f}" if "vector_homogenization_index" in t else "-"
        lines.append(
            f"| {t['table']} | {row['table_rows'].get(t['table'], '')} | {t['distinct_per_chunk']:.1f} |"
            f" {t['homogenization_index']:.3f} | {vector} | {t['class']} | {t['eps']} | {' | '.join(cells)} |"
        )
    return lines


def _settings(command: str, cfg: dict[str, Any], datasets: list[str]) -> list[str]:
    return [
        f"Command: `{command}`",
        "",
        f"Settings of {', '.join(datasets)}: DLRM dim {cfg['dim']}, tables capped at {cfg['max_rows']} rows, fused"
        f" Adagrad (lr 0.02) for the tables, dense Adagrad (lr 0.01). Criteo: {cfg['criteo_epochs']} epoch(s), batch"
        f" {cfg['criteo_batch']} per rank. Synthetic and planted: {cfg['synthetic_batches']} batches of"
        f" {cfg['synthetic_batch']} per rank. Calibration: {cfg['calibration_batches']} batches starting at"
        f" {cfg['calibration_start']:.0%} of training ({cfg.get('sensitivity_batches', 1)} probe batch(es) in"
        f" sensitivity mode); schedule step, c=2, T = half of training; backward eps {cfg.get('backward_eps', 0.01)}"
        f" for DLAC both directions. Seeds {', '.join(map(str, cfg.get('seeds', [0])))}. Machine load (1-minute"
        f" average) at the start: {cfg.get('load', '?')}.",
        "",
    ]


def markdown_lines(rows: list[dict[str, Any]], sources: list[tuple[str, dict[str, Any], list[str]]],
                   machine: str) -> list[str]:
    """The section's generated lines from ``rows``; ``sources`` holds the (command, settings, datasets) of each run
    that made them, ``machine`` what they ran on."""
    parts: list[str] = []
    for command, cfg, datasets in sources:
        parts += _settings(command, cfg, datasets)
    parts += [
        f"Machine: {machine}, 2 gloo ranks. Forward all-to-all bytes of the training batches to other ranks (as"
        " DLAC's counters count them), summed over both ranks, against the uncompressed run's float32 bytes;"
        " AUROC of the final validation.",
        "",
        "Over seeds (AUROC difference from the uncompressed run of the same seed):",
        "",
        *_seed_table(_over_seeds(rows)),
        "",
        "Every launch:",
        "",
        *_table(rows),
    ]
    first_seed = min((r.get("seed", 0) for r in rows), default=0)
    for variant in ("DLAC default", "DLAC gradient", "DLAC sensitivity", "DLAC homogenization"):
        for r in rows:
            if r["variant"] == variant and r.get("calibration") and r.get("seed", 0) == first_seed:
                parts += ["", f"Per-table calibration of the {r['dataset']} run, seed {first_seed} ({variant}):", "",
                          *_calibration_table(r)]
    return parts


def load_rows(paths: list[Path]) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any], list[str]]], str]:
    """Rows (in the remote-traffic accounting), sources and machine of stored results files, e.g. one per dataset
    run with its own settings (a dataset in several files is named by each file)."""
    stored = [load_results(p) for p in paths]
    seen: dict[str, int] = {}
    for d in stored:
        for name in {r["dataset"] for r in d["results"]}:
            seen[name] = seen.get(name, 0) + 1
    for p, d in zip(paths, stored):  # one dataset run with different settings: name each run by its file
        for r in d["results"]:
            if seen[r["dataset"]] > 1:
                r["dataset"] = f"{r['dataset']} ({Path(p).stem.removeprefix('adaptive_accuracy_')})"
    rows = normalize_bytes([r for d in stored for r in d["results"]])
    sources = [(d["metadata"]["command"], d["config"], sorted({r["dataset"] for r in d["results"]})) for d in stored]
    meta = stored[0]["metadata"] if stored else {}
    machine = f"{meta.get('cores', '?')} CPU cores; torch {meta.get('versions', {}).get('torch', '?')}"
    return rows, sources, machine


def _rebuild(paths: list[Path], markdown_out: Path | None) -> None:
    """The tables (and the markdown section) from stored results files."""
    rows, sources, machine = load_rows(paths)
    print("\n".join(_table(rows)))
    print()
    print("\n".join(_seed_table(_over_seeds(rows))))
    if markdown_out is not None:
        write_generated_block(markdown_out, SECTION, BEGIN, END, markdown_lines(rows, sources, machine))
        print(f"wrote the tables into {markdown_out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                        help="run nothing: rebuild the tables (and --markdown-out) from these results files, e.g. one"
                        " per dataset run with its own settings")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks/results/adaptive_accuracy.json")
    parser.add_argument("--markdown-out", type=Path, default=None)
    args = parser.parse_args()
    if args.from_json:
        _rebuild(args.from_json, args.markdown_out)
        return
    metadata = start_run("benchmarks/adaptive_accuracy.py", vars(args))

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
    command = "python benchmarks/adaptive_accuracy.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
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
    print("\n".join(_table(rows)))
    print()
    print("\n".join(_seed_table(_over_seeds(rows))))
    extra = {}
    if any(constant_bound(v) is not None for v in variants) and any(qcomm_variant(v) for v in variants):
        extra["frontier"] = frontier(rows)
        print()
        print("\n".join(frontier_lines(extra["frontier"], list(failed.values()))))
    write_results(args.json_out, metadata, cfg, rows, failed=list(failed.values()), **extra)
    print(f"\nwrote {args.json_out}")
    if args.markdown_out is not None:
        machine = f"{os.cpu_count()} CPU cores; torch {torch.__version__}"
        write_generated_block(args.markdown_out, SECTION, BEGIN, END,
                              markdown_lines(rows, [(command, cfg, datasets)], machine))
        print(f"wrote the tables into {args.markdown_out}")


if __name__ == "__main__":
    main()
