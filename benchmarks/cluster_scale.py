"""DLAC at cluster shape: 8 and 16 gloo ranks, 26 to 1,000 tables, DLAC both directions against its like-for-like
ceiling on an emulated 1 Gbit/s network; prints a table and the targets, writes JSON (``python -m benchmarks.render``
puts the figures into docs/benchmarks.md).

Run as root on Linux (needs ``unshare -n`` and ``tc``), from the repository root:

    python -m benchmarks.cluster_scale                                  # 8 and 16 ranks x 26, 100, 500, 1000 tables
    python -m benchmarks.cluster_scale --worlds 8 --tables 26,100 --block 2 --repeats 2   # a quick look

Every launch runs in a private network namespace whose loopback is throttled with ``tc qdisc add dev lo root tbf rate
<R> burst 1mb latency 20ms``: all the launch's ranks share that one link, as the ranks of one node share its network
card (and here also the machine's cores). Each launch is one (ranks, tables) point of benchmarks/lib/cluster_scale.py:
the example DLRM with the projection interaction, every table ``--rows`` rows of dim ``--dim`` with the same Zipf
law (the same data per table), table-wise sharding, blocks of steps alternating between DLAC both directions and its
null-codec ceiling in ABBA order after ``--warmup`` steps. Compression ratio (forward, backward, both), the per-chunk
metadata's share of the forward bytes, encode / exchange / decode / backward time per step, and the speed against
the ceiling, pooled and per repeat, against the chunk count (tables x peers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.cluster_scale import rejudge, scale_rank, summarize, table, targets
from benchmarks.lib.launch import is_tc_rate, run_ranks, shape_loopback
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import load_results, start_run, write_results
from benchmarks.lib.rule import verdict_text


def _inside_namespace(rate: str, points: list[tuple[int, int]], cfg: dict[str, Any], out: Path) -> None:
    shape_loopback(rate)
    rows = []
    for world, tables in points:
        t0 = time.perf_counter()
        launch = dict(cfg, tables=tables)
        per_rank = run_ranks(scale_rank, world, launch, timeout=cfg["timeout"])
        row = summarize(world, tables, per_rank, launch)
        row["rate"], row["launch_s"] = rate, time.perf_counter() - t0
        rows.append(row)
        print(f"  [{rate}] {world} ranks x {tables} tables: {row['total_ratio']:.1f}x both ways, DLAC"
              f" {row['dlac_step_ms']:.0f} ms, ceiling {row['ceiling_step_ms']:.0f} ms, {row['of_ceiling']:.2f} of"
              f" the ceiling ({row['launch_s']:.0f} s)", flush=True)
        out.write_text(json.dumps(rows))  # what finished survives a later launch's failure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="8,16", help="comma-separated rank counts")
    parser.add_argument("--tables", default="26,100,500,1000", help="comma-separated table counts")
    parser.add_argument("--rate", default="1gbit", help="tc rate of the shared link (or 'unthrottled')")
    parser.add_argument("--rows", type=int, default=10_000, help="rows of every table")
    parser.add_argument("--dim", type=int, default=16, help="embedding dim of every table")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per rank per step")
    parser.add_argument("--eps", type=float, default=0.01, help="DLAC's relative bound, both directions")
    parser.add_argument("--warmup", type=int, default=2, help="untimed DLAC steps first")
    parser.add_argument("--block", type=int, default=3, help="steps per block (DLAC or ceiling)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="pairs of blocks, in ABBA order (DLAC first in even repeats)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a launch may take")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "cluster_scale.json")
    parser.add_argument("--rejudge", type=Path, default=None,
                        help="judge the rows of this results file again by this code's targets and rewrite it (its"
                        " rows and their metadata kept; 'rejudged' says when)")
    parser.add_argument("--_inside", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_rows-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    tables = [int(t) for t in args.tables.split(",") if t.strip()]
    if min(worlds) < 2 or min(tables) < 1 or args.block < 1 or args.repeats < 1:
        parser.error("--worlds must be >= 2, --tables, --block and --repeats >= 1")
    points = [(w, t) for w in worlds for t in tables]
    cfg = dict(rows=args.rows, dim=args.dim, batch_size=args.batch_size, eps=args.eps, warmup=args.warmup,
               block=args.block, repeats=args.repeats, timeout=args.timeout)  # fmt: skip
    if args._inside is not None:
        _inside_namespace(args._inside, points, cfg, args._rows_out)
        return

    metadata = start_run(__spec__.name, vars(args))
    if args.rejudge is not None:
        data = rejudge(load_results(args.rejudge), metadata)
        args.rejudge.write_text(json.dumps(data, indent=1, default=str) + "\n")
        for t in data["targets"]:
            print(f"{t['target']}: {verdict_text(t)}")
        return
    if not is_tc_rate(args.rate):
        parser.error(f"rate {args.rate!r} is not a tc rate like '1gbit' (or 'unthrottled')")
    if sys.platform != "linux" or os.geteuid() != 0:
        sys.exit("benchmarks.cluster_scale emulates the network with `unshare -n` and `tc`: run it as root on Linux.")
    from lightning_dlac.codec import native_available

    if not native_available():  # built once here, not by the ranks while timed
        print("warning: the native DLAC codec did not build; the ranks run the (slow) reference codec.")
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        proc = subprocess.run(["unshare", "-n", sys.executable, "-m", __spec__.name, *sys.argv[1:], "--_inside",
                               args.rate, "--_rows-out", tmp.name], cwd=REPO)  # fmt: skip
        text = Path(tmp.name).read_text()
        rows = json.loads(text) if text else []
    if proc.returncode != 0:
        print(f"a launch failed (exit code {proc.returncode}); the {len(rows)} finished are written.")
    judged = [dict(t, rate=args.rate) for t in targets(rows)]
    print("\n".join(table(rows)))
    for t in judged:
        print(f"{t['target']}: {verdict_text(t)}")
    write_results(args.json_out, metadata, dict(cfg, rate=args.rate, worlds=worlds, tables=tables), rows,
                  targets=judged)  # fmt: skip
    print(f"wrote {args.json_out}")
    if proc.returncode != 0:
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
