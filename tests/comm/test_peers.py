"""Per-peer compression (issue 37): the plan a policy makes, the nodes read from the launcher, and a 4-rank gloo run
declared as 2 nodes x 2 ranks (torchrun's ``GROUP_RANK``) whose payloads to same-node peers go as they are, bit for
bit TorchRec's, and to the other node DLAC-encoded within their bounds, in both directions, pooled and sequence; the
counters say which bytes went where."""

from __future__ import annotations

import os

import pytest
import torch

from lightning_dlac.comm import CompressionConfig
from lightning_dlac.comm.peers import PeerPlan, check_policy, node_key, number_nodes, runs
from lightning_dlac.testing import run_ranks

EPS, BACKWARD_EPS = 0.01, 0.02
NODES = (0, 0, 1, 1)  # the 4-rank run: ranks 0, 1 on node 0 and 2, 3 on node 1


def between_racks(src: int, dst: int) -> bool:
    """A user policy, named by import path in YAML: compress from even to odd ranks only."""
    return src % 2 == 0 and dst % 2 == 1


# ------------------------------------------------------------------------------------------------ plans, no processes


def test_auto_compresses_across_nodes_on_a_gpu_cluster_and_every_peer_on_one_node_or_on_gloo() -> None:
    plan = PeerPlan.from_policy("auto", NODES, "nccl")
    assert plan.compressed == PeerPlan.from_policy("other_nodes", NODES).compressed
    # gloo: a node's ranks talk over loopback TCP, whose bytes cost CPU time (e2e_topology.json)
    assert PeerPlan.from_policy("auto", NODES, "gloo").compressed == PeerPlan.from_policy("all", NODES).compressed
    assert plan.to(0) == (False, False, True, True) and plan.source(3) == (True, True, False, False)
    assert plan.link(0, 1) == "same_node" and plan.link(1, 2) == "other_nodes"
    single = PeerPlan.from_policy("auto", (0, 0, 0), "nccl")
    assert single.to(1) == (True, False, True)  # never a rank's own block
    assert not PeerPlan.from_policy("other_nodes", (0, 0, 0)).any  # one node: TorchRec's exchange
    assert PeerPlan.everyone(2).compressed == ((False, True), (True, False))


def test_a_user_function_or_its_import_path_decides_per_pair_and_bad_policies_are_named() -> None:
    by_path = PeerPlan.from_policy(f"{__name__}.between_racks", NODES)
    assert by_path.compressed == PeerPlan.from_policy(between_racks, NODES).compressed
    assert by_path.to(0) == (False, True, False, True) and by_path.to(1) == (False,) * 4
    with pytest.raises(ValueError, match="'sometimes' is not supported"):
        check_policy("sometimes")
    with pytest.raises(ValueError, match="cannot import 'nope'"):
        CompressionConfig(compress_peers=f"{__name__}.nope")
    with pytest.raises(ValueError, match="must return True or False"):
        PeerPlan.from_policy(lambda s, d: "yes", NODES)


def test_a_rank_reads_its_node_from_the_launcher_in_order_and_nodes_are_numbered_by_first_appearance() -> None:
    assert node_key({"GROUP_RANK": "1", "NODE_RANK": "0", "SLURM_NODEID": "5"}) == "GROUP_RANK=1"
    assert node_key({"NODE_RANK": "3", "SLURM_NODEID": "5"}) == "NODE_RANK=3"
    assert node_key({"SLURM_NODEID": "5"}) == "SLURM_NODEID=5"
    assert node_key({}).startswith("host=")
    assert number_nodes(["b", "b", "a", "c", "a"]) == (0, 0, 1, 2, 1)
    assert runs([True, True, False, True]) == [(True, 0, 2), (False, 2, 3), (True, 3, 4)]


# ------------------------------------------------------------------------------------------------ 4 ranks, 2 nodes


def _inputs(src: int, rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(100 + src)) * 2 + 1


def _pooled(rank: int, world: int, backward: str, plan: PeerPlan | None, policy: str = "other_nodes") -> dict:
    """One pooled exchange and its gradient against TorchRec's, per source rank: exact or the worst error / bound."""
    import torch.distributed as dist
    from torchrec.distributed.dist_data import PooledEmbeddingsAllToAll

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressedPooledEmbeddingsAllToAll

    dims = [[8, 4], [16], [4, 4], [8]]
    tables = [[f"t{r}_{c}" for c in range(len(d))] for r, d in enumerate(dims)]
    batch = [5, 7, 3, 6]
    rows = [0, *torch.tensor(batch).cumsum(0).tolist()]
    # Without a plan, the module makes one from the config's policy on the nodes it reads from the environment.
    config = CompressionConfig(backward=backward, backward_eps=BACKWARD_EPS, error_every=0, impl="ref",
                               compress_peers=policy)
    pg = dist.group.WORLD
    ours = CompressedPooledEmbeddingsAllToAll(pg, dims, tables, config, ErrorBounds(EPS), peers=plan)
    theirs = PooledEmbeddingsAllToAll(pg, [sum(d) for d in dims])
    x = _inputs(rank, rows[-1], sum(dims[rank]))
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = ours(x_ours, batch).wait(), theirs(x_theirs, batch).wait()
    forward, col = {}, 0
    for src in range(world):
        width = sum(dims[src])
        sent = _inputs(src, rows[-1], width)[rows[rank] : rows[rank + 1]]
        got, want = out[:, col : col + width].detach(), ref[:, col : col + width].detach()
        bound = EPS * float(sent.max() - sent.min())
        forward[src] = "exact" if torch.equal(got, want) else float((got - want).abs().max()) / bound
        col += width
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(200 + rank))
    out.backward(grad)
    ref.backward(grad)
    backward_rows = {}
    for src in range(world):  # rows of src's batch: the gradient src sent back to this rank
        got, want = x_ours.grad[rows[src] : rows[src + 1]], x_theirs.grad[rows[src] : rows[src + 1]]
        backward_rows[src] = "exact" if torch.equal(got, want) else float((got - want).abs().max())
    stats = ours.stats
    return {"forward": forward, "backward": backward_rows, "same": stats.same_node_sent_bytes,
            "other": stats.other_nodes_sent_bytes, "passed": stats.passed_bytes,
            "table_passed": dict(stats.table_passed_bytes), "to": ours.layout.compress_to}


def _sequence(rank: int) -> dict:
    """A table-wise sharded EmbeddingCollection through the exchange installed from the environment's nodes, against
    TorchRec's: the ids whose table lives on this rank's node come exactly, the others within the bound."""
    from lightning_dlac.comm.sequence import CompressedSequenceEmbeddingsAllToAll
    from tests.comm.test_sequence import EPS as SEQ_EPS
    from tests.comm.test_sequence import FEATURES, _batch, _SequenceModel, _shard, _weights
    from tests.conftest import load_global_weights

    state = _SequenceModel().state_dict()
    result: dict = {}
    for mode in ("bf16", "dlac"):
        model, group = _shard(_SequenceModel(), ["table_wise"], compress=True, backward=mode,
                              compress_peers="other_nodes")
        ref, _ = _shard(_SequenceModel(), ["table_wise"], compress=False)
        load_global_weights(model, state)
        load_global_weights(ref, state)
        (a2a,) = [m for m in group if isinstance(m, CompressedSequenceEmbeddingsAllToAll)]
        owner = {t: r for r, ts in enumerate(a2a.tables_per_rank) for t in ts}
        kjt = _batch(rank, 0)
        got, _ = model(kjt)
        want, _ = ref(kjt)
        per_feature = {}
        for i, f in enumerate(FEATURES):
            table = f"seq_{i}"
            diff = (got[f].values() - want[f].values()).detach()
            weight = state[f"ec.embeddings.seq_{i}.weight"]
            ratio = float(diff.abs().max()) / (SEQ_EPS * float(weight.max() - weight.min())) if diff.numel() else 0.0
            per_feature[f] = (a2a.peers.link(rank, owner[table]), "exact" if not diff.any() else ratio)
        weights = {f: torch.randn(want[f].values().shape, generator=torch.Generator().manual_seed(7)) for f in FEATURES}
        sum((got[f].values() * weights[f]).sum() for f in FEATURES).backward()
        sum((want[f].values() * weights[f]).sum() for f in FEATURES).backward()
        got_w, want_w = _weights(model), _weights(ref)
        stats = a2a.stats
        result[mode] = {"features": per_feature, "passed": stats.passed_bytes, "same": stats.same_node_sent_bytes,
                        "other": stats.other_nodes_sent_bytes, "backward_calls": stats.backward_calls,
                        "weights_err": max((float((got_w[k] - want_w[k]).abs().max()) for k in want_w), default=0.0),
                        "weights_scale": max((float(w.abs().max()) for w in want_w.values()), default=0.0)}
    return result


def _two_nodes(rank: int, world: int) -> dict:
    os.environ["GROUP_RANK"] = str(NODES[rank])  # as torchrun sets it on each node
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    torch.distributed.init_process_group("gloo")
    out = {mode: _pooled(rank, world, mode, None) for mode in ("fp32", "bf16", "dlac")}
    out["all"] = _pooled(rank, world, "dlac", PeerPlan.from_policy("all", NODES))
    out["auto"] = _pooled(rank, world, "bf16", None, "auto")  # gloo: every peer
    out["user"] = _pooled(rank, world, "bf16", PeerPlan.from_policy(between_racks, NODES))
    out["sequence"] = _sequence(rank)
    return out


@pytest.fixture(scope="module")
def two_nodes() -> list[dict]:
    return run_ranks(_two_nodes, 4, timeout=400)


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.parametrize("backward", ["fp32", "bf16", "dlac"])
def test_same_node_payloads_are_torchrecs_bit_for_bit_and_other_nodes_within_the_bound(two_nodes: list[dict],
                                                                                        backward: str) -> None:
    for rank, result in enumerate(two_nodes):
        r = result[backward]
        assert r["to"] == tuple(NODES[d] != NODES[rank] for d in range(4)), "auto on 2 nodes: other nodes only"
        for src in range(4):
            if NODES[src] == NODES[rank]:  # own block and the same-node peer: exactly TorchRec's, both ways
                assert r["forward"][src] == "exact", (rank, src, r["forward"])
                assert r["backward"][src] == "exact", (rank, src, r["backward"])
            else:
                assert r["forward"][src] != "exact" and 0 < r["forward"][src] <= 1.0, (rank, src, r["forward"])
                if backward == "fp32":
                    assert r["backward"][src] == "exact"
                else:  # bf16 / DLAC gradients from the other node: close, not exact
                    assert r["backward"][src] != "exact" and r["backward"][src] < 0.1, (rank, src, r["backward"])


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_counters_split_the_bytes_by_link_and_the_same_node_bytes_are_the_passed_ones(two_nodes: list[dict]) -> None:
    for rank, result in enumerate(two_nodes):
        dlac, everyone = result["dlac"], result["all"]
        assert dlac["same"] == dlac["passed"] > 0  # float32 both ways to the same-node peer
        assert dlac["other"] > 0 and dlac["table_passed"]
        assert everyone["passed"] == 0 and everyone["same"] < dlac["same"]  # "all" compresses on the node too
        assert result["auto"]["to"] == tuple(d != rank for d in range(4)) and result["auto"]["passed"] == 0
        # The same node's raw bytes: every local table's rows for the peer forward, its tables' gradient back.
        assert result["fp32"]["same"] == result["dlac"]["same"] == result["bf16"]["same"]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_user_policy_compresses_exactly_the_pairs_it_names_in_both_directions(two_nodes: list[dict]) -> None:
    for rank, result in enumerate(two_nodes):
        r = result["user"]
        for src in range(4):
            compressed = between_racks(src, rank)
            assert (r["forward"][src] != "exact") == compressed, (rank, src, r["forward"])
            assert (r["backward"][src] != "exact") == between_racks(rank, src), (rank, src, r["backward"])


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_sequence_embeddings_from_the_same_node_are_exact_and_from_the_other_node_within_the_bound(
        two_nodes: list[dict]) -> None:
    for rank, result in enumerate(two_nodes):
        for mode, r in result["sequence"].items():
            for feature, (link, value) in r["features"].items():
                if link == "same_node":
                    assert value == "exact", (rank, mode, feature, value)
                else:
                    assert value == "exact" or value <= 1.0, (rank, mode, feature, value)
            assert r["backward_calls"] == 1 and r["passed"] == r["same"]
            # bf16 / DLAC gradients from the other node only: the tables end close to TorchRec's.
            assert r["weights_err"] <= 0.05 * max(r["weights_scale"], 1e-6), (rank, mode, r)
        assert sum(r["other"] for r in result["sequence"].values()) > 0



@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_two_node_lightning_run_compresses_across_nodes_and_resumes_pipelined_exactly(
        tmp_path) -> None:  # noqa: ANN001
    from tests.engine.test_pipeline import _resume

    # Lightning's num_nodes and NODE_RANK say which node a rank is on; "other_nodes" is what "auto" picks on NCCL.
    policy = {"compress_peers": "other_nodes"}
    for rank, result in enumerate(run_ranks(_resume, 4, str(tmp_path), policy, 2, timeout=540)):
        assert len(result["resumed"]) == 10 and result["resumed"] == result["uninterrupted"][10:]
        assert result["bounds"][0] == result["bounds"][1]
        for passed, same, other in result["links"]:  # every run: rows as they are within the node, DLAC across
            assert other > 0 and passed == same > 0, (rank, result["links"])


def test_the_report_splits_the_bytes_by_link_only_where_a_run_had_more_than_one_kind() -> None:
    from lightning_dlac.plugin.report import link_line

    assert link_line({"same_node_sent_bytes": 5 << 20, "other_nodes_sent_bytes": 0, "passed_bytes": 0}) is None
    line = link_line({"same_node_sent_bytes": 6 << 20, "other_nodes_sent_bytes": 2 << 20, "passed_bytes": 6 << 20})
    assert line is not None and "2.0 MiB to other nodes" in line and "6.0 MiB within nodes" in line
