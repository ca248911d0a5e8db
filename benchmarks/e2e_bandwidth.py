"""End-to-end DLRM training step time under an emulated (throttled) interconnect: TorchRec fp32 and qcomm codecs
against the DLAC compressed all-to-all and its like-for-like ceiling, on 2 gloo CPU ranks; prints a table and the
targets, writes JSON (``python -m benchmarks.render`` puts the figures into README.md and docs/).

Run as root on Linux (needs ``unshare -n`` and ``tc``), from the repository root:

    python -m benchmarks.e2e_bandwidth --rates 1gbit,10gbit --batch-size 4096 --steps 6 --warmup 2 --repeats 3

Each rate runs in its own network namespace (``unshare -n``) whose private loopback is throttled with
``tc qdisc add dev lo root tbf rate <R> burst 1mb latency 20ms`` (nothing for ``unthrottled``); inside it, every
variant is its own 2-rank launch (gloo, MASTER_ADDR=127.0.0.1, one thread per rank) training TorchRec's DLRM
(26 tables of dim 64, one-hot Zipf ids from the example's synthetic Criteo generator; ``--model dlrm_v2``: MLPerf's
DLRM v2, DLRM_DCN with dim 128 and multi-hot ids with MLPerf's pooling factors) with a plain loop:
DistributedModelParallel, table-wise sharding, fused Adagrad for the tables, dense Adagrad.

Every variant runs on the library's defaults unless its name says otherwise (``..._sync``, ``..._overlap``,
``..._auto``, ``..._classes``). Each is launched ``--repeats`` times (4 by default: an even number, so every
variant runs as often early as late), in ABBA order (the variant list reversed every other repeat); a variant's steps
are pooled (median step, slower rank per step) and every ratio is reported as the pooled medians' ratio with the
per-repeat range (launches of the same repeat paired). ``ceiling_dlac_dlac`` is DLAC both directions' like-for-like
ceiling: the same exchange module with the null codec (lightning_dlac/comm/null_codec.py), launched right after the
``dlac_dlac`` launch of its repeat and sending that launch's bytes per table and direction, with no encode or decode;
a DLAC launch more than 5% faster than the ceiling launch of its repeat is recorded as a benchmark error. The
issue-25 targets (``TARGETS``) are judged by the rule (benchmarks/lib/rule.py).

TorchRec's codecs run as TorchRec chooses them for the CPU (``get_qcomm_codecs_registry(..., device=cpu)``, its
fallbacks included: a BF16 backward is sent FP16 on gloo; each row records the precisions that ran). A qcomm variant
TorchRec cannot run here (FP8 raises inside TorchRec's all-to-all on CPU) is recorded under ``failed`` in the
results file with its error, and not launched again. ``--cpu-starved`` pins every rank and its threads to one core,
so the codecs' CPU time weighs twice as much: the benchmark of a slower machine, on any machine.

The pipelined variants (``..._pipelined``: every step through TorchRec's sparse-dist pipeline, as
``DLACStrategy(pipeline="sparse_dist")`` drives it; ``..._alternate``: blocks of unpipelined and pipelined steps in
turn within one launch, ABBA) are in benchmarks/lib/pipeline.py, with the phase timers that split a step (input dist,
lookup and output dist); each ``X_pipelined`` is compared with its twin ``X`` launch for launch, and the issue-29
target (``dlac_dlac_pipelined`` >= 1.1x ``dlac_dlac`` at 1 Gbit/s) is judged by the same rule.

The step loop, the variants, the pooling and the judgement are benchmarks/lib/e2e.py's (``train_rank`` is also the
reference for training with lightning-dlac without Lightning); the TorchRec-path stand-ins (qcomm byte counters,
zero-cost 8x codecs) are benchmarks/lib/qcomm.py's.
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

from benchmarks.lib.e2e import (
    CEILING_TOLERANCE,
    MODELS,
    VARIANTS,
    ceiling_checks,
    ceilings_after_sources,
    judge_targets,
    launch_median_ms,
    launch_order,
    pool_launches,
    sent_per_step,
    speedups,
    summarize,
    table,
    train_rank,
)
from benchmarks.lib.launch import error_line, is_tc_rate, run_ranks, shape_loopback
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.pipeline import alternate_problem, pipeline_lines, pipeline_table
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results


def _inside_namespace(rate: str, variants: list[str], cfg: dict[str, Any], out: Path) -> None:
    from lightning_dlac.testing import RanksFailed

    shape_loopback(rate)
    # Launches drift on a shared machine (+-20% between otherwise identical launches), so each variant is launched
    # `repeats` times, in ABBA order over the repeats, and its steps are pooled.
    launches: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    failed: dict[str, dict[str, Any]] = {}
    for rep in range(cfg["repeats"]):
        for position, name in enumerate(ceilings_after_sources(launch_order(variants, rep))):
            if name in failed or (VARIANTS[name].ceiling_of in failed):
                continue  # its first launch failed (the error is the platform's, not the launch's)
            t0 = time.perf_counter()
            launch_cfg = cfg
            source = VARIANTS[name].ceiling_of
            if source is not None:  # the bytes per exchange, per rank and table, of the latest launch it stands for
                latest = launches[source][-1]
                launch_cfg = dict(cfg, null_bytes=[r["bytes_per_call"] for r in latest["per_rank"]])
            load = os.getloadavg()[0]
            try:
                per_rank = run_ranks(train_rank, cfg["world_size"], name, launch_cfg, timeout=cfg["timeout"])
            except RanksFailed as err:
                if VARIANTS[name].kind != "qcomm":  # only TorchRec's codecs may be unable to run here
                    raise
                failed[name] = dict(rate=rate, variant=name, label=VARIANTS[name].label, repeat=rep,
                                    error=error_line(str(err)), traceback_tail=str(err)[-3000:])
                print(f"  [{rate}] {name} FAILED: {failed[name]['error']}", flush=True)
                continue
            launches[name].append(dict(repeat=rep, position=position, loadavg_1m=load,
                                       bytes_from=None if source is None else dict(variant=source,
                                                                                  repeat=latest["repeat"]),
                                       median_ms=launch_median_ms(per_rank), sent=sent_per_step(per_rank, cfg),
                                       per_rank=per_rank))
            print(f"  [{rate}] {name} (repeat {rep + 1}/{cfg['repeats']}): {launches[name][-1]['median_ms']:.0f}"
                  f" ms/step ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = list(failed.values())
    for name in [v for v in variants if launches[v]]:
        row = summarize(VARIANTS[name], rate, pool_launches([launch["per_rank"] for launch in launches[name]]), cfg)
        row["launch_median_ms"] = [launch["median_ms"] for launch in launches[name]]
        row["launch_loadavg_1m"] = [launch["loadavg_1m"] for launch in launches[name]]
        # The raw step times of every launch (per rank), and where each ran in the order.
        row["launches"] = [dict(repeat=launch["repeat"], position=launch["position"],
                                loadavg_1m=launch["loadavg_1m"], bytes_from=launch["bytes_from"],
                                median_ms=launch["median_ms"], sent_bytes_per_step=launch["sent"],
                                step_s_per_rank=[r["times"] for r in launch["per_rank"]])
                           for launch in launches[name]]
        rows.append(row)
    out.write_text(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1gbit,10gbit,unthrottled",
                        help="comma-separated tc rates (e.g. 1gbit, 500mbit) or 'unthrottled'")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=4,
                        help="launches per variant, in ABBA order over the repeats (an even number: every variant as"
                        " often early as late); their steps are pooled")
    parser.add_argument("--cpu-starved", action="store_true",
                        help="pin every rank (and its threads) to one core: codec time weighs twice, as on a slower"
                        " machine")
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks per launch (they share the throttled loopback: its rate is for all of them)")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows")
    parser.add_argument("--model", choices=MODELS, default="dlrm",
                        help="dlrm: dot interactions, dim 64, one-hot; dlrm_v2: MLPerf DLRM v2 (DCN, dim 128,"
                        " multi-hot)")
    parser.add_argument("--variants", default="fp32,qcomm_int8_fp16,dlac_bf16,dlac_dlac,ceiling_dlac_dlac,dlac_auto",
                        help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument("--fallback-check-every", type=int, default=64,
                        help="dlac_auto: exchanges between checks of the way not taken (the library's default 64)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a launch may take")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "e2e_bandwidth.json")
    parser.add_argument("--_inside", default=None, help=argparse.SUPPRESS)  # rate, when re-executed in a namespace
    parser.add_argument("--_rows-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be >= 1, --warmup >= 0")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.repeats % 2 and args.repeats > 1:
        print(f"note: {args.repeats} repeats is odd: the first order runs once more than the reversed one")
    for name in [v for v in variants if VARIANTS[v].ceiling_of]:  # launched right after what it stands for
        source = VARIANTS[name].ceiling_of
        if source not in variants:
            parser.error(f"{name} sends the bytes of the latest {source} launch: add {source} to --variants")
        variants.remove(name)
        variants.insert(variants.index(source) + 1, name)
    if "dlac_classes" in variants and args.warmup < 1:
        parser.error("dlac_classes calibrates its per-table bounds on the warm-up steps: give --warmup >= 1")
    for name in [v for v in variants if VARIANTS[v].pipeline == "alternate"][:1]:
        problem = alternate_problem(args.warmup, args.steps)
        if problem:
            parser.error(f"{name}: {problem}")
    if args.fallback_check_every < 1:
        parser.error("--fallback-check-every must be >= 1")
    if args.world_size < 2:
        parser.error("--world-size must be >= 2 (the all-to-all needs another rank)")
    cfg = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, max_rows=args.max_rows,
               world_size=args.world_size, model=args.model, fallback_check_every=args.fallback_check_every,
               timeout=args.timeout, repeats=args.repeats, variants=variants, order="ABBA (reversed every other"
               " repeat; each ceiling right after the launch whose bytes it sends)",
               ceiling_tolerance=CEILING_TOLERANCE, cpu_starved=args.cpu_starved,
               cpu_starved_core=min(os.sched_getaffinity(0)) if args.cpu_starved else None)

    if args._inside is not None:
        _inside_namespace(args._inside, variants, cfg, args._rows_out)
        return

    metadata = start_run(__spec__.name, vars(args))
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        if not is_tc_rate(r):
            parser.error(f"rate {r!r} is not a tc rate like '1gbit' or '500mbit' (or 'unthrottled')")
    if sys.platform != "linux" or os.geteuid() != 0:
        sys.exit("benchmarks.e2e_bandwidth emulates the interconnect with `unshare -n` and `tc`: run it as root on"
                 " Linux.")

    # Build the native codec once here (a JIT build of ~40 s) so that no rank builds it while being timed.
    from lightning_dlac.codec import native_available

    if not native_available():
        print("warning: the native DLAC codec did not build; the DLAC variants run the (slow) reference codec.")

    rows: list[dict[str, Any]] = []
    for rate in rates:
        print(f"rate {rate}: {len(variants)} variant(s) in a private network namespace", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            cmd = ["unshare", "-n", sys.executable, "-m", __spec__.name, *sys.argv[1:],
                   "--_inside", rate, "--_rows-out", tmp.name]
            proc = subprocess.run(cmd, cwd=REPO)
            text = Path(tmp.name).read_text()
            rows.extend(json.loads(text) if text else [])
            if proc.returncode != 0:
                sys.exit(f"rate {rate} failed (exit code {proc.returncode}); see the output above.")

    failed = [r for r in rows if "error" in r]  # variants TorchRec could not run here: their errors, no figures
    rows = [r for r in rows if "error" not in r]
    speedups(rows)
    pipelined = pipeline_lines(rows)  # also records each pipelined row's speed against its twin
    errors = ceiling_checks(rows)
    targets = judge_targets(rows, errors)
    print()
    print("\n".join(table(rows)))
    print("\n".join(pipeline_table(rows)))
    print("\n".join(pipelined))
    for t in targets:
        reps = ", ".join(f"{v:.2f}" for v in t["per_repeat"])
        print(f"{'MET    ' if t['met'] else 'NOT MET'} {t['rate']}: {t['target']}: {t['pooled']:.2f} pooled,"
              f" per repeat {reps}")
    for e in errors:
        print(f"BENCHMARK ERROR {e['message']}")
    for f in failed:
        print(f"FAILED {f['rate']}: {f['label']}: {f['error']}")
    write_results(args.json_out, metadata, cfg, rows, targets=targets, errors=errors, failed=failed)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
