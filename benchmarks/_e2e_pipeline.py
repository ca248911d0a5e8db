"""The pipelined variants of the end-to-end benchmark, and the phase timers that explain them.

``e2e_bandwidth.py``'s plain loop calls :class:`Stepper` for its training step: unpipelined (``model(dense, sparse)``
on the sharded ``DLRM``, as always) or, for a variant with ``pipeline="sparse_dist"``, through
:class:`~lightning_dlac.pipeline.SparseDistPipeline` (the sharded ``DLRMModule``, whose ``forward(batch)`` TorchRec
traces), exactly as ``DLACStrategy(pipeline="sparse_dist")`` drives it under Lightning. The pipeline needs the
module that reads the batch, so :func:`module_to_shard` picks what ``shard_model`` wraps.

Phase timers (:class:`PhaseTimers`, per rank, seconds summed over steps; the loop takes differences) split a step:

- ``input_dist_s``: the input dist on the step's path. Unpipelined: the sharded module's forward before its lookup
  (the splits and ids all-to-alls, launched and waited). Pipelined: starting the next batch's splits, waiting for
  them (which launches its ids), and waiting for this batch's ids in the forward.
- ``embedding_fwd_s``: lookup and output dist (``compute_and_output_dist``) and the wait for its result.
- the compressed exchange's own phase times (DLAC only) come from its ``CommStats``, as always.

The rest of a step is dense compute, the lookup's backward, the fused and dense optimizers, and for FP32 TorchRec's
gradient exchange. On CPU every wait is the rank's own thread blocking, so these times are the critical path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

PIPELINES = (None, "sparse_dist")
# Every timer PhaseTimers.phases() returns, seconds summed over steps (e2e_bandwidth.py reports them per step, in ms).
PHASES = ("input_dist_s", "embedding_fwd_s", "forward_s", "compute_and_output_dist_s", "output_wait_s",
          "pipeline_start_s", "pipeline_wait_splits_s", "pipeline_ids_wait_s")
# A pipelined variant is named after its unpipelined twin.
SUFFIX = "_pipelined"


def module_to_shard(dlrm: Any, pipeline: str | None) -> torch.nn.Module:
    """The module ``shard_model`` wraps: TorchRec's ``DLRM`` (called with dense and sparse features), or for a
    pipeline the example ``DLRMModule`` around it, whose ``forward(batch)`` the pipeline traces."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline={pipeline!r} is not one of {PIPELINES}.")
    return dlrm if pipeline else dlrm.model


def _timed(fn: Callable[..., Any], timers: dict[str, float], key: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[key] += time.perf_counter() - t0

    return call


class PhaseTimers:
    """Seconds each rank spends in the phases of the module docstring, summed since construction (only grow).

    Args:
        model: The sharded model (``DistributedModelParallel``).
        pipeline: Its :class:`~lightning_dlac.pipeline.SparseDistPipeline`, or ``None`` unpipelined.
    """

    def __init__(self, model: torch.nn.Module, pipeline: Any = None) -> None:
        from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

        self.seconds = {"forward_s": 0.0, "compute_and_output_dist_s": 0.0, "output_wait_s": 0.0,
                        "pipeline_start_s": 0.0, "pipeline_wait_splits_s": 0.0, "pipeline_ids_wait_s": 0.0}
        modules = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
        if not modules:
            raise ValueError("PhaseTimers found no ShardedEmbeddingBagCollection in the model.")
        for sebc in modules:
            compute = sebc.compute_and_output_dist
            sebc.compute_and_output_dist = self._output_timed(compute)
            if pipeline is None:  # the module's own forward: input dist, then compute_and_output_dist
                sebc.forward = _timed(sebc.forward, self.seconds, "forward_s")
        if pipeline is not None:
            start, wait = pipeline.start_sparse_data_dist, pipeline.wait_sparse_data_dist
            pipeline.start_sparse_data_dist = _timed(start, self.seconds, "pipeline_start_s")

            def wait_splits(context: Any) -> None:
                t0 = time.perf_counter()
                wait(context)
                self.seconds["pipeline_wait_splits_s"] += time.perf_counter() - t0
                for request in context.input_dist_tensors_requests.values():  # waited in the pipelined forward
                    request._wait_impl = _timed(request._wait_impl, self.seconds, "pipeline_ids_wait_s")

            pipeline.wait_sparse_data_dist = wait_splits

    def _output_timed(self, compute: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            awaitable = compute(*args, **kwargs)
            self.seconds["compute_and_output_dist_s"] += time.perf_counter() - t0
            awaitable._wait_impl = _timed(awaitable._wait_impl, self.seconds, "output_wait_s")
            return awaitable

        return call

    def phases(self) -> dict[str, float]:
        """``input_dist_s`` and ``embedding_fwd_s`` so far (module docstring), with the raw timers."""
        s = self.seconds
        pipelined = s["pipeline_start_s"] + s["pipeline_wait_splits_s"] + s["pipeline_ids_wait_s"]
        unpipelined = s["forward_s"] - s["compute_and_output_dist_s"]
        return {**s, "input_dist_s": pipelined if pipelined else unpipelined,
                "embedding_fwd_s": s["compute_and_output_dist_s"] + s["output_wait_s"]}


class Stepper:
    """The plain loop's training step, unpipelined or through the sparse-dist pipeline, with :class:`PhaseTimers`.

    Call it with the batches in order (``batches`` is every batch the loop will train, so that the pipeline can read
    one ahead); it returns the step's loss.

    Args:
        model: The sharded model, of :func:`module_to_shard`'s module.
        batches: Every batch of the run, in order.
        loss_fn: Loss of the logits and the labels.
        optimizer: The dense optimizer.
        pipeline: ``None`` or ``"sparse_dist"``.
    """

    def __init__(self, model: torch.nn.Module, batches: Sequence[Any], loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer, pipeline: str | None) -> None:
        self._model, self._loss_fn, self._optimizer = model, loss_fn, optimizer
        self._count, self._trained = len(batches), 0
        self._pipeline = self._reader = None
        if pipeline is not None:
            from lightning_dlac.pipeline import SparseDistPipeline

            self._pipeline = SparseDistPipeline(model, torch.device("cpu"))
            self._reader = iter(self._pipeline.loader(batches))
        self.timers = PhaseTimers(model, self._pipeline)

    def __call__(self, batch: Any) -> torch.Tensor:
        if self._pipeline is None:
            logits = self._model(batch.dense_features, batch.sparse_features).squeeze(-1)
        else:
            read = next(self._reader)
            if read is not batch:
                raise RuntimeError("Stepper is called with the batches in another order than it was given them.")
            batch = self._pipeline.to_device(read)
            self._trained += 1
            with self._pipeline.step(batch, last=self._trained == self._count):
                logits = self._model(batch)
        loss = self._loss_fn(logits, batch.labels)
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return loss

    def counters(self) -> dict[str, int]:
        """The pipeline's steps whose ids were sent ahead / in the step (empty unpipelined)."""
        if self._pipeline is None:
            return {}
        return {"sent_ahead": self._pipeline.sent_ahead, "sent_in_step": self._pipeline.sent_in_step}


def pipeline_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Each pipelined variant against its unpipelined twin at the same rate: the speed ratio of the pooled medians
    (twin's step / pipelined step: above 1 the pipeline pays) with the per-repeat range (the launches of one repeat
    ran one after the other), the load average at the launches, and the phases per step (ms, mean over ranks)."""
    lines = []
    for r in rows:
        if not r["variant"].endswith(SUFFIX):
            continue
        twin = next((t for t in rows if t["rate"] == r["rate"] and t["variant"] == r["variant"][: -len(SUFFIX)]),
                    None)
        if twin is None:
            continue
        pooled = twin["median_step_ms"] / r["median_step_ms"]
        paired = [b / a for a, b in zip(r["launch_median_ms"], twin["launch_median_ms"])]
        r["vs_unpipelined"], r["vs_unpipelined_per_repeat"] = pooled, paired
        spread = f" (per repeat {min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
        loads = r.get("launch_loadavg_1m", []) + twin.get("launch_loadavg_1m", [])
        load = f"; load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        lines.append(f"- {r['rate']}: {r['label']}: {pooled:.2f}x the unpipelined step{spread}{load}")
        for row in (twin, r):
            lines.append(f"  - {row['variant']}: step {row['median_step_ms']:.0f} ms, input dist on the path"
                         f" {row['input_dist_ms']:.1f} ms, lookup + output dist {row['embedding_fwd_ms']:.1f} ms")
    return lines
