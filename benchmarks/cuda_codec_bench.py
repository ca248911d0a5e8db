"""GPU codec throughput: DLAC's CUDA kernels on one all-to-all batch, beside the baselines measured in the same run.

Payload: pooled embeddings of 26 tables (dim 64, Zipf lookups) for 8 destinations x --batch rows, cut into the
26 x 8 chunks the forward all-to-all sends. Timed with CUDA events (median of --repeat calls after two warm-ups):

    memcpy                   a device-to-device copy of the payload (the memory-bandwidth ceiling)
    fp16                     a cast to float16 and back (TorchRec's FP16 qcomm)
    int8 row-wise (torch)    per-row min/scale uint8 quantization in plain torch ops (what fbgemm's
                             FloatToFused8BitRowwiseQuantized computes; fbgemm is not on the GPU image)
    int8 row-wise (fbgemm)   fbgemm's fused kernels, where fbgemm_gpu is installed
    dlac eps=...             torch.ops.dlac.encode_grid / decode_grid on the device
    dlac ... via host copies the CPU kernels on a host copy, what a build without CUDA kernels would do

GB/s are of float32 input (encode) or output (decode); "x memcpy" is that throughput over the memcpy row's. Each
DLAC row also records byte parity with the CPU kernels (payload bytes, decoded bits) and the synchronizations one
call makes (torch's sync debug mode; docs/codec.md says 1 to encode, 2 to decode), as columns: a mismatch is a
finding to report, not a reason to stop measuring. Every row is printed and flushed as it is measured and the JSON
is rewritten after each row, so a timeout loses only the rows not yet reached. Target (issue 17): >= 100 GB/s each
way on an H200. Exit status: 0 measured (even with parity failures: see the column), 1 the kernels did not build or
load, 2 no CUDA device.

    python benchmarks/cuda_codec_bench.py [--batch 4096] [--eps 0.01 0.05] [--json-out FILE] [--markdown-out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

TABLES, DIM, DESTS = 26, 64, 8
COLUMNS = ["codec", "ratio", "encode GB/s", "decode GB/s", "enc x memcpy", "dec x memcpy", "parity", "syncs e/d"]
WIDTHS = [34, 7, 12, 12, 13, 13, 22, 10]


def _cuda_time(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of fn() on the current stream, from CUDA events (after two warm-up calls)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _syncs(fn: Callable[[], object]) -> int:
    """Blocking device-to-host synchronizations one call of fn makes (torch's sync debug mode warns at each)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def payload(batch: int, seed: int = 0) -> torch.Tensor:
    """The benchmark batch on the host: 26 Zipf tables side by side, 8 * batch rows."""
    from codec_bench import zipf_payload

    rows = DESTS * batch
    return torch.cat([zipf_payload(rows, DIM, seed=seed + t) for t in range(TABLES)], dim=1)


def int8_rowwise_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise INT8 as fbgemm's Fused8BitRowwise: per row a float32 scale and bias, codes round((x - min) / scale)."""
    lo, hi = torch.aminmax(x, dim=1, keepdim=True)
    scale = ((hi - lo) / 255.0).clamp_min(1e-30)
    q = torch.round((x - lo) / scale).to(torch.uint8)
    return q, torch.cat([scale, lo], dim=1)


def int8_rowwise_decode(q: torch.Tensor, scale_bias: torch.Tensor) -> torch.Tensor:
    return q.float() * scale_bias[:, :1] + scale_bias[:, 1:]


class Table:
    """Rows printed and flushed as they come, and the JSON rewritten after each."""

    def __init__(self, json_out: Path, command: str, config: dict[str, Any]) -> None:
        self.rows: list[dict[str, Any]] = []
        self.json_out, self.command, self.config = json_out, command, config
        self.memcpy_gbps: float | None = None
        print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, WIDTHS)), flush=True)

    def add(self, row: dict[str, Any]) -> None:
        from _report import write_results

        if row["codec"] == "memcpy":
            self.memcpy_gbps = row["encode_gbps"]
        for key in ("encode", "decode"):
            gbps = row.get(f"{key}_gbps")
            row[f"{key}_x_memcpy"] = gbps / self.memcpy_gbps if gbps and self.memcpy_gbps else None
        self.rows.append(row)
        print("  ".join(c.ljust(w) for c, w in zip(self.cells(row), WIDTHS)), flush=True)
        write_results(self.json_out, self.command, self.config, self.rows)

    @staticmethod
    def cells(row: dict[str, Any]) -> list[str]:
        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        syncs = row.get("syncs")
        return [row["codec"], num(row.get("ratio"), ".1f") + ("x" if row.get("ratio") else ""),
                num(row.get("encode_gbps"), ".1f"), num(row.get("decode_gbps"), ".1f"),
                num(row.get("encode_x_memcpy"), ".3f"), num(row.get("decode_x_memcpy"), ".3f"),
                row.get("parity", "-"), "-" if syncs is None else f"{syncs[0]}/{syncs[1]}"]


def run(args: argparse.Namespace, table: Table) -> None:
    from lightning_dlac.codec import _loader
    from lightning_dlac.codec.api import device_kernels

    x_cpu = payload(args.batch)
    x = x_cpu.cuda()
    gb = x.numel() * 4 / 1e9
    rs = list(range(0, x.size(0) + 1, args.batch))
    cs = list(range(0, TABLES * DIM + 1, DIM))

    # Baselines first: they need no build, so a build failure still leaves them measured.
    table.add({"codec": "memcpy", "ratio": 1.0, "encode_gbps": gb / _cuda_time(lambda: x.clone(), args.repeat)})
    half = x.half()
    table.add({"codec": "fp16", "ratio": 2.0, "encode_gbps": gb / _cuda_time(lambda: x.half(), args.repeat),
               "decode_gbps": gb / _cuda_time(lambda: half.float(), args.repeat)})
    q, sb = int8_rowwise_encode(x)
    table.add({"codec": "int8 row-wise (torch)", "ratio": x.numel() * 4 / (q.numel() + sb.numel() * 4),
               "encode_gbps": gb / _cuda_time(lambda: int8_rowwise_encode(x), args.repeat),
               "decode_gbps": gb / _cuda_time(lambda: int8_rowwise_decode(q, sb), args.repeat)})
    try:
        import fbgemm_gpu  # noqa: F401

        fq = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x)
        table.add({"codec": "int8 row-wise (fbgemm)", "ratio": x.numel() * 4 / fq.numel(),
                   "encode_gbps": gb / _cuda_time(lambda: torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x),
                                                  args.repeat),
                   "decode_gbps": gb / _cuda_time(lambda: torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(fq),
                                                  args.repeat)})
    except (ImportError, RuntimeError, AttributeError) as e:
        print(f"int8 row-wise (fbgemm): not measured ({type(e).__name__}: {str(e)[:200]})", flush=True)

    start = time.perf_counter()
    _loader.load_native()  # raises NativeUnavailable with the build log: main() reports it
    print(f"native kernels built/loaded in {time.perf_counter() - start:.0f} s", flush=True)
    if not device_kernels("cuda"):
        raise _loader.NativeUnavailable("the native library has no CUDA kernels (built while no GPU was visible?)")
    for eps in args.eps:
        try:
            _bench_dlac(table, x_cpu, x, rs, cs, eps, args)
        except RuntimeError as e:  # a kernel error: record it and go on (a sticky CUDA error fails the rest too)
            table.add({"codec": f"dlac eps={eps:g}", "parity": "ERROR", "error": str(e)[:2000]})
            print(f"dlac eps={eps:g}: {str(e)[:2000]}", flush=True)


def _bench_dlac(table: Table, x_cpu: torch.Tensor, x: torch.Tensor, rs: list[int], cs: list[int], eps: float,
                args: argparse.Namespace) -> None:
    gb = x.numel() * 4 / 1e9
    bounds = torch.full((TABLES,), eps)
    p, s = torch.ops.dlac.encode_grid(x, rs, cs, bounds, True)
    s_host = s.cpu()
    want, want_sizes = torch.ops.dlac.encode_grid(x_cpu, rs, cs, bounds, True)
    same_bytes = torch.equal(s_host, want_sizes) and p.numel() == want.numel() and torch.equal(p.cpu(), want)
    out = torch.ops.dlac.decode_grid(p, s_host, rs, cs)
    want_out = torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)
    same_bits = torch.equal(out.cpu().view(torch.int32), want_out.view(torch.int32))
    parity = "bytes+bits equal" if same_bytes and same_bits else \
        f"DIFFERS (payload {'ok' if same_bytes else 'differs'}, decoded {'ok' if same_bits else 'differs'})"
    syncs = (_syncs(lambda: torch.ops.dlac.encode_grid(x, rs, cs, bounds, True)),
             _syncs(lambda: torch.ops.dlac.decode_grid(p, s_host, rs, cs)))
    ratio = x.numel() * 4 / p.numel()
    enc = _cuda_time(lambda: torch.ops.dlac.encode_grid(x, rs, cs, bounds, True), args.repeat)
    dec = _cuda_time(lambda: torch.ops.dlac.decode_grid(p, s_host, rs, cs), args.repeat)
    table.add({"codec": f"dlac eps={eps:g}", "ratio": ratio, "encode_gbps": gb / enc, "decode_gbps": gb / dec,
               "parity": parity, "syncs": list(syncs)})
    if args.host_copies:
        host_enc = _cuda_time(lambda: torch.ops.dlac.encode_grid(x.cpu(), rs, cs, bounds, True)[0].cuda(), 1)
        host_dec = _cuda_time(lambda: torch.ops.dlac.decode_grid(p.cpu(), s_host, rs, cs).cuda(), 1)
        table.add({"codec": f"dlac eps={eps:g} via host copies", "ratio": ratio, "encode_gbps": gb / host_enc,
                   "decode_gbps": gb / host_dec})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096, help="rows per destination")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.05])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-host-copies", dest="host_copies", action="store_false",
                        help="skip the CPU-kernel rows (seconds each on a large batch)")
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks" / "results" / "cuda_codec_bench.json")
    parser.add_argument("--markdown-out", type=Path, default=None, help="update the '## Codec on GPU' section")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"cuda_codec_bench: no device (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              "torch.cuda.is_available() is False): nothing measured", flush=True)
        return 2
    from lightning_dlac.codec import _loader

    device = torch.cuda.get_device_name()
    print(f"{device}: {TABLES} tables x {DESTS} destinations x {args.batch} rows, dim {DIM}, eps {args.eps}; "
          f"torch {torch.__version__}", flush=True)
    command = " ".join(["python benchmarks/cuda_codec_bench.py", *sys.argv[1:]])
    table = Table(args.json_out, command, {"device": device, "batch": args.batch, "eps": args.eps})
    status = 0
    try:
        run(args, table)
    except _loader.NativeUnavailable as e:
        print(f"cuda_codec_bench: the native kernels did not build or load:\n{e}", flush=True)
        status = 1
    if args.markdown_out is not None and table.rows:
        from _report import write_generated_block

        head = "| " + " | ".join(COLUMNS) + " |"
        lines = [f"{device}, {TABLES} tables x {DESTS} destinations x {args.batch} rows (dim {DIM}), `{command}`:",
                 "", head, "|" + "---|" * len(COLUMNS)] + \
                ["| " + " | ".join(Table.cells(r)) + " |" for r in table.rows]
        write_generated_block(args.markdown_out, "## Codec on GPU", "<!-- cuda_codec_bench:begin -->",
                              "<!-- cuda_codec_bench:end -->", lines)
    return status


if __name__ == "__main__":
    sys.exit(main())
