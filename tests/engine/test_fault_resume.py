"""A run stopped by a fault resumes from its last checkpoint (``ckpt_path="last"``) to the uninterrupted run's end,
without torchrun: the same weights (dense layers and table shards, bit for bit), losses and final metrics.

The faults (tests/_faults.py) hit rank 1 at batch 5, after the checkpoint of step 4: a payload corrupted in transit
(rank 0 fails to decode it: ``CompressedExchangeError``) and a killed peer (SIGKILL; rank 0 fails as the link
closes). tests/engine/test_elastic.py covers killed workers that torchrun restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_dlac import DLACStrategy
from lightning_dlac.testing import run_ranks
from tests._faults import Fault
from tests.conftest import loss_recorder, small_data, small_dlrm, trainer

BATCHES = 8  # training batches of the run (one epoch), then its 4 validation batches
EVERY = 2  # steps between checkpoints
FAULT_AT = 5  # the batch the fault hits
LAST_CHECKPOINT = 4  # the step of the last checkpoint before it: the resumed run trains batches 4 to 7
TIMEOUT_S = 20  # a rank left waiting for a peer that failed ends at this collective timeout at most


def _fit(rank: int, world_size: int, ckpt_dir: str | None, fault: str | None, resume: bool) -> dict:
    """One fit of the small DLRM; with ``ckpt_dir`` a ModelCheckpoint keeps the last checkpoint there every
    ``EVERY`` steps; ``fault`` hits rank 1 at ``FAULT_AT``; ``resume`` starts from ``ckpt_path="last"``."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    torch.manual_seed(0)
    model, recorder = small_dlrm(), loss_recorder()
    callbacks: list = [recorder]
    if ckpt_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=EVERY, save_top_k=0, save_last=True))
    if fault is not None:
        callbacks.append(Fault(fault, rank=1, batch=FAULT_AT))
    t = trainer(world_size, DLACStrategy(timeout=TIMEOUT_S), max_epochs=1, callbacks=callbacks,
                enable_checkpointing=ckpt_dir is not None)
    try:
        t.fit(model, datamodule=small_data(train_batches=BATCHES), ckpt_path="last" if resume else None)
    except Exception as err:  # noqa: BLE001 - the fault's consequence on this rank, reported
        return {"error": f"{type(err).__name__}: {err}", "step": t.global_step}
    weights = {}  # as bytes: equal means bit for bit
    for key, value in model.state_dict().items():
        tensors = [s.tensor for s in value.local_shards()] if isinstance(value, ShardedTensor) else [value]
        weights[key] = [x.numpy().tobytes() for x in tensors]
    metrics = {k: float(v) for k, v in t.callback_metrics.items()}
    return {"error": None, "losses": recorder.losses, "weights": weights, "metrics": metrics, "step": t.global_step}


@pytest.fixture(scope="module")
def uninterrupted() -> list[dict]:
    return run_ranks(_fit, 2, None, None, False, timeout=170)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fault", ["corrupt", "kill"])
def test_a_run_stopped_by_a_fault_resumes_from_its_last_checkpoint_to_the_same_end(
        tmp_path: Path, fault: str, uninterrupted: list[dict]) -> None:
    ckpt = str(tmp_path / "checkpoints")
    stopped = run_ranks(_fit, 2, ckpt, fault, False, timeout=170, expect_exit={1: -9} if fault == "kill" else None)
    if fault == "corrupt":
        assert stopped[0]["error"].startswith("CompressedExchangeError: rank 0: pooled embeddings of table"), stopped
        assert "received from rank 1 failed to decode" in stopped[0]["error"], stopped
        assert stopped[1]["error"] is not None, stopped  # its peer left the run: it did not train on alone
    else:
        assert stopped[0]["error"] is not None and stopped[1] is None, stopped
    assert stopped[0]["step"] == FAULT_AT, stopped
    assert sorted(p.name for p in Path(ckpt).iterdir()) == ["last.ckpt"]
    resumed = run_ranks(_fit, 2, ckpt, None, True, timeout=170)
    for rank, (u, r) in enumerate(zip(uninterrupted, resumed)):
        assert u["error"] is None and r["error"] is None, (u, r)
        assert r["step"] == u["step"] == BATCHES
        assert r["losses"] == u["losses"][LAST_CHECKPOINT:], rank
        differ = sorted(k for k in u["weights"] if u["weights"][k] != r["weights"][k])
        assert not differ, f"rank {rank}: these weights differ from the uninterrupted run's at the end: {differ}"
        assert r["metrics"] == u["metrics"] and r["metrics"], rank
