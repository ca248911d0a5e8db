"""The data-path benchmark's tables (``python -m benchmarks.data_bench``): the converters' rates, the binary loader's
reads per rank and the train step it must keep ahead of.
"""

from __future__ import annotations

from typing import Any


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def _tables(pre: list[dict[str, Any]], loader: list[dict[str, Any]], step: dict[str, Any] | None) -> list[str]:
    out = ["| converter | rows | seconds (median; all runs) | rows/s | vs TorchRec | peak RSS (MiB) |",
           "|---|---|---|---|---|---|"]
    for r in pre:
        runs = ", ".join(f"{t:.2f}" for t in r["all_seconds"])
        out.append(f"| {r['name']} | {r['rows']:,} | {r['seconds']:.2f} ({runs}) | {fmt_rate(r['rate'])} |"
                   f" {r['vs_torchrec']:.1f}x | {r['maxrss_mib']:.0f} |")  # fmt: skip
    if loader:
        out += ["", "| reads | rank | open (s) | batches | batches/s | rows/s | share of arrays (MiB) | RSS after (MiB)"
                " | growth while reading: anonymous / file pages (MiB) | loader vs train step |",
                "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in loader:
            a, b = r["rss_after"], r["rss_before"]
            ratio = f"{r['batches_per_second'] * step['step_seconds']:.0f}x" if step else "-"
            out.append(f"| {'mmap' if r['mmap_mode'] else 'pread'} | {r['rank']} | {r['open_seconds']:.3f} |"
                       f" {r['batches']:,} | {r['batches_per_second']:.0f} |"
                       f" {fmt_rate(r['batches_per_second'] * r['batch_size'])} | {r['share_mib']:.0f} |"
                       f" {a['VmRSS']:.0f} | {a['RssAnon'] - b['RssAnon']:+.0f} / {a['RssFile'] - b['RssFile']:+.0f} |"
                       f" {ratio} |")  # fmt: skip
    if step:
        out += ["", f"Demo model training step (batch {step['batch_size']}, one thread, dense part only):"
                f" {step['step_seconds'] * 1e3:.1f} ms median of {step['steps']}."]  # fmt: skip
    return out


def tables(results: list[dict[str, Any]]) -> list[str]:
    """The markdown tables of a results file's rows (conversions, loader reads, the train step)."""
    pre = [r for r in results if "vs_torchrec" in r]
    loader = [r for r in results if "mmap_mode" in r]
    step = next((r for r in results if "step_seconds" in r), None)
    return _tables(pre, loader, step)
