"""The end-to-end benchmarks' training step and its figures (``python -m benchmarks.e2e_bandwidth``, one throttled
loopback; ``python -m benchmarks.e2e_topology``, two emulated nodes): the ways of sending the pooled-embedding
all-to-all (:data:`VARIANTS`), one rank of a launch (:func:`train_rank`), the pooling of repeated launches, the
ratios against FP32 and against each variant's like-for-like ceiling, the targets and the table.

:func:`train_rank` is also the reference for training with lightning-dlac without Lightning: ``shard_model`` +
``install_compressed_all_to_all`` + a ``Calibrator`` fed by the exchange group's observer. The TorchRec-path
stand-ins (qcomm byte counters, zero-cost 8x codecs) are in :mod:`benchmarks.lib.qcomm`, the pipelined steps in
:mod:`benchmarks.lib.pipeline`.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.lib.pipeline import Stepper, module_to_shard, pipeline_summary
from benchmarks.lib.qcomm import codec_precision, codecs_registry
from benchmarks.lib.rule import judge

EMBEDDING_DIM = 64


# Adagrad for both, at the learning rates of examples/configs/dlrm_synthetic.yaml.
DENSE_LR, EMBEDDING_LR = 0.01, 0.02


@dataclass(frozen=True)
class Variant:
    """One way of sending the pooled-embedding all-to-all. Every setting the name does not mention is the library's
    default (``CompressionConfig()``: overlap per backend, error sampling every 10 exchanges, ...)."""

    name: str
    label: str
    kind: str  # "fp32" | "qcomm" | "dlac" | "null" | "zero"
    forward: str = "fp32"  # qcomm forward precision, or "zero8"
    backward: str = "fp32"  # qcomm / dlac backward encoding, or "zero8"
    auto_fallback: bool = False  # DLAC: CompressionOptions(auto_fallback=True), the uncompressed fallback
    classes: bool = False  # DLAC: per-table bounds from the homogenization classes, calibrated on the warm-up steps
    overlap: bool | None = None  # DLAC: None = the library's default (overlapped on NCCL, synchronous on gloo)
    ceiling_of: str | None = None  # null: the DLAC variant whose bytes it sends (its like-for-like ceiling)
    # "sparse_dist": through TorchRec's sparse-dist pipeline; "alternate": unpipelined and pipelined blocks of steps
    # in turn within one launch (e2e_pipeline.py). A pipelined variant is its unpipelined twin's name + _pipelined.
    pipeline: str | None = None
    # DLAC: which peers get the compressed exchange ("all", "other_nodes"); None: the library's default. The
    # multi-node variants (e2e_topology.py, issue 37) name it.
    compress_peers: str | None = None
    # DLAC: the pieces the synchronous exchange is sent in (CompressionConfig.pieces); None: the library's default.
    pieces: int | None = None


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("fp32", "FP32 (TorchRec, uncompressed)", "fp32"),
        Variant("qcomm_fp16_fp16", "qcomm FP16/FP16", "qcomm", "fp16", "fp16"),
        Variant("qcomm_int8_fp16", "qcomm INT8/FP16", "qcomm", "int8", "fp16"),
        # TorchRec's other codecs (issue 34): FP8 and MX4 (4.25 bits per value) both ways, MX4 forward with a BF16
        # backward (on gloo TorchRec sends that FP16). Where TorchRec cannot run one on this platform, its launch's
        # error is recorded in the results file ("failed") instead of a time.
        Variant("qcomm_fp8", "qcomm FP8/FP8", "qcomm", "fp8", "fp8"),
        Variant("qcomm_mx4", "qcomm MX4/MX4", "qcomm", "mx4", "mx4"),
        Variant("qcomm_mx4_bf16", "qcomm MX4/BF16 (FP16 on gloo)", "qcomm", "mx4", "bf16"),
        Variant("dlac_bf16", "DLAC fwd + BF16 bwd", "dlac", "dlac", "bf16"),
        Variant("dlac_fp16", "DLAC fwd + FP16 bwd", "dlac", "dlac", "fp16"),
        Variant("dlac_dlac", "DLAC both directions", "dlac", "dlac", "dlac"),
        Variant("dlac_dlac_sync", "DLAC both directions, synchronous exchanges", "dlac", "dlac", "dlac",
                overlap=False),
        Variant("dlac_dlac_overlap", "DLAC both directions, overlapped exchanges", "dlac", "dlac", "dlac",
                overlap=True),
        Variant("dlac_classes", "DLAC fwd (table-wise classes) + BF16 bwd", "dlac", "dlac", "bf16", classes=True),
        Variant("dlac_auto", "DLAC fwd + BF16 bwd, compress=auto", "dlac", "dlac", "bf16", auto_fallback=True),
        Variant("ceiling_dlac_dlac", "ceiling of DLAC both directions (null codec, DLAC's bytes)", "null", "dlac",
                "dlac", ceiling_of="dlac_dlac"),
        # The exchange sent in 4 pieces (CompressionConfig(pieces=4), issue 34: the codec works on one piece while
        # another is on the wire) and its own ceiling, the null codec sent in the same pieces.
        Variant("dlac_dlac_pieces", "DLAC both directions, sent in 4 pieces", "dlac", "dlac", "dlac", pieces=4),
        Variant("ceiling_dlac_dlac_pieces", "ceiling of DLAC both directions in 4 pieces (null codec, its bytes)",
                "null", "dlac", "dlac", ceiling_of="dlac_dlac_pieces", pieces=4),
        # Issue 37 (e2e_topology.py, 2 nodes x 2 ranks): DLAC to every peer, to the other node's ranks only (the
        # same node's pairs uncompressed), and the latter's like-for-like ceiling.
        Variant("dlac_dlac_all", "DLAC both directions, to every peer", "dlac", "dlac", "dlac", compress_peers="all"),
        Variant("dlac_dlac_other_nodes", "DLAC both directions, to other nodes only", "dlac", "dlac", "dlac",
                compress_peers="other_nodes"),
        Variant("ceiling_dlac_dlac_other_nodes", "ceiling of DLAC to other nodes only (null codec, its bytes)", "null",
                "dlac", "dlac", ceiling_of="dlac_dlac_other_nodes", compress_peers="other_nodes"),
        Variant("zero8_fwd", "zero-cost 8x, fwd only (TorchRec path)", "zero", "zero8", "fp32"),
        Variant("zero8_both", "zero-cost 8x, both directions (TorchRec path)", "zero", "zero8", "zero8"),
        Variant("fp32_pipelined", "FP32, sparse-dist pipeline", "fp32", pipeline="sparse_dist"),
        Variant("dlac_dlac_pipelined", "DLAC both directions, sparse-dist pipeline", "dlac", "dlac", "dlac",
                pipeline="sparse_dist"),
        Variant("dlac_dlac_sync_pipelined", "DLAC both directions, synchronous exchanges, sparse-dist pipeline",
                "dlac", "dlac", "dlac", overlap=False, pipeline="sparse_dist"),
        Variant("dlac_dlac_overlap_pipelined", "DLAC both directions, overlapped exchanges, sparse-dist pipeline",
                "dlac", "dlac", "dlac", overlap=True, pipeline="sparse_dist"),
        Variant("fp32_alternate", "FP32, unpipelined and sparse-dist steps in turn", "fp32", pipeline="alternate"),
        Variant("dlac_dlac_alternate", "DLAC both directions, unpipelined and sparse-dist steps in turn", "dlac",
                "dlac", "dlac", pipeline="alternate"),
        Variant("dlac_dlac_sync_alternate", "DLAC both directions, synchronous exchanges, unpipelined and sparse-dist"
                " steps in turn", "dlac", "dlac", "dlac", overlap=False, pipeline="alternate"),
        Variant("dlac_dlac_overlap_alternate", "DLAC both directions, overlapped exchanges, unpipelined and"
                " sparse-dist steps in turn", "dlac", "dlac", "dlac", overlap=True, pipeline="alternate"),
    )
}


# A launch faster than its ceiling by more than this fraction is a benchmark error, not a result.
CEILING_TOLERANCE = 0.05


# The issue-25 targets, each judged by the rule (benchmarks/lib/rule.py RULE) from pooled and per-repeat figures:
# (rate, name, variant, reference, threshold, what the figure is).
TARGETS = (
    ("1gbit", "DLAC both directions >= 0.9 of its ceiling", "dlac_dlac", "ceiling_dlac_dlac", 0.9, "ceiling"),
    ("1gbit", "DLAC fwd + BF16 bwd ahead of qcomm INT8/FP16", "dlac_bf16", "qcomm_int8_fp16", 1.0, "speed"),
    ("10gbit", "DLAC both directions >= 0.8 of its ceiling", "dlac_dlac", "ceiling_dlac_dlac", 0.8, "ceiling"),
    ("unthrottled", "compress=\"auto\" >= 0.97x FP32", "dlac_auto", "fp32", 0.97, "speed"),
    # Issue 29's target: the pipelined DLAC run against the unpipelined one (each its own launch).
    ("1gbit", "DLAC both directions, pipelined >= 1.1x unpipelined", "dlac_dlac_pipelined", "dlac_dlac", 1.1, "speed"),
)


# --model: the example DLRM (dot interactions, dim 64, one-hot) or MLPerf's DLRM v2 (DCN v2 cross layers, dim 128,
# MLPerf's MLPs, multi-hot features with MLPerf's pooling factors, bags per id as MLPerf materialises them).
MODELS = ("dlrm", "dlrm_v2")


# DLRM v2's DCN and 1024-wide over MLP diverge under dense Adagrad at 0.01 (loss 0.7 -> 1e4 in 4 steps, measured).
DLRM_V2_DENSE_LR = 0.002


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


def train_rank(rank: int, world_size: int, variant_name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of one launch: the reference plain training loop (TorchRec and lightning-dlac, no Lightning).

    ``shard_model`` plans table-wise and wraps the model in DistributedModelParallel (fused Adagrad for the tables,
    dense parameters in DDP); ``install_compressed_all_to_all`` puts DLAC's exchange in; a ``Calibrator`` fed by the
    exchange's chunk observer gives the per-table bounds (``dlac_classes``), as ``DLACCallback`` does under
    Lightning; the dense optimizer gets ``dense_parameters``; the step is an ordinary forward / backward / step."""
    import torch.distributed as dist

    from lightning_dlac.adaptive import CalibrationSettings, Calibrator, ErrorBounds
    from lightning_dlac.comm import CompressionConfig, install_compressed_all_to_all
    from lightning_dlac.comm.collectives import all_gather_object, all_reduce
    from lightning_dlac.comm.null_codec import bytes_per_call, install_null_codec
    from lightning_dlac.engine.sharding import ShardingOptions, dense_parameters, shard_model

    variant = VARIANTS[variant_name]
    if cfg.get("cpu_starved"):  # every rank, the threads it has and those it starts (gloo's), on one core
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), {cfg["cpu_starved_core"]})
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        batch_size, steps, warmup = cfg["batch_size"], cfg["steps"], cfg["warmup"]
        data, dlrm = _model_and_data(cfg.get("model", "dlrm"), cfg["max_rows"], batch_size)
        gen = data.generator
        # Pre-draw every batch (rank r of W takes global batches r, r + W, ...) so that timing is training only.
        batches = [gen.batch(i * world_size + rank, batch_size=batch_size) for i in range(warmup + steps)]

        registry, fwd_codec, bwd_codec = codecs_registry(variant)
        # The library's sharding defaults but for the model's optimizer settings (static_graph=False since issue 25;
        # the runs before it used True).
        options = ShardingOptions(sharding_types=["table_wise"], embedding_optimizer="adagrad",
                                  embedding_lr=EMBEDDING_LR, adagrad_epsilon=1e-8, qcomm_codecs_registry=registry)
        dims = {t.name: t.embedding_dim for t in dlrm.embedding_bag_collection.embedding_bag_configs()}
        model = shard_model(module_to_shard(dlrm, variant.pipeline), options, torch.device("cpu"))
        plan = model.plan
        group = None
        bounds = ErrorBounds(0.01)
        calibrator = None
        if variant.kind in ("dlac", "null"):
            exchange = dict(backward=variant.backward, auto_fallback=variant.auto_fallback,
                            fallback_check_every=cfg.get("fallback_check_every", 64), overlap=variant.overlap)
            if variant.compress_peers is not None:
                exchange["compress_peers"] = variant.compress_peers
            if variant.pieces is not None:
                exchange["pieces"] = variant.pieces
            if variant.kind == "null":  # nothing to sample: the null codec's payload is not DLAC's
                exchange["error_every"] = 0
            group = install_compressed_all_to_all(model, CompressionConfig(**exchange), bounds)
            if not group:
                raise RuntimeError("install_compressed_all_to_all installed nothing: the plan is not table-wise.")
            if variant.kind == "null":  # the like-for-like ceiling: DLAC's bytes per table and direction, no codec
                sent = cfg["null_bytes"][rank]
                install_null_codec(group, sent["forward"], sent["backward"] if variant.backward == "dlac" else None)
            if variant.classes:
                # The callback's table-wise level without Lightning: measure the warm-up steps' chunks, classify
                # (statistics reduced over ranks, so every rank picks the same bounds), apply.
                # The homogenization classes by name: they need only the forward chunks this loop observes (the
                # gradient and noise modes read the backward exchange's gradients, which no observer feeds here).
                settings = CalibrationSettings(mode="homogenization", index_eps=0.03, batches=warmup,
                                               sensitivity_batches=0)
                calibrator = Calibrator(settings, all_reduce, all_gather_object)
                calibrator.begin()
                group.set_observer(calibrator.observe)
        dense_opt = torch.optim.Adagrad(dense_parameters(model), lr=dlrm.hparams.learning_rate)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        step = Stepper(model, batches, loss_fn, dense_opt, variant.pipeline)
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
                for c in (fwd_codec, bwd_codec):
                    if c is not None:
                        c.reset()
            sent_uncompressed = group.stats().uncompressed_calls if group else 0
            t0 = time.perf_counter()
            loss = step(batch)
            elapsed = time.perf_counter() - t0
            if calibrator is not None and calibrator.measuring(i):
                calibrator.batch_measured()
            if i >= warmup:
                times.append(elapsed)
                # auto_fallback: whether this step's exchange went uncompressed (a check of the other way)
                uncompressed_steps.append(bool(group) and group.stats().uncompressed_calls > sent_uncompressed)
            losses.append(loss.item())

        out: dict[str, Any] = {"times": times, "losses": losses, "local_dim": local_dim,
                               "uncompressed_steps": uncompressed_steps, **step.report(warmup)}
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
                max_error_over_bound=max(stats.table_max_error_ratio.values(), default=None)
                if variant.kind == "dlac" else None,
                bytes_per_call=bytes_per_call(stats),  # what a null-codec launch sends to stand in for this one
                # Payload bytes to the peers of each link class, forward + backward (compress_peers).
                same_node_sent_bytes=stats.same_node_sent_bytes, other_nodes_sent_bytes=stats.other_nodes_sent_bytes,
                # Of fwd_raw_bytes / fwd_sent_bytes, those sent as they are (dlac_run.json's forward_passed_bytes)
                fwd_passed_bytes=sum(stats.table_passed_bytes.values()),
                bwd_passed_bytes=sum(stats.table_backward_passed_bytes.values()),  # the same of the gradients
            )
        elif fwd_codec is not None:
            # TorchRec's codecs see the whole send buffer, every destination's equal share included.
            out.update(
                fwd_raw_bytes=int(fwd_codec.raw_bytes * remote), fwd_sent_bytes=int(fwd_codec.sent_bytes * remote),
                bwd_raw_bytes=int(bwd_codec.raw_bytes * remote), bwd_sent_bytes=int(bwd_codec.sent_bytes * remote),
                fwd_codec_s=fwd_codec.codec_s, bwd_codec_s=bwd_codec.codec_s, fwd_calls=fwd_codec.calls,
                fwd_precision=codec_precision(fwd_codec), bwd_precision=codec_precision(bwd_codec),
            )
        else:
            out.update(fwd_raw_bytes=raw_fwd, fwd_sent_bytes=raw_fwd, bwd_raw_bytes=raw_fwd, bwd_sent_bytes=raw_fwd,
                       fwd_calls=steps)
        return out
    finally:
        dist.destroy_process_group()


def summarize(variant: Variant, rate: str, per_rank: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    steps, world = len(per_rank[0]["times"]), len(per_rank)  # pooled over repeated launches
    # A step is done when the slower rank is done: take the max over ranks per step, then the median over steps.
    step_s = [max(r["times"][i] for r in per_rank) for i in range(steps)]
    median_s = statistics.median(step_s)
    last = [statistics.fmean(r["losses"][-5:]) for r in per_rank]

    def per_step(key: str) -> float | None:
        vals = [r.get(key) for r in per_rank]
        return None if any(v is None for v in vals) else statistics.fmean(vals) / steps

    def ms(key: str) -> float | None:
        value = per_step(key)
        return None if value is None else value * 1e3

    fwd_a2a_s = None
    if variant.kind in ("dlac", "null"):
        fwd_a2a_s = sum(per_step(k) for k in ("fwd_encode_s", "fwd_exchange_s", "fwd_decode_s"))
    row = dict(
        rate=rate, world_size=world, variant=variant.name, label=variant.label, median_step_ms=median_s * 1e3,
        mean_step_ms=statistics.fmean(step_s) * 1e3,  # counts the rare slow steps (auto_fallback's checks)
        step_ms=[s * 1e3 for s in step_s], samples_per_s=world * cfg["batch_size"] / median_s,
        fwd_a2a_ms=None if fwd_a2a_s is None else fwd_a2a_s * 1e3,
        fwd_a2a_share=None if fwd_a2a_s is None else fwd_a2a_s / median_s,
        fwd_encode_ms=ms("fwd_encode_s"), fwd_exchange_ms=ms("fwd_exchange_s"), fwd_decode_ms=ms("fwd_decode_s"),
        bwd_a2a_ms=ms("bwd_s"),
        fwd_raw_bytes_per_step=per_step("fwd_raw_bytes"), fwd_sent_bytes_per_step=per_step("fwd_sent_bytes"),
        bwd_raw_bytes_per_step=per_step("bwd_raw_bytes"), bwd_sent_bytes_per_step=per_step("bwd_sent_bytes"),
        final_loss=statistics.fmean(last),
        losses=[statistics.fmean(r["losses"][i] for r in per_rank) for i in range(len(per_rank[0]["losses"]))],
        max_error_over_bound=max((r.get("max_error_over_bound") or 0.0 for r in per_rank), default=None)
        if variant.kind == "dlac" else None,
        local_dim_per_rank=[r["local_dim"] for r in per_rank],
        precisions=[per_rank[0].get("fwd_precision"), per_rank[0].get("bwd_precision")]
        if variant.kind == "qcomm" else None,  # what TorchRec's codecs sent, its fallbacks applied
        **pipeline_summary(variant.pipeline, per_rank, step_s, cfg["steps"]),
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


def launch_order(variants: list[str], repeat: int) -> list[str]:
    """The variants in the order of repeat ``repeat``: as given in even repeats, reversed in odd ones (ABBA), so a
    drift of the machine's speed between launches hits every pair of variants from both sides."""
    return list(variants) if repeat % 2 == 0 else list(reversed(variants))


def ceilings_after_sources(order: list[str]) -> list[str]:
    """``order`` with every ceiling moved right after the variant whose bytes it sends (in a reversed repeat it would
    come before it): each ceiling launch sends the bytes of the launch of its own repeat, its pair (issue 35)."""
    out = [name for name in order if VARIANTS[name].ceiling_of not in order]
    for name in order:
        source = VARIANTS[name].ceiling_of
        if source in order:
            out.insert(out.index(source) + 1, name)
    return out


def launch_median_ms(per_rank: list[dict[str, Any]]) -> float:
    steps = len(per_rank[0]["times"])
    return statistics.median(max(r["times"][i] for r in per_rank) for i in range(steps)) * 1e3


def sent_per_step(per_rank: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, float | None]:
    """A launch's bytes sent per step and rank, forward and backward (a ceiling launch sends its DLAC launch's)."""
    out = {}
    for d in ("fwd", "bwd"):
        values = [r.get(f"{d}_sent_bytes") for r in per_rank]
        out[d] = None if any(v is None for v in values) else statistics.fmean(values) / cfg["steps"]
    return out


def pool_launches(launches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One per-rank record over several launches: step times concatenated, counters summed, the rest from the
    first launch (same seeds: same losses and bounds)."""
    pooled = []
    for rank_records in zip(*launches):
        first = dict(rank_records[0])
        first["times"] = [t for r in rank_records for t in r["times"]]
        for key in ("uncompressed_steps", "step_modes", "step_phases"):
            first[key] = [u for r in rank_records for u in r[key]]
        for key, value in rank_records[0].items():
            if key.endswith(("_bytes", "_s", "_calls")) and isinstance(value, (int, float)):
                first[key] = sum(r[key] for r in rank_records)
            elif key == "max_error_over_bound" and value is not None:
                first[key] = max(r[key] for r in rank_records)
        pooled.append(first)
    return pooled


def paired(rows: list[dict[str, Any]], rate: str, variant: str, reference: str) -> tuple[float, list[float]] | None:
    """Speed of ``variant`` relative to ``reference`` at ``rate``: the pooled medians' ratio (reference step /
    variant step: above 1 is faster) and the same per repeat, from the launches of the same repeat."""
    at = {r["variant"]: r for r in rows if r["rate"] == rate}
    if variant not in at or reference not in at:
        return None
    a, b = at[variant], at[reference]
    pooled = b["median_step_ms"] / a["median_step_ms"]
    return pooled, [y / x for x, y in zip(a["launch_median_ms"], b["launch_median_ms"])]


def speedups(rows: list[dict[str, Any]]) -> None:
    """Every row's speed against FP32 at its rate: pooled, with the per-repeat range (in place)."""
    for r in rows:
        found = paired(rows, r["rate"], r["variant"], "fp32")
        if found is not None:
            r["speedup_vs_fp32"], r["speedup_vs_fp32_per_repeat"] = found


def ceiling_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Benchmark errors: a launch of a DLAC variant faster than its ceiling (the null-codec launch of the same
    repeat) by more than ``CEILING_TOLERANCE``. The ceiling leaves out only codec time, so that cannot happen
    unless something other than the codec differs between them (noise of this size included)."""
    errors = []
    for row in rows:
        source = VARIANTS[row["variant"]].ceiling_of
        if source is None:
            continue
        dlac = next((r for r in rows if r["rate"] == row["rate"] and r["variant"] == source), None)
        if dlac is None:
            continue
        for rep, (d, c) in enumerate(zip(dlac["launch_median_ms"], row["launch_median_ms"])):
            if d < (1 - CEILING_TOLERANCE) * c:
                errors.append(dict(rate=row["rate"], variant=source, ceiling=row["variant"], repeat=rep,
                                   launch_ms=d, ceiling_ms=c, message=(
                                       f"{row['rate']}, repeat {rep + 1}: {source} took {d:.0f} ms per step, its"
                                       f" ceiling {c:.0f} ms ({1 - d / c:.0%} faster than a ceiling that leaves"
                                       " out only codec time): a benchmark error, not a result")))
    return errors


def judge_targets(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The TARGETS whose variants ran, judged by the rule; a ceiling target is not judged where a launch beat its
    ceiling (a benchmark error)."""
    out = []
    for rate, name, variant, reference, threshold, kind in TARGETS:
        found = paired(rows, rate, variant, reference)
        if found is None:
            continue
        pooled, per_repeat = found  # for a ceiling: its step over DLAC's, the fraction of the ceiling's speed
        verdict = judge(name, pooled, per_repeat, threshold, rate=rate, variant=variant, reference=reference)
        verdict["invalid"] = kind == "ceiling" and any(e["rate"] == rate and e["variant"] == variant for e in errors)
        if verdict["invalid"]:
            verdict["met"] = False
        out.append(verdict)
    return out


def _fmt_bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def spread(values: list[float], fmt: str = ".0f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if len(values) > 1 else "-"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of a results file's rows."""
    lines = [
        "| rate | variant | median step ms | launch medians ms | speedup vs FP32 (per repeat) | fwd a2a share |"
        " fwd MiB/step raw -> sent (ratio) | bwd MiB/step sent | final loss |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        speedup = "-"
        if r["variant"] == "fp32":
            speedup = "1.00x"
        elif r.get("speedup_vs_fp32") is not None:
            reps = r["speedup_vs_fp32_per_repeat"]
            speedup = f"{r['speedup_vs_fp32']:.2f}x" + (f" ({spread(reps, '.2f')})" if len(reps) > 1 else "")
        share = "-" if r["fwd_a2a_share"] is None else f"{100 * r['fwd_a2a_share']:.0f}%"
        lines.append(
            f"| {r['rate']} | {r['label']} | {r['median_step_ms']:.0f} | {spread(r['launch_median_ms'])} |"
            f" {speedup} | {share} |"
            f" {_fmt_bytes(r['fwd_raw_bytes_per_step'])} -> {_fmt_bytes(r['fwd_sent_bytes_per_step'])}"
            f" ({r['fwd_ratio']:.1f}x) | {_fmt_bytes(r['bwd_sent_bytes_per_step'])} | {r['final_loss']:.4f} |"
        )
    return lines
