"""GPU codec throughput: DLAC's CUDA kernels on all-to-all batches of four payloads, beside baselines measured in the
same run.

Payloads (26 tables x dim 64, 8 destinations x --batch rows, cut into the 26 x 8 chunks the forward all-to-all
sends):

    zipf      rows looked up from random tables with Zipf ids (duplicate rows dominate: the codec's best case)
    criteo    pooled embeddings of the example DLRM trained on the shipped Criteo sample
    multihot  MLPerf DLRM v2 sized bags (1-100 ids) over that model's trained rows, sum-pooled
    gradient  the backward all-to-all's payload: d(loss) / d(pooled embeddings) of that model

(the last three from benchmarks/lib/gpu_payloads.py and its shipped file, so --batch <= 4096 for them)

Timed with CUDA events (median of --repeat calls after two warm-ups), GB/s of float32 input (encode) or output
(decode):

    memcpy                   a device-to-device copy of the payload; its bytes read and written per second are
                             printed too (each byte of the payload moves both ways)
    fp16                     a cast to float16 and back (TorchRec's FP16 qcomm)
    int8 row-wise (torch)    per-row min/scale uint8 quantization in plain torch ops (what fbgemm's
                             FloatToFused8BitRowwiseQuantized computes; fbgemm is not on the GPU image)
    int8 row-wise (fbgemm)   fbgemm's fused kernels, where fbgemm_gpu is installed
    mx4 (fbgemm triton)      TorchRec's MX4 qcomm codec: fbgemm's Triton kernels (triton_quantize_mx4 /
                             triton_dequantize_mx4) with TorchRec's settings (groups of 32 sharing an 8-bit exponent,
                             e2m1 values, round to even; 4.25 bits a value), on the flat buffer as TorchRec encodes
                             it. The kernels are pure Python/Triton: they load from fbgemm_gpu/triton without
                             importing fbgemm_gpu (whose native libraries the GPU image lacks), found through
                             $DLAC_FBGEMM_TRITON (a directory holding quantize.py and common.py), else through an
                             installed fbgemm_gpu's location
    dlac eps=...             encode_grid / decode_grid as the exchange calls them: the public API, decode with the
                             sizes on the device (the API copies them to the host: one more synchronization); the
                             op columns: torch.ops.dlac on their own, decode with host sizes
    dlac ... via host copies the CPU kernels on a host copy, what a build without CUDA kernels would do

"x memcpy" is a throughput over the memcpy row's; "err/range" the largest absolute error of a chunk (one destination's
rows of one table) over that chunk's range (max - min), the largest over the chunks. A baseline that cannot run here
(no fbgemm, no Triton, no GPU) is printed as "... not measured (why)" and listed under "not_measured" in the JSON.
Each DLAC row records byte parity with the CPU kernels (payload
bytes, decoded bits) and the synchronizations a call makes as the exchange calls it (torch's sync debug mode;
docs/codec.md: 1 to encode, 2 + 1 for the device sizes to decode), as columns: a mismatch is a finding to report,
not a reason to stop measuring. Every row is printed and flushed as it is measured and the JSON is rewritten after
each, so a timeout loses only the rows not yet reached. Target (issue 27): >= 100 GB/s each way on an H200 for the
realistic payloads. Exit status: 0 measured (even with parity failures: see the column), 1 the kernels did not
build or load, 2 no CUDA device.

Without a GPU, --emulate runs the same payloads, parity checks and synchronization counts through the CUDA
pipeline compiled for the host (tests/codec/emulated_grid.cpp) and times it with the wall clock: a rehearsal of this
script, not a measurement of the GPU (benchmarks/gpu_session.sh does so where no GPU is found).

    python -m benchmarks.cuda_codec_bench [--batch 4096] [--eps 0.01 0.05] [--payloads zipf criteo multihot gradient]
                                          [--json-out FILE] [--emulate]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.cuda_codec import DESTS, DIM, PAYLOADS, TABLES, Table, max_error_over_range, payload
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run

MX4 = "mx4 (fbgemm triton)"
# TorchRec's MX4 qcomm (fbgemm_gpu.quantize_comm: QuantizationContext's defaults passed to quantize_utils.fp32_to_mx4):
# groups of 32 values sharing an exponent, e2m1 elements, the shared exponent rounded to even (RoundingMode.even).
MX4_GROUP_SIZE, MX4_EBITS, MX4_MBITS, MX4_ROUNDING = 32, 2, 1, "even"
FBGEMM_TRITON_ENV = "DLAC_FBGEMM_TRITON"
FBGEMM_TRITON_FILES = ("quantize.py", "common.py")


class Backend:
    """Where the codec runs: the CUDA kernels on the GPU (timed with CUDA events, synchronizations counted by torch's
    sync debug mode), or with --emulate the CUDA pipeline compiled for the host (wall clock, read-backs counted)."""

    def __init__(self, emulate: bool, repeat: int) -> None:
        self.emulate, self.repeat = emulate, repeat
        self.device = "cpu" if emulate else "cuda"

    def name(self) -> str:
        return "the CUDA pipeline emulated on the host (a rehearsal)" if self.emulate else torch.cuda.get_device_name()

    def load(self) -> None:
        """Build and load the native kernels (and the emulation); NativeUnavailable if they do not build."""
        from lightning_dlac.codec import _loader
        from lightning_dlac.codec.api import device_kernels

        _loader.load_native()
        if self.emulate:
            headers = sorted(_loader.sources_dir().glob("*.h"))
            _loader.build_library([REPO / "tests" / "codec" / "emulated_grid.cpp"], headers, prefix="dlac_emu")
        elif not device_kernels("cuda"):
            raise _loader.NativeUnavailable("the native library has no CUDA kernels (built while no GPU was visible?)")

    @property
    def ops(self) -> Any:
        return torch.ops.dlac_emu if self.emulate else torch.ops.dlac

    def seconds(self, fn: Callable[[], object], repeat: int | None = None) -> float:
        """Median seconds of fn() (on the current stream), after two warm-up calls (one when emulating)."""
        repeat = self.repeat if repeat is None else repeat
        for _ in range(1 if self.emulate else 2):
            fn()
        times = []
        for _ in range(repeat):
            if self.emulate:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def syncs(self, fn: Callable[[], object]) -> int:
        """Blocking device-to-host synchronizations one call of fn makes."""
        if self.emulate:
            before = torch.ops.dlac_emu.device_to_host_copies()
            fn()
            return int(torch.ops.dlac_emu.device_to_host_copies() - before)
        from lightning_dlac.testing.cuda import count_synchronizations

        return count_synchronizations(fn)


def int8_rowwise_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise INT8 as fbgemm's Fused8BitRowwise: per row a float32 scale and bias, codes round((x - min) / scale)."""
    lo, hi = torch.aminmax(x, dim=1, keepdim=True)
    scale = ((hi - lo) / 255.0).clamp_min(1e-30)
    q = torch.round((x - lo) / scale).to(torch.uint8)
    return q, torch.cat([scale, lo], dim=1)


def int8_rowwise_decode(q: torch.Tensor, scale_bias: torch.Tensor) -> torch.Tensor:
    return q.float() * scale_bias[:, :1] + scale_bias[:, 1:]


def fbgemm_triton_dir() -> tuple[Path | None, str]:
    """The directory of fbgemm's Triton MX4 kernels (quantize.py, common.py) and where it came from, or ``None`` and
    why not: ``$DLAC_FBGEMM_TRITON`` where set, else ``<fbgemm_gpu>/triton`` of an installed fbgemm_gpu, located with
    ``importlib.util.find_spec`` without importing it (its ``__init__`` loads native libraries that a GPU image
    without fbgemm lacks, while these kernels are pure Python/Triton)."""
    given = os.environ.get(FBGEMM_TRITON_ENV)
    if given:
        where = Path(given)
        missing = [f for f in FBGEMM_TRITON_FILES if not (where / f).is_file()]
        if missing:
            return None, (f"{FBGEMM_TRITON_ENV}={given} has no {' or '.join(missing)}: point it at fbgemm_gpu/triton"
                          " (the directory holding quantize.py and common.py)")
        return where, f"{FBGEMM_TRITON_ENV}={given}"
    try:
        spec = importlib.util.find_spec("fbgemm_gpu")
    except (ImportError, ValueError) as e:
        spec, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "fbgemm_gpu is not installed"
    if spec is not None and spec.submodule_search_locations:
        where = Path(next(iter(spec.submodule_search_locations))) / "triton"
        if all((where / f).is_file() for f in FBGEMM_TRITON_FILES):
            return where, f"fbgemm_gpu's {where}"
        why = f"the installed fbgemm_gpu has no triton/quantize.py ({where})"
    return None, (f"{why} and {FBGEMM_TRITON_ENV} is not set: set it to a copy of fbgemm_gpu/triton (the directory"
                  " holding quantize.py and common.py)")


def load_mx4_kernels(package: str = "_fbgemm_triton") -> tuple[types.ModuleType | None, str]:
    """fbgemm's ``triton/quantize.py`` loaded as ``<package>.quantize`` from :func:`fbgemm_triton_dir` (a bare
    package over that directory, so its relative ``from .common import ...`` resolves and fbgemm_gpu is never
    imported), and where it came from; or ``None`` and why not (no directory, no Triton, a failed import)."""
    where, said = fbgemm_triton_dir()
    if where is None:
        return None, said
    if importlib.util.find_spec("triton") is None:
        return None, f"Triton is not installed (kernels at {said})"
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = [str(where)]  # a namespace of the directory: its __init__.py is not run
        sys.modules[package] = pkg
    try:
        return importlib.import_module(f"{package}.quantize"), said
    except Exception as e:  # noqa: BLE001  a broken copy or an incompatible Triton: a reason, not a crash
        return None, f"loading {said}/quantize.py failed ({type(e).__name__}: {str(e)[:200]})"


def baselines(table: Table, be: Backend, name: str, x: torch.Tensor, args: argparse.Namespace) -> None:
    """memcpy, FP16, INT8 row-wise and MX4 on the payload (no build needed, so a build failure still leaves them)."""
    gb = x.numel() * 4 / 1e9
    copy = gb / be.seconds(lambda: x.clone())
    table.add({"payload": name, "codec": "memcpy", "ratio": 1.0, "encode_gbps": copy, "decode_gbps": copy,
               "moved_gbps": 2 * copy})
    print(f"{name}: memcpy moves {2 * copy:.1f} GB/s counting the bytes read and written (each payload byte moves "
          "both ways)", flush=True)
    if args.quick_baselines:
        table.skip(name, MX4, "--quick-baselines: memcpy only")
        return
    half = x.half()
    table.add({"payload": name, "codec": "fp16", "ratio": 2.0, "encode_gbps": gb / be.seconds(lambda: x.half()),
               "decode_gbps": gb / be.seconds(lambda: half.float()), "max_err_range": max_error_over_range(x, half)})
    q, sb = int8_rowwise_encode(x)
    table.add({"payload": name, "codec": "int8 row-wise (torch)", "ratio": x.numel() * 4 / (q.numel() + sb.numel() * 4),
               "encode_gbps": gb / be.seconds(lambda: int8_rowwise_encode(x)),
               "decode_gbps": gb / be.seconds(lambda: int8_rowwise_decode(q, sb)),
               "max_err_range": max_error_over_range(x, int8_rowwise_decode(q, sb))})
    bench_mx4(table, be, name, x)
    if be.emulate:
        return
    try:
        import fbgemm_gpu  # noqa: F401

        fq = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x)
        table.add({"payload": name, "codec": "int8 row-wise (fbgemm)", "ratio": x.numel() * 4 / fq.numel(),
                   "encode_gbps": gb / be.seconds(lambda: torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x)),
                   "decode_gbps": gb / be.seconds(lambda: torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(fq))})
    except (ImportError, RuntimeError, AttributeError) as e:
        table.skip(name, "int8 row-wise (fbgemm)", f"{type(e).__name__}: {str(e)[:200]}")


def bench_mx4(table: Table, be: Backend, name: str, x: torch.Tensor) -> None:
    """TorchRec's MX4 qcomm on fbgemm's Triton kernels, or a line saying why not (no kernels, no Triton, no GPU)."""
    if be.emulate:
        table.skip(name, MX4, "no GPU: --emulate rehearses DLAC's CUDA pipeline, and Triton kernels need a device")
        return
    kernels, said = load_mx4_kernels()
    if kernels is None:
        table.skip(name, MX4, said)
        return
    rounding = kernels.RoundingMode[MX4_ROUNDING]
    flat = x.view(-1)  # TorchRec encodes the flat buffer where each rank's columns are a multiple of the group size

    def encode() -> torch.Tensor:
        return kernels.triton_quantize_mx4(flat, MX4_GROUP_SIZE, ebits=MX4_EBITS, mbits=MX4_MBITS,
                                           rounding_mode=rounding, stochastic_casting=False)

    def decode(q: torch.Tensor) -> torch.Tensor:
        return kernels.triton_dequantize_mx4(q, MX4_GROUP_SIZE, ebits=MX4_EBITS, mbits=MX4_MBITS)

    try:
        q = encode()  # the first call compiles the kernels
        out = decode(q)
        gb = x.numel() * 4 / 1e9
        table.add({"payload": name, "codec": MX4, "ratio": x.numel() * 4 / (q.numel() * q.element_size()),
                   "encode_gbps": gb / be.seconds(encode), "decode_gbps": gb / be.seconds(lambda: decode(q)),
                   "max_err_range": max_error_over_range(x, out[: x.numel()]), "kernels": said})
    except Exception as e:  # noqa: BLE001  Triton's compile errors have their own classes: a baseline, not a stop
        table.skip(name, MX4, f"{said}: {type(e).__name__}: {str(e)[:200]}")


def bench_dlac(table: Table, be: Backend, name: str, x_cpu: torch.Tensor, x: torch.Tensor, eps: float,
               args: argparse.Namespace) -> None:
    from lightning_dlac.codec import decode_grid, encode_grid

    gb = x.numel() * 4 / 1e9
    rs = list(range(0, x.size(0) + 1, x.size(0) // DESTS))
    cs = list(range(0, TABLES * DIM + 1, DIM))
    bounds = torch.full((TABLES,), eps)
    ops = be.ops
    p, s = ops.encode_grid(x, rs, cs, bounds, True)
    s_host = s.cpu()
    want, want_sizes = torch.ops.dlac.encode_grid(x_cpu, rs, cs, bounds, True)
    same_bytes = torch.equal(s_host, want_sizes) and p.numel() == want.numel() and torch.equal(p.cpu(), want)
    out = ops.decode_grid(p, s, rs, cs)  # sizes on the device, as the exchange receives them
    want_out = torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)
    same_bits = torch.equal(out.cpu().view(torch.int32), want_out.view(torch.int32))
    if args.inject_parity_fault:  # the GPU session's rehearsal: a mismatch must fail the session
        same_bits = False
    parity = "bytes+bits equal" if same_bytes and same_bits else \
        f"DIFFERS (payload {'ok' if same_bytes else 'differs'}, decoded {'ok' if same_bits else 'differs'})"
    row = {"payload": name, "codec": f"dlac eps={eps:g}", "ratio": x.numel() * 4 / p.numel(), "parity": parity,
           "max_err_range": max_error_over_range(x_cpu, out.cpu()),
           "op_encode_gbps": gb / be.seconds(lambda: ops.encode_grid(x, rs, cs, bounds, True)),
           "op_decode_gbps": gb / be.seconds(lambda: ops.decode_grid(p, s_host, rs, cs))}
    if be.emulate:  # the public API runs the CUDA kernels, not the emulation: op rows only
        row["syncs"] = [be.syncs(lambda: ops.encode_grid(x, rs, cs, bounds, True)),
                        be.syncs(lambda: ops.decode_grid(p, s, rs, cs))]
    else:
        row["syncs"] = [be.syncs(lambda: encode_grid(x, rs, cs, eps=bounds, impl="native")),
                        be.syncs(lambda: decode_grid(p, s, rs, cs, impl="native"))]
        row["encode_gbps"] = gb / be.seconds(lambda: encode_grid(x, rs, cs, eps=bounds, impl="native"))
        row["decode_gbps"] = gb / be.seconds(lambda: decode_grid(p, s, rs, cs, impl="native"))
    table.add(row)
    if args.host_copies and not be.emulate:
        host_enc = be.seconds(lambda: torch.ops.dlac.encode_grid(x.cpu(), rs, cs, bounds, True)[0].cuda(), 1)
        host_dec = be.seconds(lambda: torch.ops.dlac.decode_grid(p.cpu(), s_host, rs, cs).cuda(), 1)
        table.add({"payload": name, "codec": f"dlac eps={eps:g} via host copies", "ratio": row["ratio"],
                   "encode_gbps": gb / host_enc, "decode_gbps": gb / host_dec})


def run(args: argparse.Namespace, be: Backend, table: Table) -> None:
    from lightning_dlac.codec import _loader

    built = False
    for name in args.payloads:
        x_cpu, what = payload(name, args.batch)
        print(f"{name}: {tuple(x_cpu.shape)} float32 ({x_cpu.numel() * 4 / 1e6:.0f} MB): {what}", flush=True)
        x = x_cpu.to(be.device)
        baselines(table, be, name, x, args)
        if not built:
            start = time.perf_counter()
            be.load()  # raises NativeUnavailable with the build log: main() reports it
            print(f"native kernels built/loaded in {time.perf_counter() - start:.0f} s", flush=True)
            built = True
        for eps in args.eps:
            try:
                bench_dlac(table, be, name, x_cpu, x, eps, args)
            except RuntimeError as e:  # a kernel error: record it and go on (a sticky CUDA error fails the rest too)
                if isinstance(e, _loader.NativeUnavailable):
                    raise
                table.add({"payload": name, "codec": f"dlac eps={eps:g}", "parity": "ERROR", "error": str(e)[:2000]})
                print(f"{name} dlac eps={eps:g}: {type(e).__name__}: {str(e)[:2000]}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096, help="rows per destination (at most 4096 for the "
                        "criteo, multihot and gradient payloads: the samples in the shipped file)")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.05])
    parser.add_argument("--payloads", nargs="+", choices=PAYLOADS, default=list(PAYLOADS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-host-copies", dest="host_copies", action="store_false",
                        help="skip the CPU-kernel rows (seconds each on a large batch)")
    parser.add_argument("--quick-baselines", action="store_true", help="memcpy only, no FP16 / INT8 rows")
    parser.add_argument("--emulate", action="store_true",
                        help="no GPU: run the CUDA pipeline compiled for the host (a rehearsal, wall-clock times)")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "cuda_codec_bench.json")
    parser.add_argument("--inject-parity-fault", action="store_true", help=argparse.SUPPRESS)  # rehearsal only
    args = parser.parse_args()
    metadata = start_run(__spec__.name, vars(args))
    if not args.emulate and not torch.cuda.is_available():
        print(f"cuda_codec_bench: no device (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              "torch.cuda.is_available() is False): nothing measured (--emulate rehearses it on the host)", flush=True)
        return 2
    from lightning_dlac.codec import _loader

    be = Backend(args.emulate, args.repeat)
    device = be.name()
    print(f"{device}: payloads {' '.join(args.payloads)}, {TABLES} tables x {DESTS} destinations x {args.batch} rows,"
          f" dim {DIM}, eps {args.eps}; torch {torch.__version__}", flush=True)
    table = Table(args.json_out, metadata, {"device": device, "batch": args.batch, "eps": args.eps,
                                            "payloads": args.payloads, "emulated": args.emulate})
    status = 0
    try:
        run(args, be, table)
    except _loader.NativeUnavailable as e:
        print(f"cuda_codec_bench: the native kernels did not build or load:\n{e}", flush=True)
        status = 1
    wrong = [f"{r['payload']} {r['codec']}: {r['parity']}" for r in table.rows
             if str(r.get("parity", "")).startswith(("DIFFERS", "ERROR"))]
    if wrong:  # the reference is the specification: a kernel that disagrees with it is a failure, not a figure
        print(f"cuda_codec_bench: {len(wrong)} row(s) disagree with the CPU kernels or raised: {'; '.join(wrong)}",
              flush=True)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
