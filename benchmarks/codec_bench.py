"""Codec micro-benchmark: ratio and single-thread throughput on a 4096x64 Zipf payload; prints a table, writes JSON.

    python benchmarks/codec_bench.py [--impl native ref] [--out benchmarks/results/codec_bench.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lightning_dlac.codec import decode, encode, inspect, max_error


def zipf_payload(rows: int, dim: int, vocab: int = 2000, alpha: float = 1.1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, dim, generator=g) * 0.05
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** alpha
    return table[torch.multinomial(p, rows, replacement=True, generator=g)].contiguous()


def _time(fn, min_seconds: float = 0.5) -> float:
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", nargs="+", default=["native", "ref"])
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.03, 0.05])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/codec_bench.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    payloads = {"zipf": zipf_payload(args.rows, args.dim), "gaussian": torch.randn(args.rows, args.dim) * 0.05}
    results = []
    print(f"{'payload':<9} {'impl':<7} {'eps':>6} {'mode':<6} {'ratio':>7} {'enc GB/s':>9} {'dec GB/s':>9} {'err/eb':>7}")
    for name, x in payloads.items():
        nbytes = x.numel() * 4
        for impl in args.impl:
            for eps in args.eps:
                buf = encode(x, eps=eps, impl=impl)
                info = inspect(buf)
                err = max_error(x, decode(buf, impl=impl))
                enc = nbytes / _time(lambda: encode(x, eps=eps, impl=impl)) / 1e9
                dec = nbytes / _time(lambda: decode(buf, impl=impl)) / 1e9
                row = dict(payload=name, impl=impl, eps=eps, mode=str(info.mode), ratio=info.ratio,
                           encode_gbps=enc, decode_gbps=dec, max_error_over_bound=err / info.abs_eb)
                results.append(row)
                print(f"{name:<9} {impl:<7} {eps:>6} {row['mode']:<6} {info.ratio:>7.1f} {enc:>9.3f} {dec:>9.3f} "
                      f"{row['max_error_over_bound']:>7.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": args.rows, "dim": args.dim, "threads": 1, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
