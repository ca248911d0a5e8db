"""Where things are: the repository, the benchmarks' own folders and the team's Criteo sample."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"  # the committed results files every published figure is rendered from
PAYLOADS = BENCHMARKS / "payloads"  # captured payloads the codec benchmarks read (gpu_payloads writes them)
# The real Criteo sample of the team's checkout (../shared/data), beside the repository; scripts that need it say so.
CRITEO_SAMPLE = REPO.parent / "shared" / "data" / "criteo_kaggle_head10k.tsv"
