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
# Codecs: a zero-cost 8x stand-in and a byte-counting wrapper around TorchRec's codecs


class ZeroCost8xCodec:
    """TorchRec QuantizedCommCodec that sends the first 1/8 of the elements and decodes by padding with zeros.

    It costs nothing to encode or decode, so it is the ceiling any fixed 8x compression of this exchange could reach.
    Its values are garbage (7/8 zeros): the loss stays finite but the model does not learn the tables.
    """

    def encode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        flat = input_tensor.reshape(-1)
        return flat[: self.calc_quantized_size(flat.numel())].clone()

    def decode(self, input_grad: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        return torch.nn.functional.pad(input_grad.reshape(-1), (0, 7 * input_grad.numel()))

    @property
    def quantized_dtype(self) -> torch.dtype:
        return torch.float32

    def calc_quantized_size(self, input_len: int, ctx: Any = None) -> int:
        return math.ceil(input_len / 8)

    def create_context(self) -> Any:
        return None

    def padded_size(
        self, input_tensor: torch.Tensor, dim_per_rank: list[int], my_rank: int, qcomm_ctx: Any
    ) -> tuple[int, int]:
        # ceil(n / 8) per chunk must add up to ceil(N / 8) of the whole buffer: every chunk is B_rank x D rows.
        if any(d % 8 for d in dim_per_rank):
            raise ValueError(f"ZeroCost8xCodec needs every rank's dim sum to be a multiple of 8, got {dim_per_rank}.")
        return input_tensor.shape[1], 0


class CountingCodec:
    """Wraps a TorchRec QuantizedCommCodec and counts the float32 bytes it was given and the bytes it produced."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.raw_bytes = 0
        self.sent_bytes = 0
        self.codec_s = 0.0

    def reset(self) -> None:
        self.calls, self.raw_bytes, self.sent_bytes, self.codec_s = 0, 0, 0, 0.0

    def encode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.encode(input_tensor, ctx)
        self.codec_s += time.perf_counter() - t0
        self.calls += 1
        self.raw_bytes += input_tensor.numel() * input_tensor.element_size()
        self.sent_bytes += out.numel() * out.element_size()
        return out

    def decode(self, input_grad: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.decode(input_grad, ctx)
        self.codec_s += time.perf_counter() - t0
        return out

    @property
    def quantized_dtype(self) -> torch.dtype:
        # torchrec 1.8's NoOpQuantizedCommCodec defines quantized_dtype as a method, its other codecs as a property.
        dtype = self.inner.quantized_dtype
        return dtype() if callable(dtype) else dtype

    def calc_quantized_size(self, input_len: int, ctx: Any = None) -> int:
        return self.inner.calc_quantized_size(input_len, ctx)

    def create_context(self) -> Any:
        return self.inner.create_context()

    def padded_size(self, input_tensor: torch.Tensor, dim_per_rank: list[int], my_rank: int, qcomm_ctx: Any) -> Any:
        return self.inner.padded_size(input_tensor, dim_per_rank, my_rank, qcomm_ctx)


def _codecs_registry(variant: Variant) -> tuple[dict[str, Any] | None, CountingCodec | None, CountingCodec | None]:
    """The qcomm_codecs_registry for the sharder, and the counting wrappers of the pooled all-to-all codecs."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp, NoOpQuantizedCommCodec, QuantizedCommCodecs

    if variant.kind == "qcomm":
        precision = {"fp16": CommType.FP16, "int8": CommType.INT8, "bf16": CommType.BF16, "fp32": CommType.FP32}
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=precision[variant.forward], backward_precision=precision[variant.backward])
        )
    elif variant.kind == "zero":
        backward = ZeroCost8xCodec() if variant.backward == "zero8" else NoOpQuantizedCommCodec()
        registry = {CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name: QuantizedCommCodecs(ZeroCost8xCodec(), backward)}
    else:
        return None, None, None
    key = CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name
    fwd, bwd = CountingCodec(registry[key].forward), CountingCodec(registry[key].backward)
    registry[key] = QuantizedCommCodecs(forward=fwd, backward=bwd)
    return registry, fwd, bwd


class ZeroCostSameBytesExchange(torch.nn.Module):
    """Stand-in for the compressed all-to-all that sends, per step and per rank, exactly the bytes a DLAC launch
    sent (its mean per step, both directions: the int64 size exchange, then the payload) and costs nothing to
    encode or decode: the ceiling of DLAC at its own compression ratios.

    Like DLAC, a rank keeps its own rows exactly and sends nothing for them; every other column arrives as zeros
    (garbage, as the zero-cost 8x stand-in's): the loss stays finite, the tables do not learn.

    Args:
        pg: Process group.
        dims_per_rank: Column block dims per rank (the output dist's layout).
        callbacks: The output dist's callbacks, applied on ``wait()``.
        fwd_bytes: Per rank: forward bytes it sends per step (size exchange included), split evenly over the others.
        bwd_bytes: The same for the gradient exchange.
    """

    def __init__(self, pg: Any, dims_per_rank: list[list[int]], callbacks: list[Any], fwd_bytes: list[int],
                 bwd_bytes: list[int]) -> None:
        import torch.distributed as dist

        super().__init__()
        self.pg, self.rank, self.world = pg, dist.get_rank(pg), dist.get_world_size(pg)
        self.dim_sums = [sum(d) for d in dims_per_rank]
        self.n_local = [len(d) for d in dims_per_rank]
        self.callbacks = list(callbacks or [])
        self.fwd_bytes, self.bwd_bytes = fwd_bytes, bwd_bytes
        self.sent = {"fwd": 0, "bwd": 0}

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank: list[int] | None = None) -> Any:
        from torchrec.distributed.dist_data import PooledEmbeddingsAwaitable
        from torchrec.distributed.types import Awaitable

        class Ready(Awaitable[torch.Tensor]):
            def _wait_impl(self) -> torch.Tensor:
                return out

        if not batch_size_per_rank:
            batch_size_per_rank = [local_embs.size(0) // self.world] * self.world
        out = _ZeroCostSameBytesFn.apply(local_embs, self, list(batch_size_per_rank))
        awaitable = PooledEmbeddingsAwaitable(tensor_awaitable=Ready())
        awaitable.callbacks.extend(self.callbacks)
        return awaitable

    def send(self, per_rank_bytes: list[int], n_sizes: list[int], direction: str) -> None:
        """One size exchange and one payload exchange with DLAC's byte counts (forward: a rank sends one size per
        local table to each other rank; backward: one per destination's table)."""
        import torch.distributed as dist

        me, world = self.rank, self.world
        others = world - 1
        if not others:
            return
        # Sizes: forward, rank s sends n_local[s] int64 to each other rank; backward, it sends n_local[d] to rank d.
        size_out = [0 if d == me else (n_sizes[me] if direction == "fwd" else n_sizes[d]) for d in range(world)]
        size_in = [0 if s == me else (n_sizes[s] if direction == "fwd" else n_sizes[me]) for s in range(world)]
        sizes_recv = torch.empty(sum(size_in), dtype=torch.int64)
        dist.all_to_all_single(sizes_recv, torch.zeros(sum(size_out), dtype=torch.int64), size_in, size_out,
                               group=self.pg)

        def payload(src: int) -> int:  # bytes rank src sends to each other rank, its size exchange taken out
            size_bytes = (n_sizes[src] if direction == "fwd" else sum(n_sizes) - n_sizes[src]) * 8
            return max(0, per_rank_bytes[src] - size_bytes) // others

        out_splits = [0 if d == me else payload(me) for d in range(world)]
        in_splits = [0 if s == me else payload(s) for s in range(world)]
        received = torch.empty(sum(in_splits), dtype=torch.uint8)
        dist.all_to_all_single(received, torch.zeros(sum(out_splits), dtype=torch.uint8), in_splits, out_splits,
                               group=self.pg)
        self.sent[direction] += sum(out_splits) + sum(size_out) * 8


class _ZeroCostSameBytesFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, a2a: ZeroCostSameBytesExchange, batch_size_per_rank: list[int]):  # noqa: ANN001, ANN205
        ctx.a2a, ctx.batch_size_per_rank = a2a, batch_size_per_rank
        a2a.send(a2a.fwd_bytes, a2a.n_local, "fwd")
        me = a2a.rank
        first_row, first_col = sum(batch_size_per_rank[:me]), sum(a2a.dim_sums[:me])
        out = local_embs.new_zeros(batch_size_per_rank[me], sum(a2a.dim_sums))
        out[:, first_col : first_col + a2a.dim_sums[me]] = local_embs[first_row : first_row + batch_size_per_rank[me]]
        return out

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # noqa: ANN001, ANN205
        a2a, batch_size_per_rank = ctx.a2a, ctx.batch_size_per_rank
        a2a.send(a2a.bwd_bytes, a2a.n_local, "bwd")
        me = a2a.rank
        first_row, first_col = sum(batch_size_per_rank[:me]), sum(a2a.dim_sums[:me])
        grad = grad_output.new_zeros(sum(batch_size_per_rank), a2a.dim_sums[me])
        grad[first_row : first_row + batch_size_per_rank[me]] = grad_output[:, first_col : first_col + a2a.dim_sums[me]]
        return grad, None, None


def _install_zero_cost_same_bytes(model: torch.nn.Module, fwd_bytes: list[int],
                                  bwd_bytes: list[int]) -> list[ZeroCostSameBytesExchange]:
    """Put a :class:`ZeroCostSameBytesExchange` where install_compressed_all_to_all puts DLAC's exchange."""
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingDist

    installed = []
    for sebc in model.modules():
        if isinstance(sebc, ShardedEmbeddingBagCollection):
            for dist_module in sebc._output_dists:
                if type(dist_module) is TwPooledEmbeddingDist:
                    a2a = ZeroCostSameBytesExchange(dist_module._pg, dist_module._emb_dim_per_rank_per_feature,
                                                    dist_module._callbacks, fwd_bytes, bwd_bytes)
                    dist_module._dist = a2a
                    installed.append(a2a)
    if len(installed) != 1:
        raise RuntimeError(f"zero_same_ratio expects one table-wise output dist, found {len(installed)}: DLAC's"
                           " per-step bytes are per model, not per dist.")
    return installed


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
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv

    from lightning_dlac.comm import CompressionConfig, ErrorBounds, install_compressed_all_to_all
    from lightning_dlac.strategy import EmbeddingOptimizer, dense_parameters

    variant = VARIANTS[variant_name]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        batch_size, steps, warmup = cfg["batch_size"], cfg["steps"], cfg["warmup"]
        data, dlrm = _model_and_data(cfg.get("model", "dlrm"), cfg["max_rows"], batch_size)
        gen = data.generator
        # Pre-draw every batch (rank r of W takes global batches r, r + W, ...) so that timing is training only.
        batches = [gen.batch(i * world_size + rank, batch_size=batch_size) for i in range(warmup + steps)]

        registry, fwd_codec, bwd_codec = _codecs_registry(variant)
        sharder = EmbeddingBagCollectionSharder(
            fused_params={
                "optimizer": EmbeddingOptimizer.ADAGRAD.to_fbgemm(),
                "learning_rate": EMBEDDING_LR,
                "eps": 1e-8,
            },
            qcomm_codecs_registry=registry,
        )
        tables = dlrm.embedding_bag_collection.embedding_bag_configs()
        constraints = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
        pg = dist.group.WORLD
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu"),
            constraints=constraints,
        )
        plan = planner.collective_plan(dlrm.model, [sharder], pg)
        model = DistributedModelParallel(
            dlrm.model, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"), plan=plan,
            sharders=[sharder],
        )
        group = None
        bounds = ErrorBounds(0.01)
        calibration = None
        if variant.kind == "dlac":
            config = CompressionConfig(backward=variant.backward, auto_fallback=variant.auto_fallback,
                                       fallback_check_every=cfg.get("fallback_check_every", 64),
                                       overlap=variant.overlap)
            group = install_compressed_all_to_all(model, config, bounds)
            if not group:
                raise RuntimeError("install_compressed_all_to_all installed nothing: the plan is not table-wise.")
            if variant.classes:
                # The callback's policy, without Lightning: measure the warm-up steps' chunks, classify, apply. Only
                # a table's owner encodes it, so each rank's own tables' statistics are all it needs.
                from lightning_dlac.adaptive import (
                    CalibrationStats,
                    ClassBounds,
                    HomogenizationThresholds,
                    class_table_bounds,
                    classify,
                )

                calibration = CalibrationStats(ClassBounds().candidates(), index_eps=0.03)
                group.set_observer(calibration.observe)
        zero_same = None
        if variant.kind == "zero_same":
            same = cfg["same_bytes"]
            (zero_same,) = _install_zero_cost_same_bytes(model, same["fwd"], same["bwd"])
        dense_opt = torch.optim.Adagrad(dense_parameters(model), lr=dlrm.hparams.learning_rate)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        dims = {t.name: t.embedding_dim for t in tables}
        local_dim = sum(dims[n] for mp in plan.plan.values() for n, spec in mp.items() if rank in (spec.ranks or []))

        times, losses, uncompressed_steps = [], [], []
        for i, batch in enumerate(batches):
            if i == warmup and calibration is not None:
                classes = classify(calibration.tables, HomogenizationThresholds())
                bounds.set_table_bounds(class_table_bounds(classes, ClassBounds()))
                group.set_observer(None)
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
