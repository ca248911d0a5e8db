"""The pipelined variants of the end-to-end benchmark, and the phase timers that explain them.

The end-to-end benchmarks' plain loop (:func:`benchmarks.lib.e2e.train_rank`) calls :class:`Stepper` for its training
step: unpipelined (``model(dense, sparse)`` on the sharded ``DLRM``, as always) or, for a variant with
``pipeline="sparse_dist"``, through :class:`~lightning_dlac.engine.pipeline.SparseDistPipeline` (the sharded
``DLRMModule``, whose ``forward(batch)`` TorchRec traces), exactly as ``DLACStrategy(pipeline="sparse_dist")`` drives it
under Lightning; ``pipeline="alternate"`` trains blocks of steps both ways in turn within one launch. The pipeline needs
the module that reads the batch, so :func:`module_to_shard` picks what ``shard_model`` wraps.

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

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

PIPELINES = (None, "sparse_dist", "alternate")
# "alternate": blocks of this many steps, two unpipelined and two pipelined in turn (Stepper): with one block of
# warm-up steps, the timed blocks run unpipelined, pipelined, pipelined, unpipelined, ... (ABBA).
ALTERNATE_BLOCK = 4
# Every timer PhaseTimers.phases() returns, seconds summed over steps (e2e_bandwidth.py reports them per step, in ms).
PHASES = ("input_dist_s", "embedding_fwd_s", "own_input_dist_s", "compute_and_output_dist_s", "output_wait_s",
          "pipeline_start_s", "pipeline_wait_splits_s", "pipeline_ids_wait_s")
# A pipelined variant is named after its unpipelined twin.
SUFFIX = "_pipelined"


def alternate_problem(warmup: int, steps: int) -> str | None:
    """Why ``--warmup`` / ``--steps`` cannot time an ``"alternate"`` variant (its timed steps must include both
    unpipelined and pipelined blocks), or ``None``."""
    modes = {(n // ALTERNATE_BLOCK) % 4 in (2, 3) for n in range(warmup, warmup + steps)}
    if len(modes) == 2:
        return None
    return (f"the alternating variants train blocks of {ALTERNATE_BLOCK} steps, two unpipelined and two pipelined in"
            f" turn; timed steps {warmup}-{warmup + steps - 1} hold only one kind: use e.g. --warmup"
            f" {ALTERNATE_BLOCK} --steps {4 * ALTERNATE_BLOCK} (ABBA)")


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
        pipeline: Its :class:`~lightning_dlac.engine.pipeline.SparseDistPipeline`, or ``None`` unpipelined.
    """

    def __init__(self, model: torch.nn.Module, pipeline: Any = None) -> None:
        from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

        self.seconds = {"own_input_dist_s": 0.0, "compute_and_output_dist_s": 0.0, "output_wait_s": 0.0,
                        "pipeline_start_s": 0.0, "pipeline_wait_splits_s": 0.0, "pipeline_ids_wait_s": 0.0}
        modules = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
        if not modules:
            raise ValueError("PhaseTimers found no ShardedEmbeddingBagCollection in the model.")
        for sebc in modules:
            compute = sebc.compute_and_output_dist
            sebc.compute_and_output_dist = self._output_timed(compute)
            # The module's own forward (every forward unpipelined): its input dist, then compute_and_output_dist.
            if pipeline is None:
                sebc.forward = self._own_forward_timed(sebc.forward)
            else:
                sebc.forward.own_forward = self._own_forward_timed(sebc.forward.own_forward)
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

    def _own_forward_timed(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            inner, t0 = self.seconds["compute_and_output_dist_s"], time.perf_counter()
            out = forward(*args, **kwargs)
            elapsed, inner = time.perf_counter() - t0, self.seconds["compute_and_output_dist_s"] - inner
            self.seconds["own_input_dist_s"] += elapsed - inner
            return out

        return call

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
        return {**s, "input_dist_s": s["own_input_dist_s"] + pipelined,
                "embedding_fwd_s": s["compute_and_output_dist_s"] + s["output_wait_s"]}


class Stepper:
    """The plain loop's training step, unpipelined, through the sparse-dist pipeline, or both in turns
    (``"alternate"``), with :class:`PhaseTimers` read after every step.

    ``"alternate"`` trains two blocks of :data:`ALTERNATE_BLOCK` steps unpipelined and two pipelined in turn, one
    model in one launch, so that the two are compared on the same machine state (a loaded machine drifts far more
    between launches than a pipeline changes a step; with one block of warm-up the timed blocks are in ABBA order).
    Each pair of pipelined blocks is a pass of its own: its first step sends its own ids, the others had theirs sent
    during the step before (the steps the pipeline is about).

    Call it with the batches in order (``batches`` is every batch the loop will train, so that the pipeline can read
    one ahead); it returns the step's loss.

    Args:
        model: The sharded model, of :func:`module_to_shard`'s module.
        batches: Every batch of the run, in order.
        loss_fn: Loss of the logits and the labels.
        optimizer: The dense optimizer.
        pipeline: One of :data:`PIPELINES`.
    """

    def __init__(self, model: torch.nn.Module, batches: Sequence[Any], loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer, pipeline: str | None) -> None:
        if pipeline not in PIPELINES:
            raise ValueError(f"pipeline={pipeline!r} is not one of {PIPELINES}.")
        self._model, self._loss_fn, self._optimizer, self._kind = model, loss_fn, optimizer, pipeline
        self._batches = list(batches)
        self._pipeline = self._reader = None
        self._block_end = 0  # the step after the pipelined block (pass) being read
        if pipeline is not None:
            from lightning_dlac.engine.pipeline import SparseDistPipeline

            self._pipeline = SparseDistPipeline(model, torch.device("cpu"))
        self.timers = PhaseTimers(model, self._pipeline)
        self.modes: list[str] = []  # per step: "unpipelined", "sent_in_step" or "sent_ahead"
        self.step_phases: list[dict[str, float]] = []  # per step: the timers' seconds in that step

    def _pipelined(self, n: int) -> bool:
        return self._kind == "sparse_dist" or (self._kind == "alternate" and (n // ALTERNATE_BLOCK) % 4 in (2, 3))

    def __call__(self, batch: Any) -> torch.Tensor:
        n = len(self.modes)
        before, ahead = self.timers.phases(), self._pipeline.sent_ahead if self._pipeline else 0
        if not self._pipelined(n):
            logits = self._model(batch) if self._kind else \
                self._model(batch.dense_features, batch.sparse_features).squeeze(-1)
            mode = "unpipelined"
        else:
            if n >= self._block_end:  # a new pass: the rest of the run, or of this block
                self._block_end = len(self._batches) if self._kind == "sparse_dist" else \
                    min(len(self._batches), (n // (4 * ALTERNATE_BLOCK) + 1) * 4 * ALTERNATE_BLOCK)
                self._reader = iter(self._pipeline.loader(self._batches[n:self._block_end]))
            read = next(self._reader)
            if read is not batch:
                raise RuntimeError("Stepper is called with the batches in another order than it was given them.")
            batch = self._pipeline.to_device(read)
            with self._pipeline.step(batch, last=n + 1 == self._block_end):
                logits = self._model(batch)
            mode = "sent_ahead" if self._pipeline.sent_ahead > ahead else "sent_in_step"
        loss = self._loss_fn(logits, batch.labels)
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        after = self.timers.phases()
        self.modes.append(mode)
        self.step_phases.append({k: after[k] - before[k] for k in PHASES})
        return loss

    def report(self, first: int) -> dict[str, Any]:
        """From step ``first`` on (the timed steps): every timer summed (``*_s``), each step's mode and timers, and
        the pipeline's counters over the whole run."""
        timed = self.step_phases[first:]
        out: dict[str, Any] = {k: sum(p[k] for p in timed) for k in PHASES}
        out.update(step_modes=self.modes[first:], step_phases=timed)
        if self._pipeline is not None:
            out.update(sent_ahead=self._pipeline.sent_ahead, sent_in_step=self._pipeline.sent_in_step)
        return out


def pipeline_summary(pipeline: str | None, per_rank: Sequence[dict[str, Any]], step_s: Sequence[float],
                     steps: int) -> dict[str, Any]:
    """The pipeline's figures of one variant's pooled launches (``per_rank``: each rank's steps of every launch, in
    launch order, ``steps`` per launch; ``step_s``: each step's time, the slower rank's): every timer per step (ms,
    mean over ranks) and, for ``"alternate"``, the median step of each mode, the ratio of the unpipelined to the
    sent-ahead median (above 1: the pipeline pays) per launch and their median, and each mode's timers."""
    n = len(step_s)
    out: dict[str, Any] = {"pipeline": pipeline}
    for k in PHASES:
        out[k[:-2] + "_ms"] = statistics.fmean(r[k] for r in per_rank) / n * 1e3
    if pipeline != "alternate":
        return out
    modes = per_rank[0]["step_modes"]
    by_mode: dict[str, Any] = {}
    for mode in ("unpipelined", "sent_ahead", "sent_in_step"):
        at = [i for i in range(n) if modes[i] == mode]
        if at:
            by_mode[mode] = {"steps": len(at), "median_step_ms": statistics.median(step_s[i] for i in at) * 1e3,
                             **{k[:-2] + "_ms": statistics.fmean(r["step_phases"][i][k] for r in per_rank
                                                                for i in at) * 1e3 for k in PHASES}}
    out["by_mode"] = by_mode
    per_launch = []
    for start in range(0, n, steps):
        plain = [step_s[i] for i in range(start, start + steps) if modes[i] == "unpipelined"]
        ahead = [step_s[i] for i in range(start, start + steps) if modes[i] == "sent_ahead"]
        if plain and ahead:
            per_launch.append(statistics.median(plain) / statistics.median(ahead))
    if per_launch:  # within each launch (the machine's state shared), then the median over launches
        out["ahead_vs_unpipelined"] = statistics.median(per_launch)
        out["ahead_vs_unpipelined_per_launch"] = per_launch
    return out


def pipeline_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Each pipelined variant against its unpipelined twin at the same rate: the speed ratio of the pooled medians
    (twin's step / pipelined step: above 1 the pipeline pays) with the per-repeat range (the launches of one repeat
    ran one after the other), the load average at the launches, and the phases per step (ms, mean over ranks); and
    each alternating variant's pipelined steps against its unpipelined steps, within the same launches."""
    lines = []
    for r in rows:
        loads = r.get("launch_loadavg_1m", [])
        if r.get("pipeline") == "alternate" and "ahead_vs_unpipelined" in r:
            per_launch = r["ahead_vs_unpipelined_per_launch"]
            spread = f" (per launch {min(per_launch):.2f}-{max(per_launch):.2f})" if len(per_launch) > 1 else ""
            load = f"; load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
            ratio = r["ahead_vs_unpipelined"]
            lines.append(f"- {r['rate']}: {r['label']}: steps whose ids were sent ahead {ratio:.2f}x the unpipelined"
                         f" steps of the same launch (median over launches){spread}{load}")
            for mode, m in r["by_mode"].items():
                lines.append(f"  - {mode} ({m['steps']} steps): median {m['median_step_ms']:.0f} ms, input dist on the"
                             f" path {m['input_dist_ms']:.1f} ms (start {m['pipeline_start_ms']:.1f}, splits wait"
                             f" {m['pipeline_wait_splits_ms']:.1f}, ids wait {m['pipeline_ids_wait_ms']:.1f}), lookup +"
                             f" output dist {m['embedding_fwd_ms']:.1f} ms")
            continue
        pair = _twin_speed(r, rows)
        if pair is None:
            continue
        twin, pooled, paired = pair
        r["vs_unpipelined"], r["vs_unpipelined_per_repeat"] = pooled, paired
        spread = f" (per repeat {min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
        loads = loads + twin.get("launch_loadavg_1m", [])
        load = f"; load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        lines.append(f"- {r['rate']}: {r['label']}: {pooled:.2f}x the unpipelined step{spread}{load}")
        for row in (twin, r):
            lines.append(f"  - {row['variant']}: step {row['median_step_ms']:.0f} ms, input dist on the path"
                         f" {row['input_dist_ms']:.1f} ms, lookup + output dist {row['embedding_fwd_ms']:.1f} ms")
    return lines


def _twin_speed(
    row: dict[str, Any], rows: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], float, list[float]] | None:
    """For a pipelined row (``X_pipelined``): its unpipelined twin ``X`` at the same rate, the pooled medians' speed
    ratio and the per-repeat ratios (launches of the same repeat paired); None for other rows or without a twin."""
    if not row["variant"].endswith(SUFFIX):
        return None
    base = row["variant"][: -len(SUFFIX)]
    twin = next((t for t in rows if t["rate"] == row["rate"] and t["variant"] == base), None)
    if twin is None:
        return None
    paired = [b / a for a, b in zip(row["launch_median_ms"], twin["launch_median_ms"])]
    return twin, twin["median_step_ms"] / row["median_step_ms"], paired


def pipeline_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of each pipelined variant (``X_pipelined``) beside its unpipelined twin ``X`` at the same
    rate: both steps, the pipelined speed against the twin (pooled medians' ratio, per-repeat range: launches of the
    same repeat paired), and the phases per step (mean over ranks) that explain it. Empty without such pairs."""
    lines = ["| rate | variant | unpipelined step ms | pipelined step ms | pipelined speed (per repeat) | input dist on"
             " the path ms, unpipelined -> pipelined (share of the unpipelined step) | lookup + output dist ms,"
             " unpipelined -> pipelined |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        pair = _twin_speed(r, rows)
        if pair is None:
            continue
        twin, pooled, paired = pair
        spread = f" ({min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
        share = twin["input_dist_ms"] / twin["median_step_ms"]
        lines.append(f"| {r['rate']} | {twin['label']} | {twin['median_step_ms']:.0f} | {r['median_step_ms']:.0f} |"
                     f" {pooled:.2f}x{spread} | {twin['input_dist_ms']:.1f} -> {r['input_dist_ms']:.1f}"
                     f" ({100 * share:.1f}%) | {twin['embedding_fwd_ms']:.1f} -> {r['embedding_fwd_ms']:.1f} |")
    return lines if len(lines) > 2 else []
