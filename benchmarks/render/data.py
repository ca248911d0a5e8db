"""The data path's figures: docs/benchmarks.md's converters and loader, and docs/data.md's projection to the full
Criteo data sets."""

from __future__ import annotations

from benchmarks.lib.data import tables as data_tables
from benchmarks.render.core import Block, Results, source_line


def data(results: Results) -> list[str]:
    d = results.get("data_bench.json")
    cfg = d["config"]
    imported = [r["baseline_rss_mib"] for r in d["results"] if "baseline_rss_mib" in r]
    libraries = (f"; peak RSS includes the {min(imported):.0f}-{max(imported):.0f} MiB a process holds after importing"
                 " its libraries, before converting" if imported else "")
    return [source_line("data_bench.json", d, results.shown), "",
            f"Input: {cfg['source']}. Each conversion in its own process (wall time including the line count, the"
            f" dense log pass and fsync{libraries}). The loader reads files still in the page cache from being"
            " written.", "", *data_tables(d["results"])]


# Rows of the full data sets the data path is projected to (docs/data.md): Criteo Kaggle's train.txt and one day of
# the Criteo 1TB click logs (about 180M rows a day: 4.37 billion over 24 days).
KAGGLE_ROWS, ONE_TB_DAY_ROWS = 45_840_617, 180_000_000


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"


def data_projection(results: Results) -> list[str]:
    """What the measured data-path rates mean for the full data sets, from the same results file."""
    d = results.get("data_bench.json")
    pre = {r["name"]: r for r in d["results"] if "name" in r}
    loaders = [r for r in d["results"] if "batches_per_second" in r and not r["mmap_mode"]]
    step = next((r["step_seconds"] for r in d["results"] if "step_seconds" in r), None)
    lines = [source_line("data_bench.json", d, results.shown), "",
             "| what | measured | so for a full data set |", "|---|---|---|"]
    for name, r in pre.items():
        lines.append(f"| {name} | {r['rate'] / 1e3:,.0f}k rows/s, {r['vs_torchrec']:.1f}x TorchRec's converter in the"
                     f" same run; peak RSS {r['maxrss_mib']:.0f} MiB | Kaggle's {KAGGLE_ROWS / 1e6:.1f}M rows in"
                     f" {_duration(KAGGLE_ROWS / r['rate'])}; a 1TB day ({ONE_TB_DAY_ROWS / 1e6:.0f}M rows) in"
                     f" {_duration(ONE_TB_DAY_ROWS / r['rate'])} |")
    if loaders:
        rates = [r["batches_per_second"] for r in loaders]
        batch = d["config"]["batch_size"]
        vs = f" ({min(rates) * step:.0f}-{max(rates) * step:.0f}x the demo model's training step)" if step else ""
        lines.append(f"| `CriteoBinaryDataModule`, per rank, batch {batch}, one thread | {min(rates):,.0f}-"
                     f"{max(rates):,.0f} batches/s{vs} |"
                     + (" reading keeps ahead of a training step |" if step and min(rates) * step > 1 else
                        " reading is slower than a training step here: more DataLoader workers |"))
    return lines


BLOCKS = {
    "data": Block(("data_bench.json",), data),
    "data_projection": Block(("data_bench.json",), data_projection),
}
