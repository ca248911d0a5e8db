"""Failures between ranks during training: a rank that dies or raises mid-step makes the others fail within the
collective timeout, with an error, instead of hanging."""

from __future__ import annotations

import os
import re
import time

import lightning.pytorch as pl
import pytest

from lightning_dlac import DLACStrategy
from tests._launch import run_ranks
from tests.test_strategy import small_data, small_dlrm, trainer

TIMEOUT_S = 6.0


class _Fail(pl.Callback):
    """On one rank, at one training batch, die (os._exit) or raise inside the exchange's encode."""

    def __init__(self, rank: int, batch: int, how: str) -> None:
        self.rank, self.batch, self.how = rank, batch, how

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_rank != self.rank or batch_idx != self.batch:
            return
        if self.how == "dies":
            os._exit(7)  # the process vanishes mid-step, as a killed or crashed rank would
        from lightning_dlac.comm import all_to_all

        def failing_encode_grid(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise RuntimeError("injected encode failure on this rank")

        all_to_all.encode_grid = failing_encode_grid


def _train_until_failure(rank: int, world_size: int, how: str) -> dict:
    t = trainer(world_size, DLACStrategy(timeout=TIMEOUT_S), max_epochs=1, callbacks=[_Fail(1, 2, how)],
                limit_val_batches=0)
    start = time.perf_counter()
    try:
        t.fit(small_dlrm(), datamodule=small_data(train_batches=6))
    except BaseException as err:  # noqa: BLE001 - report whatever surfaced, and how long it took
        return {"error": f"{type(err).__name__}: {err}"[:2000], "elapsed": time.perf_counter() - start}
    return {"error": None, "elapsed": time.perf_counter() - start}


@pytest.mark.parametrize("how", ["dies", "raises"])
def test_a_failing_rank_makes_the_other_fail_instead_of_hanging(how: str) -> None:
    expect_exit = {1: 7} if how == "dies" else {}
    survivor, failing = run_ranks(_train_until_failure, 2, how, timeout=120, expect_exit=expect_exit)
    if how == "raises":
        assert "injected encode failure on this rank" in failing["error"]
    assert survivor["error"] is not None, "rank 0 finished training without its peer"
    # gloo names the broken link (the peer's own log has the root cause), or the timeout if the peer stays alive.
    assert re.search(r"Connection (reset|closed)|[Tt]imed out|[Tt]imeout", survivor["error"]), survivor
    # It fails at the latest one collective timeout after the failure (plus start-up), never hangs.
    assert survivor["elapsed"] < 60, survivor
