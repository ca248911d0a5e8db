"""The step-time model behind ``dlac estimate`` (lightning_dlac.commands.estimate): its formulas on numbers worked by
hand (the single link, and nodes with two link classes under each ``compress_peers`` policy), its input checks, the
rates read from a finished run's ``dlac_run.json``, and the subcommand."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lightning_dlac.commands.estimate import (
    ALL_METHODS,
    METHODS,
    POLICIES,
    POLICY_LABELS,
    Codec,
    Link,
    RunRates,
    Topology,
    Workload,
    _dims,
    combine_ratios,
    device_rates,
    main,
    policy_table,
    predict,
    predict_all,
    predict_policies,
    predict_policy,
    rates_from_run,
    read_json,
    table,
    wait_from_run,
)

# 2 tables of dim 8, batch 1000 per rank: a rank sends (W - 1) / W * 1000 * 16 * 4 bytes per direction.
WORKLOAD = Workload(batch_per_rank=1000, embedding_dims=(8, 8), compute_ms=10.0, dense_params=1000)
CODEC = Codec(forward_ratio=20.0, backward_ratio=5.0, encode_gb_s=1.0, decode_gb_s=2.0, backward_encode_gb_s=0.5,
              cast_gb_s=4.0)


def test_fp32_on_a_per_gpu_link_is_latency_plus_bytes_over_bandwidth() -> None:
    link = Link(gbit_s=1.0, latency_us=100.0)
    p = predict("fp32", WORKLOAD, CODEC, link, world=4)
    raw = 3 / 4 * 1000 * 16 * 4  # 48,000 bytes
    wire_ms = 3 * 0.1 + 8 * raw / 1e9 * 1e3  # 3 messages of 100 us + 0.384 ms
    assert p.forward_ms == pytest.approx(wire_ms) and p.backward_ms == pytest.approx(wire_ms)
    ring = 2 * 3 / 4 * 1000 * 4
    assert p.allreduce_ms == pytest.approx(6 * 0.1 + 8 * ring / 1e9 * 1e3)
    assert p.step_ms == pytest.approx(10.0 + 2 * wire_ms + p.allreduce_ms)
    # A shared link carries every rank's bytes: W times the bandwidth term, the same latency.
    shared = predict("fp32", WORKLOAD, CODEC, Link(1.0, 100.0, "shared"), world=4)
    assert shared.forward_ms == pytest.approx(3 * 0.1 + 4 * 8 * raw / 1e9 * 1e3)


def test_dlac_pays_its_codec_and_a_size_exchange_and_sends_raw_over_ratio() -> None:
    link = Link(gbit_s=1.0, latency_us=100.0)
    p = predict("dlac_dlac", WORKLOAD, CODEC, link, world=2)
    raw = 1 / 2 * 1000 * 16 * 4  # 32,000 bytes
    assert p.parts["forward_codec_ms"] == pytest.approx((raw / 1e9 + raw / 2e9) * 1e3)
    assert p.parts["forward_wire_ms"] == pytest.approx(2 * 0.1 + 8 * raw / 20 / 1e9 * 1e3)
    # Gradients: their own encode rate, the forward's decode rate (not given), their own ratio.
    assert p.parts["backward_codec_ms"] == pytest.approx((raw / 0.5e9 + raw / 2e9) * 1e3)
    assert p.parts["backward_wire_ms"] == pytest.approx(2 * 0.1 + 8 * raw / 5 / 1e9 * 1e3)
    # BF16 backward: TorchRec's cast of the whole buffer (own rows included), encode and decode, half the bytes.
    bf16 = predict("dlac_bf16", WORKLOAD, CODEC, link, world=2)
    assert bf16.parts["backward_codec_ms"] == pytest.approx(2 * 1000 * 16 * 4 / 4e9 * 1e3)
    assert bf16.parts["backward_wire_ms"] == pytest.approx(0.1 + 8 * raw / 2 / 1e9 * 1e3)


def test_int8_ratio_is_torchrec_row_wise_layout() -> None:
    # What TorchRec's INT8 qcomm codec sends (fbgemm's quantize_comm, INT8 in its default context: rows of 32
    # values, one byte each plus a float32 scale and bias), whatever the tables' dims.
    from fbgemm_gpu.quantize_comm import QuantizedCommCodec
    from fbgemm_gpu.split_embedding_configs import SparseType

    codec = QuantizedCommCodec(SparseType.INT8)
    for dims in [(64,) * 26, (128, 32, 96)]:
        x = torch.randn(512, sum(dims))
        sent = codec.encode(x, codec.create_context())
        sent_bytes = sent.numel() * sent.element_size()
        assert Workload(512, dims, 1.0).int8_ratio == pytest.approx(x.numel() * 4 / sent_bytes)
    p = predict("int8_fp16", WORKLOAD, CODEC, Link(1.0, 0.0), world=2)
    assert p.parts["forward_wire_ms"] == pytest.approx(8 * 32_000 / 3.2 / 1e9 * 1e3)


@pytest.mark.parametrize("dims", [(64,) * 26, (20, 20, 20), (100,), (32, 16)])
def test_mx4_ratio_is_the_size_fbgemm_produces(dims: tuple[int, ...]) -> None:
    """TorchRec's MX4 (fbgemm_gpu.quantize_utils.fp32_to_mx4 with its qcomm settings) on a [batch, D] buffer: rows
    padded to a multiple of 32 columns, half a byte a value and a byte per group of 32."""
    torch = pytest.importorskip("torch")
    quantize_utils = pytest.importorskip("fbgemm_gpu.quantize_utils")
    from fbgemm_gpu.triton.common import RoundingMode

    x = torch.randn(8, sum(dims))
    q = quantize_utils.fp32_to_mx4(x, 32, ebits=2, mbits=1, rounding_mode=RoundingMode.even)
    assert Workload(8, dims, 1.0).mx4_ratio == pytest.approx(x.numel() * 4 / (q.numel() * q.element_size()))
    if sum(dims) % 32 == 0:
        assert Workload(8, dims, 1.0).mx4_ratio == pytest.approx(128 / 17)  # 4.25 bits a value


MX4_CODEC = replace(CODEC, mx4_encode_gb_s=8.0, mx4_decode_gb_s=16.0)


def test_mx4_quantizes_the_whole_buffer_both_ways_and_sends_no_sizes() -> None:
    link = Link(gbit_s=1.0, latency_us=100.0)
    p = predict("mx4", WORKLOAD, MX4_CODEC, link, world=2)
    buffer, raw = 1000 * 16 * 4, 1 / 2 * 1000 * 16 * 4  # dim 16 pads to 32: ratio 64 / (32 * 17 / 32) = 64 / 17
    assert WORKLOAD.mx4_ratio == pytest.approx(64 / 17)
    for d in ("forward", "backward"):
        assert p.parts[f"{d}_codec_ms"] == pytest.approx((buffer / 8e9 + buffer / 16e9) * 1e3)
        assert p.parts[f"{d}_wire_ms"] == pytest.approx(0.1 + 8 * raw / (64 / 17) / 1e9 * 1e3)  # one message a peer


def test_mx4_is_predicted_and_tabled_only_with_its_rates() -> None:
    assert list(predict_all(WORKLOAD, CODEC, Link(10.0), 8)) == list(METHODS)
    preds = predict_all(WORKLOAD, MX4_CODEC, Link(10.0), 8)
    assert list(preds) == list(ALL_METHODS) and ALL_METHODS[-1] == "mx4"
    lines = table({8: preds})
    assert lines[0].endswith("| TorchRec qcomm MX4 fwd / MX4 bwd ms (speedup) |") and lines[2].count("x)") == 5
    with pytest.raises(ValueError, match="method 'mx4' needs the MX4 codec rates"):
        predict("mx4", WORKLOAD, CODEC, Link(10.0), 8)
    with pytest.raises(ValueError, match="MX4 needs both rates"):
        replace(CODEC, mx4_encode_gb_s=8.0)
    with pytest.raises(ValueError, match="mx4_decode_gb_s=0.0 must be a finite number > 0"):
        replace(CODEC, mx4_encode_gb_s=8.0, mx4_decode_gb_s=0.0)


def test_compression_pays_more_the_slower_the_link() -> None:
    speedups = []
    for gbit in (1.0, 10.0, 100.0, 1000.0):
        preds = predict_all(WORKLOAD, CODEC, Link(gbit, 10.0), world=8)
        speedups.append(preds["fp32"].step_ms / preds["dlac_dlac"].step_ms)
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > 1 > speedups[-1], speedups


def test_combine_ratios_weights_tables_by_their_raw_bytes() -> None:
    # 100 bytes at 10x and 300 bytes at 3x: 10 + 100 bytes sent for 400 raw.
    assert combine_ratios({"a": 100, "b": 300}, {"a": 10.0, "b": 3.0}) == pytest.approx(400 / 110)
    with pytest.raises(ValueError, match=r"no ratio for table\(s\) \['b'\]"):
        combine_ratios({"a": 1, "b": 1}, {"a": 2.0})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Link(0.0), "gbit_s=0.0 must be a finite number > 0"),
        (lambda: Link(1.0, kind="ring"), "link kind 'ring' is not supported; choose one of"),
        (lambda: Workload(0, (8,), 1.0), "batch_per_rank=0 must be >= 1"),
        (lambda: Workload(8, (), 1.0), "needs one dimension >= 1 per table"),
        (lambda: Workload(8, (8,), 1.0, allreduce_hidden=2.0), "allreduce_hidden=2.0 must be between 0 and 1"),
        (lambda: Codec(0.5, 1.0, 1.0, -1.0), "decode_gb_s=-1.0 must be a finite number > 0"),
        (lambda: predict("zstd", WORKLOAD, CODEC, Link(1.0), 2), "method 'zstd' is not modelled"),
        (lambda: predict("fp32", WORKLOAD, CODEC, Link(1.0), 1), "world=1 must be >= 2"),
        (lambda: _dims("26x"), "write COUNTxDIM or DIM"),
    ],
)
def test_bad_inputs_are_named(build, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        build()


def test_dims_and_table() -> None:
    assert _dims("2x64,128") == (64, 64, 128) and _dims("16") == (16,)
    lines = table({8: predict_all(WORKLOAD, CODEC, Link(10.0), 8)})
    assert len(lines) == 3 and lines[2].startswith("| 8 | ") and lines[2].count("x)") == len(METHODS)
    assert "(1.00x)" in lines[2]  # FP32 against itself


def test_dlac_estimate_subcommand_logs_a_table(caplog: pytest.LogCaptureFixture) -> None:
    from lightning_dlac.commands.cli import main as cli_main

    with caplog.at_level(logging.INFO):
        cli_main(["estimate", "--world-sizes", "8,64", "--gbit", "100", "--compute-ms", "5", "--encode-gbps", "100",
                  "--decode-gbps", "100", "--cast-gbps", "500"])
    text = caplog.text
    assert "100 Gbit/s per GPU" in text and "| 8 | " in text and "| 64 | " in text
    for bad in (["--encode-gbps", "0"], ["--gbit", "0"], ["--cast-gbps", "0"], ["--world-sizes", ""]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--compute-ms", "5", "--encode-gbps", "1", "--decode-gbps", "1", "--cast-gbps", "1", *bad])
        assert exit_info.value.code == 2, bad  # argparse's error exit, naming the bad input on stderr


# ---------------------------------------------------------------------------------------------- nodes and policies

# 2 nodes x 2 ranks; within a node 8 Gbit/s per rank, across nodes 1 Gbit/s per node; 100 us per message.
TOPOLOGY = Topology(nodes=2, ranks_per_node=2, intra_gbit_s=8.0, inter_gbit_s=1.0, latency_us=100.0)


def test_each_policy_on_two_nodes_worked_by_hand() -> None:
    # A rank's 1000 x 16 x 4 = 64,000 bytes split in 4 shares of 16,000: 1 peer on its node, 2 on the other node.
    share = 16_000
    p = predict_policies(WORKLOAD, CODEC, TOPOLOGY)
    # none: one message per peer; the node's NIC carries both of its ranks' 2 shares to the other node.
    near, far = 0.1 + 8 * share / 8e9 * 1e3, 2 * 0.1 + 8 * 2 * (2 * share) / 1e9 * 1e3  # 0.116 and 0.712 ms
    assert p["none"].parts == pytest.approx({
        "forward_codec_ms": 0.0, "forward_same_node_ms": near, "forward_other_nodes_ms": far,
        "backward_codec_ms": 0.0, "backward_same_node_ms": near, "backward_other_nodes_ms": far})
    assert p["none"].forward_ms == pytest.approx(0.712) and p["none"].backward_ms == pytest.approx(0.712)
    assert p["none"].step_ms == pytest.approx(10.0 + 2 * 0.712)  # compute + both exchanges, no all-reduce
    # all: every share encoded (3 x 16,000 bytes at 1 GB/s in, 2 GB/s out; gradients 0.5 GB/s in), sent at the
    # direction's ratio (20, 5) in 2 messages per peer (sizes, then payload).
    fwd_codec, bwd_codec = (48_000 / 1e9 + 48_000 / 2e9) * 1e3, (48_000 / 0.5e9 + 48_000 / 2e9) * 1e3
    assert p["all"].parts["forward_codec_ms"] == pytest.approx(0.072)
    assert p["all"].parts["forward_same_node_ms"] == pytest.approx(2 * 0.1 + 8 * share / 20 / 8e9 * 1e3)
    assert p["all"].parts["forward_other_nodes_ms"] == pytest.approx(4 * 0.1 + 8 * 2 * 2 * share / 20 / 1e9 * 1e3)
    assert p["all"].forward_ms == pytest.approx(fwd_codec + 0.4256)
    assert p["all"].backward_ms == pytest.approx(bwd_codec + 4 * 0.1 + 8 * 2 * 2 * share / 5 / 1e9 * 1e3)
    # other_nodes: only the 2 far shares encoded; the near one goes as float32, after its chunk size (the size
    # exchange goes to every peer): 2 messages.
    assert p["other_nodes"].parts["forward_codec_ms"] == pytest.approx((32_000 / 1e9 + 32_000 / 2e9) * 1e3)
    assert p["other_nodes"].parts["forward_same_node_ms"] == pytest.approx(2 * 0.1 + 8 * share / 8e9 * 1e3)
    assert p["other_nodes"].parts["forward_other_nodes_ms"] == pytest.approx(0.4256)
    assert p["other_nodes"].forward_ms == pytest.approx(0.048 + 0.4256)
    assert p["other_nodes"].backward_ms == pytest.approx(0.08 + 0.5024)
    assert p["other_nodes"].step_ms < p["all"].step_ms < p["none"].step_ms


def test_other_nodes_beats_all_when_the_node_is_fast_and_the_codec_finite() -> None:
    workload = Workload(4096, (64,) * 26, compute_ms=5.0)
    for encode in (10.0, 100.0, 1000.0):
        codec = Codec(29.0, 9.0, encode, encode)
        for intra in (900.0, 3600.0, 7200.0):
            p = predict_policies(workload, codec, Topology(4, 8, intra, 400.0, 5.0))
            assert p["other_nodes"].step_ms < p["all"].step_ms, (encode, intra)
            # the near shares cost codec time under all and next to no wire time under either
            assert p["all"].parts["forward_codec_ms"] > p["other_nodes"].parts["forward_codec_ms"]


def test_one_rank_per_node_makes_all_and_other_nodes_one_policy_and_the_single_link_model() -> None:
    topology = Topology(nodes=4, ranks_per_node=1, intra_gbit_s=100.0, inter_gbit_s=0.1, latency_us=100.0)
    p = predict_policies(WORKLOAD, CODEC, topology)
    assert replace(p["other_nodes"], method="all") == p["all"]  # every peer is on another node
    # and each node's NIC is its one rank's link: the single-link model's per-GPU link of that bandwidth
    link = Link(0.1, 100.0)
    for policy, method in (("none", "fp32"), ("all", "dlac_dlac")):
        single = predict(method, WORKLOAD, CODEC, link, world=4)
        assert (p[policy].forward_ms, p[policy].backward_ms) == pytest.approx((single.forward_ms, single.backward_ms))
    assert policy_table(p)[-1].startswith("Fastest: all = other_nodes, a step of")
    # One node: nothing crosses a NIC, so other_nodes compresses nothing and is none.
    one_node = predict_policies(WORKLOAD, CODEC, Topology(1, 4, 100.0, 1.0))
    assert replace(one_node["other_nodes"], method="none") == one_node["none"]
    assert one_node["none"].parts["forward_other_nodes_ms"] == 0.0


def test_the_policies_modelled_are_compress_peers_rules_and_none() -> None:
    from lightning_dlac.comm.peers import POLICIES as PEER_POLICIES
    from lightning_dlac.comm.peers import RULES

    assert POLICIES == ("none", *RULES) and PEER_POLICIES == ("auto", *RULES)
    assert set(POLICY_LABELS) == set(POLICIES)
    with pytest.raises(ValueError, match="'auto' is not a rule of its own: it picks one of the others per job"):
        predict_policy("auto", WORKLOAD, CODEC, TOPOLOGY)


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_encodes_the_shares_of_the_peers_its_peer_plan_compresses(policy: str) -> None:
    """The model and the exchange read one rule per policy: the codec time it models is the encode and decode of
    one share for every peer that PeerPlan.from_policy compresses for (3 nodes x 2 ranks, seen from rank 0)."""
    from lightning_dlac.comm.peers import PeerPlan

    topology = Topology(nodes=3, ranks_per_node=2, intra_gbit_s=8.0, inter_gbit_s=1.0)
    compressed = 0 if policy == "none" else sum(PeerPlan.from_policy(policy, (0, 0, 1, 1, 2, 2)).to(0))
    share = WORKLOAD.batch_per_rank * WORKLOAD.total_dim * 4 / topology.world
    codec_ms = compressed * share * (1 / 1e9 + 1 / 2e9) * 1e3  # CODEC's forward rates: 1 GB/s in, 2 GB/s out
    assert predict_policy(policy, WORKLOAD, CODEC, topology).parts["forward_codec_ms"] == pytest.approx(codec_ms)
    assert compressed == {"none": 0, "all": 5, "other_nodes": 4}[policy]


def test_policy_table_names_the_fastest() -> None:
    lines = policy_table(predict_policies(WORKLOAD, CODEC, TOPOLOGY))
    assert len(lines) == 2 + len(POLICIES) + 1 and lines[2].startswith("| none (FP32 to every peer) | 0.71 (0.00 + ")
    assert lines[-1].startswith("Fastest: other_nodes, a step of") and "none " in lines[-1] and "all " in lines[-1]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Topology(0, 8, 1.0, 1.0), "nodes=0 and ranks_per_node=8 must both be >= 1"),
        (lambda: Topology(1, 1, 1.0, 1.0), "1 node x 1 rank exchanges nothing"),
        (lambda: Topology(2, 8, 1.0, 0.0), "inter_gbit_s=0.0 must be a finite number > 0"),
        (lambda: predict_policy("some", WORKLOAD, CODEC, TOPOLOGY), "policy 'some' is not modelled"),
    ],
)
def test_bad_topologies_are_named(build, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        build()


NODES = ["--nodes", "2", "--ranks-per-node", "8", "--intra-gbit", "3600", "--inter-gbit", "400", "--compute-ms", "5",
         "--encode-gbps", "100", "--decode-gbps", "100"]


def test_dlac_estimate_with_nodes_logs_the_policies(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        main(NODES)
    text = caplog.text
    assert "2 nodes x 8 ranks; within a node 3600 Gbit/s per rank, across nodes 400 Gbit/s per node" in text
    assert all(f"| {label} |" in text for label in ("none (FP32 to every peer)", "all (DLAC to every peer)"))
    assert "Fastest: other_nodes" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (NODES[:2] + NODES[8:], "--nodes without --ranks-per-node, --intra-gbit, --inter-gbit"),
        ([*NODES, "--gbit", "100"], "--gbit belong(s) to the single-link model"),
        ([*NODES, "--world-sizes", "8", "--shared"], "--world-sizes, --shared belong(s) to the single-link model"),
        (NODES[:8], "--compute-ms, --encode-gbps, --decode-gbps required"),
        (NODES[:8] + NODES[10:], "--compute-ms required"),
    ],
)
def test_dlac_estimate_names_missing_and_clashing_flags(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- --from-run


def _write_run(directory: Path, **overrides: float) -> Path:
    """A dlac_run.json whose summary is what the callback's monitor writes for 10 batches on 2 ranks."""
    from lightning_dlac.comm import CommStats
    from lightning_dlac.plugin.metrics import CompressionMonitor

    monitor = CompressionMonitor(per_table=False, all_reduce=lambda tensor, op: tensor)
    # Summed over 2 ranks and 10 batches: 4 MB raw sent as 200 kB; 0.04 s encoding, 0.02 s decoding; 2 s of
    # training batches of which 0.5 s in the exchanges.
    monitor.totals = CommStats(calls=20, raw_bytes=4_000_000, sent_bytes=200_000, encode_s=0.04, decode_s=0.02)
    monitor.batches, monitor.train_s, monitor.a2a_s = 10, 2.0, 0.5
    summary = {**monitor.summary(world_size=2), **overrides}
    path = directory / "dlac_run.json"
    path.write_text(json.dumps({"mode": "adaptive", "summary": summary, "history": []}))
    return path


def test_rates_from_a_finished_run(tmp_path: Path) -> None:
    rates = rates_from_run(_write_run(tmp_path))
    assert rates.forward_ratio == pytest.approx(20.0)
    assert rates.encode_gb_s == pytest.approx(4e6 / 0.04 / 1e9)  # 0.1 GB/s: bytes over the ranks' encode seconds
    assert rates.decode_gb_s == pytest.approx(4e6 / 0.02 / 1e9)
    assert rates.compute_ms == pytest.approx((2.0 - 0.5) / 20 * 1e3)  # 75 ms per step and rank
    assert rates_from_run(tmp_path) == rates  # the run's directory names its file
    without_times = json.loads((tmp_path / "dlac_run.json").read_text())
    del without_times["summary"]["train_s"]
    (tmp_path / "dlac_run.json").write_text(json.dumps(without_times))
    assert rates_from_run(tmp_path).compute_ms is None


def test_rates_from_a_run_leave_out_what_a_per_peer_plan_sent_as_it_was(tmp_path: Path) -> None:
    # 1 MB of the 4 MB raw went to same-node peers as it was (compress_peers): the codec made 200 kB of the other 3 MB.
    rates = rates_from_run(_write_run(tmp_path, raw_bytes=4_000_000, sent_bytes=1_200_000,
                                      forward_passed_bytes=1_000_000))
    assert rates.forward_ratio == pytest.approx(15.0)
    assert rates.encode_gb_s == pytest.approx(3e6 / 0.04 / 1e9)
    assert rates.policy == "other_nodes"  # the run's wait is measured against the policy it ran


def test_rates_from_a_run_read_the_gradient_ratio_and_the_exchange_time(tmp_path: Path) -> None:
    # Gradients: 4 MB raw, 1.5 MB sent, of which 1 MB as it was (to same-node peers): the codec made 0.5 MB of 3 MB.
    rates = rates_from_run(_write_run(tmp_path, backward_raw_bytes=4_000_000, backward_sent_bytes=1_500_000,
                                      backward_passed_bytes=1_000_000))
    assert rates.backward_ratio == pytest.approx(6.0)
    assert rates.exchanges_ms == pytest.approx(0.5 / 20 * 1e3)  # a2a_s over 10 batches x 2 ranks: 25 ms
    assert rates.policy == "all"
    # A file from before the gradient bytes were recorded still loads, without a gradient ratio.
    old = json.loads((tmp_path / "dlac_run.json").read_text())
    for key in ("backward_raw_bytes", "backward_sent_bytes", "backward_passed_bytes"):
        del old["summary"][key]
    (tmp_path / "dlac_run.json").write_text(json.dumps(old))
    assert rates_from_run(tmp_path).backward_ratio is None
    assert rates_from_run(tmp_path).forward_ratio == pytest.approx(20.0)


def test_rates_from_a_run_with_a_median_step_are_those_of_a_typical_step(tmp_path: Path) -> None:
    # The mean step is 2 s / 20 = 100 ms (75 compute, 25 exchanges); the median one 80 ms: a few slow steps pulled
    # the sums up, so both are shared out of the median step in the sums' proportion (x 0.8).
    rates = rates_from_run(_write_run(tmp_path, step_ms=80.0))
    assert rates.step_ms == 80.0
    assert rates.compute_ms == pytest.approx(60.0) and rates.exchanges_ms == pytest.approx(20.0)
    assert rates.encode_gb_s == pytest.approx(4e6 / 0.04 / 1e9)  # the codec rates stay the sums'
    assert rates_from_run(_write_run(tmp_path, step_ms=None)).compute_ms == pytest.approx(75.0)  # no median: the mean


# 2 nodes x 1 rank, batch 1000 x 250 columns: 1 MB per direction, one 0.5 MB share to the one peer (on the other
# node); codec 1 GB/s each way, 4 Gbit/s across, no latency.
TWO = Topology(nodes=2, ranks_per_node=1, intra_gbit_s=4.0, inter_gbit_s=4.0, latency_us=0.0)
RUN = RunRates(forward_ratio=10.0, encode_gb_s=1.0, decode_gb_s=1.0, compute_ms=75.0, backward_ratio=5.0,
               exchanges_ms=25.0)


def test_the_wait_is_the_runs_exchange_time_beyond_the_models_exchanges_for_its_own_policy() -> None:
    workload = Workload(batch_per_rank=1000, embedding_dims=(250,), compute_ms=75.0)
    codec = Codec(forward_ratio=10.0, backward_ratio=5.0, encode_gb_s=1.0, decode_gb_s=1.0)
    # all: codec 0.5 MB / 1 GB/s twice = 1 ms per direction; wire 8 x 0.5 MB / ratio / 4 Gbit/s = 0.1 ms forward
    # (ratio 10), 0.2 ms backward (ratio 5): 2.3 ms of the run's 25 ms of exchanges are modelled, 22.7 ms are the wait.
    assert wait_from_run(RUN, workload, codec, TWO) == pytest.approx(22.7)
    preds = predict_policies(replace(workload, wait_ms=22.7), codec, TWO)
    assert preds["all"].step_ms == pytest.approx(100.0)  # the run's own step: compute + exchanges (75 + 25)
    assert preds["none"].step_ms == pytest.approx(75.0 + 22.7 + 2 * 1.0)  # float32: 8 x 0.5 MB / 4 Gbit/s = 1 ms
    assert preds["none"].wait_ms == pytest.approx(22.7)
    # Run against another policy (other_nodes: here every peer is on the other node, so the same exchanges).
    assert wait_from_run(replace(RUN, policy="other_nodes"), workload, codec, TWO) == pytest.approx(22.7)
    # A run faster than the model's exchanges waited for nobody; one without a2a_s has no wait to give.
    assert wait_from_run(replace(RUN, exchanges_ms=1.0), workload, codec, TWO) == 0.0
    assert wait_from_run(replace(RUN, exchanges_ms=None), workload, codec, TWO) is None
    with pytest.raises(ValueError, match="wait_ms"):
        Workload(batch_per_rank=1000, embedding_dims=(250,), compute_ms=75.0, wait_ms=-1.0)


def test_dlac_estimate_from_run_adds_the_runs_wait_and_gradient_ratio(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # The run above as a file: 10 batches x 2 ranks, 2 s of training of which 0.5 s exchanges (compute 75 ms, 25 ms
    # of exchanges per step); gradients 4 MB raw sent as 0.8 MB (ratio 5).
    path = _write_run(tmp_path, backward_raw_bytes=4_000_000, backward_sent_bytes=800_000)
    argv = ["--nodes", "2", "--ranks-per-node", "1", "--intra-gbit", "4", "--inter-gbit", "4", "--latency-us", "0",
            "--batch", "1000", "--dims", "250", "--from-run", str(path), "--forward-ratio", "10", "--encode-gbps", "1",
            "--decode-gbps", "1"]
    with caplog.at_level(logging.INFO):
        main(argv)
    read = next(line for line in caplog.text.splitlines() if "dlac estimate: from" in line)
    assert read.endswith("compute 75.00 ms per step, gradient ratio 5.00; gradient codec rates from the flags, else"
                         " the forward's (a run times the gradient exchange as one phase); wait on the slowest rank"
                         " 22.70 ms per step (the run's exchanges beyond this model's for its policy all on these"
                         " nodes)")
    assert "step = compute + wait on the slowest rank (22.70 ms) + both exchanges" in caplog.text
    rows = {p: next(line for m in caplog.messages for line in m.splitlines() if line.startswith(f"| {p} "))
            for p in POLICIES}
    assert float(rows["all"].split("|")[4].split()[0]) == pytest.approx(100.0)
    assert float(rows["none"].split("|")[4].split()[0]) == pytest.approx(99.7)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        main([*argv, "--wait-ms", "0", "--backward-ratio", "2"])  # flags override the run
    assert "wait on the slowest rank" not in caplog.text
    rows = {p: next(line for m in caplog.messages for line in m.splitlines() if line.startswith(f"| {p} "))
            for p in POLICIES}
    assert float(rows["none"].split("|")[4].split()[0]) == pytest.approx(77.0)


def test_dlac_estimate_from_run_and_flags_override_it(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_run(tmp_path)
    with caplog.at_level(logging.INFO):
        main([*NODES[:8], "--from-run", str(path), "--decode-gbps", "50"])
    read = next(line for line in caplog.text.splitlines() if "dlac estimate: from" in line)
    # the decode rate given on the command line, everything else from the run
    assert read.endswith(f"dlac estimate: from {path}: forward ratio 20.00, encode 0.1 GB/s, compute 75.00 ms per"
                         " step; gradient ratio and rates from the flags; wait on the slowest rank 0.00 ms per step"
                         " (the run's exchanges beyond this model's for its policy all on these nodes)")
    none_row = next(line for line in caplog.text.splitlines() if "| none (FP32 to every peer) |" in line)
    assert float(none_row.split("|")[4].split()[0]) > 75.0  # the run's compute plus the exchanges
    # The single-link model still needs the cast rate, which a run does not measure.
    with pytest.raises(SystemExit):
        main(["--world-sizes", "8", "--from-run", str(path)])
    assert "--cast-gbps required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "is not JSON"),
        ('{"history": []}', "has no 'summary' object"),
        ({"encode_ms": None}, "summary.encode_ms is missing"),
        ({"raw_bytes": "many"}, "summary.raw_bytes is not a number ('many')"),
        ({"sent_bytes": 0}, "summary.sent_bytes is 0, so the run compressed nothing to measure"),
    ],
)
def test_a_bad_run_file_is_named_with_the_fix(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "dlac_run.json"
    if isinstance(content, dict):
        path = _write_run(tmp_path)
        run = json.loads(path.read_text())
        run["summary"].update(content)
        run["summary"] = {k: v for k, v in run["summary"].items() if v is not None}
        path.write_text(json.dumps(run))
    elif isinstance(content, str):
        path.write_text(content)
    with pytest.raises(ValueError, match="DLACCallback\\(report=True\\)") as info:
        rates_from_run(path)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("write", "members", "message"),
    [
        (None, {}, "cannot read it (No such file or directory)"),
        ("directory", {}, "cannot read it (Is a directory)"),
        ("{not json", {}, "is not JSON (Expecting property name enclosed in double quotes"),
        (b"\xff\xfe binary", {}, "is not JSON ("),
        ("[1, 2]", {"summary": dict}, "has no 'summary' object"),
        ('{"summary": []}', {"summary": dict}, "has no 'summary' object"),
        ('{"results": {}}', {"results": list}, "has no 'results' list"),
    ],
)
def test_the_json_reader_names_the_file_the_reason_and_the_fix(tmp_path: Path, write: str | bytes | None,
                                                               members: dict[str, type], message: str) -> None:
    path = tmp_path / "given.json"
    if write == "directory":
        path.mkdir()
    elif isinstance(write, bytes):
        path.write_bytes(write)
    elif write is not None:
        path.write_text(write)
    where = f"--some-option {str(path)!r}"
    with pytest.raises(ValueError) as err:
        read_json(path, where, "give the file that X wrote", members)
    assert str(err.value).startswith(where) and message in str(err.value)
    assert str(err.value).endswith("; give the file that X wrote.")


def test_the_json_reader_returns_the_object(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"summary": {"a": 1}, "other": 2}')
    assert read_json(tmp_path / "run.json", "x", "y", {"summary": dict}) == {"summary": {"a": 1}, "other": 2}


def test_both_readers_read_through_the_one_reader(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for read, option in ((rates_from_run, "--from-run"), (device_rates, "--device-rates")):
        with pytest.raises(ValueError, match=rf"^{option} '.*bad.json' is not JSON \(Expecting"):
            read(bad)
    bad.write_text('{"history": []}')
    with pytest.raises(ValueError, match="has no 'results' list; give the JSON that benchmarks/cuda_codec_bench.py"):
        device_rates(bad)


def test_every_name_of_the_one_estimate_module_is_still_importable_from_it() -> None:
    import lightning_dlac.commands.estimate as estimate
    from lightning_dlac.commands.estimate import cli, model, rates

    for module in (model, rates, cli):
        public = [n for n, v in vars(module).items()
                  if not n.startswith("_") and getattr(v, "__module__", module.__name__) == module.__name__
                  and not isinstance(v, type(estimate))]  # fmt: skip
        assert [n for n in public if getattr(estimate, n, None) is not getattr(module, n)] == [], module.__name__
    assert estimate._dims is cli._dims and estimate._positive is model._positive  # private helpers too
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        estimate.nothing  # noqa: B018


def test_the_example_in_docs_multinode_is_what_the_command_prints(caplog: pytest.LogCaptureFixture) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "multinode.md").read_text()
    section = text.split("## Which peers to compress", 1)[1]
    command, printed = re.findall(r"```\n(.*?)\n```", section, flags=re.S)[:2]
    argv = command.replace("\\\n", " ").split()
    assert argv[:4] == ["dlac", "estimate", "--nodes", "4"]
    with caplog.at_level(logging.INFO):
        main(argv[2:])
    assert printed.splitlines() == [line for m in caplog.messages for line in m.splitlines()], (
        "docs/multinode.md's dlac estimate example is stale: paste what the command prints now")


# ---------------------------------------------------------------------------------------------- --device-rates


def _bench_row(payload: str, codec: str, enc: float, dec: float, **extra: object) -> dict[str, object]:
    return {"payload": payload, "codec": codec, "ratio": 2.0, "encode_gbps": enc, "decode_gbps": dec, **extra}


def _write_bench(directory: Path, mx4: bool = True, gradient: bool = True, **config: object) -> Path:
    """A cuda_codec_bench.json shaped as the script writes it: metadata, config, results rows, not_measured."""
    rows = [_bench_row("criteo", "memcpy", 1800.0, 1800.0, moved_gbps=3600.0),
            _bench_row("criteo", "fp16", 2000.0, 1000.0),
            _bench_row("criteo", "int8 row-wise (torch)", 300.0, 450.0),
            _bench_row("criteo", "dlac eps=0.01", 16.0, 32.0, parity="bytes+bits equal", syncs=[1, 3]),
            _bench_row("criteo", "dlac eps=0.01 via host copies", 1.0, 3.0),
            _bench_row("criteo", "dlac eps=0.05", 22.0, 33.0, parity="bytes+bits equal", syncs=[1, 3])]
    not_measured = []
    if mx4:
        rows.append(_bench_row("criteo", "mx4 (fbgemm triton)", 400.0, 800.0, max_err_range=0.1))
    else:
        not_measured.append({"payload": "criteo", "codec": "mx4 (fbgemm triton)", "reason": "Triton is not installed"})
    if gradient:
        rows.append(_bench_row("gradient", "dlac eps=0.01", 7.0, 30.0, parity="bytes+bits equal"))
    path = directory / "cuda_codec_bench.json"
    path.write_text(json.dumps({"metadata": {"command": "python benchmarks/cuda_codec_bench.py"},
                                "config": {"device": "NVIDIA H200", "batch": 4096, "emulated": False, **config},
                                "results": rows, "not_measured": not_measured}))
    return path


def test_device_rates_read_each_row_of_a_gpu_run(tmp_path: Path) -> None:
    rates = device_rates(_write_bench(tmp_path))
    assert (rates.device, rates.encode_gb_s, rates.decode_gb_s) == ("NVIDIA H200", 16.0, 32.0)
    assert (rates.backward_encode_gb_s, rates.backward_decode_gb_s) == (7.0, 30.0)
    assert rates.cast_gb_s == pytest.approx(2 / (1 / 2000 + 1 / 1000))  # the model costs a cast as 2 bytes / rate
    assert (rates.mx4_encode_gb_s, rates.mx4_decode_gb_s, rates.mx4_missing) == (400.0, 800.0, "")
    other = device_rates(_write_bench(tmp_path, mx4=False, gradient=False), eps=0.05)
    assert (other.encode_gb_s, other.backward_encode_gb_s, other.mx4_encode_gb_s) == (22.0, None, None)
    assert other.mx4_missing.endswith("codec 'mx4 (fbgemm triton)' (not measured: Triton is not installed)")


@pytest.mark.parametrize(
    ("write", "kwargs", "message"),
    [
        (lambda d: _write_bench(d), {"eps": 0.1}, "has no row payload 'criteo', codec 'dlac eps=0.1' with encode and"
                                                   " decode GB/s (its payloads: criteo, gradient)"),
        (lambda d: _write_bench(d), {"payload": "zipf"}, "has no row payload 'zipf', codec 'dlac eps=0.01'"),
        (lambda d: _write_bench(d, emulated=True), {}, "is a rehearsal on the host"),
        (lambda d: d / "missing.json", {}, "cannot read it"),
        (lambda d: d, {}, "cannot read it"),
    ],
)
def test_a_missing_row_or_a_bad_file_is_named_with_the_file(tmp_path: Path, write, kwargs: dict[str, object],  # noqa: ANN001
                                                            message: str) -> None:
    path = write(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        device_rates(path, **kwargs)  # type: ignore[arg-type]
    assert f"--device-rates {str(path)!r}" in str(err.value)


def test_dlac_estimate_device_rates_states_the_gpu_comparison(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_bench(tmp_path)
    with caplog.at_level(logging.INFO):
        main(["--world-sizes", "8", "--compute-ms", "5", "--device-rates", str(path), "--decode-gbps", "50"])
    text = caplog.text
    assert ("NVIDIA H200, payload criteo, dlac eps=0.01: GB/s DLAC encode 16, gradient encode 7, gradient decode 30,"
            " cast (fp16) 1.33e+03, MX4 encode 400, MX4 decode 800") in text  # --decode-gbps given: not taken
    assert "TorchRec qcomm MX4 fwd / MX4 bwd ms (speedup)" in text
    # No MX4 row: refused, naming the row, the file and the fix, unless its rates are given as flags.
    bare = _write_bench(tmp_path, mx4=False)
    with pytest.raises(SystemExit):
        main(["--compute-ms", "5", "--device-rates", str(bare)])
    err = capsys.readouterr().err
    assert f"--device-rates {str(bare)!r} has no row payload 'criteo', codec 'mx4 (fbgemm triton)'" in err
    assert "give --mx4-encode-gbps and --mx4-decode-gbps" in err
    caplog.clear()
    with caplog.at_level(logging.INFO):
        main(["--world-sizes", "8", "--compute-ms", "5", "--device-rates", str(bare), "--mx4-encode-gbps", "1",
              "--mx4-decode-gbps", "2"])
    assert "TorchRec qcomm MX4 fwd / MX4 bwd" in caplog.text
    # With --nodes: the DLAC rates only (no cast, no MX4 there), and the MX4 flags clash.
    nodes = ["--nodes", "2", "--ranks-per-node", "2", "--intra-gbit", "100", "--inter-gbit", "10", "--compute-ms", "5"]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        main([*nodes, "--device-rates", str(bare)])
    assert "GB/s DLAC encode 16, DLAC decode 32, gradient encode 7, gradient decode 30\n" in caplog.text + "\n"
    with pytest.raises(SystemExit):
        main([*nodes, "--mx4-encode-gbps", "1", "--mx4-decode-gbps", "2", "--encode-gbps", "1", "--decode-gbps", "1"])
    assert "--mx4-encode-gbps, --mx4-decode-gbps belong(s) to the single-link model" in capsys.readouterr().err
