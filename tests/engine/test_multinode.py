"""Multi-node launch on one machine: 2 "nodes" x 1 process started by torchrun on 127.0.0.1 through `dlac fit`
(trainer num_nodes=2, devices=1) finish with the same final metrics and the same all-to-all bytes as the
2-process single-node run of the same config (Lightning's own launcher, devices=2). docs/multinode.md describes
the recipe this runs.

No port is chosen, closed and handed on (another process could take it in between): both launches rendezvous
through a TCPStore this test hosts on port 0 and keeps bound (lightning_dlac/testing/launch.py ``hosted_store``). The
torchrun
agents use it as their c10d rendezvous endpoint (``is_host=false``); the node that becomes rank 0 then hosts the
workers' store on a port of its own kernel's choosing. Each process writes its output to a file, so neither can
block on a full pipe while the other waits for it in a collective."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_dlac.testing import hosted_store

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dlrm_synthetic.yaml"
# Variables a launcher sets; each run here starts from a clean environment and its launcher sets its own.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "PL_GLOBAL_SEED")  # fmt: skip
RUN = ["--trainer.max_steps=6", "--trainer.val_check_interval=3", "--trainer.log_every_n_steps=2",
       "--trainer.enable_progress_bar=false", "--data.batch_size=256", "--data.max_rows=200",
       "--data.num_train_batches=6", "--data.num_val_batches=2", "--model.embedding_dim=16",
       "--model.dense_arch_layer_sizes=[16, 16]", "--model.over_arch_layer_sizes=[16, 1]"]  # fmt: skip


def _config(tmp_path: Path, name: str) -> Path:
    """The demo config with its callback schedule scaled down to a 6-step run and logs under tmp_path/name."""
    text = CONFIG.read_text()
    for old, new in (("calibration_start: 48", "calibration_start: 1"), ("calibration_batches: 8",
                     "calibration_batches: 2"), ("T: 96", "T: 4"), ("log_every_n_steps: 16", "log_every_n_steps: 2"),
                     ("save_dir: logs", f"save_dir: {tmp_path / name}")):  # fmt: skip
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["OMP_NUM_THREADS"] = "1"  # the same threads in both launches, so the arithmetic is the same
    return env


def _bin(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if not path.is_file():
        pytest.fail(f"{name} is not installed next to {sys.executable}; install the project (pip install -e .)")
    return str(path)


def _run_together(commands: list[list[str]], logs: list[Path], cwd: Path, env: dict[str, str],
                  timeout: float) -> list[int]:
    """Start every command at once, each writing to its log file; return their exit codes. As soon as one fails,
    the others are killed (they would wait for it in a collective), with the processes they started; all are killed
    at ``timeout``."""
    files = [log.open("w") for log in logs]
    procs = [subprocess.Popen(c, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
             for c, f in zip(commands, files)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the launcher and the ranks it started (its session)
            p.wait()
        for f in files:
            f.close()
    return [p.returncode for p in procs]


def _run_record(log_root: Path) -> dict:
    (run_dir,) = list(log_root.glob("dlrm_synthetic/version_*"))
    return json.loads((run_dir / "dlac_run.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_by_torchrun_match_one_node_with_two_processes(tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    # One node, two processes: Lightning's own launcher starts the second; both join the store hosted here.
    with hosted_store() as store:
        env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
        (code,) = _run_together(
            [[_bin("dlac"), "fit", "--config", str(_config(tmp_path, "single")), "--trainer.devices=2", *RUN]],
            [tmp_path / "single.log"], work, env, timeout=420,
        )  # fmt: skip
    assert code == 0, (tmp_path / "single.log").read_text()[-6000:]

    # Two "nodes" of one process each, rendezvous through the store hosted here, both started here as on two hosts.
    config = _config(tmp_path, "multi")
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    with hosted_store() as store:
        codes = _run_together(
            [[_bin("torchrun"), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{store.port}", "--rdzv-id=dlac-multinode-test", "--rdzv-conf=is_host=false",
              "--local-addr=127.0.0.1", "--no-python", _bin("dlac"), "fit", "--config", str(config),
              "--trainer.num_nodes=2", "--trainer.devices=1", *RUN] for _ in range(2)],
            logs, work, _env(), timeout=420,
        )  # fmt: skip
    outputs = [log.read_text() for log in logs]
    for k, (code, out) in enumerate(zip(codes, outputs)):
        assert code == 0, f"node {k} (exit codes {codes}):\n{out[-6000:]}"

    one, two = _run_record(tmp_path / "single"), _run_record(tmp_path / "multi")
    assert one["summary"]["world_size"] == two["summary"]["world_size"] == 2
    assert one["summary"]["batches"] == two["summary"]["batches"] == 6
    # The same data, sharding and codec: the same compressed bytes and the same final metrics.
    assert (two["summary"]["raw_bytes"], two["summary"]["sent_bytes"]) == (
        one["summary"]["raw_bytes"], one["summary"]["sent_bytes"])  # fmt: skip
    assert set(one["final_metrics"]) == set(two["final_metrics"]) and "val/auroc" in one["final_metrics"]
    for key, value in one["final_metrics"].items():
        assert two["final_metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    # The node the rendezvous made node 0 hosts global rank 0, which alone prints the end-of-run line.
    finished = [out for out in outputs if "dlac fit finished after 6 steps" in out]
    assert len(finished) == 1 and sum("dlac fit finished" in out for out in outputs) == 1, outputs[0][-4000:]
