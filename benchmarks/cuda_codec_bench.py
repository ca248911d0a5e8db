"""GPU codec throughput: DLAC's CUDA kernels on one all-to-all batch, beside the baselines measured in the same run.

Payload: pooled embeddings of 26 tables (dim 64, Zipf lookups) for 8 destinations x --batch rows, cut into the
26 x 8 chunks the forward all-to-all sends. Timed with CUDA events (median of --repeat calls after a warm-up):

    dlac encode / decode     torch.ops.dlac.encode_grid / decode_grid on the device, at each eps
    memcpy                   a device-to-device copy of the payload (the memory-bandwidth ceiling)
    fp16                     a cast to float16 and back (TorchRec's FP16 qcomm)
    int8 row-wise            fbgemm FloatToFused8BitRowwiseQuantized and back (TorchRec's INT8 qcomm), if available
    dlac via host copies     the CPU kernels on a host copy, what a build without CUDA kernels would do

GB/s are of float32 input (encode) or output (decode). The encoder synchronizes twice per call (the chunk sizes
decide the payload size) and the decoder twice; both are inside the timings. Target (issue #3): >= 100 GB/s
each way on an H200. Needs a CUDA device; exits with status 2 without one.

    python benchmarks/cuda_codec_bench.py [--batch 4096] [--markdown-out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

TABLES, DIM, DESTS = 26, 64, 8


def _cuda_time(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of fn() on the current stream (after two warm-up calls)."""
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


def payload(batch: int, seed: int = 0) -> torch.Tensor:
    from codec_bench import zipf_payload

    rows = DESTS * batch
    return torch.cat([zipf_payload(rows, DIM, seed=seed + t) for t in range(TABLES)], dim=1)


def run(args: argparse.Namespace) -> list[dict]:
    from lightning_dlac.codec import _loader
    from lightning_dlac.codec.api import device_kernels

    _loader.load_native()
    if not device_kernels("cuda"):
        raise SystemExit("the native library has no CUDA kernels (torch without CUDA, or built without a GPU visible)")
    x_cpu = payload(args.batch)
    x = x_cpu.cuda()
    gb = x.numel() * 4 / 1e9
    rs = list(range(0, x.size(0) + 1, args.batch))
    cs = list(range(0, TABLES * DIM + 1, DIM))
    rows: list[dict] = []

    def add(name: str, encode_s: float, decode_s: float | None, ratio: float) -> None:
        rows.append({"codec": name, "ratio": ratio, "encode_gbps": gb / encode_s,
                     "decode_gbps": gb / decode_s if decode_s else None})

    add("memcpy", _cuda_time(lambda: x.clone(), args.repeat), None, 1.0)
    half = x.half()
    add("fp16", _cuda_time(lambda: x.half(), args.repeat), _cuda_time(lambda: half.float(), args.repeat), 2.0)
    try:
        import fbgemm_gpu  # noqa: F401

        q = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x)
        add("int8 row-wise", _cuda_time(lambda: torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x), args.repeat),
            _cuda_time(lambda: torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(q), args.repeat),
            x.numel() * 4 / q.numel())
    except (ImportError, RuntimeError, AttributeError) as e:
        print(f"int8 row-wise skipped: {e}")
    for eps in args.eps:
        rows.extend(_bench_dlac(x_cpu, x, rs, cs, eps, args.repeat))
    return rows


def _bench_dlac(x_cpu: torch.Tensor, x: torch.Tensor, rs: list[int], cs: list[int], eps: float,
                repeat: int) -> list[dict]:
    gb = x.numel() * 4 / 1e9
    bounds = torch.full((TABLES,), eps)
    p, s = torch.ops.dlac.encode_grid(x, rs, cs, bounds, True)
    want = torch.ops.dlac.encode_grid(x_cpu, rs, cs, bounds, True)
    if not (torch.equal(p.cpu(), want[0]) and torch.equal(s.cpu(), want[1])):
        raise SystemExit(f"eps {eps}: the CUDA payload differs from the CPU kernels' (a parity bug)")
    ratio = x.numel() * 4 / p.numel()
    enc = _cuda_time(lambda: torch.ops.dlac.encode_grid(x, rs, cs, bounds, True), repeat)
    dec = _cuda_time(lambda: torch.ops.dlac.decode_grid(p, s, rs, cs), repeat)
    host_enc = _cuda_time(lambda: torch.ops.dlac.encode_grid(x.cpu(), rs, cs, bounds, True)[0].cuda(), 1)
    host_dec = _cuda_time(lambda: torch.ops.dlac.decode_grid(p.cpu(), s.cpu(), rs, cs).cuda(), 1)
    return [
        {"codec": f"dlac eps={eps:g}", "ratio": ratio, "encode_gbps": gb / enc, "decode_gbps": gb / dec},
        {"codec": f"dlac eps={eps:g} via host copies", "ratio": ratio, "encode_gbps": gb / host_enc,
         "decode_gbps": gb / host_dec},
    ]


def format_table(rows: list[dict], markdown: bool) -> str:
    head = ["codec", "ratio", "encode GB/s", "decode GB/s"]
    body = [[r["codec"], f"{r['ratio']:.1f}x", f"{r['encode_gbps']:.1f}",
             "-" if r["decode_gbps"] is None else f"{r['decode_gbps']:.1f}"] for r in rows]
    if markdown:
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] +
                         ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in [head, *body])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096, help="rows per destination")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.05])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json-out", type=Path, default=REPO / "benchmarks" / "results" / "cuda_codec_bench.json")
    parser.add_argument("--markdown-out", type=Path, default=None, help="update the '## Codec on GPU' section")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_codec_bench: needs a CUDA device (none visible)")
        return 2
    rows = run(args)
    device = torch.cuda.get_device_name()
    print(f"{device}: {TABLES} tables x {DESTS} destinations x {args.batch} rows, dim {DIM}")
    print(format_table(rows, markdown=False))
    from _report import write_generated_block, write_results

    command = " ".join(["python benchmarks/cuda_codec_bench.py", *sys.argv[1:]])
    write_results(args.json_out, command, {"device": device, "batch": args.batch, "eps": args.eps}, rows)
    if args.markdown_out is not None:
        lines = [f"{device}, {TABLES} tables x {DESTS} destinations x {args.batch} rows (dim {DIM}), `{command}`:", "",
                 format_table(rows, markdown=True)]
        write_generated_block(args.markdown_out, "## Codec on GPU", "<!-- cuda_codec_bench:begin -->",
                              "<!-- cuda_codec_bench:end -->", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
