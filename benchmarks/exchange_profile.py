"""Where the compressed pooled exchange spends its time, phase by phase, next to the codec's own time for the same
bytes (issue 34): what of an exchange is codec work and what is not.

On 2 gloo CPU ranks (one thread each, as in e2e_bandwidth.py), each rank runs :class:`~lightning_dlac.comm.
CompressedPooledEmbeddingsAllToAll` forward (``wait()``) and backward on a realistic pooled payload: 26 tables of
dim 64 (13 per rank) looked up one-hot with the example's synthetic Criteo ids (Zipf, ``--max-rows`` rows per
table, TorchRec's default uniform init), ``--batch-size`` samples per rank, the gradient of a random upstream
loss. Every backward encoding in ``--backward`` is profiled (DLAC forward with each).

While the timed steps run, the exchange's public functions (``lightning_dlac.comm.exchange``: the encode and decode
wrappers, the codec calls ``encode_grid`` / ``decode_grid`` they make, the size exchange, the payload launch and
wait, the casts) are wrapped with timers that read wall time and this thread's CPU time, inclusive and exclusive of
the wrapped calls they make. A direction's time not inside any wrapped call is the module's own: autograd, the
float casts of the input and the gradient, the statistics and the error sampling (every ``error_every`` calls),
Python. Phases, per direction and step (median over steps, the slower rank):

- ``encode`` / ``decode``: the codec calls as the exchange makes them (validation included);
- ``encode: joins`` / ``decode: concatenation``: the rest of the encode / decode functions (slicing, joins,
  concatenations, the own block);
- ``size exchange``, ``payload launch``, ``payload wait``: the collectives (the wait's wall time is the transfer
  the launch did not finish; its CPU time is this thread's). The size exchange is the first point where the ranks
  meet after encoding: its wall time includes waiting for the slower rank's encode;
- ``gather, cast``: the backward's gathering of the owners' columns and the cast to the wire dtype;
- ``own block``: the result tensor and the copy into it of the block this rank keeps (its own rows or columns,
  which never go on the wire), made between the payload's launch and its wait;
- ``module``: the rest, as above.

Each phase also counts this thread's minor page faults: a large new tensor is mapped fresh (glibc serves big
allocations with ``mmap`` until its threshold adapts, and returns them), so the first code that writes it pays for
zeroed pages, whichever phase that is; ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` change that.

Then, one rank at a time, the codec's native kernels (``torch.ops.dlac.encode_grid`` / ``decode_grid``) are called
directly on the arguments of the codec calls of one more, untimed step (same block, splits, bounds and payload); for
the bf16 / fp16 backward the cast of the same float32 gradient to the wire dtype and back, contiguous; for the own
block the same copy into a tensor of the block's layout (a column block of the output is strided): the kernel's own
time for the same bytes, with its memory in the state a step has it. Each call's input is a tensor of its own,
written just before the call (a step reads data it has just written, into memory it has just allocated), and its
output is a tensor of the exchange's layout last written before all the others of its repeats (the exchange writes
the memory of the previous step's result). Replayed on the same output a kernel finds it in the caches: the decode
took about half the time it takes into memory written long ago. Replayed on the same input tensor the encoder gets
faster call after call, however the tensor is written in between: the results file keeps that replay too
(``one_address``), the forward encode's reference before.
The issue-34 target is each phase within 1.5x of it (``phase / kernel``, on wall and on CPU time; on a shared machine
the CPU time is the steadier figure: wall time counts the slices other processes took). With ``--profiler-steps``,
a ``torch.profiler`` pass over that many more steps adds the self CPU time of the copies (``aten::cat``,
``aten::copy_``, ``aten::_to_copy``, ...) and allocations (``aten::empty*``, ``aten::zeros``) per direction; its
figures include the profiler's own overhead (they ran well above the timed phases here) and are off by default.

    python -m benchmarks.exchange_profile                  # ~1-2 min on 2 cores
    python -m benchmarks.exchange_profile --steps 4 --json-out /tmp/p.json   # a smoke run

Prints the table and writes benchmarks/results/exchange_profile.json (metadata as every results file).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.launch import run_ranks
from benchmarks.lib.paths import RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results

TABLES, DIM = 26, 64
# The wrapped public functions of the exchange: attribute -> phase, wrapped on the module that defines them, where
# their callers look them up (the pooled layout's in lightning_dlac.comm.pooled, the wire functions and the codec's
# in lightning_dlac.comm.exchange). Calls nest (start_forward runs exchange_sizes and start_payload;
# encode_for_others runs encode_chunks, which runs encode_grid): a function's exclusive time is its own, less the
# wrapped calls inside it.
WRAPPED = {
    "encode_for_others": "encode: joins",
    "encode_chunks": "encode: joins",
    "encode_grid": "encode",
    "start_forward": "payload launch",
    "exchange_sizes": "size exchange",
    "exchange_unknown_sizes": "size exchange",
    "start_payload": "payload launch",
    "start_cast": "payload launch",
    "decode_from_others": "decode: concatenation",
    "decode_chunks": "decode: concatenation",
    "decode_grid": "decode",
    "start_backward_dlac": "gather, cast",
    "start_backward_cast": "gather, cast",
    "finish_backward": "decode: concatenation",
    "start_output": "own block",
    "start_gradient": "own block",
    "place_own": "own block",
}
WAIT = "payload wait"  # InFlight.wait
MODULE = "module"
PHASES = ("encode", "encode: joins", "gather, cast", "size exchange", "payload launch", "own block", WAIT, "decode",
          "decode: concatenation", MODULE)
# The profiler's ops that are copies and allocations.
COPY_OPS = ("aten::cat", "aten::copy_", "aten::_to_copy", "aten::index", "aten::slice_scatter")
ALLOC_OPS = ("aten::empty", "aten::empty_strided", "aten::zeros", "aten::new_zeros", "aten::zero_")


def _now() -> tuple[float, float, float]:
    """Wall seconds, this thread's CPU seconds, and this thread's minor page faults so far (first touches of newly
    mapped memory: what a large new tensor costs the first code that writes it)."""
    return time.perf_counter(), time.thread_time(), float(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)


class PhaseClock:
    """Exclusive wall and thread-CPU seconds of the wrapped calls, per direction and phase, for the step being timed;
    and, while ``recording``, the arguments of every call (the kernel reference replays them). Arguments are kept
    only in an untimed step of their own: held during a timed step they would be one more reference to the tensors
    the exchange returns (its gradient: autograd then copies it into the leaf's ``.grad`` instead of taking it, and
    the timed backward pays for that copy)."""

    def __init__(self) -> None:
        self.direction = "forward"
        self._stack: list[list[float]] = []  # per open call: its wrapped children's [wall, cpu, faults]
        self.step: dict[tuple[str, str], list[float]] = {}  # (direction, phase) -> [wall, cpu, faults] exclusive
        self.top: dict[str, list[float]] = {}  # direction -> [wall, cpu, faults] of the outermost wrapped calls
        self.calls: dict[str, dict[str, list[tuple]]] = {}  # direction -> function -> this step's (args, kwargs)
        self.recording = False

    def reset(self) -> None:
        self.step, self.top, self.calls = {}, {}, {}

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        self._stack.append([0.0, 0.0, 0.0])
        start = _now()
        try:
            yield
        finally:
            spent = [b - a for a, b in zip(start, _now())]
            children = self._stack.pop()
            acc = self.step.setdefault((self.direction, phase), [0.0, 0.0, 0.0])
            for i in range(3):
                acc[i] += spent[i] - children[i]
            outer = self._stack[-1] if self._stack else self.top.setdefault(self.direction, [0.0, 0.0, 0.0])
            for i in range(3):
                outer[i] += spent[i]

    def wrap(self, name: str, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.recording:
                self.calls.setdefault(self.direction, {}).setdefault(name, []).append((args, kwargs))
            with self.timed(phase):
                return fn(*args, **kwargs)

        return wrapper


def _install(clock: PhaseClock) -> None:
    """Wrap the exchange's public functions where they are defined (this rank process only)."""
    from lightning_dlac.comm import exchange

    try:
        from lightning_dlac.comm import pooled
    except ImportError:  # an older package (--label): the pooled layout was in exchange.py
        pooled = exchange
    for name, phase in WRAPPED.items():
        home = pooled if name in vars(pooled) else exchange
        if name in vars(home):  # an older exchange (--label) may lack some
            setattr(home, name, clock.wrap(name, getattr(home, name), phase))
    wait = exchange.InFlight.wait

    def timed_wait(flight: Any) -> torch.Tensor:
        with clock.timed(WAIT):
            return wait(flight)

    exchange.InFlight.wait = timed_wait


def pooled_payload(rank: int, world: int, batch_size: int, max_rows: int, seed: int = 0) -> torch.Tensor:
    """This rank's ``local_embs`` [world x batch_size, 13 x 64]: its tables' pooled (one-hot) embeddings of every
    rank's samples, rows grouped by destination rank, looked up with the synthetic Criteo ids."""
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    data = SyntheticCriteoDataModule(max_rows=max_rows, batch_size=batch_size, seed=seed)
    sizes = data.num_embeddings_per_feature
    mine = range(rank * TABLES // world, (rank + 1) * TABLES // world)
    g = torch.Generator().manual_seed(seed + 1)
    weights = {t: (torch.rand(sizes[t], DIM, generator=g) * 2 - 1) * (1.0 / sizes[t]) ** 0.5 for t in range(TABLES)}
    blocks = []
    for dst in range(world):
        ids = data.generator.batch(dst, batch_size=batch_size).sparse_features.values().view(TABLES, batch_size)
        blocks.append(torch.cat([weights[t][ids[t]] for t in mine], dim=1))
    return torch.cat(blocks).contiguous()


def _median_s(repeat: int, fn: Callable[..., Any], *args: Any, fresh: int | None = None,
              reused: int | None = None, one_input: bool = False) -> tuple[float, float]:
    """Median wall and thread-CPU seconds of ``repeat`` calls of ``fn(*args)``. With ``fresh``, argument ``fresh`` (an
    input) is a different one of ``repeat`` tensors of its layout every call, written just before it
    (:func:`_written_inputs`); with ``one_input`` too, the same tensor every call. With ``reused``, argument
    ``reused`` (an output) is a different one of ``repeat`` tensors of its layout, all made and written before the
    first call (:func:`_reused_targets`)."""
    targets = _reused_targets(args[reused], repeat) if reused is not None else []
    sources = _written_inputs(args[fresh], 1 if one_input else repeat) if fresh is not None else []
    wall, cpu = [], []
    for i in range(repeat):
        call = list(args)
        if sources:
            call[fresh] = sources[i % len(sources)].copy_(args[fresh])
        if reused is not None:
            call[reused] = targets[i]
        w0, c0 = time.perf_counter(), time.thread_time()
        fn(*call)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.thread_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _written_inputs(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` tensors of ``t``'s layout (its strides, so a column block stays one), each the input of one timed call,
    written just before it: a step's input is data the step has just written (the lookup's output, the upstream
    gradient) into memory it has just allocated, never the memory the previous call read. The native encoder read
    one input tensor faster call after call, however the tensor was written in between (before it copied column
    blocks into a contiguous block, down to about two thirds of its first call's time after half a dozen calls;
    ``one_address`` in the results file is that replay); a different tensor each call runs at the first call's
    speed, as the exchange's encode does."""
    return [torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for _ in range(n)]


def _reused_targets(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` tensors of ``t``'s layout, each written once, in order: the i-th is written by its timed call after the
    n - 1 others were, as the exchange writes its result into the memory of the previous step's (reused, so no page
    faults; but a whole step of other memory traffic since it was last touched). A reference that wrote one target
    call after call would find it in the caches (on an Intel machine a forward decode into the same target ran in
    about half the time it took into targets written long before), faster than a step can."""
    targets = [torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device) for _ in range(n)]
    for target in targets:
        target.zero_()
    return targets


def _into(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    return target.copy_(source)


def _add(total: list[float], seconds: tuple[float, float]) -> None:
    total[0] += seconds[0]
    total[1] += seconds[1]


def _kernel_times(clock: PhaseClock, direction: str, repeat: int) -> dict[str, Any]:
    """The native kernels on the arguments of ``direction``'s last codec calls, called directly: wall and CPU seconds
    per step (every call of the step), and the bytes they read and wrote."""
    from lightning_dlac.codec.reference import check_grid_bounds

    out: dict[str, Any] = {}
    calls = clock.calls.get(direction, {})
    for name, op in (("encode_grid", "encode"), ("decode_grid", "decode")):
        total, one_address, raw, wire = [0.0, 0.0], [0.0, 0.0], 0, 0
        for args, kwargs in calls.get(name, []):
            if op == "encode":
                x, rs, cs = args[0], list(args[1]), list(args[2])
                bounds, relative = check_grid_bounds(kwargs.get("eps"), kwargs.get("abs_eb"), len(cs) - 1)
                payload, _ = torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)
                _add(total, _median_s(repeat, torch.ops.dlac.encode_grid, x, rs, cs, bounds, relative, fresh=0))
                # The replay on one input tensor, the reference before: it shows how much faster the encoder reads
                # memory it has read in the calls before.
                _add(one_address, _median_s(repeat, torch.ops.dlac.encode_grid, x, rs, cs, bounds, relative, fresh=0,
                                            one_input=True))
                raw += x.numel() * 4
                wire += payload.numel()
            else:
                payload, sizes, rs, cs = args[0], args[1], list(args[2]), list(args[3])
                sizes = torch.as_tensor(sizes, dtype=torch.int64)
                block = kwargs.get("out")
                if block is None:
                    _add(total, _median_s(repeat, torch.ops.dlac.decode_grid, payload, sizes, rs, cs))
                else:  # into tensors of the exchange's layout (a block of its output), as it does
                    _add(total, _median_s(repeat, torch.ops.dlac.decode_grid_into, payload, sizes, rs, cs, block,
                                          reused=4))
                raw += rs[-1] * cs[-1] * 4
                wire += payload.numel()
        if calls.get(name):
            out[op] = dict(seconds=total[0], cpu_seconds=total[1], raw_bytes=raw, wire_bytes=wire)
            if op == "encode":
                out[op].update(one_address_seconds=one_address[0], one_address_cpu_seconds=one_address[1])
    for args, _ in calls.get("start_backward_cast", []):
        grad, wire_dtype = args[0], args[3]
        if wire_dtype == torch.float32:
            continue
        # The whole gradient there and back, as the exchange casts it (the own block too: it goes on the wire), from
        # float32 (the exchange is handed float32), into tensors written long before (reused).
        grad = grad.contiguous().float()
        wire, back = torch.empty_like(grad, dtype=wire_dtype), torch.empty_like(grad)
        total = [0.0, 0.0]
        wire.copy_(grad)
        _add(total, _median_s(repeat, _into, wire, grad, fresh=1, reused=0))
        _add(total, _median_s(repeat, _into, back, wire, fresh=1, reused=0))
        out["cast"] = dict(seconds=total[0], cpu_seconds=total[1], raw_bytes=grad.numel() * 4,
                           wire_bytes=wire.numel() * wire.element_size())
    total, nbytes = [0.0, 0.0], 0
    for args, _ in calls.get("place_own", []):
        # The same copy into tensors of the block's layout, written long before: the forward's own block is a column
        # block of the output (TorchRec's layout), whose rows lie the output's width apart; a contiguous target
        # (the yardstick before) did less work than the exchange can.
        block, own = args[0], args[1]
        _add(total, _median_s(repeat, _into, block, own, fresh=1, reused=0))
        nbytes += own.numel() * own.element_size()
    if nbytes:
        out["copy"] = dict(seconds=total[0], cpu_seconds=total[1], raw_bytes=nbytes, wire_bytes=0)
    return out


def _profile_rank(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.codec import native_available
    from lightning_dlac.comm import CompressionConfig
    from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll

    torch.set_num_threads(1)
    if not native_available():
        raise RuntimeError("the native codec did not build: the profile compares the exchange with its kernels")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        clock = PhaseClock()
        _install(clock)
        x = pooled_payload(rank, world, cfg["batch_size"], cfg["max_rows"])
        per_rank_tables = [[f"t{t}" for t in range(r * TABLES // world, (r + 1) * TABLES // world)]
                           for r in range(world)]
        dims = [[DIM] * len(t) for t in per_rank_tables]
        g = torch.Generator().manual_seed(100 + rank)
        upstream = torch.randn(cfg["batch_size"], TABLES * DIM, generator=g) * 1e-3
        results: dict[str, Any] = {}
        for backward in cfg["backward"]:
            a2a = CompressedPooledEmbeddingsAllToAll(
                dist.group.WORLD, dims, per_rank_tables, CompressionConfig(backward=backward, impl="native"),
                ErrorBounds(cfg["eps"]))
            steps: list[dict[str, Any]] = []
            digest = None
            for step in range(cfg["warmup"] + cfg["steps"]):
                clock.reset()
                inp = x.clone().requires_grad_(True)
                dist.barrier()
                clock.direction = "forward"
                start = _now()
                out = a2a(inp).wait()
                fwd = [b - a for a, b in zip(start, _now())]
                dist.barrier()
                clock.direction = "backward"
                start = _now()
                out.backward(upstream)
                bwd = [b - a for a, b in zip(start, _now())]
                if step < cfg["warmup"]:
                    del out, inp  # as a training step does: nothing of it is held into the next one
                    continue
                record: dict[str, Any] = {}
                for direction, (wall, cpu, faults) in (("forward", fwd), ("backward", bwd)):
                    phases = {p: list(v) for (d, p), v in clock.step.items() if d == direction}
                    top = clock.top.get(direction, [0.0, 0.0, 0.0])
                    phases[MODULE] = [wall - top[0], cpu - top[1], faults - top[2]]
                    record[direction] = dict(wall_s=wall, cpu_s=cpu, faults=faults, phases=phases)
                steps.append(record)
                digest = [float(out.detach().double().sum()), float(inp.grad.double().sum())]
                del out, inp
            # One more step, untimed, whose calls' arguments the kernel reference replays.
            clock.reset()
            clock.recording = True
            inp = x.clone().requires_grad_(True)
            clock.direction = "forward"
            out = a2a(inp).wait()
            clock.direction = "backward"
            out.backward(upstream)
            clock.recording = False
            del out, inp
            kernels = {}
            for r in range(world):  # one rank at a time: the kernels alone, not sharing the cores with the other
                if r == rank:
                    kernels = {d: _kernel_times(clock, d, cfg["kernel_repeat"]) for d in ("forward", "backward")}
                dist.barrier()
            ops = _profiled_ops(a2a, x, upstream, cfg["profiler_steps"])
            stats = a2a.stats
            results[backward] = dict(steps=steps, kernels=kernels, ops=ops, digest=digest,
                                     forward_raw_bytes=stats.raw_bytes / stats.calls,
                                     forward_sent_bytes=stats.sent_bytes / stats.calls,
                                     backward_raw_bytes=stats.backward_raw_bytes / max(stats.backward_calls, 1),
                                     backward_sent_bytes=stats.backward_sent_bytes / max(stats.backward_calls, 1))
        return results
    finally:
        dist.destroy_process_group()


def _profiled_ops(a2a: Any, x: torch.Tensor, upstream: torch.Tensor, steps: int) -> dict[str, dict[str, float]]:
    """Self CPU seconds per step of the copy and allocation ops, per direction, from ``torch.profiler``."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    if steps < 1:
        return {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            inp = x.clone().requires_grad_(True)
            dist.barrier()
            with record_function("profile forward"):
                out = a2a(inp).wait()
            dist.barrier()
            with record_function("profile backward"):
                out.backward(upstream)
    totals = {"forward": {"copies": 0.0, "allocation": 0.0}, "backward": {"copies": 0.0, "allocation": 0.0}}
    for event in prof.events():
        kind = "copies" if event.name in COPY_OPS else "allocation" if event.name in ALLOC_OPS else None
        parent = event.cpu_parent
        while kind is not None and parent is not None:  # the direction whose span it ran in
            if parent.name in ("profile forward", "profile backward"):
                totals[parent.name.split()[1]][kind] += event.self_cpu_time_total / 1e6 / steps
                break
            parent = parent.cpu_parent
    return totals


def _ratios(phases: dict[str, Any], kernels: dict[str, Any], clock: str) -> dict[str, float]:
    """Each codec phase (the codec call and the rest of its function) over the kernel's own time, on ``clock``
    ("wall" or "cpu")."""
    key, kkey = f"{clock}_ms", "ms" if clock == "wall" else "cpu_ms"

    def ms(phase: str) -> float:
        return phases.get(phase, {}).get(key, 0.0)

    out = {}
    if "encode" in kernels and "encode" in phases:
        out["encode"] = (ms("encode") + ms("encode: joins")) / kernels["encode"][kkey]
    if "decode" in kernels and "decode" in phases:
        out["decode"] = (ms("decode") + ms("decode: concatenation")) / kernels["decode"][kkey]
    if "cast" in kernels:  # the backward's gather and cast, and the received gradient's cast and concatenation
        out["cast"] = (ms("gather, cast") + ms("decode: concatenation")) / kernels["cast"][kkey]
    if "copy" in kernels and "own block" in phases:
        out["own block"] = ms("own block") / kernels["copy"][kkey]
    return out


def summarize(per_rank: list[dict[str, Any]], backward: str) -> dict[str, Any]:
    """Per direction: the median step of the slower rank, each phase's median wall and CPU seconds (of that rank
    pair's slower value per step), the kernels' own seconds and the ratios the target reads."""
    runs = [r[backward] for r in per_rank]
    n = len(runs[0]["steps"])
    out: dict[str, Any] = {}
    for direction in ("forward", "backward"):
        step_wall = [max(r["steps"][i][direction]["wall_s"] for r in runs) for i in range(n)]
        step_cpu = [max(r["steps"][i][direction]["cpu_s"] for r in runs) for i in range(n)]
        phases = {}
        for phase in PHASES:
            wall, cpu, faults = ([max(r["steps"][i][direction]["phases"].get(phase, [0.0, 0.0, 0.0])[k] for r in runs)
                                  for i in range(n)] for k in range(3))
            if any(wall) or any(cpu):
                phases[phase] = dict(wall_ms=statistics.median(wall) * 1e3, cpu_ms=statistics.median(cpu) * 1e3,
                                     page_faults=statistics.median(faults))
        kernels = {}
        for op in ("encode", "decode", "cast", "copy"):
            found = [r["kernels"][direction][op] for r in runs if op in r["kernels"][direction]]
            if found:
                kernels[op] = dict(ms=max(k["seconds"] for k in found) * 1e3,
                                   cpu_ms=max(k["cpu_seconds"] for k in found) * 1e3,
                                   raw_bytes=max(k["raw_bytes"] for k in found),
                                   wire_bytes=max(k["wire_bytes"] for k in found))
                if all("one_address_seconds" in k for k in found):
                    kernels[op].update(one_address_ms=max(k["one_address_seconds"] for k in found) * 1e3,
                                       one_address_cpu_ms=max(k["one_address_cpu_seconds"] for k in found) * 1e3)
        codec_ms = sum(k["ms"] for k in kernels.values())
        ops = {kind: max(r["ops"].get(direction, {}).get(kind, 0.0) for r in runs) * 1e3
               for kind in ("copies", "allocation")} if runs[0]["ops"] else {}
        wall_ms = statistics.median(step_wall) * 1e3
        ratios = {clock: _ratios(phases, kernels, clock) for clock in ("wall", "cpu")}
        transfer = sum(phases.get(p, {}).get("wall_ms", 0.0) for p in ("size exchange", "payload launch", WAIT))
        cpu_ms = statistics.median(step_cpu) * 1e3
        codec_cpu_ms = sum(k["cpu_ms"] for k in kernels.values())
        # The whole direction's CPU time over its kernels' CPU time: what the target reads when every phase is in.
        ratios["cpu"]["direction"] = cpu_ms / codec_cpu_ms if codec_cpu_ms else None
        out[direction] = dict(wall_ms=wall_ms, cpu_ms=cpu_ms, phases=phases, kernels=kernels, kernel_ms=codec_ms,
                              kernel_cpu_ms=codec_cpu_ms, transfer_ms=transfer, profiler_ms=ops,
                              phase_over_kernel=ratios)
    out["bytes"] = {k: runs[0][k] for k in ("forward_raw_bytes", "forward_sent_bytes", "backward_raw_bytes",
                                            "backward_sent_bytes")}
    out["digest"] = [r["digest"] for r in runs]
    return out


def table(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for backward, s in summary.items():
        b = s["bytes"]
        lines.append(f"DLAC forward + {backward} backward: forward {b['forward_raw_bytes'] / 1e6:.1f} MB ->"
                     f" {b['forward_sent_bytes'] / 1e6:.2f} MB, backward {b['backward_raw_bytes'] / 1e6:.1f} MB ->"
                     f" {b['backward_sent_bytes'] / 1e6:.2f} MB per call and rank")
        for direction in ("forward", "backward"):
            d = s[direction]
            lines.append(f"  {direction}: {d['wall_ms']:.1f} ms wall, {d['cpu_ms']:.1f} ms CPU per step (kernels"
                         f" alone {d['kernel_ms']:.1f} ms wall, {d['kernel_cpu_ms']:.1f} ms CPU; transfer"
                         f" {d['transfer_ms']:.1f} ms)")
            lines.append(f"    {'phase':<24}{'wall ms':>9}{'CPU ms':>9}{'faults':>9}")
            for phase, v in d["phases"].items():
                lines.append(f"    {phase:<24}{v['wall_ms']:>9.2f}{v['cpu_ms']:>9.2f}{v['page_faults']:>9.0f}")
            for op, k in d["kernels"].items():
                lines.append(f"    kernel {op:<17}{k['ms']:>9.2f}{k['cpu_ms']:>9.2f}"
                             f"  ({k['raw_bytes'] / 1e6:.1f} MB raw, {k['wire_bytes'] / 1e6:.2f} MB wire)")
                if "one_address_ms" in k:
                    lines.append(f"    kernel {op + ', one input':<17}{k['one_address_ms']:>9.2f}"
                                 f"{k['one_address_cpu_ms']:>9.2f}  (the same input tensor every call)")
            for kind, ms in d["profiler_ms"].items():
                lines.append(f"    profiler: {kind:<14}{'':>9}{ms:>9.2f}")
            for clock, ratios in d["phase_over_kernel"].items():
                text = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None)
                lines.append(f"    phase / kernel ({clock}): {text}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per rank")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows (as e2e_bandwidth)")
    parser.add_argument("--backward", default="bf16,dlac", help="backward encodings to profile, comma-separated")
    parser.add_argument("--eps", type=float, default=0.01, help="forward relative bound of every table")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per backward encoding")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--kernel-repeat", type=int, default=7, help="timed calls of each kernel (median)")
    parser.add_argument("--profiler-steps", type=int, default=0, help="steps under torch.profiler (0: none)")
    parser.add_argument("--label", default=None,
                        help="what exchange code ran, kept in the config (e.g. an older package on PYTHONPATH)")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "exchange_profile.json")
    args = parser.parse_args()
    metadata = start_run(__spec__.name, vars(args))
    cfg = dict(batch_size=args.batch_size, max_rows=args.max_rows, backward=args.backward.split(","), eps=args.eps,
               steps=args.steps, warmup=args.warmup, kernel_repeat=args.kernel_repeat,
               profiler_steps=args.profiler_steps, world_size=2, threads_per_rank=1, tables=TABLES, dim=DIM,
               label=args.label, package=str(Path(importlib.util.find_spec("lightning_dlac").origin).parent))
    per_rank = run_ranks(_profile_rank, 2, cfg)
    summary = {b: summarize(per_rank, b) for b in cfg["backward"]}
    print("\n".join(table(summary)))
    write_results(args.json_out, metadata, cfg, summary)
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
