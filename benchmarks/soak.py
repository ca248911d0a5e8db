"""A soak: a long DLACStrategy run on 2 CPU ranks, to see whether anything grows with the steps.

The demo's model and data (examples/configs/dlrm_synthetic.yaml: the example DLRM, 26 tables of dim 64, synthetic
Criteo-like data) with ``DLACCallback`` recalibrating through the run, a checkpoint every ``--checkpoint-every`` steps
(DLACStrategy's sharded, atomic save of ``last``), a CSVLogger and the compression report at the end, for ``--steps``
training steps (20,000 by default, epochs of ``--epoch-batches``, a short validation after each). Every rank times
every step (wall clock and CPU time) and samples its resident memory, open files and threads every ``--sample-every``
steps (benchmarks/lib/soak.py's ``Sampler``); after ``--warmup`` steps, memory and the median step CPU time must grow
by less than 2% per 10,000 steps (Theil-Sen slope, robust to the checkpoint and validation steps, which are left out
of the step time anyway), the wall time too where the machine's load stayed calm, and open files and threads not at
all.

    python -m benchmarks.soak                         # about 25 minutes on 2 cores
    python -m benchmarks.soak --steps 600 --warmup 200 --checkpoint-every 200 --epoch-batches 300   # a smoke run

Writes benchmarks/results/soak.json; ``python -m benchmarks.render`` renders its table into docs/reliability.md and its
plot into docs/figures/soak.svg.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.lib.launch import child_env
from benchmarks.lib.paths import RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results
from benchmarks.lib.soak import Sampler, judge, rank_file, step_windows, table


def _child(spec: dict[str, Any]) -> None:
    """The 2-rank run (Lightning starts the second rank by running this command again)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    from lightning_dlac import DLACCallback, DLACStrategy, ShardingOptions

    torch.set_num_threads(1)
    pl.seed_everything(0)
    run = Path(spec["dir"])
    data = SyntheticCriteoDataModule(max_rows=10_000, batch_size=spec["batch_size"],
                                     num_train_batches=spec["epoch_batches"], num_val_batches=4, seed=0)  # fmt: skip
    model = DLRMModule(num_embeddings_per_feature=data.num_embeddings_per_feature, embedding_dim=64,
                       dense_arch_layer_sizes=[256, 64], over_arch_layer_sizes=[256, 128, 1], learning_rate=0.01,
                       optimizer="adagrad")  # fmt: skip
    sampler = Sampler(every=spec["sample_every"])
    callbacks = [
        DLACCallback(calibration_batches=8, calibration_start=spec["calibration_start"],
                     recalibrate_every=spec["recalibrate_every"], schedule="step", c=2.0,
                     T=spec["calibration_start"] * 2, log_every_n_steps=50),
        ModelCheckpoint(dirpath=run / "checkpoints", every_n_train_steps=spec["checkpoint_every"], save_last=True,
                        save_top_k=0),
        sampler,
    ]  # fmt: skip
    strategy = DLACStrategy(sharding=ShardingOptions(embedding_optimizer="adagrad", embedding_lr=0.02))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=spec["steps"],
                         logger=CSVLogger(run / "logs", name="soak"), callbacks=callbacks, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=50)  # fmt: skip
    trainer.fit(model, datamodule=data)
    rank_file(spec["out"], trainer.global_rank).write_text(json.dumps(sampler.result(trainer.global_rank)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20_000, help="training steps")
    parser.add_argument("--warmup", type=int, default=2_000, help="steps left out of the growth fits")
    parser.add_argument("--checkpoint-every", type=int, default=1_000, help="steps between checkpoints")
    parser.add_argument("--epoch-batches", type=int, default=2_000, help="training batches per rank per epoch")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per batch and rank")
    parser.add_argument("--sample-every", type=int, default=100, help="steps between two /proc samples")
    parser.add_argument("--calibration-start", type=int, default=500, help="DLACCallback's first calibration")
    parser.add_argument("--recalibrate-every", type=int, default=2_500, help="DLACCallback's period")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true", help="keep the run directory (checkpoints, logs, report)")
    parser.add_argument("--timeout", type=float, default=4 * 3600.0)
    parser.add_argument("--json-out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return

    metadata = start_run(__spec__.name, vars(args))
    run = Path(tempfile.mkdtemp(prefix="dlac_soak_", dir=args.workdir))
    spec = dict(dir=str(run), out=str(run / "sampler"), steps=args.steps, epoch_batches=args.epoch_batches,
                batch_size=args.batch_size, sample_every=args.sample_every, checkpoint_every=args.checkpoint_every,
                calibration_start=args.calibration_start, recalibrate_every=args.recalibrate_every)  # fmt: skip
    env = child_env()
    try:
        done = subprocess.run([sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)], env=env, cwd=run,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=args.timeout)  # fmt: skip
        (run / "run.log").write_text(done.stdout)
        if done.returncode != 0:
            raise SystemExit(f"the soak run failed (exit {done.returncode}):\n{done.stdout[-6000:]}")
        ranks = [json.loads(rank_file(spec["out"], r).read_text()) for r in range(2)]
        reports = sorted(run.glob("logs/soak/version_*/dlac_report.md"))
        checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
        report_line = next((line for line in done.stdout.splitlines() if "forward all-to-all:" in line), None)
    finally:
        if not args.keep:
            shutil.rmtree(run, ignore_errors=True)
    judgement = judge(ranks, args.warmup)
    series = [{"rank": r["rank"], "samples": r["samples"], "marked_steps": len(r["marked"]),
               "step_windows": step_windows(r["step_s"], r["marked"]),
               "step_cpu_windows": step_windows(r["step_cpu_s"], r["marked"])} for r in ranks]  # fmt: skip
    outcome = {"steps": [len(r["step_s"]) + 1 for r in ranks], "report_written": bool(reports),
               "checkpoints": checkpoints, "report_line": report_line}  # fmt: skip
    print("\n".join(table(judgement)))
    print(f"steps per rank {outcome['steps']}, checkpoints {checkpoints}, report written: {bool(reports)}")
    model = "examples/configs/dlrm_synthetic.yaml's DLRM (26 tables, dim 64), DLACCallback (noise mode)"
    config = {k: v for k, v in spec.items() if k not in ("dir", "out")} | {"warmup": args.warmup, "world_size": 2,
                                                                          "model": model}
    write_results(args.json_out, metadata, config, series, judgement=judgement, outcome=outcome,
                  targets=[dict(t, rate="2 ranks") for t in judgement["targets"]])
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
