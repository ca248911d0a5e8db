"""``dlac report LOG_DIR [--baseline OTHER_LOG_DIR]``: rebuild a finished run's compression report
(:mod:`lightning_dlac.plugin.report`), optionally compared with a reference run."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from lightning_dlac.plugin.report import METRICS_CSV, RUN_FILE, headline, load_baseline, write_report

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """``dlac report LOG_DIR [--baseline OTHER_LOG_DIR]``: rebuild the report of a finished run, optionally
    compared with a reference run."""
    parser = argparse.ArgumentParser(prog="dlac report", description=main.__doc__)
    parser.add_argument("log_dir", type=Path, help=f"run directory holding {RUN_FILE}")
    parser.add_argument("--no-plots", action="store_true", help="write the markdown only")
    parser.add_argument("--baseline", type=Path, default=None,
                        help=f"log directory of a reference run (its {RUN_FILE}, else its {METRICS_CSV}), e.g. the"
                        " same training uncompressed: its loss and AUROC are overlaid and the final differences"
                        " stated")
    args = parser.parse_args(argv)
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    try:
        path = write_report(args.log_dir, plots=not args.no_plots, baseline=args.baseline)
        ref = load_baseline(args.baseline) if args.baseline is not None else None
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    run = json.loads((args.log_dir / RUN_FILE).read_text())
    for line in headline(run, ref):
        rank_zero_info(f"dlac: {line}")
    rank_zero_info(f"dlac: report in {path}")
