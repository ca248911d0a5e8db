"""Every benchmark that backs a figure in README.md or docs/, at one depth, in one command (the plan and its depths:
benchmarks/lib/plan.py).

    python -m benchmarks.suite --depth quick --render     # make bench-quick: about 25 minutes on 2 idle cores
    python -m benchmarks.suite --depth full --render      # make bench: every results file, many hours
    python -m benchmarks.suite --depth smoke --results /tmp/dlac-bench-smoke   # make bench-smoke: ~8 minutes

Each step runs its script in a fresh process (``python -m benchmarks.<script>``, from the repository root) with
``DLAC_BENCH_DEPTH`` set (recorded in the results file's metadata) and writes ``<results>/<file>``; the suite goes on
after a failed step and exits non-zero at the end. ``<results>/suite_<depth>.json`` records what ran, how long each
step took and the load average around it (the duration estimate of the next run). With ``--render`` it then runs the
renderer (``python -m benchmarks.render``) on the same directory (in place for benchmarks/results/, else into
``<results>/rendered/``). A smoke run's figures are not results: ``--results`` must name a scratch directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.paths import CRITEO_SAMPLE, REPO, RESULTS
from benchmarks.lib.plan import DEPTHS, command, outputs_help, steps_at
from benchmarks.lib.results import start_run, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", choices=DEPTHS, required=True)
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory the results files go to")
    parser.add_argument("--only", default=None, help="comma-separated results files: run just their steps (no"
                        " suite_<depth>.json record: that is a whole run's duration)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--render", action="store_true", help="then render the blocks from the same directory")
    args = parser.parse_args()
    results = args.results.resolve()
    if args.depth == "smoke" and results == RESULTS.resolve():
        parser.error("a smoke run's figures are not results: give --results a scratch directory (make bench-smoke"
                     " uses /tmp/dlac-bench-smoke)")
    try:
        steps = steps_at(args.depth, [o.strip() for o in args.only.split(",")] if args.only else None)
    except ValueError as err:
        parser.error(str(err))
    if any(s.needs_criteo for s in steps) and not CRITEO_SAMPLE.is_file():
        parser.error(f"the Criteo sample {CRITEO_SAMPLE} is missing (the team checkout's shared/data): the accuracy"
                     " figures on it cannot be made without it")
    if args.dry_run:
        for step in steps:
            print(" ".join(command(step, args.depth, results)))
        return

    results.mkdir(parents=True, exist_ok=True)
    metadata = start_run(__spec__.name, vars(args))
    env = dict(os.environ, DLAC_BENCH_DEPTH=args.depth)
    log = []
    start = time.perf_counter()
    for i, step in enumerate(steps, 1):
        cmd = command(step, args.depth, results)
        print(f"\n=== [{i}/{len(steps)}] {step.output}: {' '.join(cmd[1:])}", flush=True)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=REPO, env=env).returncode
        log.append(dict(output=step.output, command=cmd[1:], returncode=rc, seconds=round(time.perf_counter() - t0, 1),
                        loadavg_before=load, loadavg_after=os.getloadavg()[0]))
        print(f"=== {step.output}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in {log[-1]['seconds']:.0f} s",
              flush=True)
        if not args.only:  # the record is the whole depth's duration (the suite_duration block); a part is not
            write_results(results / f"suite_{args.depth}.json", dict(metadata), {"depth": args.depth},
                          {"seconds": round(time.perf_counter() - start, 1), "steps": log})
    failed = [s["output"] for s in log if s["returncode"]]
    print(f"\nsuite ({args.depth}): {len(log) - len(failed)} of {len(log)} steps done in"
          f" {(time.perf_counter() - start) / 60:.1f} min" + (f"; failed: {failed}" if failed else ""))
    status = 1 if failed else 0
    if args.render:
        render = [sys.executable, "-m", "benchmarks.render", "--results", str(results)]
        if results != RESULTS.resolve():
            render += ["--out", str(results / "rendered")]
        rc = subprocess.run(render, cwd=REPO).returncode
        status = status or rc
    sys.exit(status)


if __name__ == "__main__":
    main()
