"""Failures between ranks during training: a rank that dies or raises mid-step makes the others fail with an error
instead of hanging: at once when its process is gone, at the collective timeout when it stays alive.

Nothing is timed. A survivor is given a collective timeout (600 s) far beyond the test's own limit, so a test that
passes proves the failure was detected without waiting for it; where the timeout itself is under test, the error
must name the timeout the strategy was given."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest

from lightning_dlac import CompressionOptions, DLACStrategy
from lightning_dlac.testing import netem, run_ranks
from tests._faults import Fault, kill_stopped
from tests.conftest import loss_recorder, small_data, small_dlrm, trainer

SURVIVOR_TIMEOUT_S = 600  # far beyond the tests' own limits: reaching it fails the test
HUNG_PEER_TIMEOUT_S = 15  # the collective timeout under test: a live peer that stopped answering


class _Fail(pl.Callback):
    """On one rank, at one training batch, die (os._exit) or raise inside the exchange's encode."""

    def __init__(self, rank: int, batch: int, how: str) -> None:
        self.rank, self.batch, self.how = rank, batch, how

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_rank != self.rank or batch_idx != self.batch:
            return
        if self.how == "dies":
            os._exit(7)  # the process vanishes mid-step, as a killed or crashed rank would
        from lightning_dlac.comm import exchange

        def failing_encode_grid(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise RuntimeError("injected encode failure on this rank")

        exchange.encode_grid = failing_encode_grid


def _in_step(workdir: Path, rank: int, world_size: int) -> None:
    """A barrier outside torch.distributed (the process group does not exist yet): every rank leaves a marker and
    waits for all of them; the test's timeout bounds the wait."""
    (workdir / f"ready_{rank}").touch()
    while not all((workdir / f"ready_{r}").exists() for r in range(world_size)):
        time.sleep(0.01)


def _train_until_failure(rank: int, world_size: int, how: str, timeout_s: float, workdir: str) -> dict:
    """Fit until rank 1 fails at batch 2. With ``how="hangs"`` rank 1 raises and then stays alive, out of every
    collective, until rank 0 is done (rank 0 leaves a marker): rank 0 waits in the exchange for a peer that never
    comes."""
    import torchrec.distributed.model_parallel  # noqa: F401 - imported before the fit, as below
    import torchrec.distributed.planner  # noqa: F401

    from lightning_dlac.codec import native_available

    rank0_done = Path(workdir) / "rank0_done"
    t = trainer(world_size, DLACStrategy(timeout=timeout_s), max_epochs=1,
                callbacks=[_Fail(1, 2, "raises" if how == "hangs" else how)], limit_val_batches=0)
    model, data = small_dlrm(), small_data(train_batches=6)
    # The ranks enter the fit together, with the heavy imports and the native build behind them: a short timeout
    # must only ever meet the hung peer, not a rank still starting up on a busy machine.
    native_available()
    _in_step(Path(workdir), rank, world_size)
    try:
        t.fit(model, datamodule=data)
        error = None
    except BaseException as err:  # noqa: BLE001 - report whatever surfaced
        error = f"{type(err).__name__}: {err}"[:2000]
    if rank == 0:
        rank0_done.touch()
    elif how == "hangs":
        while not rank0_done.exists():  # alive and silent; the test's timeout bounds the wait
            time.sleep(0.01)
    return {"error": error}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["dies", "raises"])
def test_a_failing_rank_makes_the_other_fail_instead_of_hanging(tmp_path: Path, how: str) -> None:
    expect_exit = {1: 7} if how == "dies" else {}
    survivor, failing = run_ranks(_train_until_failure, 2, how, SURVIVOR_TIMEOUT_S, str(tmp_path), timeout=170,
                                  expect_exit=expect_exit)
    if how == "raises":
        assert "injected encode failure on this rank" in failing["error"]
    assert survivor["error"] is not None, "rank 0 finished training without its peer"
    # gloo names the broken link: the failing process is gone, so nothing waited for the collective timeout
    # (SURVIVOR_TIMEOUT_S, far longer than this test may run).
    assert re.search(r"Connection (reset|closed)", survivor["error"]), survivor


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_timeout_ends_a_collective_waiting_for_a_hung_peer(tmp_path: Path) -> None:
    """DLACStrategy(timeout=...) is the collective timeout: rank 0 waits in the all-to-all for rank 1, which raised
    and stays alive without answering; rank 0's error names rank 1, the exchange and the step, and the timeout the
    strategy was given (with the default, 30 minutes, the test would run out of its own time instead)."""
    survivor, failing = run_ranks(_train_until_failure, 2, "hangs", HUNG_PEER_TIMEOUT_S, str(tmp_path), timeout=170)
    assert "injected encode failure on this rank" in failing["error"]
    assert survivor["error"] is not None, "rank 0 finished training without its peer"
    # rank 1 entered the forward exchange (its progress mark is rank 0's) and raised there: it is named as the rank
    # that went silent after reaching the point rank 0 waits at.
    assert re.match(rf"PeerTimeoutError: rank 1 stopped answering: rank 0 waited {HUNG_PEER_TIMEOUT_S} s in the"
                    r" forward exchange \((sizes|payload)\), call 3, at step 2 \(reached it too, then went silent;"
                    r" last mark: rank 1: forward exchange, call 3\)$", survivor["error"]), survivor


def _non_finite_gradients(rank: int, world_size: int) -> dict[str, list[int]]:
    import torch
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig
    from tests.comm.test_comm import BACKWARDS, _inputs, _tables

    dist.init_process_group("gloo")
    dims_per_rank = [[4, 4], [8]]
    counts = {}
    for mode in BACKWARDS:
        a2a = CompressedPooledEmbeddingsAllToAll(
            dist.group.WORLD, dims_per_rank, _tables(dims_per_rank), CompressionConfig(backward=mode, error_every=0),
            ErrorBounds(),
        )
        x = _inputs(rank, 8, sum(dims_per_rank[rank]), compressible=True).requires_grad_()
        out = a2a(x, [4, 4]).wait()
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(rank))
        grad[0, 1], grad[1, 5], grad[2, 12] = float("nan"), float("inf"), float("-inf")  # one per owner's columns
        out.backward(grad)
        local = torch.tensor([x.grad.isnan().sum(), x.grad.isposinf().sum(), x.grad.isneginf().sum()])
        dist.all_reduce(local)
        counts[mode] = local.tolist()
    dist.barrier()
    return counts


@pytest.mark.slow
def test_non_finite_gradients_arrive_as_sent_in_every_backward_mode() -> None:
    counts, _ = run_ranks(_non_finite_gradients, 2)
    # Each rank injected one NaN, one +Inf and one -Inf: all of them reach the table owners, in every mode (the
    # casts keep them; the DLAC codec sends a chunk holding them raw).
    assert counts == {mode: [2, 2, 2] for mode in counts}, counts


def _no_lookups_for_some_features(rank: int, world_size: int) -> dict:
    import copy

    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from tests.conftest import load_global_weights

    model = small_dlrm()
    reference = copy.deepcopy(model)
    t = trainer(world_size, DLACStrategy(compression=CompressionOptions(eps=0.01)), limit_val_batches=1)
    t.validate(model, datamodule=small_data(), verbose=False)
    load_global_weights(model, reference.state_dict())
    data = small_data(batch_size=32)
    data.setup("validate")
    kjt = next(iter(data.val_dataloader())).sparse_features
    # cat_3 looks nothing up on rank 0 (all bags empty); cat_7 on both ranks; on rank 1 a whole batch of zero rows.
    empty = {"cat_7"} | ({"cat_3"} if rank == 0 else set())
    rows = 0 if rank == 1 else 32
    lengths, values = [], []
    for key, jt in zip(kjt.keys(), kjt.split([1] * len(kjt.keys()))):
        n = jt.lengths()[:rows]
        n = torch.zeros_like(n) if key in empty else n
        lengths.append(n)
        values.append(jt.values()[: int(n.sum())])
    batch = KeyedJaggedTensor.from_lengths_sync(kjt.keys(), torch.cat(values), torch.cat(lengths))
    with torch.no_grad():
        sharded = model.embedding_bag_collection(batch).to_dict()
        # TorchRec's unsharded EBC itself cannot take a batch of zero rows; the sharded one (ours) can.
        unsharded = reference.embedding_bag_collection(batch).to_dict() if rows else {}
    worst = max(
        (float((sharded[k] - v).abs().max()) / (0.01 * float(v.max() - v.min()) + 1e-7) for k, v in unsharded.items()),
        default=0.0,
    )
    zero = all(bool((sharded[k] == 0).all()) for k in empty)
    return {"shape": list(sharded["cat_0"].shape), "worst": worst, "empty_is_zero": zero}


@pytest.mark.slow
def test_features_with_no_lookups_and_a_rank_with_no_rows() -> None:
    r0, r1 = run_ranks(_no_lookups_for_some_features, 2)
    assert r0["shape"] == [32, 16] and r1["shape"] == [0, 16]
    assert r0["empty_is_zero"] and r1["empty_is_zero"]  # empty bags pool to exact zeros (a constant chunk)
    assert r0["worst"] <= 1 + 1e-4 and r1["worst"] == 0.0


# ---------------------------------------------------------------------------------------------- a peer gone silent

SILENT_PEER_TIMEOUT_S = 5  # the collective timeout of the run whose peer stops


_HOSTED: list = []  # rank 0's store server, kept alive for the fit


def _store_in_rank_0(rank: int) -> None:
    """Move the ranks' store into rank 0's process, as Lightning's launcher has it: rank 0 hosts one on a port the
    kernel picks and hands the port on through the parent's store; both ranks then join it as clients."""
    from datetime import timedelta

    import torch.distributed as dist

    parent = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timedelta(seconds=60))
    if rank == 0:
        _HOSTED.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                     timeout=timedelta(seconds=60)))
        parent.set("rank0_store_port", str(_HOSTED[0].port))
    os.environ["MASTER_PORT"] = parent.get("rank0_store_port").decode()


def _train_until_a_peer_stops(rank: int, world_size: int, workdir: str, stops: int, at: str = "batch_start") -> dict:
    """Fit until rank ``stops`` stops itself at batch 2 (where it is rank 0, the store is in its process); the
    other rank reports its error, then kills the stopped rank."""
    import torchrec.distributed.model_parallel  # noqa: F401 - imported before the fit, as above
    import torchrec.distributed.planner  # noqa: F401

    from lightning_dlac.codec import native_available
    from lightning_dlac.comm import PeerTimeoutError

    if stops == 0:
        _store_in_rank_0(rank)
    t = trainer(world_size, DLACStrategy(timeout=SILENT_PEER_TIMEOUT_S), max_epochs=1,
                callbacks=[Fault("stop", rank=stops, batch=2, workdir=workdir, at=at)], limit_val_batches=0)
    model, data = small_dlrm(), small_data(train_batches=6)
    native_available()
    _in_step(Path(workdir), rank, world_size)
    try:
        t.fit(model, datamodule=data)
        return {"error": None}
    except PeerTimeoutError as err:
        return {"error": str(err), "silent": list(err.silent), "step": err.step, "type": type(err).__name__,
                "unreachable": err.store_unreachable}
    finally:
        if rank != stops:
            kill_stopped(workdir, rank=stops)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_peer_that_stops_answering_is_named_with_the_step_and_the_exchange(tmp_path: Path) -> None:
    """Rank 1 stops (SIGSTOP) between two steps; rank 0, waiting in the next collective, fails at the collective
    timeout with a PeerTimeoutError whose one-line message names rank 1, the step and where rank 0 waited: rank 1's
    last progress mark in the store (hosted by the parent here, as torchrun's agent hosts it) is behind rank 0's."""
    survivor, _ = run_ranks(_train_until_a_peer_stops, 2, str(tmp_path), 1, timeout=110, expect_exit={1: -9})
    assert survivor["type"] == "PeerTimeoutError", survivor
    assert survivor["silent"] == [1] and survivor["step"] == 2, survivor
    message = survivor["error"]
    assert "\n" not in message, message
    # Where rank 0 waits: the step's first collective (TorchRec's input all-to-all) or the compressed exchange. Rank
    # 1's last mark in the store is its newest or one shortly before: marks reach the store every 50 ms, and a
    # stopped process writes nothing more.
    assert re.match(rf"rank 1 stopped answering: rank 0 waited {SILENT_PEER_TIMEOUT_S} s in the "
                    r"(forward pass \(TorchRec's input all-to-all\)|forward exchange \((sizes|payload)\), call 3), "
                    r"at step 2 \(last mark: rank 1: [^;()]+\)$", message), message


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_peer_that_stops_before_its_backward_pass_is_named_in_the_backward_pass(tmp_path: Path) -> None:
    """Rank 1 stops as its backward pass of step 2 starts; rank 0 waits in its own backward pass (DDP's all-reduce
    of the dense gradients, or the gradient exchange), and its error names rank 1, step 2 and that wait (where
    rank 0 waits before its own next mark, rank 1 is named as having reached the same point)."""
    survivor, _ = run_ranks(_train_until_a_peer_stops, 2, str(tmp_path), 1, "backward", timeout=110,
                            expect_exit={1: -9})
    assert survivor["type"] == "PeerTimeoutError" and survivor["silent"] == [1], survivor
    assert re.match(rf"rank 1 stopped answering: rank 0 waited {SILENT_PEER_TIMEOUT_S} s in the (backward pass \(DDP's"
                    r" gradient all-reduce\)|backward exchange \((sizes|payload)\), call 3), at step 2 \((reached it"
                    r" too, then went silent; )?last mark: rank 1: [^;()]+\)$",
                    survivor["error"]), survivor


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_rank_0_hosting_the_store_is_reported_as_unreachable(tmp_path: Path) -> None:
    """Under Lightning's launcher the store lives in rank 0's process: when rank 0 stops, nothing can read the
    marks, and rank 1's error says that rank 0 (the store host) or the network is unreachable, with the step and
    where it waited."""
    _, survivor = run_ranks(_train_until_a_peer_stops, 2, str(tmp_path), 0, timeout=110, expect_exit={0: -9})
    assert survivor["type"] == "PeerTimeoutError" and survivor["unreachable"], survivor
    assert re.match(r"a peer stopped answering and the store cannot be read: rank 0 \(the store host\) or the network"
                    rf" is unreachable; rank 1 waited ({SILENT_PEER_TIMEOUT_S} s|the collective timeout) in the"
                    r" .*, at step 2$", survivor["error"]), survivor


# ---------------------------------------------------------------------------------------------- a lossy network

LOSSY_BATCHES = 10  # training batches of the lossy run and its clean twin (then 2 validation batches)


def _fit_for_weights(rank: int, world_size: int, namespaces: list[str] | None, master: str | None) -> dict:
    """A short 2-rank DLACStrategy fit; with ``namespaces`` each rank first enters its own (a
    :class:`~lightning_dlac.testing.netem.LossyNetwork`'s), so that every byte between the ranks, the store's
    included, crosses the lossy link to rank 0 at ``master``. Returns the losses, the final metrics and this rank's
    weights as bytes."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if namespaces is not None:
        from lightning_dlac.testing.netem import enter_namespace

        enter_namespace(namespaces[rank])
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE")  # rank 0 hosts the store, in its namespace
        os.environ.update(MASTER_ADDR=master, MASTER_PORT="29500", GLOO_SOCKET_IFNAME="tun0")
    import torch

    torch.manual_seed(0)
    model, recorder = small_dlrm(), loss_recorder()
    t = trainer(world_size, DLACStrategy(timeout=120), max_epochs=1, callbacks=[recorder], limit_val_batches=2)
    t.fit(model, datamodule=small_data(train_batches=LOSSY_BATCHES))
    weights = {}
    for key, value in model.state_dict().items():
        tensors = [s.tensor for s in value.local_shards()] if isinstance(value, ShardedTensor) else [value]
        weights[key] = [x.numpy().tobytes() for x in tensors]
    return {"losses": recorder.losses, "metrics": {k: float(v) for k, v in t.callback_metrics.items()},
            "weights": weights, "sent": t.strategy.total_comm_stats().sent_bytes}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(netem.unavailable() is not None, reason=f"no lossy network here: {netem.unavailable()}")
def test_a_lossy_jittery_network_ends_with_the_clean_run_s_weights_and_metrics() -> None:
    """tc netem's 1% loss with 5-50 ms of jitter, in user space (lightning_dlac/testing/netem.py: the ranks in
    network namespaces joined by TUN devices, a forwarder dropping and delaying each packet): TCP retransmits and
    reorders, and the run ends exactly as the clean run of the same seed does: the same losses, final metrics and
    weights, bit for bit."""
    clean = run_ranks(_fit_for_weights, 2, None, None, timeout=200)
    with netem.LossyNetwork(ranks=2, loss=0.01, delay_ms=(5, 50), seed=0) as network:
        lossy = run_ranks(_fit_for_weights, 2, [network.namespace(r) for r in range(2)], network.address(0),
                          timeout=200)
        counts = network.counts
    assert counts.dropped > 0 and counts.forwarded > 50 * counts.dropped / 2, counts  # it did drop, about 1%
    for rank, (c, lo) in enumerate(zip(clean, lossy)):
        assert lo["losses"] == c["losses"] and len(c["losses"]) == LOSSY_BATCHES, rank
        assert lo["metrics"] == c["metrics"] and c["metrics"], rank
        differ = sorted(k for k in c["weights"] if c["weights"][k] != lo["weights"][k])
        assert not differ, f"rank {rank}: these weights differ from the clean run's: {differ}"
        assert lo["sent"] == c["sent"] > 0, rank  # the same bytes went through the compressed exchange
