"""Surviving failures (docs/multinode.md, "Surviving failures"): `torchrun --max-restarts` + `dlac fit --config
examples/configs/dlrm_elastic.yaml --ckpt_path=last` on 2 CPU ranks, training a model that draws at random in every
step (dropout, sampled negatives, NumPy and Python draws: tests/engine/_random_dlrm.py), with workers killed by
SIGKILL before the first checkpoint (the restart starts from the beginning), at a random step inside the
calibration window (resuming from a checkpoint taken in the middle of a calibration), during a checkpoint save and
at a random step after the last checkpoint, ends with the uninterrupted run's final state bit for bit (dense
weights, embedding tables, fused and dense optimizer state, DLACCallback state, every rank's random state), its
per-step loss curve (each step replayed after a restart reproduces the loss the killed attempt had) and its final
metrics; and a restarted worker group meets in rendezvous even when one rank starts late.

The kills come from the workers themselves (tests/engine/_elastic_faults.py, a callback the run's config names), so
each lands at a known step; the seed of the random steps is printed, and ``DLAC_ELASTIC_SEEDS=a,b,...`` (or a count,
``DLAC_ELASTIC_SEEDS=5``) reruns the test for those seeds. Every torchrun rendezvouses through a store this test
hosts (``hosted_store``: no port is picked, closed and handed on) and runs in a session of its own, killed with
every process it started if it outlives its time (``run_session``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from lightning_dlac.testing import hosted_store, run_session
from tests.engine._elastic_faults import KILL_MARK, loss_curve

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "dlrm_elastic.yaml"
# Training steps of the run, a checkpoint every EVERY steps (5, 10, 15), validation every VAL steps (3, 6, ..., 15):
# apart, because Lightning does not rerun a validation due at the step a resumed checkpoint was taken.
STEPS, EVERY, VAL = 15, 5, 3
# DLACCallback measures batches 4-6 (steps 5-7), so the checkpoint at step 5 is taken in the middle of a calibration.
CALIBRATION_START, CALIBRATION_BATCHES = 4, 3
# Variables a launcher sets; each run here starts from a clean environment and torchrun sets its own.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_MAX_RESTARTS", "GROUP_WORLD_SIZE", "PL_GLOBAL_SEED")  # fmt: skip


def _seeds() -> list[int]:
    given = os.environ.get("DLAC_ELASTIC_SEEDS", "").strip()
    if not given:
        return [random.SystemRandom().randrange(10**6)]
    if given.isdigit() and "," not in given and int(given) <= 20:
        return [random.SystemRandom().randrange(10**6) for _ in range(int(given))]
    return [int(s) for s in given.split(",")]


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        pytest.fail(f"{name} is not installed next to {sys.executable}; install the project (pip install -e .)")
    return str(path)


def _config(run: Path, plan: dict[str, dict[str, int]] | None = None) -> Path:
    """The shipped elastic config scaled down to a 15-step run of a small model that draws at random, everything
    under ``run``."""
    config = yaml.safe_load(CONFIG.read_text())
    trainer = config["trainer"]
    trainer.update(val_check_interval=VAL, log_every_n_steps=2, enable_progress_bar=False)
    trainer["logger"]["init_args"]["save_dir"] = str(run / "logs")
    by_class = {c["class_path"].rsplit(".", 1)[-1]: c["init_args"] for c in trainer["callbacks"]}
    by_class["DLACCallback"].update(calibration_start=CALIBRATION_START, calibration_batches=CALIBRATION_BATCHES, T=8,
                                    log_every_n_steps=4)  # fmt: skip
    by_class["ModelCheckpoint"].update(dirpath=str(run / "checkpoints"), every_n_train_steps=EVERY)
    trainer["callbacks"].append({"class_path": "tests.engine._elastic_faults.LossCurve",
                                 "init_args": {"directory": str(run)}})  # fmt: skip
    if plan is not None:
        trainer["callbacks"].append({"class_path": "tests.engine._elastic_faults.Faults", "init_args": {"plan": plan}})
    config["model"]["class_path"] = "tests.engine._random_dlrm.RandomDLRM"
    config["model"]["init_args"].update(embedding_dim=16, dense_arch_layer_sizes=[16, 16],
                                        over_arch_layer_sizes=[16, 1])
    config["data"]["init_args"].update(max_rows=200, batch_size=128, num_train_batches=STEPS, num_val_batches=2)
    run.mkdir(parents=True)
    path = run / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _torchrun_command(port: int, max_restarts: int, *command: str) -> list[str]:
    """torchrun on one node whose c10d rendezvous is the store on ``port`` (hosted here; the agent then hosts its
    workers' store on a port its kernel picks and keeps bound)."""
    return [_bin("torchrun"), "--nnodes=1", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=dlac-elastic-test",
            "--rdzv-conf=is_host=false", "--local-addr=127.0.0.1", *command]  # fmt: skip


def _torchrun(run: Path, max_restarts: int, plan: dict[str, dict[str, int]] | None = None) -> str:
    """torchrun of `dlac fit --ckpt_path=last`; returns the output, both streams drained together while it runs."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    config = _config(run, plan)
    with hosted_store() as store:
        command = _torchrun_command(store.port, max_restarts, "--no-python", _bin("dlac"), "fit", "--config",
                                    str(config), "--ckpt_path=last")  # fmt: skip
        done = run_session(command, cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-8000:]
    return done.stdout


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}/").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, value in enumerate(tree) for k, v in _flat(value, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): tree}


def _final_state(run: Path, scratch: Path) -> dict[str, Any]:
    """Everything the run's last checkpoint (the last step's) holds, every rank's random state included, flattened,
    less what differs between any two
    runs (the time measurements, and the observed error / bound, sampled every ``error_every`` exchanges counted
    since the process started) and DLACCallback's history of logged metrics (after a restart it lacks the metrics
    Lightning logged before it, e.g. the last validation's, until they are logged again)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    last = run / "checkpoints" / "last.ckpt"
    dcp_to_torch_save(last, scratch)  # every rank's shards as whole tensors
    sharded = torch.load(scratch, weights_only=True)
    meta = torch.load(last / "meta.pt", weights_only=True)
    kept = {"tensors": sharded, "global_step": meta["global_step"], "epoch": meta["epoch"],
            "optimizer_states": meta["optimizer_states"], "random_state": meta["dlac_random_state"],
            "dlac_callback": {k: v for k, v in meta["callbacks"].items() if "DLACCallback" in k}}  # fmt: skip
    assert kept["dlac_callback"] and sharded["state_dict"] and sharded["fused_optimizer"]
    assert len(kept["random_state"]) == 2
    return {k: v for k, v in _flat(kept).items() if not _measured(k)}


def _measured(key: str) -> bool:
    name = key.rsplit("/", 2)
    timed = ("/history/", "/step_counts/")  # the step-time histogram counts batches per wall-time bin
    return any(part in key for part in timed) or any(
        part.endswith(("_ms", "_s", "a2a_share")) or "err" in part for part in name)


def _final_metrics(run: Path) -> dict[str, float]:
    # Each attempt logs into a version of its own; the one that finished wrote the run record.
    (record,) = list((run / "logs").glob("dlrm_elastic/version_*/dlac_run.json"))
    return json.loads(record.read_text())["final_metrics"]


def _differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """The keys whose values differ (tensors bit for bit, not close), or that only one side has."""
    differ = sorted(got.keys() ^ want.keys())
    for key in sorted(got.keys() & want.keys()):
        a, b = got[key], want[key]
        same = torch.equal(a, b) if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor) else a == b
        differ += [] if same else [key]
    return differ


def _curves(run: Path) -> list[dict[int, list[str]]]:
    return [loss_curve(run, rank) for rank in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = tmp_path_factory.mktemp("elastic") / "uninterrupted"
    output = _torchrun(run, max_restarts=0)
    assert f"dlac fit finished after {STEPS} steps" in output, output[-4000:]
    curves = _curves(run)
    assert all(sorted(c) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in c.values()) for c in curves)
    return {"state": _final_state(run, run / "state.pt"), "metrics": _final_metrics(run), "curves": curves}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", _seeds())
def test_killed_workers_restart_and_end_bit_identical(tmp_path: Path, uninterrupted: dict[str, Any], seed: int):
    """Five attempts: 0 killed before the first checkpoint (1 starts from the beginning), 1 killed in the calibration
    window after the checkpoint taken inside it (2 resumes in the middle of the calibration), 2 killed during its
    first save (3 resumes from the same checkpoint), 3 killed after the next checkpoint (4 resumes from it and
    finishes)."""
    rng = random.Random(seed)
    calibrated = CALIBRATION_START + CALIBRATION_BATCHES  # the step after the calibration's last batch
    plan = {"0": {"rank": rng.randrange(2), "step": rng.randint(1, EVERY - 1)},
            "1": {"rank": rng.randrange(2), "step": rng.randint(EVERY + 1, calibrated)},
            "2": {"rank": 0, "during_save": 1},
            "3": {"rank": rng.randrange(2), "step": rng.randint(2 * EVERY + 1, STEPS - 1)}}  # fmt: skip
    print(f"seed {seed}: {plan}")
    run = tmp_path / "killed"
    output = _torchrun(run, max_restarts=4, plan=plan)
    context = f"seed {seed}, plan {plan} (DLAC_ELASTIC_SEEDS={seed} reruns it)"
    for attempt in ("0", "1", "3"):
        kill = plan[attempt]
        assert f"{KILL_MARK} attempt {attempt} rank {kill['rank']} after step {kill['step']}" in output, context
    assert f"{KILL_MARK} attempt 2 rank 0 during a save" in output, context + output[-6000:]
    # Attempts 0 and 1 found no checkpoint; 2 and 3 resumed from step 5's (3 because 2's save at 10 never
    # completed), 4 from step 10's.
    assert output.count("there is no last checkpoint available") == 2, context + output[-6000:]
    assert output.count("Restored all states from the checkpoint at") == 3, context + output[-6000:]
    assert "torchrun restart 4, process group on 2 ranks under a fresh rendezvous prefix" in output, context
    assert f"dlac fit finished after {STEPS} steps" in output, context + output[-4000:]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["last.ckpt"], context  # nothing half-written left
    state = _final_state(run, tmp_path / "state.pt")
    assert any(k.startswith("tensors/state_dict/") and "embedding_bags" in k for k in state)  # the tables are in it
    assert not _differences(state, uninterrupted["state"]), (context, _differences(state, uninterrupted["state"]))
    for rank, (curve, want) in enumerate(zip(_curves(run), uninterrupted["curves"])):
        replayed = {step: losses for step, losses in curve.items() if len(set(losses)) > 1}
        assert not replayed, (context, rank, "a replayed step's loss differs from the killed attempt's", replayed)
        assert {step: losses[0] for step, losses in curve.items()} == {s: v[0] for s, v in want.items()}, (context,
                                                                                                         rank)
    assert _final_metrics(run) == uninterrupted["metrics"], context


RENDEZVOUS = """
import os, signal, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from lightning_dlac.engine.elastic import attempt, restart_store
rank = int(os.environ["RANK"])
if attempt() == 1 and rank == 1:
    time.sleep(3)  # the other rank reaches rendezvous first, while the previous attempt's keys are in the store
timeout = timedelta(seconds=60)
store = restart_store(timeout)
kwargs = {} if store is None else dict(store=store, rank=rank, world_size=2)
dist.init_process_group("gloo", timeout=timeout, **kwargs)
x = torch.ones(1)
dist.all_reduce(x)
print(f"attempt {attempt()} rank {rank}: all_reduce {x.item()}", flush=True)
if attempt() == 0 and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier() if attempt() > 0 else time.sleep(60)
"""


@pytest.mark.slow
def test_a_restarted_group_meets_when_one_rank_starts_late(tmp_path: Path) -> None:
    """Without restart_store the early rank reads the late one's dead address from the previous attempt and fails
    with 'Gloo connectFullMesh failed ... Connection refused': torchrun's agent keeps one store for all attempts
    (with the c10d rendezvous here, and with the static one of --master-addr/--master-port alike)."""
    script = tmp_path / "rendezvous.py"
    script.write_text(RENDEZVOUS)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    with hosted_store() as store:
        done = run_session(_torchrun_command(store.port, 1, str(script)), env=env, cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:]
    for rank in range(2):
        assert f"attempt 1 rank {rank}: all_reduce 2.0" in done.stdout, done.stdout[-6000:]

