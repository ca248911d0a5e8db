"""Multi-node launch on one machine: 2 "nodes" x 1 process started by torchrun on 127.0.0.1 through `dlac fit`
(trainer num_nodes=2, devices=1) finish with the same final metrics and the same all-to-all bytes as the
2-process single-node run of the same config (Lightning's own launcher, devices=2). docs/multinode.md describes
the recipe this runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "dlrm_synthetic.yaml"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_record(log_root: Path) -> dict:
    (run_dir,) = list(log_root.glob("dlrm_synthetic/version_*"))
    return json.loads((run_dir / "dlac_run.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_by_torchrun_match_one_node_with_two_processes(tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    # One node, two processes: Lightning's own launcher starts the second.
    single = subprocess.run(
        [_bin("dlac"), "fit", "--config", str(_config(tmp_path, "single")), "--trainer.devices=2", *RUN],
        cwd=work, env=_env(), capture_output=True, text=True, timeout=420,
    )  # fmt: skip
    assert single.returncode == 0, (single.stdout + single.stderr)[-6000:]

    # Two "nodes" of one process each, rendezvous on 127.0.0.1, both started here as on two hosts.
    port = _free_port()
    config = _config(tmp_path, "multi")
    nodes = [
        subprocess.Popen(
            [_bin("torchrun"), "--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
             f"--master-port={port}", "--no-python", _bin("dlac"), "fit", "--config", str(config),
             "--trainer.num_nodes=2", "--trainer.devices=1", *RUN],
            cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for k in range(2)
    ]
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=420)
            outputs.append(out)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    for k, (node, out) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {k}:\n{out[-6000:]}"

    one, two = _run_record(tmp_path / "single"), _run_record(tmp_path / "multi")
    assert one["summary"]["world_size"] == two["summary"]["world_size"] == 2
    assert one["summary"]["batches"] == two["summary"]["batches"] == 6
    # The same data, sharding and codec: the same compressed bytes and the same final metrics.
    assert (two["summary"]["raw_bytes"], two["summary"]["sent_bytes"]) == (
        one["summary"]["raw_bytes"], one["summary"]["sent_bytes"])  # fmt: skip
    assert set(one["final_metrics"]) == set(two["final_metrics"]) and "val/auroc" in one["final_metrics"]
    for key, value in one["final_metrics"].items():
        assert two["final_metrics"][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    # Node 0 hosts global rank 0, which prints the end-of-run line (stdout or rank-zero logging on stderr).
    assert "dlac fit finished after 6 steps" in outputs[0], outputs[0][-4000:]
    assert "dlac fit finished" not in outputs[1]
