"""Compressed pooled-embedding all-to-all: bounds against TorchRec's exchange, gradients, statistics, the decode
error path, and compression active under DLACStrategy (2-rank gloo runs)."""

from __future__ import annotations

import copy
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_dlac.testing import run_ranks
from tests.conftest import native_expected

# Direct-module cases: batch size per rank (None: TorchRec's even split of local_embs) and column block dims per rank.
CASES = {
    "uneven_batches": ([3, 7], [[4, 16, 8], [32]]),  # tables of different dims, more tables than ranks
    "empty_batch": ([0, 5], [[8, 8], [16]]),
    "rank_without_tables": ([4, 6], [[8, 8], []]),
    "even_default_split": (None, [[8], [8, 4]]),
    "many_rows": ([64, 64], [[16, 16], [16]]),  # large enough for the 44-byte chunk headers not to dominate
    "non_finite": ([4, 4], [[4, 4], [8]]),  # NaN / Inf in table t0_0's chunks for both destinations
}
# Three ranks: the middle one sends to ranks on both sides of itself (two grids around its own, local rows).
CASES_3 = {
    "three_ranks": ([3, 5, 2], [[8, 4], [16], [4, 4]]),
    "three_ranks_middle_without_tables": ([4, 2, 3], [[8], [], [4, 8]]),
}
BACKWARDS = ("fp32", "bf16", "fp16", "dlac")
# The native kernels wherever they are expected to build: "auto" would fall back to the reference on a broken build
# and these cases would test the reference twice. With DLAC_TESTS_ALLOW_NO_NATIVE=1, whatever "auto" finds.
NATIVE = "native" if native_expected() else "auto"
# (backward mode, codec impl, compressible data) of each direct-module run.
RUNS = [*((b, NATIVE, False) for b in BACKWARDS), ("dlac", "ref", False), ("bf16", NATIVE, True)]
EPS, TABLE_EPS, BACKWARD_EPS = 0.01, {"t0_1": 0.05}, 0.02
# The module fixtures' own budgets (each is one 2-rank launch running many cases or fits, on a loaded 2-core machine);
# a test that sets a fixture up gets the fixture's budget plus its own margin.
EXCHANGE_BUDGET_S, LIGHTNING_BUDGET_S = 480, 600
pytestmark = pytest.mark.timeout(max(EXCHANGE_BUDGET_S, LIGHTNING_BUDGET_S) + 120)


def _tables(dims_per_rank: list[list[int]]) -> list[list[str]]:
    return [[f"t{r}_{c}" for c in range(len(dims))] for r, dims in enumerate(dims_per_rank)]


def _inputs(src: int, rows: int, cols: int, compressible: bool) -> torch.Tensor:
    """Rank ``src``'s local_embs; every rank can regenerate every rank's input."""
    g = torch.Generator().manual_seed(1000 + src)
    if not compressible:
        return torch.randn(rows, cols, generator=g) * 3 + 1
    vocab = torch.randn(3, cols, generator=g)  # rows drawn from a few distinct vectors, as pooled hot ids are
    return vocab[torch.randint(0, 3, (rows,), generator=g)]


def _upstream_grad(dst: int, rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(2000 + dst))


def _exchange_case(
    rank: int, world_size: int, case: str, backward: str, impl: str, compressible: bool, device: str = "cpu",
    overlap: bool = True,
) -> dict:
    """Run TorchRec's and the compressed all-to-all on the same input; return the observed error / bound ratios.
    Inputs live on ``device`` (the process group's backend must reach it); results are compared on the CPU. The
    overlapped exchange is left pending across an all-reduce on the same group (as DDP's would be) and must not have
    decoded anything before its ``wait()``."""
    import torch.distributed as dist
    from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.codec import impl_calls
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig, pooled

    calls_before = impl_calls()
    batch_size_per_rank, dims_per_rank = {**CASES, **CASES_3}[case]
    splits = batch_size_per_rank or [4] * world_size
    row_splits = [0, *torch.tensor(splits).cumsum(0).tolist()]
    tables = _tables(dims_per_rank)
    bounds = ErrorBounds(default_eps=EPS)
    bounds.set_table_bounds(TABLE_EPS)
    config = CompressionConfig(backward=backward, backward_eps=BACKWARD_EPS, error_every=1, impl=impl,
                               overlap=overlap)
    pg = dist.group.WORLD
    ours = CompressedPooledEmbeddingsAllToAll(pg, dims_per_rank, tables, config, bounds)
    theirs = PooledEmbeddingsAllToAll(pg, [sum(d) for d in dims_per_rank])

    inputs = [_inputs(r, row_splits[-1], sum(dims_per_rank[r]), compressible) for r in range(world_size)]
    if case == "non_finite":
        inputs[0][0, 0], inputs[0][1, 1], inputs[0][5, 2] = float("nan"), float("inf"), float("-inf")
    x_ours = inputs[rank].to(device, copy=True).requires_grad_()
    x_theirs = inputs[rank].to(device, copy=True).requires_grad_()
    decodes = []
    decode_from_others = pooled.decode_from_others
    pooled.decode_from_others = lambda *a, **k: decodes.append(1) or decode_from_others(*a, **k)
    try:
        pending = ours(x_ours, batch_size_per_rank)
        decoded_before_wait = len(decodes)
        dist.all_reduce(torch.ones(1, device=device), group=pg)  # another collective while the payload is in flight
        out_dev = pending.wait()
    finally:
        pooled.decode_from_others = decode_from_others
    ref_dev = theirs(x_theirs, batch_size_per_rank).wait()
    assert out_dev.device == x_ours.device, "the exchange must return its output on the input's device"
    out, ref = out_dev.detach().cpu(), ref_dev.detach().cpu()
    me_rows = slice(row_splits[rank], row_splits[rank + 1])
    assert out.shape == ref.shape == (splits[rank], sum(map(sum, dims_per_rank))), (out.shape, ref.shape)

    # Forward: each (source rank, table) block within that table's bound of the sender's chunk range.
    fwd_ratio: dict[str, float] = {}
    col = 0
    for src, dims in enumerate(dims_per_rank):
        local_col = 0
        for name, dim in zip(tables[src], dims):
            chunk = inputs[src][me_rows, local_col : local_col + dim]
            err = (out[:, col : col + dim] - ref[:, col : col + dim]).abs()
            if chunk.numel() and not chunk.isfinite().all():
                # A chunk holding NaN / Inf is sent exactly, as TorchRec would.
                exact = torch.equal(out[:, col : col + dim].nan_to_num(7.0), ref[:, col : col + dim].nan_to_num(7.0))
                fwd_ratio[name] = 0.0 if exact else float("inf")
            elif chunk.numel() and src == rank:
                # The rows a rank keeps for itself are never encoded: they arrive exactly.
                fwd_ratio[name] = 0.0 if torch.equal(out[:, col : col + dim], ref[:, col : col + dim]) else float("inf")
            elif chunk.numel():
                bound = bounds.effective(name) * float(chunk.max() - chunk.min())
                fwd_ratio[name] = float(err.max()) / bound if bound else float(err.max() > 0) * float("inf")
            col += dim
            local_col += dim

    # Backward with the same upstream gradient; TorchRec divides by the world size (comm_ops GRADIENT_DIVISION).
    total_dim = out.size(1)
    grad = _upstream_grad(rank, splits[rank], total_dim)
    out_dev.backward(grad.to(device))
    ref_dev.backward(grad.to(device))
    g_ours, g_ref = x_ours.grad.cpu(), x_theirs.grad.cpu()
    assert g_ours is not None and g_ours.shape == g_ref.shape == x_ours.shape
    grad_result: dict = {"equal": torch.equal(g_ours, g_ref), "max_rel": 0.0, "dlac_ratio": 0.0,
                         "own_rows_equal": torch.equal(g_ours[me_rows], g_ref[me_rows])}
    if g_ref.numel():
        diff = (g_ours - g_ref).abs()
        grad_result["max_rel"] = float((diff / (g_ref.abs() + 1e-30)).max())
        grad_result["max_abs"] = float(diff.max())
        # DLAC bound per gradient chunk: rows of destination r, one of my tables' columns, over r's upstream grad.
        my_first_col = sum(sum(d) for d in dims_per_rank[:rank])
        local_col = 0
        worst = 0.0
        for dim in dims_per_rank[rank]:
            cols = slice(my_first_col + local_col, my_first_col + local_col + dim)
            for r in range(world_size):
                g_r = _upstream_grad(r, splits[r], total_dim)[:, cols]
                if not g_r.numel():
                    continue
                bound = BACKWARD_EPS * float(g_r.max() - g_r.min()) / world_size
                err = float(diff[row_splits[r] : row_splits[r + 1], local_col : local_col + dim].max())
                worst = max(worst, err / bound)
            local_col += dim
        grad_result["dlac_ratio"] = worst

    stats = ours.stats
    calls_after = impl_calls()
    return {
        "codec_calls": {i: sum(n - calls_before[i][op] for op, n in ops.items()) for i, ops in calls_after.items()},
        "fwd_ratio": fwd_ratio,
        "grad": grad_result,
        "stats": {
            "calls": stats.calls,
            "raw_bytes": stats.raw_bytes,
            "sent_bytes": stats.sent_bytes,
            "table_raw_bytes": dict(stats.table_raw_bytes),
            "table_sent_bytes": dict(stats.table_sent_bytes),
            "table_max_error_ratio": dict(stats.table_max_error_ratio),
            "backward_calls": stats.backward_calls,
            "backward_raw_bytes": stats.backward_raw_bytes,
            "backward_sent_bytes": stats.backward_sent_bytes,
            "non_finite_tables": sorted(stats.non_finite_tables),
        },
        "local_raw": (row_splits[-1] - splits[rank]) * sum(dims_per_rank[rank]) * 4,  # rows for other ranks
        "decoded_before_wait": decoded_before_wait,
        "decoded_after_wait": len(decodes),
        "out": out,
        "grad_in": g_ours,
    }


def _without_tensors(result: dict) -> dict:
    """A case's result without its tensors (a rank's tensors cannot cross the result queue: it exits first)."""
    return {k: v for k, v in result.items() if k not in ("out", "grad_in")}


def _all_exchange_cases(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        results = {(case, *run): _exchange_case(rank, world_size, case, *run) for case in CASES for run in RUNS}
        for case in CASES:  # the synchronous path, compared here with the overlapped one (tensors stay in the rank)
            for backward in ("bf16", "dlac"):
                sync = _exchange_case(rank, world_size, case, backward, NATIVE, False, overlap=False)
                overlapped = results[(case, backward, NATIVE, False)]
                sync["same_out"] = torch.equal(overlapped["out"].nan_to_num(7.0), sync["out"].nan_to_num(7.0))
                sync["same_grad"] = torch.equal(overlapped["grad_in"], sync["grad_in"])
                results[("sync", case, backward)] = sync
        results = {key: _without_tensors(r) for key, r in results.items()}
        from lightning_dlac.adaptive import ErrorBounds
        from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig

        default = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, [[8], [8]], _tables([[8], [8]]),
                                                     CompressionConfig(), ErrorBounds())
        results["gloo_default_overlaps"] = default._overlap
        # Both ranks must be done with every collective before either tears gloo down: a peer destroying its group
        # mid-flight aborted the other process at exit ("terminate called without an active exception").
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def exchange_results() -> list[dict]:
    """Every direct-module case on two real ranks, run once (process start-up dominates the cost)."""
    return run_ranks(_all_exchange_cases, 2, timeout=EXCHANGE_BUDGET_S)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_forward_within_each_table_bound_of_torchrec(exchange_results: list[dict], case: str) -> None:
    batch_size_per_rank, dims_per_rank = CASES[case]
    for rank, results in enumerate(exchange_results):
        for run in RUNS:
            ratios = results[(case, *run)]["fwd_ratio"]
            expected = {t for tables in _tables(dims_per_rank) for t in tables}
            if batch_size_per_rank and batch_size_per_rank[rank] == 0:
                expected = set()  # this rank receives no rows
            assert set(ratios) == expected, (rank, ratios)
            assert all(r <= 1 + 1e-4 for r in ratios.values()), (rank, run, ratios)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_torchrec_per_backward_mode(exchange_results: list[dict], case: str) -> None:
    for rank, results in enumerate(exchange_results):
        fp32 = results[(case, "fp32", NATIVE, False)]["grad"]
        assert fp32["equal"], (rank, fp32)
        bf16 = results[(case, "bf16", NATIVE, False)]["grad"]
        assert bf16["max_rel"] <= 2**-8 + 1e-6, (rank, bf16)
        fp16 = results[(case, "fp16", NATIVE, False)]["grad"]
        assert fp16["max_rel"] <= 2**-11 + 1e-6 or fp16["max_abs"] < 1e-7, (rank, fp16)
        for impl in (NATIVE, "ref"):
            dlac = results[(case, "dlac", impl, False)]["grad"]
            assert dlac["dlac_ratio"] <= 1 + 1e-4, (rank, impl, dlac)
            assert dlac["own_rows_equal"], "the gradient of this rank's own rows never leaves it: exact"
            batch_sizes = CASES[case][0] or [4, 4]
            others_rows = sum(batch_sizes) - batch_sizes[rank]
            assert not dlac["equal"] or not any(CASES[case][1][rank]) or not others_rows, "sent exactly"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_exchange_decodes_on_wait_and_equals_the_synchronous_one(exchange_results: list[dict],
                                                                             case: str) -> None:
    for rank, results in enumerate(exchange_results):
        for backward in ("bf16", "dlac"):
            overlapped, sync = results[(case, backward, NATIVE, False)], results[("sync", case, backward)]
            # Launched by forward(), decoded by wait(): nothing decoded in between, once after.
            assert (overlapped["decoded_before_wait"], overlapped["decoded_after_wait"]) == (0, 1), (rank, backward)
            assert (sync["decoded_before_wait"], sync["decoded_after_wait"]) == (1, 1), (rank, backward)
            assert sync["same_out"] and sync["same_grad"], (rank, backward)
            assert overlapped["stats"] == sync["stats"], (rank, backward)
        # overlap=None (the default) is the synchronous path on gloo, where it measured faster; NCCL overlaps.
        assert results["gloo_default_overlaps"] is False


@pytest.mark.slow
def test_each_exchange_runs_the_codec_implementation_it_was_given(exchange_results: list[dict]) -> None:
    """The codec API's counters (lightning_dlac.codec.impl_calls) on each rank: the native kernels encoded and
    decoded every run given them (the suite's "auto" included), the reference every run given "ref", never both."""
    for rank, results in enumerate(exchange_results):
        for case in CASES:
            for run in RUNS:
                calls = results[(case, *run)]["codec_calls"]
                impl = run[1] if run[1] != "auto" else None
                if impl is None:  # DLAC_TESTS_ALLOW_NO_NATIVE=1: whichever "auto" found, but only one
                    assert (calls["native"] == 0) != (calls["ref"] == 0), (rank, case, run, calls)
                    continue
                other = "ref" if impl == "native" else "native"
                assert calls[impl] > 0 and calls[other] == 0, (rank, case, run, calls)


@pytest.mark.slow
def test_stats_count_bytes_tables_and_observed_error(exchange_results: list[dict]) -> None:
    for rank, results in enumerate(exchange_results):
        for case, (_, dims_per_rank) in CASES.items():
            for compressible in (False, True):
                stats = results[(case, "bf16", NATIVE, compressible)]["stats"]
                local = _tables(dims_per_rank)[rank]
                assert stats["calls"] == 1 and stats["backward_calls"] == 1
                assert stats["raw_bytes"] == results[(case, "bf16", NATIVE, compressible)]["local_raw"]
                assert set(stats["table_raw_bytes"]) == set(stats["table_sent_bytes"]) == set(local)
                assert set(stats["table_max_error_ratio"]) == set(local)
                assert all(r <= 1 + 1e-4 for r in stats["table_max_error_ratio"].values()), stats
                assert sum(stats["table_raw_bytes"].values()) == stats["raw_bytes"]
                # (NaN / Inf chunks go raw; a destination with no rows still gets a 48-byte header per table)
                if compressible and local and stats["raw_bytes"] and case != "non_finite":
                    assert stats["sent_bytes"] < stats["raw_bytes"], stats
                    if case == "many_rows":
                        assert stats["sent_bytes"] * 4 < stats["raw_bytes"], stats
                assert stats["non_finite_tables"] == (["t0_0"] if case == "non_finite" and rank == 0 else [])
                # bf16 halves the gradient bytes
                assert stats["backward_sent_bytes"] * 2 == stats["backward_raw_bytes"]


def _corrupted_exchange(rank: int, world_size: int, timeout_s: float, workdir: str) -> dict:
    """Rank 1 corrupts the body of its chunk of table ``t1_1`` for rank 0; rank 0 must name it, then stay alive but
    gone from the collectives (as a rank unwinding its error would be) until rank 1 is done; rank 1, blocked in its
    gradient exchange waiting for rank 0, must fail with the collective timeout instead of hanging."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.codec.format import HEADER_SIZE
    from lightning_dlac.comm import CompressedExchangeError, CompressedPooledEmbeddingsAllToAll, CompressionConfig
    from lightning_dlac.comm import exchange as exchange_module

    peer_done = Path(workdir) / "rank1_done"
    # Connect with time to spare (a busy machine can take seconds to start a rank), then give the group the timeout
    # under test, for the exchange's collectives.
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    dist.barrier()
    _set_pg_timeout(timedelta(seconds=timeout_s))
    dims_per_rank = [[8], [8, 8]]
    if rank == 1:
        encode_grid = exchange_module.encode_grid

        def corrupting_encode_grid(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            payload, sizes = encode_grid(*args, **kwargs)
            # Chunks are row-block-major: (destination 0, local table 1) is chunk 1.
            payload[int(sizes[0]) + HEADER_SIZE + 3] ^= 0xFF
            return payload, sizes

        exchange_module.encode_grid = corrupting_encode_grid
    a2a = CompressedPooledEmbeddingsAllToAll(
        dist.group.WORLD, dims_per_rank, _tables(dims_per_rank), CompressionConfig(error_every=0), ErrorBounds()
    )
    x = _inputs(rank, 12, sum(dims_per_rank[rank]), compressible=False).requires_grad_()
    try:
        out = a2a(x, [6, 6]).wait()
    except CompressedExchangeError as err:
        while not peer_done.exists():  # alive, in no collective; the test's timeout bounds the wait
            time.sleep(0.01)
        return {"error": f"{type(err).__name__}: {err}"}
    try:
        out.sum().backward()  # its gradient all-to-all waits for rank 0, which never joins
    except Exception as err:  # noqa: BLE001 - whatever gloo raises, it must raise rather than hang
        return {"error": f"{type(err).__name__}: {err}", "rank0_alive": not peer_done.exists()}
    finally:
        peer_done.touch()
    return {"error": None}


@pytest.mark.slow
@pytest.mark.timeout(120)  # the peer would wait for ever without its collective timeout
def test_corrupted_payload_names_source_rank_and_table_and_peer_does_not_hang(tmp_path: Path) -> None:
    timeout_s = 4.0
    failing, peer = run_ranks(_corrupted_exchange, 2, timeout_s, str(tmp_path), timeout=110)
    assert re.search(
        r"CompressedExchangeError: rank 0: pooled embeddings of table 't1_1' received from rank 1 failed to decode",
        failing["error"] or "",
    ), failing
    assert peer["error"] is not None, "rank 1's next collective succeeded without rank 0"
    # Rank 0 was alive (the link up) while rank 1 waited: what ended the wait is the collective timeout, the one
    # the process group was given, and the error names the rank that went silent and the exchange rank 1 waited in
    # (rank 0's last progress mark is its forward exchange, behind rank 1's).
    assert peer["rank0_alive"], peer
    assert re.match(rf"PeerTimeoutError: rank 0 stopped answering: rank 1 waited {timeout_s:g} s in the backward"
                    r" exchange \((sizes|payload)\), call 1 \(last mark: rank 0: forward exchange, call 1\)$",
                    peer["error"]), peer


def _auto_fallback(rank: int, world_size: int) -> list[bool]:
    """24 exchanges with the uncompressed fallback, timed by a scripted clock: the codec costs 6 ms for the first 11
    calls and 1 ms after; the uncompressed all-to-all 4 ms, then 50 ms. Returns, per call, whether it went
    uncompressed (checking it then equals TorchRec's exactly, in both directions)."""
    import contextlib

    import torch.distributed as dist
    from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll, CompressionConfig
    from lightning_dlac.comm.timing import PhaseTimer

    class ScriptedTimer(PhaseTimer):
        def __init__(self) -> None:
            super().__init__(torch.device("cpu"))
            self.call = 0

        @contextlib.contextmanager
        def phase(self, name: str, label: str | None = None):  # noqa: ANN206
            yield
            slow_codec = self.call < 11
            if name == "backward_s":
                cost = 0.0  # the forward's times decide here; the gradient exchange is checked for exactness
            elif label and "uncompressed" in label:
                cost = (0.004 if slow_codec else 0.05) / 2  # launch, wait
            else:
                cost = (0.006 if slow_codec else 0.001) / 4  # encode, exchange (launch, wait), decode
            self._pending.append((name, 0.0, cost))

    dist.init_process_group("gloo")
    dims_per_rank = [[8, 8], [16]]
    config = CompressionConfig(auto_fallback=True, fallback_check_every=4, error_every=0)
    ours = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, dims_per_rank, _tables(dims_per_rank), config,
                                              ErrorBounds())
    ours.recorder.timer = timer = ScriptedTimer()
    theirs = PooledEmbeddingsAllToAll(dist.group.WORLD, [sum(d) for d in dims_per_rank])
    ways = []
    for call in range(24):
        timer.call = call
        x = _inputs(rank, 12, sum(dims_per_rank[rank]), compressible=True).requires_grad_()
        x_theirs = x.detach().clone().requires_grad_()
        before = ours.stats.uncompressed_calls
        out = ours(x, [6, 6]).wait()
        ways.append(ours.stats.uncompressed_calls > before)
        grad = _upstream_grad(rank, 6, out.size(1))
        out.backward(grad)
        if ways[-1]:  # TorchRec's exchange, float32 both ways (the configured bf16 backward is not used)
            ref = theirs(x_theirs, [6, 6]).wait()
            ref.backward(grad)
            assert torch.equal(out, ref) and torch.equal(x.grad, x_theirs.grad)
    assert ours.stats.calls == 24
    dist.barrier()
    return ways


@pytest.mark.slow
def test_auto_fallback_sends_uncompressed_only_while_that_is_faster() -> None:
    r0, r1 = run_ranks(_auto_fallback, 2)
    assert r0 == r1  # the same way on every rank at every call, as the collectives require
    uncompressed = {k for k, raw in enumerate(r0) if raw}
    # Calls 0-1 measure the codec, call 2 the plain all-to-all; the codec is slower by 1.5x, so the plain one is used
    # and the codec checked 4 calls later (6); that confirms it, so the next check is min(4 * 1.5, 2 * 4) = 6 calls
    # on (12). From call 11 the plain one is slow: the check at 12 sees the codec faster again and switches back,
    # checked 4 calls later (16, confirmed: the gap is 7.7x, the next check 8 calls on, at 24).
    assert uncompressed == {2, 3, 4, 5, 7, 8, 9, 10, 11, 16}, sorted(uncompressed)


# ---------------------------------------------------------------------------------------------- through Lightning


def _fit(world_size: int, steps: int, **compression: Any) -> tuple[list[float], object]:
    from lightning_dlac import CompressionOptions, DLACStrategy
    from tests.conftest import loss_recorder, small_data, small_dlrm, trainer

    torch.manual_seed(0)
    recorder = loss_recorder()
    strategy = DLACStrategy(compression=CompressionOptions(**compression))
    t = trainer(world_size, strategy, max_steps=steps, callbacks=[recorder], limit_val_batches=0)
    t.fit(small_dlrm(), datamodule=small_data(train_batches=steps))
    return recorder.losses, t.strategy


def _pooled_embeddings_within_bound(rank: int, world_size: int, eps: float, sharding_type: str) -> dict[str, float]:
    """Sharded EBC with compression against its unsharded twin, per key: observed error / (eps * key range), on
    batches of a different size on each rank."""
    from lightning_dlac import CompressionOptions, DLACStrategy, ShardingOptions
    from tests.conftest import FEATURES, load_global_weights, small_data, small_dlrm, trainer

    model = small_dlrm()
    reference = copy.deepcopy(model)
    data = small_data()
    # Column shards of 8 dims: the 16-dim tables are split, so one key's columns come from several chunks.
    split = {} if sharding_type == "table_wise" else {f"t_{f}": {"min_partition": 8} for f in FEATURES}
    strategy = DLACStrategy(sharding=ShardingOptions(sharding_types=[sharding_type], table_constraints=split),
                            compression=CompressionOptions(eps=eps))
    t = trainer(world_size, strategy, limit_val_batches=1)
    t.validate(model, datamodule=data, verbose=False)
    assert t.strategy.exchanges, "validate() installed no compressed all-to-all"
    load_global_weights(model, reference.state_dict())
    ratios: dict[str, float] = {}
    with torch.no_grad():
        uneven = small_data(batch_size=64 - 24 * rank)
        uneven.setup("validate")
        for batch in list(uneven.val_dataloader())[:2]:
            assert batch.sparse_features.stride() == 64 - 24 * rank
            sharded = model.embedding_bag_collection(batch.sparse_features).to_dict()
            unsharded = reference.embedding_bag_collection(batch.sparse_features).to_dict()
            assert sharded.keys() == unsharded.keys()
            for key, exact in unsharded.items():
                # A key's columns for this rank's rows are one chunk (table-wise) or several (column shards), each
                # with a value range no larger than the key's.
                bound = eps * float(exact.max() - exact.min()) + 1e-7
                ratio = float((sharded[key] - exact).abs().max()) / bound
                ratios[key] = max(ratios.get(key, 0.0), ratio)
    return ratios


def _lightning_runs(rank: int, world_size: int) -> dict:
    from lightning_dlac.codec import impl_calls

    steps = 30
    before = impl_calls()
    compressed, strategy = _fit(world_size, steps, error_every=1)
    after = impl_calls()
    stats = strategy.total_comm_stats()
    uncompressed, plain = _fit(world_size, steps, enabled=False)
    dlac_backward, dlac_strategy = _fit(world_size, steps, backward="dlac")
    return {
        "codec_calls": {i: {op: n - before[i][op] for op, n in ops.items()} for i, ops in after.items()},
        "compressed": compressed,
        "uncompressed": uncompressed,
        "dlac_backward": dlac_backward,
        "exchanges": len(strategy.exchanges),
        "plain_exchanges": len(plain.exchanges),
        "calls": stats.calls,
        "raw_bytes": stats.raw_bytes,
        "sent_bytes": stats.sent_bytes,
        "max_error_ratio": max(stats.table_max_error_ratio.values(), default=float("nan")),
        "compressed_tables": strategy.exchange_group.compressed_tables,
        "dlac_backward_calls": dlac_strategy.total_comm_stats().backward_calls,
        "dlac_backward_ratio": dlac_strategy.total_comm_stats().backward_raw_bytes
        / max(dlac_strategy.total_comm_stats().backward_sent_bytes, 1),
        "pooled_ratios": {
            sharding_type: _pooled_embeddings_within_bound(rank, world_size, 0.02, sharding_type)
            for sharding_type in ("table_wise", "column_wise", "table_column_wise")
        },
    }


@pytest.fixture(scope="module")
def lightning_results() -> list[dict]:
    """Three 30-batch fits (compressed, uncompressed, DLAC backward) and three validations, on two ranks."""
    return run_ranks(_lightning_runs, 2, timeout=LIGHTNING_BUDGET_S)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _learns_as_uncompressed(losses: list[float], uncompressed: list[float]) -> tuple[float, float]:
    """(|gap|, drop): the gap between the last 10 batches' mean loss of a run and of the uncompressed run with the
    same seed and data, and how far the uncompressed run's mean loss fell from its first 10 batches to its last 10.
    Compression that does not hurt learning leaves a gap that is a small part of the drop."""
    gap = abs(_mean(losses[-10:]) - _mean(uncompressed[-10:]))
    return gap, _mean(uncompressed[:10]) - _mean(uncompressed[-10:])


@pytest.mark.slow
def test_training_compresses_and_learns_as_the_uncompressed_run_does(lightning_results: list[dict]) -> None:
    from lightning_dlac.codec import native_available

    for r in lightning_results:
        assert r["exchanges"] > 0 and r["plain_exchanges"] == 0
        assert r["calls"] > 0 and r["sent_bytes"] < r["raw_bytes"], r
        assert r["max_error_ratio"] <= 1 + 1e-4, r
        assert len(r["compressed"]) == len(r["uncompressed"]) == 30
        # The oracle is the uncompressed run with the same seed and batches: the first batch's loss differs only by
        # the forward's compression error; the rest of the run learns what the uncompressed run learns.
        assert r["compressed"][0] == pytest.approx(r["uncompressed"][0], rel=1e-3)
        gap, drop = _learns_as_uncompressed(r["compressed"], r["uncompressed"])
        assert drop > 0.05 and gap < 0.25 * drop, (gap, drop)
        # The fit encoded with the native kernels (the suite's "auto"), never the reference.
        if native_expected():
            assert r["codec_calls"]["native"]["encode"] >= 30 and r["codec_calls"]["ref"]["encode"] == 0, r
        else:
            assert r["codec_calls"]["native" if native_available() else "ref"]["encode"] >= 30, r
    # Table-wise: each table is sent compressed by exactly one rank.
    tables0, tables1 = lightning_results[0]["compressed_tables"], lightning_results[1]["compressed_tables"]
    assert tables0 and tables1 and not set(tables0) & set(tables1) and len(tables0) + len(tables1) == 26


@pytest.mark.slow
def test_training_with_dlac_backward_learns_as_the_uncompressed_run_does(lightning_results: list[dict]) -> None:
    for r in lightning_results:
        losses = r["dlac_backward"]
        assert r["dlac_backward_calls"] == len(losses) == 30
        assert r["dlac_backward_ratio"] > 1, r
        assert losses[0] == r["compressed"][0]  # the same forward: the backward's encoding acts from step 2 on
        gap, drop = _learns_as_uncompressed(losses, r["uncompressed"])
        assert drop > 0.05 and gap < 0.25 * drop, (gap, drop)


@pytest.mark.slow
@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "table_column_wise"])
def test_sharded_pooled_embeddings_within_bound_of_unsharded(lightning_results: list[dict], sharding_type: str) -> None:
    for r in lightning_results:
        ratios = r["pooled_ratios"][sharding_type]
        assert len(ratios) == 26, ratios
        assert max(ratios.values()) <= 1 + 1e-3, ratios
        assert max(ratios.values()) > 0, "no key differs at all: was the exchange compressed?"


def _nccl_exchange_cases(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", timeout=timedelta(seconds=120))
    try:
        cases = ("uneven_batches", "many_rows", "rank_without_tables")
        results = {
            (case, b): _without_tensors(_exchange_case(rank, world_size, case, b, "auto", True, device=f"cuda:{rank}"))
            for case in cases for b in ("bf16", "dlac")
        }
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL)")
def test_exchange_over_nccl_on_gpus() -> None:
    """The same cases over NCCL with CUDA tensors: payloads, sizes and outputs stay on the GPUs."""
    for rank, results in enumerate(run_ranks(_nccl_exchange_cases, 2)):
        for (case, backward), r in results.items():
            assert all(v <= 1 + 1e-4 for v in r["fwd_ratio"].values()), (rank, case, r["fwd_ratio"])
            if backward == "dlac":
                assert r["grad"]["dlac_ratio"] <= 1 + 1e-4 and r["grad"]["own_rows_equal"], (rank, case, r["grad"])
            if r["stats"]["raw_bytes"] and any(CASES[case][1][rank]):
                assert r["stats"]["sent_bytes"] < r["stats"]["raw_bytes"], (rank, case, r["stats"])


def _three_rank_cases(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        results = {(case, b): _without_tensors(_exchange_case(rank, world_size, case, b, NATIVE, compressible))
                   for case in CASES_3 for b in ("fp32", "dlac") for compressible in (True,)}
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_three_ranks_send_around_their_own_rows() -> None:
    for rank, results in enumerate(run_ranks(_three_rank_cases, 3)):
        for (case, backward), r in results.items():
            batch_sizes, dims_per_rank = CASES_3[case]
            assert set(r["fwd_ratio"]) == {t for tables in _tables(dims_per_rank) for t in tables}, (rank, case)
            assert all(v <= 1 + 1e-4 for v in r["fwd_ratio"].values()), (rank, case, r["fwd_ratio"])
            remote_rows = sum(batch_sizes) - batch_sizes[rank]
            assert r["stats"]["raw_bytes"] == remote_rows * sum(dims_per_rank[rank]) * 4, (rank, case)
            if dims_per_rank[rank]:
                assert r["stats"]["sent_bytes"] < r["stats"]["raw_bytes"], (rank, case, r["stats"])
            if backward == "fp32":
                assert r["grad"]["equal"], (rank, case)
            else:
                assert r["grad"]["dlac_ratio"] <= 1 + 1e-4 and r["grad"]["own_rows_equal"], (rank, case, r["grad"])
