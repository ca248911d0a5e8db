"""Checkpoints and restarts of a DLACStrategy run: what a failure costs, to size the checkpoint interval.

Save and load, per rank: the demo model (examples/configs/dlrm_synthetic.yaml's DLRM: 26 tables, 119,889 rows of dim
64, Adagrad) and the same model with every table 10x larger, trained 2 steps on 2 gloo ranks, then
``trainer.save_checkpoint`` (Lightning's dump + DLACStrategy's atomic sharded save: every rank's shards, ``meta.pt``,
``manifest.json``, the switch) and ``strategy.load_checkpoint`` (the checks, then every rank's shards and fused
optimizer state read in place), each ``--repeats`` times; every rank times its own calls (they are collective, so
the ranks' times agree to the barrier). Size: the checkpoint directory, and the largest rank's shard file. Each model
twice: with ``CheckpointOptions(verify=True)`` (the default: every rank checksums the files it wrote at save,
and its share of all files at load) and ``False`` (sizes only); the difference is what the checksums cost, and
``checksum_s`` times the CRC32 of each rank's own files alone (page cache warm, as in the save).

Restart: ``torchrun --standalone --nproc-per-node 2 --max-restarts 1 dlac fit --config
examples/configs/dlrm_elastic.yaml --ckpt_path=last`` (checkpoints every 40 steps), one worker killed with SIGKILL
after step ``--kill-step`` (default 50); from the kill to the first resumed step, split into the agent noticing the
failure and starting new workers (to the new processes' start), imports and argument parsing, rendezvous, sharding
+ checkpoint load + Lightning's sanity validation, and the first step. The resumed run then replays the steps since
the checkpoint (the work lost), which is also reported. The run is stopped once it is back at the killed step.

    python -m benchmarks.checkpoint_bench                 # make bench runs it (python -m benchmarks.suite)
    python -m benchmarks.render                           # the figures of docs/benchmarks.md and docs/multinode.md

Writes benchmarks/results/checkpoint_bench.json (with the run's metadata); the blocks ``render:checkpoint``
(docs/benchmarks.md) and ``render:multinode_restart`` (docs/multinode.md) are rendered from it by
benchmarks/lib/checkpoint.py's :func:`tables` and :func:`multinode_lines`. The checkpoints and runs (under
``--workdir``) are deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.checkpoint import tables
from benchmarks.lib.launch import child_env
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results

ELASTIC = REPO / "examples" / "configs" / "dlrm_elastic.yaml"
CLOCK = "DLAC_CLOCK "  # the prefix of StepClock's lines in the workers' output


# ----------------------------------------------------------------------------------------------- save and load


def _save_load(spec: dict[str, Any]) -> None:
    """One 2-rank run (Lightning launches the second rank by running this command again): fit 2 steps, then time
    saves and loads on every rank; each rank writes its results to ``<out>.rank<r>.json``."""
    import lightning.pytorch as pl
    import torch
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    from lightning_dlac import CheckpointOptions, DLACStrategy, ShardingOptions
    from lightning_dlac.criteo.format import capped_cardinalities
    from lightning_dlac.engine.checkpoint import file_checksum

    torch.set_num_threads(1)
    sizes = [spec["scale"] * n for n in capped_cardinalities(10_000)]
    data = SyntheticCriteoDataModule(num_embeddings_per_feature=sizes, batch_size=512, num_train_batches=2,
                                     num_val_batches=0)  # fmt: skip
    model = DLRMModule(num_embeddings_per_feature=sizes, embedding_dim=64, dense_arch_layer_sizes=[256, 64],
                       over_arch_layer_sizes=[256, 128, 1], learning_rate=0.01, optimizer="adagrad")  # fmt: skip
    directory = Path(spec["dir"])

    class Timer(pl.Callback):
        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            strategy = trainer.strategy
            path = directory / "bench.ckpt"
            saves, loads = [], []
            for _ in range(spec["repeats"]):
                strategy.barrier()
                t = time.perf_counter()
                trainer.save_checkpoint(path)
                saves.append(time.perf_counter() - t)
            for _ in range(spec["repeats"]):
                strategy.barrier()
                t = time.perf_counter()
                strategy.load_checkpoint(path)
                loads.append(time.perf_counter() - t)
            files = {p.name: p.stat().st_size for p in path.iterdir()}
            rank = trainer.global_rank
            # What this rank checksums at a save: the files it wrote (rank 0 also DCP's .metadata and meta.pt).
            own = [name for name in files if name.startswith(f"__{rank}_")
                   or (rank == 0 and name in (".metadata", "meta.pt"))]  # fmt: skip
            t = time.perf_counter()
            for name in own:
                file_checksum(path / name)
            checksum_s = time.perf_counter() - t
            result = dict(rank=rank, save_s=saves, load_s=loads, total_bytes=sum(files.values()),
                          rank_shard_bytes=files.get(f"__{rank}_0.distcp", 0), table_rows=sum(sizes),
                          checksum_s=checksum_s, checksum_bytes=sum(files[n] for n in own))  # fmt: skip
            Path(f"{spec['out']}.rank{rank}.json").write_text(json.dumps(result))

    strategy = DLACStrategy(sharding=ShardingOptions(embedding_optimizer="adagrad"),
                            checkpointing=CheckpointOptions(verify=spec["verify"]))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy,
                         max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[Timer()])  # fmt: skip
    trainer.fit(model, datamodule=data)


def _run_save_load(scale: int, verify: bool, repeats: int, workdir: Path, timeout: float) -> list[dict[str, Any]]:
    directory = Path(tempfile.mkdtemp(prefix=f"save_load_x{scale}_", dir=workdir))
    spec = dict(scale=scale, verify=verify, repeats=repeats, dir=str(directory), out=str(directory / "result"))
    env = child_env()
    done = subprocess.run([sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)], env=env, cwd=directory,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"save/load run x{scale} (verify={verify}) failed:\n{done.stdout[-4000:]}")
    return [json.loads(Path(f"{spec['out']}.rank{r}.json").read_text()) for r in range(2)]


# ----------------------------------------------------------------------------------------------------- restart


def _process_start() -> float:
    """When this process started (seconds since the epoch), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return boot + int(fields[19]) / ticks  # field 22 of stat(5), counted after the command name


def _clock(event: str, **fields: Any) -> None:
    record = dict(event=event, t=time.time(), pid=os.getpid(), rank=int(os.environ.get("RANK", 0)),
                  attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), **fields)  # fmt: skip
    sys.stdout.flush()
    os.write(1, f"{CLOCK}{json.dumps(record)}\n".encode())  # one write: the other rank's output cannot split it


try:
    from lightning.pytorch import Callback as _Callback
except ImportError:  # the parent process measures without Lightning
    _Callback = object


class StepClock(_Callback):
    """Prints when this worker started, had its arguments parsed (this callback built), had its process group
    (setup), began training (sharded, restored, sanity-checked) and ended each training step."""

    def __init__(self) -> None:
        _clock("process_start", at=_process_start())
        _clock("built")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        _clock("setup")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        _clock("train_start", step=trainer.global_step)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        _clock("step", step=trainer.global_step)


def _restart_config(run: Path) -> tuple[Path, int]:
    import yaml

    config = yaml.safe_load(ELASTIC.read_text())
    trainer = config["trainer"]
    trainer["enable_progress_bar"] = False
    trainer["logger"]["init_args"]["save_dir"] = str(run / "logs")
    for callback in trainer["callbacks"]:
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["dirpath"] = str(run / "checkpoints")
            every = int(callback["init_args"]["every_n_train_steps"])
    trainer["callbacks"].append({"class_path": f"{__spec__.name}.StepClock"})
    path = run / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, every


def _run_restart(kill_step: int, kill_rank: int, workdir: Path, timeout: float) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="restart_", dir=workdir))
    config, every = _restart_config(run)
    if kill_step <= every:
        raise SystemExit(f"--kill-step {kill_step} must come after the first checkpoint (step {every}).")
    env = child_env()  # StepClock is imported from this module
    dlac = str(Path(sys.executable).with_name("dlac"))
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node=2",
               "--max-restarts=1", "--no-python", dlac, "fit", "--config", str(config), "--ckpt_path=last"]
    agent = subprocess.Popen(command, cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # fmt: skip
    events: list[dict[str, Any]] = []
    killed_at, log = None, []
    deadline = time.monotonic() + timeout
    try:
        for line in agent.stdout:  # one stream: torchrun's and both workers' output, drained as it comes
            log.append(line)
            if time.monotonic() > deadline:
                raise TimeoutError("".join(log[-50:]))
            if CLOCK not in line:
                continue
            event, _ = json.JSONDecoder().raw_decode(line, line.index(CLOCK) + len(CLOCK))
            events.append(event)
            if (killed_at is None and event["event"] == "step" and event["attempt"] == 0
                    and event["rank"] == kill_rank and event["step"] == kill_step):
                os.kill(event["pid"], signal.SIGKILL)
                killed_at = time.time()
            if event["event"] == "step" and event["attempt"] == 1 and event["step"] >= kill_step:
                break  # back where it was killed: what the benchmark measures is over
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)  # torchrun and the workers it started, in the session we made
            agent.wait(60)
        (run / "torchrun.log").write_text("".join(log))  # kept with --keep
    if killed_at is None:
        raise RuntimeError("the run never reached the step to kill at:\n" + "".join(log[-80:]))

    def first(name: str, **match: Any) -> float:
        """When the resumed attempt's slower rank got to ``name`` (the ranks wait for each other there)."""
        times = [e["at" if name == "process_start" else "t"] for e in events if e["event"] == name
                 and e["attempt"] == 1 and all(e.get(k) == v for k, v in match.items())]
        return max(times)

    resumed_from = (kill_step // every) * every
    phases = {"detect_and_respawn_s": first("process_start") - killed_at,
              "imports_and_cli_s": first("built") - first("process_start"),
              "rendezvous_s": first("setup") - first("built"),
              "shard_restore_sanity_s": first("train_start") - first("setup"),
              "first_step_s": first("step", step=resumed_from + 1) - first("train_start")}  # fmt: skip
    return dict(kill_step=kill_step, kill_rank=kill_rank, resumed_from=resumed_from,
                kill_to_first_step_s=first("step", step=resumed_from + 1) - killed_at,
                kill_to_killed_step_s=first("step", step=kill_step) - killed_at, **phases)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scales", default="1,10", help="table-size multipliers of the demo model to save and load")
    parser.add_argument("--repeats", type=int, default=3, help="saves and loads per model")
    parser.add_argument("--no-unverified", action="store_true",
                        help="skip the runs with CheckpointOptions(verify=False) (the checksums' cost is then not"
                        " measured)")
    parser.add_argument("--restarts", type=int, default=2, help="killed-and-restarted runs (0: none)")
    parser.add_argument("--kill-step", type=int, default=50, help="kill a worker after this step (attempt 0)")
    parser.add_argument("--kill-rank", type=int, default=1, help="the rank to kill")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints and run directories")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json-out", type=Path, default=RESULTS / "checkpoint_bench.json")
    args = parser.parse_args()
    if args.child:
        _save_load(json.loads(args.child))
        return

    metadata = start_run(__spec__.name, vars(args))
    workdir = Path(tempfile.mkdtemp(prefix="dlac_checkpoint_bench_", dir=args.workdir))
    try:
        save_load = {(int(s), verify): _run_save_load(int(s), verify, args.repeats, workdir, args.timeout)
                     for s in args.scales.split(",") for verify in (True, False)[:1 if args.no_unverified else 2]}
        restarts = [_run_restart(args.kill_step, args.kill_rank, workdir, args.timeout) for _ in range(args.restarts)]
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)  # the x10 checkpoint alone is 0.6 GB
    rows = [dict(kind="save_load", scale=s, verify=v, ranks=r) for (s, v), r in save_load.items()]
    rows += [dict(kind="restart", **r) for r in restarts]
    print("\n".join(tables(rows)))
    config = dict(scales=[int(s) for s in args.scales.split(",")], repeats=args.repeats, restarts=args.restarts,
                  verify=[True] if args.no_unverified else [True, False],
                  kill_step=args.kill_step, kill_rank=args.kill_rank, storage="local disk, page cache warm")
    write_results(args.json_out, metadata, config, rows)
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
