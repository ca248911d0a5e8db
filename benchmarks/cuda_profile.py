"""Where DLAC's CUDA kernels spend their time: one encode and one decode of a GPU codec benchmark payload (criteo, eps
0.01, benchmarks.cuda_codec_bench's op columns: torch.ops.dlac with relative bounds, decode with host sizes), after
warm-ups. benchmarks/cuda_profile.sh runs it twice:

    --mode timeline   torch.profiler (CUPTI, no replay): every GPU activity of the two calls in launch order, with
                      its start, duration and the GPU idle time before it, named after the DLAC launch that queued it
                      (the kernels' host-side names: cuda_ext/dlac_grid_launch.h's KernelScope) or the aten op; then
                      the time per name and the calls' wall time against GPU busy time (the rest: host work, the
                      read-back synchronizations, launch gaps). Before it, CUDA-event times of both calls with
                      the serial kernels spread over the SMs and with 256 threads a block (their old geometry).
                      Written to --out/timeline.txt.
    --mode ncu        the same calls between cudaProfilerStart/Stop, for `ncu --profile-from-start off` (the
                      warm-ups are not profiled).

Exit status 2 without a CUDA device (nothing profiled), 1 when the kernels do not build or load.

    python -m benchmarks.cuda_profile --mode timeline --out DIR [--payload criteo] [--eps 0.01] [--batch 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.cuda_codec import DESTS, DIM, TABLES, payload
from benchmarks.lib.plan import outputs_help

PHASES = ("profile: encode", "profile: decode")
SERIAL_ENV = "DLAC_CUDA_SERIAL_THREADS"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RANGE_CATS = ("cpu_op", "user_annotation")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


def workload(name: str, batch: int, eps: float) -> tuple[Callable[[], Any], Callable[[], Any], str]:
    """Encode and decode calls on the payload as the GPU codec benchmark's op columns make them, and a line saying
    what."""
    from lightning_dlac.codec import _loader
    from lightning_dlac.codec.api import device_kernels

    x_cpu, what = payload(name, batch)
    x = x_cpu.cuda()
    rs = list(range(0, x.size(0) + 1, x.size(0) // DESTS))
    cs = list(range(0, TABLES * DIM + 1, DIM))
    bounds = torch.full((TABLES,), eps)
    _loader.load_native()
    if not device_kernels("cuda"):
        raise _loader.NativeUnavailable("the native library has no CUDA kernels")
    ops = torch.ops.dlac
    p, s = ops.encode_grid(x, rs, cs, bounds, True)
    s_host = s.cpu()
    line = (f"{name} {tuple(x.shape)} float32 ({x.numel() * 4 / 1e6:.0f} MB), eps {eps:g} relative, "
            f"{len(rs) - 1}x{len(cs) - 1} chunks, payload {p.numel() / 1e6:.2f} MB "
            f"(ratio {x.numel() * 4 / p.numel():.1f}): {what[:160]}")
    return (lambda: ops.encode_grid(x, rs, cs, bounds, True)), (lambda: ops.decode_grid(p, s_host, rs, cs)), line


def event_ms(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Median milliseconds of fn() between CUDA events (as benchmarks.cuda_codec_bench times it)."""
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def short(name: str, width: int = 70) -> str:
    """A kernel's name, cut: templates and arguments dropped where that leaves something."""
    base = name.split("(")[0].removeprefix("void ")
    depth, out = 0, []
    for ch in base:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    s = "".join(out).strip() or name
    return s if len(s) <= width else s[: width - 3] + "..."


def timeline_report(trace: dict[str, Any]) -> list[str]:
    """The report of a Kineto chrome trace holding the two PHASES annotations (see the module docstring)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("cat") in RANGE_CATS]
    launch_at: dict[Any, tuple[float, Any]] = {}
    for e in events:
        if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {}):
            launch_at[e["args"]["correlation"]] = (float(e["ts"]), e.get("tid"))
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: float(e["ts"]))

    def enclosing(ts: float, tid: Any, phases: bool) -> str | None:
        best = None
        for r in ranges:
            if r.get("tid") != tid or (r["name"] in PHASES) != phases:
                continue
            t0, d = float(r["ts"]), float(r.get("dur", 0))
            if t0 <= ts <= t0 + d and (best is None or d < float(best.get("dur", 0))):
                best = r
        return None if best is None else best["name"]

    lines: list[str] = []
    for phase in PHASES:
        ann = [r for r in ranges if r["name"] == phase]
        if not ann:
            lines.append(f"== {phase}: not in the trace")
            continue
        a = ann[0]
        t0 = float(a["ts"])
        rows = []
        for e in gpu:
            corr = e.get("args", {}).get("correlation")
            at, ltid = launch_at.get(corr, (None, None))
            if at is None or enclosing(at, ltid, True) != phase:
                continue
            label = enclosing(at, ltid, False) or "?"
            rows.append((float(e["ts"]), float(e.get("dur", 0)), label, e.get("cat"), e.get("name", "")))
        if not rows:
            lines.append(f"== {phase}: no GPU activity found")
            continue
        end = max(max(ts + d for ts, d, *_ in rows), t0 + float(a.get("dur", 0)))
        busy, prev_end = 0.0, t0
        lines.append(f"== {phase}: host call {float(a.get('dur', 0)) / 1e3:.3f} ms; from its start to its end or its "
                     f"last GPU activity {(end - t0) / 1e3:.3f} ms; {len(rows)} GPU activities")
        lines.append(f"{'start us':>9} {'dur us':>9} {'idle us':>8}  {'launched by':<42} kernel")
        per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for ts, d, label, cat, name in rows:
            idle = max(0.0, ts - prev_end)
            busy += d
            prev_end = max(prev_end, ts + d)
            kind = "" if cat == "kernel" else f"[{cat}] "
            lines.append(f"{ts - t0:9.1f} {d:9.1f} {idle:8.1f}  {label[:42]:<42} {kind}{short(name)}")
            per[label][0] += d
            per[label][1] += 1
        lines.append(f"-- {phase}: GPU busy {busy / 1e3:.3f} ms of {(end - t0) / 1e3:.3f} ms "
                     f"({100 * busy / max(end - t0, 1e-9):.0f}%); the rest is host work, read-back waits and launch "
                     "gaps")
        lines.append(f"-- {phase}: GPU time per launch name, largest first:")
        for label, (d, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"   {d / 1e3:9.3f} ms {100 * d / max(busy, 1e-9):5.1f}%  x{n:<3} {label}")
        lines.append("")
    return lines


def key_averages_table(prof: Any) -> str:
    for key in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        try:
            return prof.key_averages().table(sort_by=key, row_limit=45, max_name_column_width=48)
        except Exception:  # noqa: BLE001  the column's name changed across torch versions
            continue
    return "(key_averages table unavailable)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("timeline", "ncu"), required=True)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--payload", default="criteo")
    parser.add_argument("--eps", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"cuda_profile: no device (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              "torch.cuda.is_available() is False): nothing profiled", flush=True)
        return 2
    from lightning_dlac.codec import _loader

    try:
        enc, dec, what = workload(args.payload, args.batch, args.eps)
    except _loader.NativeUnavailable as e:
        print(f"cuda_profile: the native kernels did not build or load:\n{e}", flush=True)
        return 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {what}", flush=True)
    for _ in range(args.warmup):
        enc()
        dec()
    torch.cuda.synchronize()
    if args.mode == "ncu":
        torch.cuda.profiler.start()
        enc()
        torch.cuda.synchronize()
        dec()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("cuda_profile: one encode and one decode ran between cudaProfilerStart and cudaProfilerStop", flush=True)
        return 0
    gb = args.batch * 8 * 26 * 64 * 4 / 1e9
    head = [what]
    # The serial kernels' geometry (Huffman tables and blocks, CRC segments): spread over the SMs (the default), and
    # 256 threads a block, as for_each launches them (what they had before); DLAC_CUDA_SERIAL_THREADS is read at
    # every launch.
    given = os.environ.get(SERIAL_ENV)
    for label, value in (("serial kernels spread over the SMs", given), ("serial kernels 256 threads a block", "256")):
        if value is None:
            os.environ.pop(SERIAL_ENV, None)
        else:
            os.environ[SERIAL_ENV] = value
        enc()
        dec()
        e_ms, d_ms = event_ms(enc), event_ms(dec)
        head.append(f"CUDA events, median of 5, {label} ({SERIAL_ENV}={value or 'unset'}): encode {e_ms:.3f} ms "
                    f"({gb / e_ms * 1e3:.1f} GB/s), decode {d_ms:.3f} ms ({gb / d_ms * 1e3:.1f} GB/s)")
    if given is None:
        os.environ.pop(SERIAL_ENV, None)
    else:
        os.environ[SERIAL_ENV] = given
    head += [f"(the profile below: {SERIAL_ENV}={given or 'unset'})", ""]
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for phase, fn in zip(PHASES, (enc, dec)):
            with torch.profiler.record_function(phase):
                fn()
            torch.cuda.synchronize()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timeline.txt").write_text("\n".join(head) + "\n")  # the CUDA-event times, whatever follows
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            report = timeline_report(json.loads(path.read_text()))
    except Exception as e:  # noqa: BLE001  a trace this parser does not know: the table below still says a lot
        report = [f"(the timeline could not be read from the trace: {type(e).__name__}: {e})", ""]
    lines = head + report + ["== torch.profiler key_averages (both calls)", key_averages_table(prof)]
    text = "\n".join(lines) + "\n"
    (args.out / "timeline.txt").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
