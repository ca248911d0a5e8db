"""benchmarks/gpu_session.sh, rehearsed without a GPU: it runs clean, and every way a real session can go wrong makes it
exit non-zero instead of counting as skipped (issue 36). Stand-ins on PATH play the parts this machine lacks: an
``nvidia-smi`` that lists a GPU torch cannot use, and a ``compute-sanitizer`` that either cannot run here or finds an
error. The benchmark's parity fault is injected through DLAC_SESSION_BENCH_ARGS."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.lib.paths import REPO

FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
[ "$1" = -L ] && { echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0; }
echo "name, memory.total [MiB], driver_version, clocks.max.sm [MHz]"
echo "NVIDIA H200, 143771 MiB, 570.00, 1980 MHz"
"""

# The probe is the one call whose command holds "device='cuda'": "unsupported" fails it as a driver that refuses the
# tool would; "finds" passes it and reports an error in whatever it is then asked to run (after running it).
FAKE_SANITIZER = """#!/usr/bin/env bash
if [ "$1" = --version ]; then echo "NVIDIA (R) Compute Sanitizer (stand-in)"; exit 0; fi
if [[ "$*" == *"device='cuda'"* ]]; then
  if [ "$DLAC_FAKE_SANITIZER" = unsupported ]; then
    echo "========= Error: Target application returned an error: device not supported"; exit 1
  fi
  exit 0
fi
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do
  case "$1" in --tool|--error-exitcode|--report-api-errors|--print-limit|--racecheck-report) shift 2;; *) shift;; esac
done
"$@"
echo "========= Invalid __global__ read of size 4 bytes (stand-in finding)"
echo "========= ERROR SUMMARY: 1 error"
exit 3
"""


def _tools(tmp_path: Path, nvidia_smi: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"compute-sanitizer": FAKE_SANITIZER, **({"nvidia-smi": FAKE_NVIDIA_SMI} if nvidia_smi else {})}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _session(tmp_path: Path, nvidia_smi: bool, sanitizer: str, bench_args: str = "") -> tuple[int, str, Path]:
    out = tmp_path / "out"
    bin_dir = _tools(tmp_path, nvidia_smi)
    # The machine's own PATH without any real nvidia-smi or compute-sanitizer: the stand-ins are the only ones.
    path = [str(bin_dir), str(Path(sys.executable).parent)]
    path += [p for p in os.environ.get("PATH", "").split(os.pathsep)
             if p and not any((Path(p) / t).exists() for t in ("nvidia-smi", "compute-sanitizer"))]
    # The suite's own build cache (the session's default is /tmp/dlac_extensions, for the lent machine): the
    # extensions the rest of the suite built already are found there instead of built again.
    from lightning_dlac.native.build import cache_root

    env = {"DLAC_EXTENSION_DIR": str(cache_root()),
           **os.environ, "PATH": os.pathsep.join(path), "OUT": str(out), "PYTHON": sys.executable,
           "CUDA_HOME": str(tmp_path / "no-cuda"), "DLAC_FAKE_SANITIZER": sanitizer, "DLAC_SESSION_DAMAGED": "10",
           "DLAC_SESSION_BENCH_ARGS": bench_args}
    proc = subprocess.Popen(["bash", str(REPO / "benchmarks" / "gpu_session.sh")], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, stdout, out


def _status(stdout: str, stage: str) -> str:
    summary = stdout[stdout.rindex("GPU session summary"):]
    match = re.search(rf"^{re.escape(stage)}\s+(.+?)\s+\d+\s+\S+$", summary, re.M)
    assert match, summary
    return match.group(1)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_rehearsal_runs_clean_and_a_sanitizer_that_cannot_run_is_not_a_finding(tmp_path: Path) -> None:
    rc, stdout, out = _session(tmp_path, nvidia_smi=False, sanitizer="unsupported")
    assert rc == 0, stdout[-4000:]
    assert _status(stdout, "4 benchmark") == "rehearsed (no GPU)"
    assert _status(stdout, "5 memcheck") == _status(stdout, "6 sanitizers") == "rehearsed; sanitizer unsupported"
    assert "compute-sanitizer cannot run a trivial CUDA program here" in (out / "5_memcheck.txt").read_text()
    assert "10 damaged payloads decoded whole and by chunk" in stdout  # a count, not a time
    grid_cases = re.search(r"sanitizer workload \(small\): (\d+) results, all equal", stdout)
    assert grid_cases and int(grid_cases.group(1)) >= 24, stdout[-3000:]  # every grid case of the CUDA tests
    assert (out / "4_bench.json").is_file() and "metadata" in (out / "4_bench.json").read_text()
    # The MX4 baseline cannot run in the rehearsal: it is listed as not measured, with the reason, not dropped.
    assert '"codec": "mx4 (fbgemm triton)"' in (out / "4_bench.json").read_text()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_an_unusable_gpu_a_parity_fault_and_a_sanitizer_finding_each_fail_the_session(tmp_path: Path) -> None:
    rc, stdout, _ = _session(tmp_path, nvidia_smi=True, sanitizer="finds", bench_args="--inject-parity-fault")
    assert rc != 0, stdout[-4000:]
    assert re.search(r"ERROR: nvidia-smi lists 1 GPU\(s\) \(GPU 0: NVIDIA H200.*\) but torch .*"
                     r"torch\.cuda\.is_available\(\) is False", stdout), stdout[-3000:]
    assert _status(stdout, "0 device") == "FAILED (GPU unusable)"
    assert _status(stdout, "4 benchmark").startswith("FAILED")
    assert "disagree with the CPU kernels" in stdout
    assert _status(stdout, "5 memcheck") == "FAILED (exit 3)"
