"""The step-time model's tables (``python -m benchmarks.scaling_model``): its validation against this machine's
throttled runs and its projection to GPU clusters.
"""

from __future__ import annotations

from typing import Any

from lightning_dlac.commands.estimate import METHOD_LABELS, METHODS

DIMS = (64,) * 26  # the end-to-end benchmarks' DLRM (benchmarks/lib/e2e.py)


def validation_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| ranks | rate (calibrated on) | method | measured ms (launch medians) | predicted ms | error |",
             "|---:|---|---|---:|---:|---:|"]
    for r in rows:
        meds = r["launch_medians_ms"]
        spread = f" ({min(meds):.0f}-{max(meds):.0f})" if len(meds) > 1 else ""
        lines.append(f"| {r['world']} | {r['rate']} ({r['calibrated_on']}) | {METHOD_LABELS[r['method']]} |"
                     f" {r['measured_ms']:.0f}{spread} | {r['predicted_ms']:.0f} | {100 * r['error']:+.0f}% |")
    return lines


def projection_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| link | GPU codec GB/s | GPUs | FP32 ms | " + " | ".join(
        f"{METHOD_LABELS[m]} speedup" for m in METHODS[1:]) + " |", "|---|---:|---:|---:|" + "---:|" * 3]
    for r in rows:
        cells = [f"{r['fp32_ms'] / r[f'{m}_ms']:.2f}x" for m in METHODS[1:]]
        lines.append(f"| {r['link']} | {r['codec_gb_s']:g} | {r['world']} | {r['fp32_ms']:.1f} | " + " | ".join(cells)
                     + " |")
    return lines
