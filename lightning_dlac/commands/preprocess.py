"""``dlac preprocess criteo``: the command line of the converter and of the multi-hot materialisation.

``dlac preprocess criteo --output DIR [--workers N] [--multi-hot-sizes ...] INPUT...`` converts Criteo TSV files
(:func:`lightning_dlac.criteo.preprocess_criteo`) and, with ``--multi-hot-sizes``, materialises MLPerf DLRM v2's
multi-hot ids (:func:`lightning_dlac.criteo.materialize_multi_hot`), from the TSV files or from ``<stem>_sparse.npy``
files converted before. Only NumPy is imported before the arguments are parsed, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_dlac.criteo.format import (
    CRITEO_KAGGLE_CARDINALITIES,
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS_PER_FEATURE,
    SPARSE_COLUMNS,
    CriteoFormatError,
)
from lightning_dlac.native import IMPLS, NativeUnavailable

# The logger every part of the converter reports through (per-file summaries, skipped lines), this command too.
PACKAGE_LOGGER = "lightning_dlac.criteo"
log = logging.getLogger(PACKAGE_LOGGER)

__all__ = ["build_parser", "main"]


def _int_list(text: str, named: dict[str, Sequence[int]], option: str) -> list[int]:
    """A comma-separated list of integers, or one of the ``named`` shorthands."""
    key = text.strip().lower()
    if key in named:
        return [int(v) for v in named[key]]
    try:
        return [int(v) for v in text.replace(" ", "").strip("[]").split(",")]
    except ValueError:
        shorthands = " or ".join(repr(k) for k in named)
        raise argparse.ArgumentTypeError(
            f"{option} takes {SPARSE_COLUMNS} comma-separated integers or {shorthands}, got {text!r}."
        ) from None


def _option(named: dict[str, Sequence[int]], option: str) -> Callable[[str], list[int]]:
    return lambda text: _int_list(text, named, option)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or ``taskset`` limits it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dlac preprocess``."""
    parser = argparse.ArgumentParser(
        prog="dlac preprocess",
        description="Convert datasets to the binary layouts the DataModules read.",
    )
    sub = parser.add_subparsers(dest="dataset", required=True)
    criteo = sub.add_parser(
        "criteo",
        help="Criteo TSV (Kaggle train.txt, 1TB day_N) -> TorchRec's <stem>_{dense,sparse,labels}.npy",
        description="Criteo TSV files (Kaggle train.txt, 1TB day_0..day_23) -> TorchRec's binary layout:"
        " <stem>_dense.npy float32 [N,13], <stem>_sparse.npy int64 [N,26], <stem>_labels.npy int32 [N,1]. With"
        " --multi-hot-sizes, also MLPerf DLRM v2's multi-hot ids <stem>_sparse_multi_hot.npz (one int32 [N, P]"
        " array per feature), from the TSV files or from <stem>_sparse.npy files converted before.",
    )
    criteo.add_argument(
        "inputs", nargs="+", metavar="INPUT",
        help="Criteo TSV files (decompressed), or with --multi-hot-sizes also <stem>_sparse.npy files converted before",
    )  # fmt: skip
    criteo.add_argument("--output", "-o", required=True, help="output directory (created if missing)")
    criteo.add_argument(
        "--workers", "-j", type=_positive_int, default=available_cores(),
        help=f"threads per file (default: the cores this process may run on, {available_cores()} here)",
    )  # fmt: skip
    criteo.add_argument(
        "--skip-bad-lines", action="store_true", help="skip malformed lines and report how many, instead of stopping"
    )
    criteo.add_argument("--overwrite", action="store_true", help="replace existing output files")
    criteo.add_argument("--no-progress", action="store_true", help="no progress bar")
    criteo.add_argument(
        "--impl", choices=IMPLS, default="auto",
        help="parser: native if it builds, else the pure-Python reference (auto, the default), native, or ref;"
        " DLAC_PREPROCESS_IMPL sets it too",
    )  # fmt: skip
    criteo.add_argument(
        "--multi-hot-sizes", metavar="P0,...,P25|mlperf",
        type=_option({"mlperf": MLPERF_MULTI_HOT_SIZES}, "--multi-hot-sizes"),
        help="also write <stem>_sparse_multi_hot.npz with these ids per row for each feature; 'mlperf' is MLPerf DLRM"
        " v2's 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1",
    )  # fmt: skip
    criteo.add_argument(
        "--num-embeddings-per-feature", metavar="N0,...,N25|mlperf|kaggle",
        type=_option({"mlperf": MLPERF_NUM_EMBEDDINGS_PER_FEATURE, "kaggle": CRITEO_KAGGLE_CARDINALITIES},
                     "--num-embeddings-per-feature"),
        help="table sizes the multi-hot ids are drawn for (required with --multi-hot-sizes; train with the same):"
        " 'mlperf' is MLPerf's Criteo 1TB sizes (40M-row cap), 'kaggle' Criteo Kaggle's cardinalities",
    )  # fmt: skip
    criteo.add_argument(
        "--max-rows", type=int, default=None,
        help="cap every table size at this many rows (CriteoBinaryDataModule's max_rows for the same tables)",
    )  # fmt: skip
    return parser


def _show_progress_lines() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    package = logging.getLogger(PACKAGE_LOGGER)
    if package.level == logging.NOTSET:
        # An import (torchrec's) may already have given the root logger a handler at WARNING: the per-file summary
        # lines are INFO and would not be seen.
        package.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """``dlac preprocess criteo --output DIR [--multi-hot-sizes ...] INPUT...``; returns the exit status (an error is
    logged as one line, status 1). Output goes through the ``lightning_dlac.criteo`` logger (to stderr unless
    logging is set up)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _show_progress_lines()
    multi_hot = args.multi_hot_sizes is not None
    tables = args.num_embeddings_per_feature
    if multi_hot and tables is None:
        parser.error(
            "--multi-hot-sizes needs --num-embeddings-per-feature (the table sizes the extra ids are drawn from; train"
            " with the same): a list, 'mlperf' or 'kaggle'."
        )
    if not multi_hot and (tables is not None or args.max_rows is not None):
        parser.error("--num-embeddings-per-feature and --max-rows only apply with --multi-hot-sizes.")
    if args.max_rows is not None:
        if args.max_rows < 1:
            parser.error(f"--max-rows must be at least 1, got {args.max_rows}.")
        tables = [min(n, args.max_rows) for n in tables]
    npys = [p for p in args.inputs if p.endswith("_sparse.npy")]
    tsvs = [p for p in args.inputs if not p.endswith("_sparse.npy")]
    if npys and not multi_hot:
        parser.error(f"{npys[0]} is already converted; pass --multi-hot-sizes to materialise its multi-hot ids.")
    from lightning_dlac.criteo.convert import preprocess_criteo
    from lightning_dlac.criteo.multi_hot import materialize_multi_hot

    try:
        results = []
        if tsvs:
            results = preprocess_criteo(
                tsvs,
                args.output,
                workers=args.workers,
                skip_bad_lines=args.skip_bad_lines,
                progress=not args.no_progress,
                overwrite=args.overwrite,
                impl=args.impl,
            )
        for r in results:
            skipped = f", skipped {r.bad_lines} malformed line(s) (first: {r.first_bad_line})" if r.bad_lines else ""
            log.info(
                f"{r.input} -> {r.paths[0].parent}/{r.stem}_{{dense,sparse,labels}}.npy: {r.rows} rows in"
                f" {r.seconds:.1f} s ({r.rows_per_second / 1e6:.2f}M rows/s){skipped}"
            )
        if multi_hot:
            sources = [r.paths[1] for r in results] + [Path(p) for p in npys]
            for m in materialize_multi_hot(
                sources, args.output, args.multi_hot_sizes, tables, workers=args.workers, overwrite=args.overwrite,
                progress=not args.no_progress,
            ):  # fmt: skip
                log.info(
                    f"{m.source} -> {m.path}: {m.rows} rows in {m.seconds:.1f} s"
                    f" ({m.rows_per_second / 1e6:.2f}M rows/s)"
                )
    except (CriteoFormatError, FileNotFoundError, FileExistsError, ValueError, NativeUnavailable) as e:
        log.error(f"dlac preprocess: error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
