"""Render the figures of README.md and docs/ from the results files: ``python -m benchmarks.render``.

Every figure block in those files sits between ``<!-- BEGIN render:NAME -->`` and ``<!-- END render:NAME -->`` and
is the renderer's output for block NAME: made from the results files it names (benchmarks/results/*.json, written by
the benchmark scripts; ``make bench-quick`` / ``make bench`` run them), or, while a file is missing, a line saying
which command writes it. Text outside the markers is written by hand and kept. Each block's renderer lives in the
module of the document section it renders (benchmarks/render/blocks.py lists them). The figures (docs/figures/*.svg)
are drawn from the results files too; each SVG carries the SHA-256 of the files it was drawn from, which ``--check``
compares (benchmarks/render/figures.py).

    python -m benchmarks.render                  # rewrite the blocks in place from benchmarks/results/
    python -m benchmarks.render --check          # exit 1 if a block differs from what the files give
    python -m benchmarks.render --results DIR --out DIR/rendered   # render copies from other results

After rendering it prints every judged target and every benchmark error in the results it used, and exits with
status 3 when a file records a benchmark error (e.g. a DLAC launch faster than its own ceiling), so a run that
produced one cannot pass for a clean one. tests/benchmarks/test_figures.py checks that the committed blocks agree with
the committed results files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.render.blocks import FIGURES, blocks_in, render_text, summary
from benchmarks.render.core import DOCS, Results
from benchmarks.render.figures import stale as stale_figure
from benchmarks.render.figures import write_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the results files")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the rendered files under this directory instead of in place")
    args = parser.parse_args()
    results = Results(args.results)
    stale = []
    for doc in DOCS:
        path = REPO / doc
        text = path.read_text()
        rendered = render_text(text, results)
        if args.check:
            old, new = blocks_in(text), blocks_in(rendered)
            stale += [f"{doc}: block {n}" for n in old if old[n] != new[n]]
            continue
        target = path if args.out is None else args.out / doc
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered)
        print(f"rendered {len(blocks_in(text))} block(s) of {doc} into {target}")
    for shown, figure in FIGURES.items():
        if any(results.get(f) is None for f in figure.files):
            continue  # its block says which command writes the files
        if args.check:
            why = stale_figure(figure, results, REPO / shown)
            stale += [f"{shown}: {why}"] if why else []
            continue
        target = REPO / shown if args.out is None else args.out / shown
        write_figure(figure, results, target)
        print(f"drew {shown} into {target}")
    targets, errors = summary(results)
    for line in targets:
        print(line)
    for line in errors:
        print(f"BENCHMARK ERROR {line}")
    if stale:
        sys.exit("blocks that differ from the results files (run python -m benchmarks.render):\n  "
                 + "\n  ".join(stale))
    if errors and not args.check:
        sys.exit(3)


if __name__ == "__main__":
    main()
