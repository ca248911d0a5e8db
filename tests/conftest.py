"""Suite-wide set-up and the helpers several test modules share.

Only pytest and torch (and, where installed, Hypothesis) are imported at module level: the codec tests must still
collect on a machine that has torch alone (the GPU image). Everything that needs lightning or torchrec imports it
inside the helper that uses it.

- Native build honesty: where a C++ compiler exists the native codec and the native Criteo parser are expected to
  build, and ``DLAC_CODEC_IMPL=native`` and ``DLAC_PREPROCESS_IMPL=native`` are set for the whole run (this
  process, spawned ranks and subprocesses inherit them), overriding whatever the shell set, so every ``"auto"`` in
  the suite runs the native code or fails loudly instead of silently testing the reference twice.
  ``DLAC_TESTS_ALLOW_NO_NATIVE=1`` is the only way out (native tests skip, "auto" falls back with a warning, the
  shell's values stand), for machines whose compiler cannot build torch extensions.
- Processes belong to slow tests: a test not marked ``slow`` that starts a process (``multiprocessing``, spawned
  ranks, DataLoader workers, ``subprocess``) fails, naming what it started, so ``make test-fast`` stays fast and
  in-process. Building the native code (the compiler and ninja, run by torch's JIT loader) is not counted.
- Hypothesis runs derandomized (a fixed seed per test) when ``CI=true``: a red CI run replays on every machine.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch

ALLOW_NO_NATIVE = "DLAC_TESTS_ALLOW_NO_NATIVE"

try:
    from hypothesis import settings as _hypothesis_settings
except ModuleNotFoundError:  # the codec property tests need it; everything else runs without
    _hypothesis_settings = None
else:
    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        _hypothesis_settings.load_profile("ci")


def compiler_present() -> bool:
    """Whether the C++ compiler the native loader would use (``$CXX``, else ``c++``) is on PATH."""
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def native_opted_out() -> bool:
    """Whether ``DLAC_TESTS_ALLOW_NO_NATIVE`` allows the native codec to be missing."""
    return os.environ.get(ALLOW_NO_NATIVE, "").strip().lower() in ("1", "true", "yes")


def native_expected() -> bool:
    """The native codec must build here: a compiler exists and the opt-out is not set."""
    return compiler_present() and not native_opted_out()


# The implementation variables the suite pins to "native" (DLAC_TESTS_ALLOW_NO_NATIVE=1 leaves them to the shell).
NATIVE_IMPL_VARS = ("DLAC_CODEC_IMPL", "DLAC_PREPROCESS_IMPL")


def pytest_configure(config: Any) -> None:
    if not native_expected():
        return
    overridden = {k: os.environ[k] for k in NATIVE_IMPL_VARS if os.environ.get(k, "native") != "native"}
    os.environ.update(dict.fromkeys(NATIVE_IMPL_VARS, "native"))
    if overridden:
        import warnings

        warnings.warn(
            f"the test suite runs the native code: it ignores {overridden} from the environment. To test without"
            f" the native code, set {ALLOW_NO_NATIVE}=1 (then the shell's values apply).",
            stacklevel=1,
        )


# ------------------------------------------------------------------------------- processes belong to slow tests

# Frames of code allowed to start processes inside any test: building native code (torch's JIT loader runs the
# compiler and ninja) and the one-time font scan of matplotlib, neither of which runs test work in another process.
_SPAWN_ALLOWED = ("torch/utils/cpp_extension.py", "matplotlib/font_manager.py", "ctypes/util.py")


def _spawn_allowed() -> bool:
    import traceback

    return any(frame.filename.replace(os.sep, "/").endswith(_SPAWN_ALLOWED) for frame in traceback.extract_stack())


class _SpawnRecorder:
    """Records every process started while active (multiprocessing starts, subprocess launches), outside the
    allowed builders."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __enter__(self) -> _SpawnRecorder:
        import multiprocessing.process
        import subprocess

        self._mp_start = multiprocessing.process.BaseProcess.start
        self._execute_child = subprocess.Popen._execute_child
        recorder = self

        def start(process: Any) -> None:
            if not _spawn_allowed():
                recorder.started.append(f"a {type(process).__name__} (multiprocessing)")
            return recorder._mp_start(process)

        def execute_child(popen: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
            if not _spawn_allowed():
                words = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
                recorder.started.append("subprocess " + " ".join(str(w)[:60] for w in words[:3]))
            return recorder._execute_child(popen, args, *rest, **kwargs)

        multiprocessing.process.BaseProcess.start = start
        subprocess.Popen._execute_child = execute_child
        return self

    def __exit__(self, *exc: Any) -> None:
        import multiprocessing.process
        import subprocess

        multiprocessing.process.BaseProcess.start = self._mp_start
        subprocess.Popen._execute_child = self._execute_child


def _unmarked_spawns(item: pytest.Item, phase: str) -> Any:
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with _SpawnRecorder() as recorder:
        result = yield
    if recorder.started:
        seen = sorted(set(recorder.started))
        pytest.fail(
            f"{item.nodeid} started {len(recorder.started)} process(es) in its {phase} ({', '.join(seen[:4])}) but"
            " is not marked @pytest.mark.slow: tests that start processes are slow tests (make test-fast skips"
            " them). Mark it slow, or keep its work in this process.",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    return (yield from _unmarked_spawns(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _unmarked_spawns(item, "call"))


# ------------------------------------------------------------------------------------ the small DLRM of the tests

FEATURES = [f"cat_{i}" for i in range(26)]  # the Criteo layout: 26 categorical features, one table each
TABLES = [f"t_cat_{i}" for i in range(26)]
ROWS = [40 + 20 * i for i in range(26)]


def small_dlrm(seed: int = 0, **kwargs: Any) -> Any:
    """The example DLRM with 26 small tables (40-540 rows, dim 16) and tiny MLPs."""
    from lightning_dlac.examples.dlrm import DLRMModule

    return DLRMModule(
        num_embeddings_per_feature=ROWS,
        feature_names=FEATURES,
        embedding_dim=16,
        dense_arch_layer_sizes=[32, 16],
        over_arch_layer_sizes=[32, 1],
        seed=seed,
        **kwargs,
    )


def small_data(seed: int = 0, train_batches: int = 30, batch_size: int = 64) -> Any:
    """Synthetic Criteo-like batches for :func:`small_dlrm` (4 validation batches)."""
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    return SyntheticCriteoDataModule(
        num_embeddings_per_feature=ROWS,
        batch_size=batch_size,
        num_train_batches=train_batches,
        num_val_batches=4,
        seed=seed,
    )


def trainer(world_size: int, strategy: Any = None, **kwargs: Any) -> Any:
    """A quiet CPU Trainer on ``world_size`` devices with ``strategy`` (default ``DLACStrategy()``)."""
    import lightning.pytorch as pl

    from lightning_dlac import DLACStrategy

    defaults = dict(
        accelerator="cpu",
        devices=world_size,
        strategy=strategy if strategy is not None else DLACStrategy(),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


def run_length(batches: float, accumulate: int = 1, done: int = 0) -> Any:
    """What DLACCallback reads of a Trainer about the run's length, without one: ``batches`` optimizer steps
    (``estimated_stepping_batches``) of ``accumulate`` batches each, ``done`` training batches already run (a
    resumed run's)."""
    from types import SimpleNamespace

    progress = SimpleNamespace(total=SimpleNamespace(completed=done))
    return SimpleNamespace(estimated_stepping_batches=batches, accumulate_grad_batches=accumulate,
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))


def load_global_weights(module: torch.nn.Module, global_state: dict[str, torch.Tensor]) -> None:
    """Copy an unsharded state dict into a sharded module: each rank fills the shards it owns. Every entry of the
    module's state dict must be in ``global_state``."""
    from lightning_dlac.engine.sharding import load_unsharded_state

    missing = [key for key in module.state_dict() if key not in global_state]
    if missing:
        raise KeyError(f"global_state lacks {missing}")
    load_unsharded_state(module, global_state)


def loss_recorder() -> Any:
    """A Lightning callback whose ``losses`` lists the training loss of every batch."""
    import lightning.pytorch as pl

    class LossRecorder(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
            self.losses.append(float(outputs["loss"]))

    return LossRecorder()


def bounds_recorder(dlac: Any) -> Any:
    """A Lightning callback that records, for every training batch, the bound multiplier, every table's effective
    bound and the callback's table bounds (placed after ``dlac``, it sees the bounds each batch is sent with)."""
    import lightning.pytorch as pl

    class BoundsRecorder(pl.Callback):
        def __init__(self) -> None:
            self.multipliers: list[float] = []
            self.effective: list[dict[str, float]] = []
            self.table_bounds: list[dict[str, float]] = []
            self.calibrated_at_first_batch: bool | None = None
            self.dlac = dlac

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
            bounds = trainer.strategy.error_bounds
            self.multipliers.append(bounds.multiplier)
            self.effective.append({t: bounds.effective(t) for t in TABLES})
            self.table_bounds.append(self.dlac.table_bounds)
            if self.calibrated_at_first_batch is None:
                self.calibrated_at_first_batch = self.dlac.calibrated and bool(bounds.table_bounds())

    return BoundsRecorder()


def memory_logger() -> Any:
    """A Lightning logger that is neither CSV nor TensorBoard: ``rows`` holds every ``(step, metrics)`` written."""
    import lightning.pytorch as pl

    class MemoryLogger(pl.loggers.Logger):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int | None, dict[str, float]]] = []

        @property
        def name(self) -> str:
            return "memory"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, params, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
            pass

    return MemoryLogger()


# ------------------------------------------------------------------------------------- a Criteo Kaggle-format TSV


def write_criteo_tsv(path: Any, rows: int = 10_000, positives: int = 2_180, seed: int = 0,
                     bad_lines: dict[int, str] | None = None) -> Any:
    """Write ``rows`` lines in the Criteo Kaggle layout (label, 13 integer and 26 hashed categorical fields,
    tab-separated, empty = missing) to ``path``; return it.

    As in the real file: ``positives`` labels are 1; integer fields are heavy-tailed counts, about 10% missing, and
    ``int_1`` is sometimes negative (-1..-3); categorical fields are 8-digit lowercase hex hashes of Zipf-distributed
    ids, missing at a per-feature rate (0-15%). ``bad_lines`` ({1-based line number: text}) replaces those lines with
    malformed ones, for the parser's error paths.
    """
    import random
    from pathlib import Path

    rng = random.Random(seed)
    labels = [1] * positives + [0] * (rows - positives)
    rng.shuffle(labels)
    lines = []
    for i in range(rows):
        fields = [str(labels[i])]
        for k in range(13):
            r = rng.random()
            if r < 0.1:
                fields.append("")
            elif k == 1 and r < 0.25:
                fields.append(str(-rng.randint(1, 3)))
            else:
                fields.append(str(int(rng.paretovariate(1.1)) - 1 + (1000 if k == 4 else 0) * rng.randint(0, 3)))
        for k in range(26):
            if rng.random() < 0.05 * (k % 4):
                fields.append("")
            else:
                token = int(rng.paretovariate(1.05)) * 2654435761 + k * 40503  # Zipf-like id, hashed to 32 bits
                fields.append(f"{token & 0xFFFFFFFF:08x}")
        lines.append("\t".join(fields))
    for number, text in (bad_lines or {}).items():
        lines[number - 1] = text
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
