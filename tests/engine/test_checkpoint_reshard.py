"""A checkpoint written by 2 ranks resumes on 3 ranks and on 1 (torch.distributed.checkpoint reshards): identical
embedding tables and fused optimizer state, DLACCallback state carried, and rank 0 warns that the random state
cannot continue exactly (rank 2 of 3 derives its own); a checkpoint for other tables is refused naming the table."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from lightning_dlac import DLACCallback
from lightning_dlac.testing import run_ranks
from tests.conftest import FEATURES, ROWS, small_data, small_dlrm, trainer

STEPS = 6


def _local_state(t) -> dict[str, np.ndarray]:  # noqa: ANN001
    """This rank's table shards and their fused-optimizer state, whole tables under table-wise sharding (as numpy
    arrays: tensors would cross to the parent as shared-memory handles of a process that has exited)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    weights = t.lightning_module.embedding_bag_collection.state_dict()
    optimizer = t.strategy.distributed_model.fused_optimizer.state_dict()["state"]
    named = [(k, v) for k, v in weights.items()]
    named += [(f"{param}/{name}", v) for param, state in optimizer.items() for name, v in state.items()]
    for key, value in named:
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                out[key] = shard.tensor.detach().cpu().numpy().copy()
    return out


def _run(rank: int, world_size: int, ckpt: str, phase: str) -> dict:
    torch.manual_seed(0)
    dlac = DLACCallback(calibration_batches=2, sensitivity_batches=0, schedule="linear", T=10, log_every_n_steps=2,
                        report=False)
    t = trainer(world_size, max_steps=STEPS, callbacks=[dlac], limit_val_batches=0)
    if phase == "save":
        t.fit(small_dlrm(), datamodule=small_data(train_batches=STEPS))
        t.save_checkpoint(ckpt)
    elif phase == "other_tables":
        from lightning_dlac.examples.dlrm import DLRMModule

        rows = [ROWS[0] + 8, *ROWS[1:]]  # table t_cat_0 has 8 more rows than the checkpoint's
        model = DLRMModule(num_embeddings_per_feature=rows, feature_names=FEATURES, embedding_dim=16,
                           dense_arch_layer_sizes=[32, 16], over_arch_layer_sizes=[32, 1])
        try:
            t.fit(model, datamodule=small_data(train_batches=STEPS), ckpt_path=ckpt)
        except RuntimeError as err:
            return {"error": str(err)}
        return {"error": None}
    else:  # resume: the loop restores global step STEPS = max_steps, so nothing trains after loading
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.fit(small_dlrm(seed=1), datamodule=small_data(train_batches=STEPS), ckpt_path=ckpt)
        random_state = [str(w.message) for w in caught if "random" in str(w.message).lower()]
    return {"state": _local_state(t), "bounds": dlac.table_bounds, "step": dlac.step,
            "calibrations": dlac.calibrator.calibrations, "global_step": t.global_step,
            "random_state_warnings": random_state if phase == "resume" else []}


def _union(results: list[dict]) -> dict[str, np.ndarray]:
    merged: dict[str, np.ndarray] = {}
    for r in results:
        assert not set(merged) & set(r["state"]), "a table-wise table was held by two ranks"
        merged.update(r["state"])
    return merged


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    """A checkpoint written by 2 ranks after a short calibrated fit, and what each rank held."""
    ckpt = str(tmp_path_factory.mktemp("reshard") / "ckpt")
    return ckpt, run_ranks(_run, 2, ckpt, "save")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_two_rank_checkpoint_resumes_on_three_ranks_and_on_one(saved: tuple[str, list[dict]]) -> None:
    ckpt, saved = saved
    expected = _union(saved)
    assert len([k for k in expected if k.endswith(".weight")]) == 26 and any("/" in k for k in expected)
    for world in (3, 1):
        resumed = run_ranks(_run, world, ckpt, "resume")
        got = _union(resumed)
        assert sorted(got) == sorted(expected), world
        for key, value in expected.items():
            # A different initialisation (seed=1) before loading: equality means every shard came from the file.
            assert np.array_equal(got[key], value), (world, key)
        assert [len(r["random_state_warnings"]) for r in resumed] == [1] + [0] * (world - 1)  # rank 0 says it
        assert f"written by 2 rank(s) and resumes on {world}" in resumed[0]["random_state_warnings"][0]
        for r in resumed:
            assert r["global_step"] == STEPS and r["step"] == saved[0]["step"] == STEPS
            assert r["bounds"] == saved[0]["bounds"] and r["calibrations"] == saved[0]["calibrations"]


@pytest.mark.slow
def test_a_checkpoint_for_other_tables_is_refused_naming_the_table(saved: tuple[str, list[dict]]) -> None:
    for r in run_ranks(_run, 2, saved[0], "other_tables"):
        assert r["error"] is not None and "does not fit this model" in r["error"], r
        assert "t_cat_0" in r["error"], r["error"]
