"""The accuracy-bytes frontier against TorchRec's codecs on the family of worlds (issue 33 item 3).

``python -m benchmarks.adaptive_accuracy`` draws the frontier on the Criteo sample; this script draws it on each
world of the family (benchmarks/lib/calibration_data.py), with the same arms and the same judgement
(benchmarks/lib/frontier.py's :func:`frontier` and FRONTIER_DEFINITIONS), under the protocol the family's default is
judged by (``python -m benchmarks.calibration_bench --settle``: every arm trains until its validation AUROC settles,
at most SETTLE_MAX batches; paired training seeds):

- ``uncompressed``, the reference every AUROC difference is taken against;
- DLAC at constant bounds 0.002 / 0.005 / 0.01 / 0.03 / 0.05 for the whole run, and the default ``DLACCallback()``;
- TorchRec's qcomm codecs FP16, INT8 (FP16 backward), FP8 and MX4 (its 4-bit codec), DLAC off. A codec TorchRec
  cannot run here (FP8 on CPU) is recorded under ``failed`` with its error, and not launched again.

Per world: every arm's point (AUROC difference from the uncompressed run of the same seed; forward and total bytes
per step, summed over both ranks, remote traffic only), every qcomm point's dominating DLAC points, and whether the
default is on or near the frontier. The summary counts the worlds where each target holds::

    python -m benchmarks.frontier_worlds --count 3 --json-out benchmarks/results/frontier_worlds.json

Why settled runs, not a fixed length: on some worlds the runs sit on a plateau and leave it at a step the
trajectory decides (evaluation world 1000: calibration_curves.json, docs/adaptive.md), so at a fixed length an arm
is caught before or after its climb by chance, the noise of a comparison is of the order of the climb, and "within
noise" would admit every point. A world costs about 20 settled launches: tens of minutes to an hour on 2 cores.
``--count`` evaluation worlds from ``--first``; they only judge: nothing here is fitted. ``--resume`` continues a
file this script wrote under the same options; with a larger ``--train-seeds`` it runs only the launches the file
lacks (each arm under each new seed) and judges every world again over all its seeds. The file is written as each
world is judged; the launches of the world in progress are kept as each finishes in a log beside it
(:class:`LaunchLog`), so a run stopped mid-world loses at most the launch it was making: ``--resume`` takes them.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.lib.calibration_arms import (
    CONSTANT_PREFIX,
    QCOMM_PREFIX,
    SETTLE_DELTA,
    SETTLE_EVERY,
    SETTLE_MAX,
    WORLD_FULL,
    default_rule,
    run_world,
    training_seed,
)
from benchmarks.lib.calibration_data import EVAL_WORLDS, draw_world
from benchmarks.lib.calibration_judgement import FLOOR_Z
from benchmarks.lib.calibration_resume import config_differs, resumed_worlds
from benchmarks.lib.frontier import FRONTIER_DEFINITIONS, FRONTIER_TARGETS, frontier, frontier_lines
from benchmarks.lib.launch import run_ranks
from benchmarks.lib.paths import RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import load_results, start_run, write_results

# The arms, and the names frontier() reads them by. all_tight and all_loose are the constant bounds 0.01 and 0.05
# (the calibration benchmark's names for them).
ARMS = {
    "uncompressed": "uncompressed",
    CONSTANT_PREFIX + "0.002": "constant 0.002",
    CONSTANT_PREFIX + "0.005": "constant 0.005",
    "all_tight": "constant 0.01",
    CONSTANT_PREFIX + "0.03": "constant 0.03",
    "all_loose": "constant 0.05",
    "default": "DLAC default",
    QCOMM_PREFIX + "FP16/FP16": "qcomm FP16/FP16",
    QCOMM_PREFIX + "INT8/FP16": "qcomm INT8/FP16",
    QCOMM_PREFIX + "FP8/FP8": "qcomm FP8/FP8",
    QCOMM_PREFIX + "MX4/MX4": "qcomm MX4/MX4",
}


class LaunchLog:
    """The launches a run has made but not yet written to its results file, one JSON line each as it finishes.

    A world is judged, and the results file written, once all its launches are in; a world is twenty to fifty
    settled launches, up to two hours on 2 cores, and a run stopped partway (a lost machine, a session's end) would
    lose them. The log sits beside the results file (``frontier_worlds.launches.jsonl`` for ``frontier_worlds.json``):
    each run that appends to it first writes a line naming itself (its command, commit, date, processor and
    configuration), then one line per launch. The log is removed once every launch in it is in the results file;
    ``--resume`` takes the launches of a log left behind (:meth:`kept`), a run without ``--resume`` discards it.
    """

    def __init__(self, results: Path, metadata: dict[str, Any], cfg: dict[str, Any]) -> None:
        self.path = results.with_name(results.stem + ".launches.jsonl")
        self._part = {k: metadata.get(k) for k in ("command", "git_commit", "date", "cpu")} | {"config": cfg}
        self._worlds: set[int] = set()  # the worlds whose launches the log holds
        self._started = False  # whether this run's own line is in the log

    def append(self, row: dict[str, Any]) -> None:
        """Keep one finished launch (a row of :func:`run_arm`)."""
        with self.path.open("a") as f:
            if not self._started:
                f.write(json.dumps({"part": self._part}) + "\n")
                self._started = True
            f.write(json.dumps({"launch": row}) + "\n")
        self._worlds.add(row["world"])

    def written(self, worlds: list[int]) -> None:
        """The results file now holds these worlds: remove the log if every launch in it is of one of them."""
        if self._worlds <= set(worlds):
            self.path.unlink(missing_ok=True)
            self._worlds.clear()
            self._started = False

    def discard(self) -> None:
        """A run starting afresh (no ``--resume``): an earlier run's log is not this run's."""
        if self.path.exists():
            n = sum(line.startswith('{"launch": ') for line in self.path.read_text().splitlines())
            print(f"discarding {n} launches an earlier run left in {self.path} (--resume keeps them)", flush=True)
            self.path.unlink()

    def kept(self, rows: list[dict[str, Any]], metadata: dict[str, Any]) -> list[dict[str, Any]]:
        """For ``--resume``: the launches of a log an earlier run left that ``rows`` (the results file's) lack, each
        run that made them recorded under ``metadata["resumed_from"]`` with its launches and their worlds. Refused
        with the reason when a run that made them had another configuration or planned other worlds, or ran on
        another kind of processor: a launch repeats to the last digit on one kind only, and a seed's arms are paired
        with its uncompressed launch."""
        if not self.path.exists():
            return []
        parts: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        lines = self.path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:  # cut off as the run was stopped: that launch runs again
                    print(f"{self.path}: its last line was cut off; that launch runs again", flush=True)
                    break
                raise SystemExit(f"--resume: line {i + 1} of {self.path} is not JSON; remove the file to run its"
                                 " launches again") from None
            if "part" in entry:
                parts.append((entry["part"], []))
            elif parts:
                parts[-1][1].append(entry["launch"])
        have = {(r["world"], r["arm"], r["seed"]) for r in rows}
        kept: list[dict[str, Any]] = []
        for part, logged in parts:
            differ = config_differs(part["config"], self._part["config"], may_grow=("train_seeds",))
            foreign = sorted({r["world"] for r in logged} - set(self._part["config"]["seeds"]))
            why = (f"was made under another configuration ({', '.join(differ)} differ)" if differ
                   else f"holds worlds {foreign} this run does not plan" if foreign
                   else f"was made on {part.get('cpu')!r}, this run is on {self._part.get('cpu')!r}"
                   if part.get("cpu") != self._part.get("cpu") else None)
            if why:
                raise SystemExit(f"--resume: the log {self.path} of launches not yet in the results file {why};"
                                 " rerun with its options and on its machine, or remove the log to run them here")
            new = [r for r in logged if (r["world"], r["arm"], r["seed"]) not in have]
            have |= {(r["world"], r["arm"], r["seed"]) for r in new}
            if new:
                metadata.setdefault("resumed_from", []).append(
                    {k: v for k, v in part.items() if k != "config"}
                    | {"launches": len(new), "worlds": sorted({r["world"] for r in new})})
                print(f"resuming: {len(new)} launch(es) of world(s) {sorted({r['world'] for r in new})} kept in"
                      f" {self.path}", flush=True)
            kept += new
        self._worlds = {r["world"] for r in kept}
        return kept


def run_arm(cfg: dict[str, Any], world: int, arm: str, train_seed: int, timeout: float) -> dict[str, Any]:
    """One arm of one world under one training seed: a 2-rank launch, bytes summed over the ranks (each counts what
    it sends), as a row of frontier()."""
    ranks = run_ranks(run_world, 2, arm, dict(cfg, world=world, train_seed=train_seed, traffic=True),
                      timeout=timeout)
    r0 = ranks[0]
    row = {"dataset": f"world {world}", "world": world, "variant": ARMS[arm], "arm": arm, "seed": train_seed,
           "init_seed": training_seed(world, train_seed), "val_auroc": r0["val_auroc"], "steps": r0["steps"],
           "seconds": r0["seconds"], "settled": r0.get("settled"), "byte_accounting": "remote"}
    for key in ("fwd_raw_bytes", "fwd_sent_bytes", "bwd_raw_bytes", "bwd_sent_bytes"):
        row[key] = sum(r[key] for r in ranks)
    # The validation curve: where an arm reaches the cap unsettled, it says whether the cap caught a climb.
    for key in ("table_bounds", "curve"):
        if key in r0:
            row[key] = r0[key]
    return row


def summarize(per_world: list[dict[str, Any]]) -> dict[str, Any]:
    """Over worlds: the share where each target holds, per qcomm point the worlds where a DLAC point dominates it,
    and the default's median AUROC difference from uncompressed and bytes against the fewest-bytes qcomm point."""
    met = {t: [x["met"] for w in per_world for x in w["frontier"]["targets"] if x["target"] == t]
           for t in FRONTIER_TARGETS}
    dominated: dict[str, list[int]] = {}
    for w in per_world:
        for pair in w["frontier"]["pairs"]:
            dominated.setdefault(pair["qcomm"], [0, 0])
            dominated[pair["qcomm"]][0] += bool(pair["dominated_by"])
            dominated[pair["qcomm"]][1] += 1
    default, vs_qcomm = [], []
    for w in per_world:
        points = {p["variant"]: p for p in w["frontier"]["points"]}
        qcomm = [p for p in points.values() if p["kind"] == "qcomm"]
        if "DLAC default" in points:
            default.append(points["DLAC default"]["delta_mean"])
            if qcomm:
                fewest = min(q["fwd_bytes_per_step"] for q in qcomm)
                vs_qcomm.append(points["DLAC default"]["fwd_bytes_per_step"] / fewest)
    return {"worlds": len(per_world),
            **{t: sum(v) / len(v) if v else None for t, v in met.items()},
            "qcomm_dominated": {q: {"worlds": n, "of": of} for q, (n, of) in dominated.items()},
            "default_delta_median": statistics.median(default) if default else None,
            "default_fwd_bytes_vs_fewest_qcomm_median": statistics.median(vs_qcomm) if vs_qcomm else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=0, help="the first evaluation world (an index into the split)")
    parser.add_argument("--count", type=int, default=3, help="how many evaluation worlds")
    parser.add_argument("--train-seeds", type=int, default=2, help="paired training seeds per world")
    parser.add_argument("--steps", type=int, default=SETTLE_MAX,
                        help="the most training batches per rank an arm may take to settle")
    parser.add_argument("--val-every", type=int, default=SETTLE_EVERY,
                        help="validate (and test whether the AUROC settled) every this many batches")
    parser.add_argument("--val-batches", type=int, default=128, help="validation batches over both ranks")
    parser.add_argument("--arms", default=None, help=f"comma-separated subset of {list(ARMS)}")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a 2-rank launch may take")
    parser.add_argument("--resume", action="store_true",
                        help="continue --json-out: the worlds, and the seeds of a larger --train-seeds, it lacks")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "frontier_worlds.json")
    args = parser.parse_args()
    metadata = start_run(__spec__.name, vars(args))

    arms = [a.strip() for a in args.arms.split(",")] if args.arms else list(ARMS)
    if set(arms) - set(ARMS) or "uncompressed" not in arms:
        raise SystemExit(f"--arms: a subset of {list(ARMS)} that keeps uncompressed")
    worlds = EVAL_WORLDS[args.first: args.first + args.count]
    cfg = dict(worlds="eval", seeds=list(worlds), steps=args.steps, val_batches=args.val_batches,
               lr=WORLD_FULL["lr"], train_seeds=args.train_seeds, settle=True, val_every=args.val_every,
               settle_delta=SETTLE_DELTA, arms=[a for a in ARMS if a in arms], floor_z=FLOOR_Z,
               default_rule=default_rule())
    per_world, rows = (resumed_worlds(args.json_out, cfg, metadata, may_grow=("train_seeds",)) if args.resume
                       else ([], []))
    log = LaunchLog(args.json_out, metadata, cfg)
    unwritten: set[int] = set()  # worlds with launches the log kept that the results file lacks
    if args.resume:
        kept = log.kept(rows, metadata)
        rows += kept
        unwritten = {r["world"] for r in kept}
    else:
        log.discard()
    failed: dict[str, dict[str, Any]] = {}  # arm -> its first launch's error (TorchRec cannot run it here)
    for f in (load_results(args.json_out).get("failed", []) if per_world else []):
        failed[f["arm"]] = copy.deepcopy(f)
    for world in worlds:
        ran = {(r["arm"], r["seed"]) for r in rows if r["world"] == world}
        planned = [(s, a) for s in range(cfg["train_seeds"]) for a in cfg["arms"] if (a, s) not in ran]
        if (world in {w["world"] for w in per_world} and world not in unwritten
                and not any(a not in failed for _, a in planned)):
            continue
        print(f"world {world}: {draw_world(world).summary()}", flush=True)
        if ran:
            print(f"  {len(ran)} launches of it in the file; running seeds"
                  f" {sorted({s for s, a in planned if a not in failed})} of {cfg['train_seeds']}", flush=True)
        here = []
        for train_seed, arm in planned:
            if arm in failed:
                skipped = failed[arm].setdefault("not_launched", [])
                failing = [failed[arm]["world"], failed[arm]["seed"]]  # the launch that failed, not a skipped one
                if [world, train_seed] not in (failing, *skipped):
                    skipped.append([world, train_seed])
                continue
            try:
                row = run_arm(cfg, world, arm, train_seed, args.timeout)
            except Exception as e:  # noqa: BLE001 - a qcomm codec TorchRec cannot run on this platform
                # Only a codec's first launch may fail for good (FP8 on CPU): an arm that has run before
                # failed for another reason (a timeout, a lost rank), which is this run's error.
                if not arm.startswith(QCOMM_PREFIX) or any(r["arm"] == arm for r in (*rows, *here)):
                    raise
                failed[arm] = {"arm": arm, "variant": ARMS[arm], "world": world, "seed": train_seed,
                               "error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"}
                print(f"  seed {train_seed} {arm}: FAILED {failed[arm]['error']}", flush=True)
                continue
            here.append(row)
            log.append(row)
            print(f"  seed {train_seed} {arm}: val AUROC {row['val_auroc']:.4f},"
                  f" {row['fwd_sent_bytes'] / max(row['steps'], 1):.0f} forward bytes/step,"
                  f" {row['seconds']:.0f} s", flush=True)
        rows += here
        (judged,) = frontier([r for r in rows if r["world"] == world])  # with the launches the file held
        per_world = [w for w in per_world if w["world"] != world]
        per_world.append({"world": world, "spec": draw_world(world).summary(), "frontier": judged,
                          "failed": copy.deepcopy(list(failed.values()))})
        per_world.sort(key=lambda w: worlds.index(w["world"]))
        print("\n".join(frontier_lines([judged], [])), flush=True)
        done = [w["world"] for w in per_world]
        # A run growing the seeds and stopped partway leaves worlds with fewer: the file says the fewest it holds.
        fewest = min(len({r["seed"] for r in rows if r["world"] == w}) for w in done)
        grown = {"train_seeds": fewest, "train_seeds_planned": cfg["train_seeds"]} if fewest < cfg["train_seeds"] \
            else {}
        write_results(args.json_out, metadata, dict(cfg, seeds=done, **({"seeds_planned": list(worlds)}
                                                                          if done != list(worlds) else {}), **grown),
                      rows, summary=summarize(per_world), per_world=per_world, failed=list(failed.values()),
                      definitions=FRONTIER_DEFINITIONS)
        log.written(done)
    print(f"\nsummary: {summarize(per_world)}")
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
