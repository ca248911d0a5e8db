"""The plan of every published figure: which script writes which results file, with which arguments, at each depth
of the suite (``python -m benchmarks.suite --depth smoke|quick|full``; ``make bench-smoke``, ``make bench-quick``,
``make bench``). The suite runs it; the renderer reads it to say which command makes a missing file; each script's
``--help`` reads it to say what that script writes and how long its committed run took (:func:`outputs_help`).

Depths:

- ``smoke``: tiny steps, batches and repeats, to prove the pipeline end to end (its results are not figures: they
  go to a scratch directory);
- ``quick``: the figures a release is judged on: the codec (every payload), end to end at 1 and 10 Gbit/s with the
  like-for-like ceiling and unthrottled with the uncompressed fallback (3 repeats each), the sparse-dist pipeline
  against unpipelined training at 1 and 10 Gbit/s (separate launches, and within one launch), DLRM v2 end to end, the
  scaling model's validation at 2 ranks, adaptive accuracy on the Criteo sample (3 seeds), the data path at reduced
  size, and issue 34's: the exchange profile, TorchRec's FP8 and MX4 codec rows, every TorchRec codec against DLAC at 1
  Gbit/s and the same race with every rank on one core (``--cpu-starved``);
- ``full``: all of ``quick`` at more repeats and full size, plus the scaling model at 3 and 4 ranks, every adaptive
  accuracy dataset (planted, synthetic for 200 and 2,000 steps, Criteo for 2 epochs, DLRM v2), the calibration
  benchmarks and worlds, the frontiers and checkpoints, the cluster shape (8 and 16 ranks, up to 1,000 tables) and
  the 20,000-step soak.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lib.paths import REPO, RESULTS

DEPTHS = ("smoke", "quick", "full")
E2E_THROTTLED = "fp32,qcomm_int8_fp16,dlac_bf16,dlac_dlac,ceiling_dlac_dlac"
E2E_UNTHROTTLED = "fp32,qcomm_int8_fp16,dlac_bf16,dlac_auto"
E2E_MODEL = "fp32,qcomm_int8_fp16,dlac_bf16,dlac_dlac"
# Issue 29: each pipelined variant beside its unpipelined twin (separate launches), and the same comparisons within
# one launch (blocks of steps both ways in turn, ABBA: 4 warm-up steps, then 16 timed).
E2E_PIPELINE = "fp32,fp32_pipelined,dlac_dlac,dlac_dlac_pipelined,dlac_dlac_overlap,dlac_dlac_overlap_pipelined"
E2E_PIPELINE_ALTERNATE = "fp32_alternate,dlac_dlac_alternate,dlac_dlac_overlap_alternate"
# Issue 34: every TorchRec codec against DLAC, and the same with every rank on one core (FP8 cannot run on CPU).
E2E_QCOMM_RACE = "fp32,qcomm_int8_fp16,qcomm_fp8,qcomm_mx4,qcomm_mx4_bf16,dlac_bf16,dlac_dlac,ceiling_dlac_dlac"
# The exchange whole (the default) and in 4 pieces (issue 34), each against its own null-codec ceiling.
E2E_PIECES = "dlac_dlac,ceiling_dlac_dlac,dlac_dlac_pieces,ceiling_dlac_dlac_pieces"
E2E_QCOMM_STARVED = "fp32,qcomm_int8_fp16,qcomm_mx4,dlac_bf16,dlac_dlac,ceiling_dlac_dlac"
E2E_TOPOLOGY = "fp32,qcomm_int8_fp16,dlac_dlac_all,dlac_dlac_other_nodes,ceiling_dlac_dlac_other_nodes"
# At 10 Gbit/s against the fastest qcomm variant of the 1 Gbit/s race (MX4's CPU kernels are slower than the wire
# there already; the full depth also runs the whole race at both rates).
E2E_QCOMM_FAST_LINK = "fp32,qcomm_int8_fp16,dlac_bf16,dlac_dlac,ceiling_dlac_dlac"
# The default policy against uncompressed, a constant 0.01, all-loose (0.05) and TorchRec's practical baseline.
ADAPTIVE_QUICK = "uncompressed,constant 0.01,constant 0.05,DLAC default,qcomm INT8/FP16"
# Issue 33 item 3's accuracy-bytes frontier: every constant bound and TorchRec codec it names
ADAPTIVE_FRONTIER = ("uncompressed,constant 0.002,constant 0.005,constant 0.01,constant 0.03,constant 0.05,"
                     "DLAC default,qcomm FP16/FP16,qcomm INT8/FP16,qcomm FP8/FP8,qcomm MX4/MX4")


@dataclass(frozen=True)
class Step:
    """One benchmark run: the results file it writes, the script that writes it (its module, run as ``python -m``)
    and its arguments at each depth it runs at (``{results}`` in an argument is the results directory)."""

    output: str  # the results file's name, under the results directory
    module: str  # the script, e.g. "benchmarks.e2e_bandwidth"
    args: dict[str, list[str]]  # depth -> arguments (without --json-out, which the suite adds)
    needs_criteo: bool = False  # reads the team's Criteo sample (paths.CRITEO_SAMPLE)

    def count(self, flag: str, depth: str = "full") -> int | None:
        """The number this step passes as ``flag`` at ``depth`` (``None`` where it leaves the script's default)."""
        args = self.args[depth]
        return int(args[args.index(flag) + 1]) if flag in args else None


def _e2e(rates: str, variants: str, batch: int, steps: int, warmup: int, repeats: int, *extra: str) -> list[str]:
    return ["--rates", rates, "--variants", variants, "--batch-size", str(batch), "--steps", str(steps),
            "--warmup", str(warmup), "--repeats", str(repeats), *extra]


def _adaptive(datasets: str, seeds: str, variants: str | None, *extra: str) -> list[str]:
    return ["--datasets", datasets, "--seeds", seeds, *(["--variants", variants] if variants else []), *extra]


STEPS: tuple[Step, ...] = (
    Step("codec_bench.json", "benchmarks.codec_bench", {
        "smoke": ["--quick"],
        "quick": ["--repeat", "5", "--min-seconds", "0.3"],
        "full": ["--repeat", "15", "--min-seconds", "1.5"],
    }),
    Step("e2e_throttled.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit,10gbit", "fp32,dlac_dlac,ceiling_dlac_dlac", 256, 2, 1, 2),
        "quick": _e2e("1gbit,10gbit", E2E_THROTTLED, 4096, 6, 2, 3),
        "full": _e2e("1gbit,10gbit", E2E_THROTTLED, 4096, 8, 2, 5),
    }),
    Step("e2e_unthrottled.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("unthrottled", E2E_UNTHROTTLED, 256, 2, 1, 1),
        "quick": _e2e("unthrottled", E2E_UNTHROTTLED, 4096, 6, 2, 3),
        "full": _e2e("unthrottled", E2E_UNTHROTTLED, 4096, 8, 2, 6),
    }),
    Step("e2e_dlrm_v2.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", "fp32,dlac_dlac", 64, 1, 1, 1, "--model", "dlrm_v2"),
        "quick": _e2e("1gbit", E2E_MODEL, 512, 4, 1, 2, "--model", "dlrm_v2"),
        "full": _e2e("1gbit", E2E_MODEL, 512, 6, 1, 3, "--model", "dlrm_v2"),
    }),
    Step("e2e_pipeline.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", "fp32,fp32_pipelined,dlac_dlac,dlac_dlac_pipelined", 256, 2, 1, 1),
        "quick": _e2e("1gbit,10gbit", E2E_PIPELINE, 4096, 6, 2, 3),
        "full": _e2e("1gbit,10gbit", E2E_PIPELINE, 4096, 8, 2, 5),
    }),
    Step("e2e_pipeline_alternate.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", "dlac_dlac_alternate", 256, 8, 4, 1),
        "quick": _e2e("1gbit,10gbit", E2E_PIPELINE_ALTERNATE, 4096, 16, 4, 2),
        "full": _e2e("1gbit,10gbit", E2E_PIPELINE_ALTERNATE, 4096, 16, 4, 3),
    }),
    Step("exchange_profile.json", "benchmarks.exchange_profile", {
        "smoke": ["--batch-size", "512", "--steps", "2", "--warmup", "1", "--kernel-repeat", "2"],
        "quick": [],
        "full": ["--steps", "24", "--kernel-repeat", "15"],
    }),
    Step("codec_bench_qcomm.json", "benchmarks.codec_bench", {
        "smoke": ["--quick", "--qcomm", "fp8", "mx4", "--no-dlrm-v2"],
        "quick": ["--qcomm", "fp8", "mx4", "--no-dlrm-v2", "--eps", "0.01", "0.05"],
        "full": ["--qcomm", "fp8", "mx4", "--no-dlrm-v2", "--eps", "0.01", "0.05", "--repeat", "15"],
    }),
    Step("e2e_pieces.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", E2E_PIECES, 256, 2, 1, 1),
        "quick": _e2e("1gbit,100mbit", E2E_PIECES, 4096, 4, 1, 4),
        "full": _e2e("1gbit,100mbit", E2E_PIECES, 4096, 6, 2, 4),
    }),
    Step("e2e_qcomm_race.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", "fp32,qcomm_fp8,qcomm_mx4,dlac_dlac", 256, 2, 1, 2),
        "quick": _e2e("1gbit", E2E_QCOMM_RACE, 4096, 4, 1, 4),
        "full": _e2e("1gbit,10gbit", E2E_QCOMM_RACE, 4096, 6, 2, 4),
    }),
    Step("e2e_qcomm_race_10gbit.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("10gbit", "fp32,dlac_dlac", 256, 2, 1, 2),
        "quick": _e2e("10gbit", E2E_QCOMM_FAST_LINK, 4096, 4, 1, 4),
        "full": _e2e("10gbit", E2E_QCOMM_FAST_LINK, 4096, 6, 2, 4),
    }),
    Step("e2e_qcomm_race_starved.json", "benchmarks.e2e_bandwidth", {
        "smoke": _e2e("1gbit", "fp32,dlac_dlac", 256, 2, 1, 2, "--cpu-starved"),
        "quick": _e2e("1gbit", E2E_QCOMM_STARVED, 4096, 4, 1, 4, "--cpu-starved"),
        "full": _e2e("1gbit", E2E_QCOMM_STARVED, 4096, 6, 2, 4, "--cpu-starved"),
    }),
    Step("e2e_topology.json", "benchmarks.e2e_topology", {
        "smoke": _e2e("1gbit", "fp32,dlac_dlac_all,dlac_dlac_other_nodes", 256, 2, 1, 2),
        "quick": _e2e("1gbit", E2E_TOPOLOGY, 2048, 4, 2, 4),
        "full": _e2e("1gbit,10gbit", E2E_TOPOLOGY, 4096, 6, 2, 4),
    }),
    Step("e2e_world3.json", "benchmarks.e2e_bandwidth", {
        "full": _e2e("1gbit,unthrottled", E2E_MODEL, 4096, 4, 2, 3, "--world-size", "3"),
    }),
    Step("e2e_world4.json", "benchmarks.e2e_bandwidth", {
        "full": _e2e("1gbit,unthrottled", E2E_MODEL, 4096, 4, 2, 3, "--world-size", "4"),
    }),
    Step("scaling_model.json", "benchmarks.scaling_model", {
        "smoke": ["{results}/e2e_throttled.json"],
        "quick": ["{results}/e2e_throttled.json"],
        "full": ["{results}/e2e_throttled.json", "{results}/e2e_world3.json", "{results}/e2e_world4.json"],
    }),
    Step("adaptive_accuracy_criteo_1epoch.json", "benchmarks.adaptive_accuracy", {
        "smoke": _adaptive("criteo", "0", ADAPTIVE_QUICK, "--criteo-batch", "512", "--calibration-batches", "2"),
        "quick": _adaptive("criteo", "0,1,2", ADAPTIVE_QUICK, "--criteo-epochs", "1"),
        "full": _adaptive("criteo", "0,1,2", None, "--criteo-epochs", "1"),
    }, needs_criteo=True),
    Step("adaptive_accuracy_criteo_2epochs.json", "benchmarks.adaptive_accuracy", {
        "full": _adaptive("criteo", "0,1,2", None, "--criteo-epochs", "2"),
    }, needs_criteo=True),
    Step("adaptive_frontier_criteo.json", "benchmarks.adaptive_accuracy", {  # issue 33: against every qcomm codec
        "full": _adaptive("criteo", "0,1,2,3,4", ADAPTIVE_FRONTIER, "--criteo-epochs", "2"),
    }, needs_criteo=True),
    Step("adaptive_accuracy_planted.json", "benchmarks.adaptive_accuracy", {
        "full": _adaptive("planted", "0,1,2", None, "--synthetic-batches", "240"),
    }),
    Step("adaptive_accuracy_synthetic.json", "benchmarks.adaptive_accuracy", {
        "full": _adaptive("synthetic", "0,1", None, "--synthetic-batches", "200"),
    }),
    Step("adaptive_accuracy_synthetic_2000.json", "benchmarks.adaptive_accuracy", {
        "full": _adaptive("synthetic", "0,1,2", "uncompressed,constant 0.01,DLAC homogenization,DLAC sensitivity,"
                          "DLAC both directions", "--synthetic-batches", "2000", "--synthetic-batch", "128"),
    }),
    Step("adaptive_accuracy_dlrm_v2.json", "benchmarks.adaptive_accuracy", {
        "full": _adaptive("synthetic_v2", "0,1,2", "uncompressed,DLAC homogenization", "--synthetic-batches", "96",
                          "--synthetic-batch", "128", "--calibration-batches", "4"),
    }),
    # Issue 56: the cluster shape (8 and 16 ranks, 26 to 1,000 tables) and the 20,000-step soak.
    Step("cluster_scale.json", "benchmarks.cluster_scale", {
        "smoke": ["--worlds", "4", "--tables", "26,100", "--rows", "1000", "--block", "1", "--repeats", "2"],
        "full": [],
    }),
    Step("soak.json", "benchmarks.soak", {
        "smoke": ["--steps", "300", "--warmup", "100", "--checkpoint-every", "100", "--epoch-batches", "150",
                  "--sample-every", "20", "--calibration-start", "50", "--recalibrate-every", "100"],
        "full": [],
    }),
    Step("checkpoint_bench.json", "benchmarks.checkpoint_bench", {
        "smoke": ["--scales", "1", "--repeats", "1", "--restarts", "1", "--kill-step", "41"],
        "full": [],
    }),
    Step("calibration_bench_quick.json", "benchmarks.calibration_bench", {
        "smoke": ["--seeds", "1", "--quick", "--steps", "40", "--val-batches", "8"],
        "quick": ["--seeds", "1", "--quick"],
        "full": ["--seeds", "1", "--quick"],  # the quick run's direction, checked against the full one's
    }),
    Step("calibration_bench.json", "benchmarks.calibration_bench", {
        "full": ["--seeds", "3"],
    }),
    Step("calibration_trace.json", "benchmarks.calibration_bench", {
        "full": ["--seeds", "2", "--trace"],
    }),
    Step("calibration_worlds_quick.json", "benchmarks.calibration_bench", {  # issue 33: the family of worlds
        "smoke": ["--worlds", "eval", "--count", "1", "--steps", "20", "--val-batches", "8", "--train-seeds", "2"],
        "quick": ["--worlds", "eval", "--quick"],
        "full": ["--worlds", "eval", "--quick"],
    }),
    Step("calibration_worlds_fit.json", "benchmarks.calibration_bench", {  # the noise budget, dev worlds only
        "full": ["--worlds", "dev", "--fit", "--count", "20"],
    }),
    Step("calibration_worlds_dev.json", "benchmarks.calibration_bench", {  # the default mode, chosen on dev worlds
        "full": ["--worlds", "dev", "--first", "20", "--count", "3", "--train-seeds", "2", "--variants",
                 "uncompressed,all_tight,all_loose,default,gradient,noise_recal"],
    }),
    Step("calibration_ablation.json", "benchmarks.calibration_bench", {  # the planted roles against the ablation
        "full": ["--ablate", "20", "--train-seeds", "2"],
    }),
    Step("calibration_ablation_eval.json", "benchmarks.calibration_bench", {  # the same, on an evaluation world
        # Settled (world 1000 parts by chance at 1000 steps); about 28 launches, resumed arm by arm.
        "full": ["--ablate", "1000", "--train-seeds", "2", "--settle", "--resume"],
    }),
    Step("calibration_ablation_eval_1014.json", "benchmarks.calibration_bench", {  # one whose runs settle
        # World 1000's ablation measured its plateau, not its tables. Of the evaluation worlds whose every arm settled
        # under both seeds in calibration_worlds_settled_relative.json with a floor under 0.0005, 1014 has the fewest
        # tables (8): chosen by its noise and cost before its ablation ran. 22 launches, resumed arm by arm.
        "full": ["--ablate", "1014", "--train-seeds", "2", "--settle", "--resume"],
    }),
    Step("calibration_worlds.json", "benchmarks.calibration_bench", {
        "full": ["--worlds", "eval", "--count", "20"],
    }),
    Step("calibration_perturb.json", "benchmarks.calibration_bench", {  # what the worlds' floors are made of
        "full": ["--perturb", "1000:1"],
    }),
    Step("calibration_curves.json", "benchmarks.calibration_bench", {  # where along the run arms part
        "smoke": ["--curves", "30:1", "--steps", "20", "--val-every", "10", "--val-batches", "8"],
        "full": ["--curves", "1000:0,1000:1", "--steps", "3000", "--val-every", "250"],
    }),
    Step("calibration_settle_dev.json", "benchmarks.calibration_bench", {  # every arm to its settled AUROC
        "smoke": ["--worlds", "dev", "--first", "23", "--count", "1", "--train-seeds", "2", "--variants",
                  "uncompressed,all_tight,all_loose", "--settle", "--steps", "40", "--val-every", "10",
                  "--val-batches", "8"],
        "full": ["--worlds", "dev", "--first", "23", "--count", "3", "--train-seeds", "2", "--variants",
                 "uncompressed,all_tight,all_loose", "--settle"],
    }),
    Step("calibration_worlds_settled.json", "benchmarks.calibration_bench", {  # the eval worlds, settled
        "smoke": ["--worlds", "eval", "--count", "1", "--train-seeds", "2", "--variants",
                  "uncompressed,all_tight,all_loose,default", "--settle", "--steps", "40", "--val-every", "10",
                  "--val-batches", "8"],
        # All 20, continuing the worlds the file holds (the committed one was made this way, in parts).
        "full": ["--worlds", "eval", "--count", "20", "--train-seeds", "2", "--variants",
                 "uncompressed,all_tight,all_loose,default", "--settle", "--resume"],
    }),
    Step("calibration_drift_dev.json", "benchmarks.calibration_bench", {  # the default's statistic along a run
        "full": ["--worlds", "dev", "--drift", "--count", "20"],
    }),
    Step("calibration_worlds_dev_relative.json", "benchmarks.calibration_bench", {  # the relative default, dev
        "full": ["--worlds", "dev", "--first", "20", "--count", "3", "--train-seeds", "2", "--variants",
                 "uncompressed,all_tight,all_loose,default,noise_absolute"],
    }),
    Step("calibration_worlds_settled_relative.json", "benchmarks.calibration_bench", {  # the relative default, eval
        # Its baselines are the settled run's (the same worlds, seeds and processor): only the default runs there,
        # but on worlds whose baselines are missing or fail the spot check (world 1000 did), every arm runs.
        "full": ["--worlds", "eval", "--count", "20", "--train-seeds", "2", "--variants",
                 "uncompressed,all_tight,all_loose,default", "--settle", "--resume", "--baselines-from",
                 "benchmarks/results/calibration_worlds_settled.json"],
    }),
    Step("frontier_worlds.json", "benchmarks.frontier_worlds", {  # issue 33 item 3 on the family, settled arms
        "smoke": ["--count", "1", "--steps", "20", "--val-every", "10", "--val-batches", "8", "--arms",
                  "uncompressed,all_tight,default,qcomm:INT8/FP16"],
        "full": ["--count", "3", "--train-seeds", "5", "--resume"],
    }),
    Step("data_bench.json", "benchmarks.data_bench", {
        "smoke": ["--rows", "20000", "--torchrec-rows", "2000", "--python-rows", "2000", "--loader-rows", "40000",
                  "--repeat", "1"],
        "quick": ["--rows", "1000000", "--torchrec-rows", "50000", "--python-rows", "100000", "--loader-rows",
                  "4000000", "--repeat", "2"],
        "full": [],
    }),
)


def depth_writing(output: str) -> str | None:
    """The shallowest depth (``quick`` or ``full``) whose run writes results file ``output``; None if none does. A run
    at a depth also writes its own record, ``suite_<depth>.json``."""
    for depth in ("quick", "full"):
        if output == f"suite_{depth}.json":
            return depth
        if any(s.output == output and depth in s.args for s in STEPS):
            return depth
    return None


def steps_at(depth: str, only: list[str] | None = None) -> list[Step]:
    """The steps a run at ``depth`` makes (``only``: just those writing these files), in order."""
    steps = [s for s in STEPS if depth in s.args]
    if only:
        unknown = sorted(set(only) - {s.output for s in steps})
        if unknown:
            raise ValueError(f"no step writes {unknown} at depth {depth}; choose from {[s.output for s in steps]}")
        steps = [s for s in steps if s.output in only]
    return steps


def command(step: Step, depth: str, results: Path) -> list[str]:
    """The command line of ``step`` at ``depth``, writing into ``results``."""
    args = [a.replace("{results}", str(results)) for a in step.args[depth]]
    return [sys.executable, "-m", step.module, *args, "--json-out", str(results / step.output)]


# What no depth of the suite writes: made elsewhere (a lent GPU) or by hand, with what makes it (paths from the
# repository root; "" for a script that writes no file).
ELSEWHERE: dict[str, tuple[tuple[str, str], ...]] = {
    "benchmarks.cuda_codec_bench": (("benchmarks/results/cuda_codec_bench.json",
                                     "benchmarks/gpu_session.sh on a lent GPU (its stage 4)"),),
    "benchmarks.capture_payloads": (("benchmarks/payloads/criteo_dlrm.npz",
                                     "by hand, when the captured payloads change"),),
    "benchmarks.suite": (("benchmarks/results/suite_quick.json", "make bench-quick's record of its steps"),),
    "benchmarks.cuda_profile": (("", "nothing: prints where the CUDA codec spends its time, on a lent GPU"
                                 " (benchmarks/cuda_profile.sh)"),),
}


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 \
        else f"{seconds / 3600:.1f} h"


def _took(path: Path) -> str:
    """How long the committed run that wrote results file ``path`` took, from its metadata (every part of a resumed
    run added up)."""
    if path.suffix != ".json" or not path.is_file():
        return "no committed run"
    meta = json.loads(path.read_text()).get("metadata", {})
    parts = [p.get("wall_s") for p in meta.get("resumed_from", [])] + [meta.get("wall_s")]
    if any(s is None for s in parts):
        return "its committed run did not record its time"
    where = f"{meta.get('cores', '?')} cores, {str(meta.get('date', '?'))[:10]}" + \
        (f", depth {meta['depth']}" if meta.get("depth") else "")
    if len(parts) > 1:
        return f"its committed run took {_minutes(sum(parts))} in {len(parts)} parts ({where})"
    return f"its committed run took {_minutes(parts[0])} ({where})"


def outputs_help(module: str, results: Path = RESULTS) -> str:
    """The epilog of a script's ``--help``: every results file the plan has ``module`` write, at which depths, and
    how long its committed run took (read from that file, so it cannot go stale). Outside the suite, ``--json-out``
    names the file a run writes."""
    lines = ["What it writes (benchmarks/lib/plan.py; times are the committed runs', on the machine named):"]
    for step in (s for s in STEPS if s.module == module):
        depths = ", ".join(f"make bench{'' if d == 'full' else '-' + d}" for d in DEPTHS if d in step.args)
        lines.append(f"  benchmarks/results/{step.output} ({depths}): {_took(results / step.output)}")
    for path, how in ELSEWHERE.get(module, ()):
        lines.append(f"  {path} ({how}): {_took(REPO / path)}" if path else f"  {how}")
    if len(lines) == 1:
        lines.append("  no results file of the plan")
    return "\n".join(lines)
