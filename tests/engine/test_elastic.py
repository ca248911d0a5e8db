"""Surviving failures (docs/multinode.md, "Surviving failures"): `torchrun --max-restarts` + `dlac fit --config
examples/configs/dlrm_elastic.yaml --ckpt_path=last` on 2 CPU ranks, with workers killed by SIGKILL at a step drawn
at random after the first checkpoint, during a checkpoint save and before the first checkpoint (the restart then
starts from the beginning), ends with the uninterrupted run's final state bit for bit (dense weights, embedding
tables, fused and dense optimizer state, DLACCallback state) and its final metrics; and a restarted worker group
meets in rendezvous even when one rank starts late.

The kills come from the workers themselves (tests/engine/_elastic_faults.py, a callback the run's config names), so each
lands at a known step; the seed of the random step is printed, and ``DLAC_ELASTIC_SEEDS=a,b,...`` (or a count,
``DLAC_ELASTIC_SEEDS=5``) reruns the test for those seeds.
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

from tests.engine._elastic_faults import KILL_MARK

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "dlrm_elastic.yaml"
# Training steps of the run, a checkpoint every EVERY steps (5, 10, 15), validation every VAL steps (3, 6, ..., 15):
# apart, because Lightning does not rerun a validation due at the step a resumed checkpoint was taken.
STEPS, EVERY, VAL = 15, 5, 3
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
    """The shipped elastic config scaled down to a 15-step run of a small model, everything under ``run``."""
    config = yaml.safe_load(CONFIG.read_text())
    trainer = config["trainer"]
    trainer.update(val_check_interval=VAL, log_every_n_steps=2, enable_progress_bar=False)
    trainer["logger"]["init_args"]["save_dir"] = str(run / "logs")
    by_class = {c["class_path"].rsplit(".", 1)[-1]: c["init_args"] for c in trainer["callbacks"]}
    by_class["DLACCallback"].update(calibration_start=5, calibration_batches=2, T=8, log_every_n_steps=4)
    by_class["ModelCheckpoint"].update(dirpath=str(run / "checkpoints"), every_n_train_steps=EVERY)
    if plan is not None:
        trainer["callbacks"].append({"class_path": "tests.engine._elastic_faults.Faults", "init_args": {"plan": plan}})
    config["model"]["init_args"].update(embedding_dim=16, dense_arch_layer_sizes=[16, 16],
                                        over_arch_layer_sizes=[16, 1])
    config["data"]["init_args"].update(max_rows=200, batch_size=128, num_train_batches=STEPS, num_val_batches=2)
    run.mkdir(parents=True)
    path = run / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _torchrun(run: Path, max_restarts: int, plan: dict[str, dict[str, int]] | None = None) -> str:
    """`torchrun --standalone` (its store on a port the kernel picks, held bound) of `dlac fit --ckpt_path=last`;
    returns the output, both streams drained together while it runs."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    command = [_bin("torchrun"), "--standalone", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
               "--no-python", _bin("dlac"), "fit", "--config", str(_config(run, plan)), "--ckpt_path=last"]  # fmt: skip
    done = subprocess.run(command, cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
    """Everything the run's last checkpoint (the last step's) holds, flattened, less what differs between any two
    runs (the time measurements, and the observed error / bound, sampled every ``error_every`` exchanges counted
    since the process started) and DLACCallback's history of logged metrics (after a restart it lacks the metrics
    Lightning logged before it, e.g. the last validation's, until they are logged again)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    last = run / "checkpoints" / "last.ckpt"
    dcp_to_torch_save(last, scratch)  # every rank's shards as whole tensors
    sharded = torch.load(scratch, weights_only=True)
    meta = torch.load(last / "meta.pt", weights_only=True)
    kept = {"tensors": sharded, "global_step": meta["global_step"], "epoch": meta["epoch"],
            "optimizer_states": meta["optimizer_states"],
            "dlac_callback": {k: v for k, v in meta["callbacks"].items() if "DLACCallback" in k}}  # fmt: skip
    assert kept["dlac_callback"] and sharded["state_dict"] and sharded["fused_optimizer"]
    return {k: v for k, v in _flat(kept).items() if not _measured(k)}


def _measured(key: str) -> bool:
    name = key.rsplit("/", 2)
    return "/history/" in key or any(part.endswith(("_ms", "_s", "a2a_share")) or "err" in part for part in name)


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


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run = tmp_path_factory.mktemp("elastic") / "uninterrupted"
    output = _torchrun(run, max_restarts=0)
    assert f"dlac fit finished after {STEPS} steps" in output, output[-4000:]
    return {"state": _final_state(run, run / "state.pt"), "metrics": _final_metrics(run)}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", _seeds())
def test_killed_workers_restart_and_end_bit_identical(tmp_path: Path, uninterrupted: dict[str, Any], seed: int):
    rng = random.Random(seed)
    step, rank = rng.randint(EVERY + 1, STEPS - 1), rng.randrange(2)
    print(f"seed {seed}: attempt 0 kills rank {rank} after step {step}; attempt 1 kills rank 0 during its first save")
    plan = {"0": {"rank": rank, "step": step}, "1": {"rank": 0, "during_save": 1}}
    run = tmp_path / "killed"
    output = _torchrun(run, max_restarts=2, plan=plan)
    context = f"seed {seed} (DLAC_ELASTIC_SEEDS={seed} reruns it)"
    # Attempt 0 died at `step`, attempt 1 in a save, attempt 2 finished; attempts 1 and 2 resumed from last.ckpt.
    assert f"{KILL_MARK} attempt 0 rank {rank} after step {step}" in output, context + output[-6000:]
    assert f"{KILL_MARK} attempt 1 rank 0 during a save" in output, context + output[-6000:]
    assert output.count("Restored all states from the checkpoint at") == 2, context + output[-6000:]
    assert "torchrun restart 2, process group on 2 ranks under a fresh rendezvous prefix" in output, context
    assert f"dlac fit finished after {STEPS} steps" in output, context + output[-4000:]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["last.ckpt"], context  # nothing half-written left
    state = _final_state(run, tmp_path / "state.pt")
    assert any(k.startswith("tensors/state_dict/") and "embedding_bags" in k for k in state)  # the tables are in it
    assert not _differences(state, uninterrupted["state"]), (context, _differences(state, uninterrupted["state"]))
    assert _final_metrics(run) == uninterrupted["metrics"], context



@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_killed_before_the_first_checkpoint_restarts_from_the_beginning(tmp_path: Path,
                                                                                  uninterrupted: dict[str, Any]):
    """With no checkpoint yet, ``--ckpt_path=last`` finds none and the restarted group trains from step 0: the same
    run, bit for bit, as one that was never interrupted."""
    step = EVERY - 1  # the last step before the first save
    run = tmp_path / "killed_early"
    output = _torchrun(run, max_restarts=1, plan={"0": {"rank": 1, "step": step}})
    assert f"{KILL_MARK} attempt 0 rank 1 after step {step}" in output, output[-6000:]
    assert "torchrun restart 1, process group on 2 ranks under a fresh rendezvous prefix" in output, output[-6000:]
    assert "there is no last checkpoint available" in output and "Restored all states" not in output, output[-6000:]
    assert f"dlac fit finished after {STEPS} steps" in output, output[-4000:]
    state = _final_state(run, tmp_path / "state.pt")
    assert not _differences(state, uninterrupted["state"]), _differences(state, uninterrupted["state"])
    assert _final_metrics(run) == uninterrupted["metrics"]


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
    command = [_bin("torchrun"), "--standalone", "--nproc-per-node=2", "--max-restarts=1", str(script)]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-6000:]
    for rank in range(2):
        assert f"attempt 1 rank {rank}: all_reduce 2.0" in done.stdout, done.stdout[-6000:]

