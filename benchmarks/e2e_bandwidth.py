"""End-to-end DLRM training step time under an emulated (throttled) interconnect: TorchRec fp32 and qcomm codecs
against the DLAC compressed all-to-all, on 2 gloo CPU ranks; prints a table, writes JSON and a markdown table.

Run as root on Linux (needs ``unshare -n`` and ``tc``), from the repository root:

    python benchmarks/e2e_bandwidth.py --rates 1gbit,unthrottled --batch-size 4096 --steps 8 --warmup 2 \\
        --markdown-out docs/benchmarks.md

Each rate runs in its own network namespace (``unshare -n``) whose private loopback is throttled with
``tc qdisc add dev lo root tbf rate <R> burst 1mb latency 20ms`` (nothing for ``unthrottled``); inside it, every
variant is its own 2-rank launch (gloo, MASTER_ADDR=127.0.0.1, one thread per rank) training TorchRec's DLRM
(26 tables of dim 64, one-hot Zipf ids from the example's synthetic Criteo generator; ``--model dlrm_v2``: MLPerf's
DLRM v2, DLRM_DCN with dim 128 and multi-hot ids with MLPerf's pooling factors) with a plain loop:
DistributedModelParallel, table-wise sharding, fused Adagrad for the tables, dense Adagrad.

That loop (``_train_rank``) is also the reference for training with lightning-dlac without Lightning:
``shard_model`` + ``install_compressed_all_to_all`` + a ``Calibrator`` fed by the exchange group's observer.
The stand-ins it compares with (qcomm byte counters, zero-cost exchanges) are in ``_e2e_stand_ins.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests._launch (the project's rank launcher) lives at the repository root
    sys.path.insert(0, str(REPO))

from _e2e_stand_ins import _codecs_registry, _install_zero_cost_same_bytes  # noqa: E402 - beside this script
from _report import write_generated_block, write_results  # noqa: E402 - beside this script

SECTION = "## End-to-end training under a throttled interconnect"
BEGIN, END = "<!-- e2e_bandwidth:begin -->", "<!-- e2e_bandwidth:end -->"
EMBEDDING_DIM = 64
# Adagrad for both, at the learning rates of examples/configs/dlrm_synthetic.yaml.
DENSE_LR, EMBEDDING_LR = 0.01, 0.02


@dataclass(frozen=True)
class Variant:
    """One way of sending the pooled-embedding all-to-all."""

    name: str
    label: str
    kind: str  # "fp32" | "qcomm" | "dlac" | "zero" | "zero_same"
    forward: str = "fp32"  # qcomm forward precision, or "zero8"
    backward: str = "fp32"  # qcomm / dlac backward encoding, or "zero8"
    auto_fallback: bool = False  # DLAC: DLACStrategy(compress="auto"), the uncompressed fallback
    classes: bool = False  # DLAC: per-table bounds from the homogenization classes, calibrated on the warm-up steps
    overlap: bool = True  # DLAC: exchanges launched and waited on when needed (False: the synchronous path)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("fp32", "FP32 (TorchRec, uncompressed)", "fp32"),
        Variant("qcomm_fp16_fp16", "qcomm FP16/FP16", "qcomm", "fp16", "fp16"),
        Variant("qcomm_int8_fp16", "qcomm INT8/FP16", "qcomm", "int8", "fp16"),
        Variant("dlac_bf16", "DLAC fwd + BF16 bwd", "dlac", "dlac", "bf16"),
        Variant("dlac_fp16", "DLAC fwd + FP16 bwd", "dlac", "dlac", "fp16"),
        Variant("dlac_dlac", "DLAC both directions", "dlac", "dlac", "dlac"),
        Variant("dlac_dlac_sync", "DLAC both directions, synchronous exchanges", "dlac", "dlac", "dlac",
                overlap=False),
        Variant("dlac_classes", "DLAC fwd (table-wise classes) + BF16 bwd", "dlac", "dlac", "bf16", classes=True),
        Variant("dlac_auto", "DLAC fwd + BF16 bwd, compress=auto", "dlac", "dlac", "bf16", auto_fallback=True),
        Variant("zero8_fwd", "zero-cost 8x, fwd only", "zero", "zero8", "fp32"),
        Variant("zero8_both", "zero-cost 8x, both directions", "zero", "zero8", "zero8"),
        Variant("zero_same_ratio", "zero-cost, DLAC's bytes, both directions", "zero_same", "zero_same", "zero_same"),
    )
}
# zero_same_ratio sends what the launch of this variant just before it (same repeat, same namespace) sent.
SAME_BYTES_AS = "dlac_dlac"


# --------------------------------------------------------------------------------------------------------------
# One rank


# --model: the example DLRM (dot interactions, dim 64, one-hot) or MLPerf's DLRM v2 (DCN v2 cross layers, dim 128,
# MLPerf's MLPs, multi-hot features with MLPerf's pooling factors, bags per id as MLPerf materialises them).
MODELS = ("dlrm", "dlrm_v2")
# DLRM v2's DCN and 1024-wide over MLP diverge under dense Adagrad at 0.01 (loss 0.7 -> 1e4 in 4 steps, measured).
DLRM_V2_DENSE_LR = 0.002
# Each model's table has its own generated block (section, begin and end markers) in the markdown file.
MARKDOWN_BLOCKS = {
    "dlrm": (SECTION, BEGIN, END),
    "dlrm_v2": ("## End-to-end training of DLRM v2 (DCN, dim 128, multi-hot) under a throttled interconnect",
                "<!-- e2e_bandwidth dlrm_v2:begin -->", "<!-- e2e_bandwidth dlrm_v2:end -->"),
}


def _model_and_data(model: str, max_rows: int, batch_size: int) -> tuple[Any, Any]:
    """The synthetic datamodule and the (unsharded) example LightningModule of ``--model``."""
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

    if model == "dlrm_v2":
        data = SyntheticCriteoDataModule(max_rows=max_rows, batch_size=batch_size, seed=0,
                                         multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES))
        dlrm = DLRMModule(data.num_embeddings_per_feature, embedding_dim=128, dense_arch_layer_sizes=[512, 256, 128],
                          over_arch_layer_sizes=[1024, 1024, 512, 256, 1], interaction="dcn", dcn_num_layers=3,
                          dcn_low_rank_dim=512, learning_rate=DLRM_V2_DENSE_LR)
        return data, dlrm
    data = SyntheticCriteoDataModule(max_rows=max_rows, batch_size=batch_size, seed=0)
    return data, DLRMModule(data.num_embeddings_per_feature, embedding_dim=EMBEDDING_DIM, learning_rate=DENSE_LR)


def _train_rank(rank: int, world_size: int, variant_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of one launch: the reference plain training loop (TorchRec and lightning-dlac, no Lightning).

    ``shard_model`` plans table-wise and wraps the model in DistributedModelParallel (fused Adagrad for the tables,
    dense parameters in DDP); ``install_compressed_all_to_all`` puts DLAC's exchange in; a ``Calibrator`` fed by the
    exchange's chunk observer gives the per-table bounds (``dlac_classes``), as ``DLACCallback`` does under
    Lightning; the dense optimizer gets ``dense_parameters``; the step is an ordinary forward / backward / step."""
    import torch.distributed as dist

    from lightning_dlac.adaptive import CalibrationSettings, Calibrator
    from lightning_dlac.comm import CompressionConfig, ErrorBounds, install_compressed_all_to_all
    from lightning_dlac.comm.collectives import all_gather_object, all_reduce
    from lightning_dlac.sharding import ShardingOptions, dense_parameters, shard_model

    variant = VARIANTS[variant_name]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        batch_size, steps, warmup = cfg["batch_size"], cfg["steps"], cfg["warmup"]
        data, dlrm = _model_and_data(cfg.get("model", "dlrm"), cfg["max_rows"], batch_size)
        gen = data.generator
        # Pre-draw every batch (rank r of W takes global batches r, r + W, ...) so that timing is training only.
        batches = [gen.batch(i * world_size + rank, batch_size=batch_size) for i in range(warmup + steps)]

        registry, fwd_codec, bwd_codec = _codecs_registry(variant)
        # static_graph=True: DistributedModelParallel's default DDP wrapper, which this benchmark has always used.
        options = ShardingOptions(sharding_types=["table_wise"], embedding_optimizer="adagrad",
                                  embedding_lr=EMBEDDING_LR, adagrad_epsilon=1e-8, static_graph=True,
                                  qcomm_codecs_registry=registry)
        dims = {t.name: t.embedding_dim for t in dlrm.embedding_bag_collection.embedding_bag_configs()}
        model = shard_model(dlrm.model, options, torch.device("cpu"))
        plan = model.plan
        group = None
        bounds = ErrorBounds(0.01)
        calibrator = None
        if variant.kind == "dlac":
            config = CompressionConfig(backward=variant.backward, auto_fallback=variant.auto_fallback,
                                       fallback_check_every=cfg.get("fallback_check_every", 64),
                                       overlap=variant.overlap)
            group = install_compressed_all_to_all(model, config, bounds)
            if not group:
                raise RuntimeError("install_compressed_all_to_all installed nothing: the plan is not table-wise.")
            if variant.classes:
                # The callback's table-wise level without Lightning: measure the warm-up steps' chunks, classify
                # (statistics reduced over ranks, so every rank picks the same bounds), apply.
                settings = CalibrationSettings(index_eps=0.03, batches=warmup, sensitivity_batches=0)
                calibrator = Calibrator(settings, all_reduce, all_gather_object)
                calibrator.begin()
                group.set_observer(calibrator.observe)
        zero_same = None
        if variant.kind == "zero_same":
            same = cfg["same_bytes"]
            (zero_same,) = _install_zero_cost_same_bytes(model, same["fwd"], same["bwd"])
        dense_opt = torch.optim.Adagrad(dense_parameters(model), lr=dlrm.hparams.learning_rate)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        local_dim = sum(dims[n] for mp in plan.plan.values() for n, spec in mp.items() if rank in (spec.ranks or []))

        times, losses, uncompressed_steps = [], [], []
        for i, batch in enumerate(batches):
            if i == warmup and calibrator is not None:
                group.set_observer(None)
                calibrator.finish(i, group.all_compressed_tables)
                bounds.set_table_bounds(calibrator.table_bounds)
            if i == warmup:
                dist.barrier()
                warm = group.stats() if group else None  # counters only grow: the timed steps are the difference
                if zero_same is not None:
                    zero_same.sent = {"fwd": 0, "bwd": 0}
                for c in (fwd_codec, bwd_codec):
                    if c is not None:
                        c.reset()
            sent_uncompressed = group.stats().uncompressed_calls if group else 0
            t0 = time.perf_counter()
            logits = model(batch.dense_features, batch.sparse_features).squeeze(-1)
            loss = loss_fn(logits, batch.labels)
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            elapsed = time.perf_counter() - t0
            if calibrator is not None and calibrator.measuring(i):
                calibrator.batch_measured()
            if i >= warmup:
                times.append(elapsed)
                # compress="auto": whether this step's exchange went uncompressed (a check of the other way)
                uncompressed_steps.append(bool(group) and group.stats().uncompressed_calls > sent_uncompressed)
            losses.append(loss.item())

        out: dict[str, Any] = {"times": times, "losses": losses, "local_dim": local_dim,
                               "uncompressed_steps": uncompressed_steps}
        # Bytes to other ranks (the block a rank keeps is a local copy, and DLAC's statistics count it nowhere).
        remote = (world_size - 1) / world_size
        raw_fwd = (world_size - 1) * batch_size * local_dim * 4 * steps
        if group:
            stats = group.stats() - warm
            out.update(
                fwd_raw_bytes=stats.raw_bytes, fwd_sent_bytes=stats.sent_bytes,
                bwd_raw_bytes=stats.backward_raw_bytes, bwd_sent_bytes=stats.backward_sent_bytes,
                fwd_encode_s=stats.encode_s, fwd_exchange_s=stats.exchange_s, fwd_decode_s=stats.decode_s,
                bwd_s=stats.backward_s, fwd_calls=stats.calls, uncompressed_calls=stats.uncompressed_calls,
                table_bounds=bounds.table_bounds(),
                max_error_over_bound=max(stats.table_max_error_ratio.values(), default=None),
            )
        elif zero_same is not None:
            out.update(fwd_raw_bytes=raw_fwd, fwd_sent_bytes=zero_same.sent["fwd"], bwd_raw_bytes=raw_fwd,
                       bwd_sent_bytes=zero_same.sent["bwd"], fwd_calls=steps)
        elif fwd_codec is not None:
            # TorchRec's codecs see the whole send buffer, every destination's equal share included.
            out.update(
                fwd_raw_bytes=int(fwd_codec.raw_bytes * remote), fwd_sent_bytes=int(fwd_codec.sent_bytes * remote),
                bwd_raw_bytes=int(bwd_codec.raw_bytes * remote), bwd_sent_bytes=int(bwd_codec.sent_bytes * remote),
                fwd_codec_s=fwd_codec.codec_s, bwd_codec_s=bwd_codec.codec_s, fwd_calls=fwd_codec.calls,
            )
        else:
            out.update(fwd_raw_bytes=raw_fwd, fwd_sent_bytes=raw_fwd, bwd_raw_bytes=raw_fwd, bwd_sent_bytes=raw_fwd,
                       fwd_calls=steps)
        return out
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------------------
# Inside one network namespace: all variants at one rate


def _summarize(variant: Variant, rate: str, per_rank: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    steps, world = len(per_rank[0]["times"]), len(per_rank)  # pooled over repeated launches
    # A step is done when the slower rank is done: take the max over ranks per step, then the median over steps.
    step_s = [max(r["times"][i] for r in per_rank) for i in range(steps)]
    median_s = statistics.median(step_s)
    last = [statistics.fmean(r["losses"][-5:]) for r in per_rank]

    def per_step(key: str) -> float | None:
        vals = [r.get(key) for r in per_rank]
        return None if any(v is None for v in vals) else statistics.fmean(vals) / steps

    fwd_a2a_s = None
    if variant.kind == "dlac":
        fwd_a2a_s = sum(per_step(k) for k in ("fwd_encode_s", "fwd_exchange_s", "fwd_decode_s"))
    row = dict(
        rate=rate, world_size=world, variant=variant.name, label=variant.label, median_step_ms=median_s * 1e3,
        mean_step_ms=statistics.fmean(step_s) * 1e3,  # counts the rare slow steps (compress="auto"'s checks)
        step_ms=[s * 1e3 for s in step_s], samples_per_s=world * cfg["batch_size"] / median_s,
        fwd_a2a_ms=None if fwd_a2a_s is None else fwd_a2a_s * 1e3,
        fwd_a2a_share=None if fwd_a2a_s is None else fwd_a2a_s / median_s,
        fwd_encode_ms=None if per_step("fwd_encode_s") is None else per_step("fwd_encode_s") * 1e3,
        fwd_exchange_ms=None if per_step("fwd_exchange_s") is None else per_step("fwd_exchange_s") * 1e3,
        fwd_decode_ms=None if per_step("fwd_decode_s") is None else per_step("fwd_decode_s") * 1e3,
        bwd_a2a_ms=None if per_step("bwd_s") is None else per_step("bwd_s") * 1e3,
        fwd_raw_bytes_per_step=per_step("fwd_raw_bytes"), fwd_sent_bytes_per_step=per_step("fwd_sent_bytes"),
        bwd_raw_bytes_per_step=per_step("bwd_raw_bytes"), bwd_sent_bytes_per_step=per_step("bwd_sent_bytes"),
        final_loss=statistics.fmean(last),
        losses=[statistics.fmean(r["losses"][i] for r in per_rank) for i in range(len(per_rank[0]["losses"]))],
        max_error_over_bound=max((r.get("max_error_over_bound") or 0.0 for r in per_rank), default=None)
        if variant.kind == "dlac" else None,
        local_dim_per_rank=[r["local_dim"] for r in per_rank],
    )
    row["fwd_ratio"] = row["fwd_raw_bytes_per_step"] / row["fwd_sent_bytes_per_step"]
    if variant.auto_fallback:
        row["uncompressed_share"] = per_rank[0]["uncompressed_calls"] / max(per_rank[0]["fwd_calls"], 1)
        row["label"] += f" ({row['uncompressed_share']:.0%} of steps uncompressed)"
        # What the checks cost, measured within the launches (immune to load drift between launches): the mean
        # step over the mean step that went compressed, i.e. the fixed-compression step of the same launches.
        flags = [any(r["uncompressed_steps"][i] for r in per_rank) for i in range(steps)]
        compressed = [s for s, f in zip(step_s, flags) if not f]
        row["uncompressed_steps"] = [i for i, f in enumerate(flags) if f]
        row["check_overhead"] = statistics.fmean(step_s) / statistics.fmean(compressed) - 1 if compressed else None
    if variant.classes:
        chosen = {t: eps for r in per_rank for t, eps in r["table_bounds"].items()}
        row["table_bounds"] = chosen
        counts = [sum(1 for eps in chosen.values() if eps == e) for e in (0.01, 0.03, 0.05)]
        row["label"] += f" ({counts[0]} tight / {counts[1]} base / {counts[2]} loose)"
    if not math.isfinite(row["final_loss"]):
        raise RuntimeError(f"{variant.name} at {rate}: the training loss is not finite ({row['final_loss']}).")
    return row


def _inside_namespace(rate: str, variants: list[str], cfg: dict[str, Any], out: Path) -> None:
    from tests._launch import run_ranks

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if rate != "unthrottled":
        subprocess.run(
            ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "1mb", "latency", "20ms"],
            check=True,
        )
    # Launches drift on a shared machine (+-20% between otherwise identical launches), so each variant is launched
    # `repeats` times in round-robin order and its steps are pooled: slow drift then hits every variant alike.
    launches: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in variants}
    for rep in range(cfg["repeats"]):
        for name in variants:
            t0 = time.perf_counter()
            launch_cfg = cfg
            if name == "zero_same_ratio":  # the bytes per step, per rank, of this repeat's DLAC launch
                dlac = launches[SAME_BYTES_AS][-1]
                launch_cfg = dict(cfg, same_bytes={
                    d: [round(r[f"{d}_sent_bytes"] / cfg["steps"]) for r in dlac] for d in ("fwd", "bwd")})
            per_rank = run_ranks(_train_rank, cfg["world_size"], name, launch_cfg, timeout=cfg["timeout"])
            launches[name].append(per_rank)
            step_ms = statistics.median(max(r["times"][i] for r in per_rank) for i in range(cfg["steps"])) * 1e3
            print(f"  [{rate}] {name} (launch {rep + 1}/{cfg['repeats']}): {step_ms:.0f} ms/step"
                  f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = [_summarize(VARIANTS[name], rate, _pool(launches[name]), cfg) for name in variants]
    for name, row in zip(variants, rows):
        steps = cfg["steps"]
        row["launch_median_ms"] = [
            statistics.median(max(r["times"][i] for r in per_rank) for i in range(steps)) * 1e3
            for per_rank in launches[name]
        ]
    out.write_text(json.dumps(rows))


def _pool(launches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One per-rank record over several launches: step times concatenated, counters summed, the rest from the
    first launch (same seeds: same losses and bounds)."""
    pooled = []
    for rank_records in zip(*launches):
        first = dict(rank_records[0])
        first["times"] = [t for r in rank_records for t in r["times"]]
        first["uncompressed_steps"] = [u for r in rank_records for u in r["uncompressed_steps"]]
        for key, value in rank_records[0].items():
            if key.endswith(("_bytes", "_s", "_calls")) and isinstance(value, (int, float)):
                first[key] = sum(r[key] for r in rank_records)
            elif key == "max_error_over_bound" and value is not None:
                first[key] = max(r[key] for r in rank_records)
        pooled.append(first)
    return pooled


# --------------------------------------------------------------------------------------------------------------
# Parent: one namespace per rate, then the tables


def _fmt_bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _spread(row: dict[str, Any]) -> str:
    meds = row.get("launch_median_ms") or []
    return f"{min(meds):.0f}-{max(meds):.0f}" if len(meds) > 1 else "-"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| rate | variant | median step ms | launch medians ms | samples/s | speedup vs FP32 | fwd a2a share |"
        " fwd MiB/step raw -> sent (ratio) | bwd MiB/step sent | final loss |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    base = {r["rate"]: r["median_step_ms"] for r in rows if r["variant"] == "fp32"}
    for r in rows:
        speedup = f"{base[r['rate']] / r['median_step_ms']:.2f}x" if r["rate"] in base else "-"
        share = "-" if r["fwd_a2a_share"] is None else f"{100 * r['fwd_a2a_share']:.0f}%"
        lines.append(
            f"| {r['rate']} | {r['label']} | {r['median_step_ms']:.0f} | {_spread(r)} | {r['samples_per_s']:.0f}"
            f" | {speedup}"
            f" | {share} |"
            f" {_fmt_bytes(r['fwd_raw_bytes_per_step'])} -> {_fmt_bytes(r['fwd_sent_bytes_per_step'])}"
            f" ({r['fwd_ratio']:.1f}x) | {_fmt_bytes(r['bwd_sent_bytes_per_step'])} | {r['final_loss']:.4f} |"
        )
    return lines


def _ceiling_lines(rows: list[dict[str, Any]]) -> list[str]:
    """DLAC both directions against the zero-cost stand-in with its bytes (its ceiling), and the overlapped exchange
    against the synchronous one, per rate: ratios of median step times (and of the per-launch medians, paired by
    repeat: the two launches of a pair ran back to back)."""
    lines = []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        at = {r["variant"]: r for r in rows if r["rate"] == rate}
        for name, ref, what in (("dlac_dlac", "zero_same_ratio", "fraction of the same-bytes zero-cost ceiling"),
                                ("dlac_dlac", "dlac_dlac_sync", "overlapped / synchronous speed")):
            if name in at and ref in at:
                pooled = at[ref]["median_step_ms"] / at[name]["median_step_ms"]
                paired = [b / a for a, b in zip(at[name]["launch_median_ms"], at[ref]["launch_median_ms"])]
                at[name][f"vs_{ref}"] = pooled
                spread = f" (per repeat {min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
                lines.append(f"- {rate}: {at[name]['label']}: {what} {pooled:.2f}{spread}")
        auto, fixed = at.get("dlac_auto"), at.get("dlac_bf16")
        if auto is not None and auto.get("check_overhead") is not None:
            versus = (f"; mean step speed {fixed['mean_step_ms'] / auto['mean_step_ms']:.2f}x of fixed compression's"
                      " (DLAC fwd + BF16 bwd, other launches)" if fixed is not None else "")
            lines.append(f"- {rate}: compress=auto: its {len(auto['uncompressed_steps'])} uncompressed steps of"
                         f" {len(auto['step_ms'])} cost {auto['check_overhead']:+.1%} over its compressed steps"
                         f" (the same launches' fixed compression){versus}")
    return lines


def _write_markdown(path: Path, rows: list[dict[str, Any]], command: str, cfg: dict[str, Any]) -> None:
    write_generated_block(path, *MARKDOWN_BLOCKS[cfg.get("model", "dlrm")], [
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}),"
        f" {cfg.get('world_size', 2)} gloo ranks, one"
        f" thread each; torch {torch.__version__}. Batch {cfg['batch_size']} per rank; each variant launched"
        f" {cfg['repeats']} time(s), round-robin over the variants, {cfg['steps']} timed steps after"
        f" {cfg['warmup']} warm-up steps per launch; median over all timed steps (per step, the slower rank), and"
        " the range of the per-launch medians. Bytes are per rank per step, to the other ranks (the rows a rank"
        " keeps for itself are a local copy: DLAC neither encodes nor sends them).",
        "",
        *_table(rows),
        "",
        *_ceiling_lines(rows),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1gbit,10gbit,unthrottled",
                        help="comma-separated tc rates (e.g. 1gbit, 500mbit) or 'unthrottled'")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=1,
                        help="launches per variant, round-robin over the variants; their steps are pooled")
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks per launch (they share the throttled loopback: its rate is for all of them)")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows")
    parser.add_argument("--model", choices=MODELS, default="dlrm",
                        help="dlrm: dot interactions, dim 64, one-hot; dlrm_v2: MLPerf DLRM v2 (DCN, dim 128,"
                        " multi-hot)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--fallback-check-every", type=int, default=64,
                        help="dlac_auto: exchanges between checks of the way not taken (the library's default 64;"
                             " a short launch sees a check only with a small value, e.g. 4 for 8 steps)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks/results/e2e_bandwidth.json")
    parser.add_argument("--markdown-out", type=Path, default=None,
                        help=f"markdown file whose '{SECTION}' section gets the table (e.g. docs/benchmarks.md)")
    parser.add_argument("--_inside", default=None, help=argparse.SUPPRESS)  # rate, when re-executed in a namespace
    parser.add_argument("--_rows-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be >= 1, --warmup >= 0")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if "zero_same_ratio" in variants:  # launched right after the DLAC launch whose bytes it sends
        if SAME_BYTES_AS not in variants:
            parser.error(f"zero_same_ratio sends what {SAME_BYTES_AS} sent in the same repeat: add {SAME_BYTES_AS}")
        variants.remove("zero_same_ratio")
        variants.insert(variants.index(SAME_BYTES_AS) + 1, "zero_same_ratio")
    if "dlac_classes" in variants and args.warmup < 1:
        parser.error("dlac_classes calibrates its per-table bounds on the warm-up steps: give --warmup >= 1")
    if args.fallback_check_every < 1:
        parser.error("--fallback-check-every must be >= 1")
    if args.world_size < 2:
        parser.error("--world-size must be >= 2 (the all-to-all needs another rank)")
    cfg = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, max_rows=args.max_rows,
               world_size=args.world_size, model=args.model, fallback_check_every=args.fallback_check_every,
               timeout=args.timeout, repeats=args.repeats)

    if args._inside is not None:
        _inside_namespace(args._inside, variants, cfg, args._rows_out)
        return

    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        if r != "unthrottled" and not re.fullmatch(r"\d+(\.\d+)?([kmg]?bit|[kmg]?bps)", r):
            parser.error(f"rate {r!r} is not a tc rate like '1gbit' or '500mbit' (or 'unthrottled')")
    if sys.platform != "linux" or os.geteuid() != 0:
        sys.exit("e2e_bandwidth.py emulates the interconnect with `unshare -n` and `tc`: run it as root on Linux.")

    # Build the native codec once here (a JIT build of ~40 s) so that no rank builds it while being timed.
    from lightning_dlac.codec import native_available

    if not native_available():
        print("warning: the native DLAC codec did not build; the DLAC variants run the (slow) reference codec.")

    command = "python benchmarks/e2e_bandwidth.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[dict[str, Any]] = []
    for rate in rates:
        print(f"rate {rate}: {len(variants)} variant(s) in a private network namespace", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            cmd = ["unshare", "-n", sys.executable, str(Path(__file__).resolve()), *sys.argv[1:],
                   "--_inside", rate, "--_rows-out", tmp.name]
            proc = subprocess.run(cmd, cwd=REPO)
            text = Path(tmp.name).read_text()
            rows.extend(json.loads(text) if text else [])
            if proc.returncode != 0:
                sys.exit(f"rate {rate} failed (exit code {proc.returncode}); see the output above.")

    print()
    print("\n".join(_table(rows)))
    print("\n".join(_ceiling_lines(rows)))
    write_results(args.json_out, command, cfg, rows)
    print(f"\nwrote {args.json_out}")
    if args.markdown_out is not None:
        _write_markdown(args.markdown_out, rows, command, cfg)
        print(f"wrote the table into {args.markdown_out}")


if __name__ == "__main__":
    main()
