"""The two-node benchmark's pure parts (``python -m benchmarks.e2e_topology``, issue 37 item 2), in-process: the command
lines that build and throttle the emulated network, each rank's namespace and torchrun environment, the launch order,
the bytes per link class and the targets judged by the rule. The namespaces themselves need root and run in the
benchmark, not here."""

from __future__ import annotations

from pathlib import Path

import pytest

import benchmarks.e2e_topology as topo
from benchmarks.lib import estimate_check as te
from benchmarks.lib.e2e import VARIANTS, ceilings_after_sources, launch_order


def test_the_network_is_two_namespaces_joined_by_a_veth_pair_throttled_on_both_ends() -> None:
    t = topo.Topology(4194304)  # the largest pid: every interface name still fits IFNAMSIZ
    assert len({t.namespace(0), t.namespace(1)}) == 2 and all(len(t.veth(n)) <= 15 for n in (0, 1))
    setup = topo.setup_commands(t)
    assert setup[:3] == [["ip", "netns", "add", t.namespace(0)], ["ip", "netns", "add", t.namespace(1)],
                         ["ip", "link", "add", t.veth(0), "type", "veth", "peer", "name", t.veth(1)]]
    for node in (0, 1):
        inside = ["ip", "netns", "exec", t.namespace(node)]
        assert ["ip", "link", "set", t.veth(node), "netns", t.namespace(node)] in setup
        assert [*inside, "ip", "addr", "add", f"10.78.0.{node + 1}/24", "dev", t.veth(node)] in setup
        assert [*inside, "ip", "link", "set", "lo", "up"] in setup
        assert [*inside, "tc", "qdisc", "replace", "dev", t.veth(node), "root", "tbf", "rate", "1gbit", "burst", "1mb",
                "latency", "20ms"] in topo.rate_commands(t, "1gbit")
    assert all("del" in cmd for cmd in topo.rate_commands(t, "unthrottled"))
    assert topo.teardown_commands(t) == [["ip", "netns", "del", t.namespace(n)] for n in (0, 1)]


def test_ranks_run_two_per_node_with_the_environment_torchrun_gives_them() -> None:
    t = topo.Topology(77)
    for rank in range(4):
        node = rank // 2
        env = topo.rank_env(t, rank, 29501)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "4" and env["LOCAL_RANK"] == str(rank % 2)
        assert env["GROUP_RANK"] == str(node) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "10.78.0.1" and env["MASTER_PORT"] == "29501"
        assert env["GLOO_SOCKET_IFNAME"] == t.veth(node)  # gloo advertises the node's veth address
        cmd = topo.rank_command(t, rank, Path("spec.json"), Path("out.json"))
        assert cmd[:4] == ["ip", "netns", "exec", t.namespace(node)] and cmd[-4:] == [
            "--_rank-spec", "spec.json", "--_rank-out", "out.json"]


def test_launches_alternate_abba_with_each_ceiling_right_after_its_source() -> None:
    names = list(topo.DEFAULT_VARIANTS)
    assert all(n in VARIANTS for n in names)
    assert VARIANTS["dlac_dlac_all"].compress_peers == "all"
    assert VARIANTS["dlac_dlac_other_nodes"].compress_peers == "other_nodes"
    assert VARIANTS["ceiling_dlac_dlac_other_nodes"].ceiling_of == "dlac_dlac_other_nodes"
    reversed_order = ceilings_after_sources(launch_order(names, 1))
    assert reversed_order == ["dlac_dlac_other_nodes", "ceiling_dlac_dlac_other_nodes", "dlac_dlac_all",
                              "qcomm_int8_fp16", "fp32"]


def _row(variant: str, launch_ms: list[float]) -> dict:
    ordered = sorted(launch_ms)
    return dict(rate="1gbit", variant=variant, label=VARIANTS[variant].label, launch_median_ms=launch_ms,
                median_step_ms=ordered[len(ordered) // 2])


def test_the_targets_are_judged_by_the_two_thirds_rule_against_every_qcomm_variant_that_ran() -> None:
    rows = [_row("dlac_dlac_all", [400, 420, 410]), _row("dlac_dlac_other_nodes", [350, 360, 390]),
            _row("qcomm_int8_fp16", [600, 610, 380])]
    verdicts = {t["reference"]: t for t in topo.judge_targets(rows, errors=[])}
    assert set(verdicts) == {"dlac_dlac_all", "qcomm_int8_fp16"}
    vs_all = verdicts["dlac_dlac_all"]  # 410 / 360 = 1.14 pooled; per repeat 1.14, 1.17, 1.05: two of three meet
    assert vs_all["per_repeat"] == pytest.approx([400 / 350, 420 / 360, 410 / 390])
    assert vs_all["repeats_meeting"] == 2 and vs_all["met"]
    vs_qcomm = verdicts["qcomm_int8_fp16"]  # ahead in two of three repeats: met
    assert vs_qcomm["threshold"] == 1.0 and vs_qcomm["repeats_meeting"] == 2 and vs_qcomm["met"]
    error = dict(rate="1gbit", variant="dlac_dlac_other_nodes")  # counted in each verdict, as e2e_bandwidth's
    assert [t["ceiling_errors"] for t in topo.judge_targets(rows, errors=[error])] == [1, 1]


def test_fp32_bytes_split_by_link_class_as_each_peers_equal_share() -> None:
    per_rank = [dict(times=[0.1, 0.1], fwd_sent_bytes=600, bwd_sent_bytes=600) for _ in range(4)]
    links = topo.link_bytes_per_step("fp32", per_rank)
    assert [x["node"] for x in links] == [0, 0, 1, 1]
    assert all(x["same_node"] == 200 and x["other_nodes"] == 400 for x in links)  # 1 peer here, 2 on the other node
    dlac = topo.link_bytes_per_step("dlac_dlac_other_nodes", [dict(times=[0.1, 0.1], same_node_sent_bytes=1000,
                                                                   other_nodes_sent_bytes=100)] * 4)
    assert dlac[0] == dict(rank=0, node=0, source="CommStats", same_node=500, other_nodes=50)


# dlac estimate against the launches (issue 37 item 3): benchmarks/lib/estimate_check.py

SHARE = 2048 * 26 * 64 * 4 // 4  # one peer's float32 share of a step at batch 2048 on 4 ranks


def _dlac_rank(times: list[float]) -> dict:
    """One rank's record as e2e_bandwidth's _train_rank writes it for a DLAC launch of len(times) steps."""
    return dict(times=times, fwd_raw_bytes=3e9, fwd_sent_bytes=1.1e9, fwd_passed_bytes=1e9, fwd_encode_s=0.1,
                fwd_exchange_s=0.03, fwd_decode_s=0.05, bwd_s=0.12, bwd_raw_bytes=3e9, bwd_sent_bytes=0.5e9)


def test_tc_rates_read_in_gbit_and_tbf_frames_carry_tcp_payload_by_header_sizes() -> None:
    assert te.tc_rate_gbit("1gbit") == 1.0 and te.tc_rate_gbit("500mbit") == 0.5
    assert te.tc_rate_gbit("100mbps") == pytest.approx(0.8)  # tc's bps is bytes per second
    assert te.tc_rate_gbit("unthrottled") is None
    assert te.TCP_PAYLOAD_SHARE == pytest.approx(1448 / 1514)


def test_a_launch_reads_back_through_estimates_own_reader_as_its_dlac_run_json_would() -> None:
    summary = te.run_summary([_dlac_rank([0.3, 0.5]) for _ in range(4)])
    assert summary["world_size"] == 4 and summary["batches"] == 2
    assert summary["train_s"] == pytest.approx(3.2) and summary["a2a_s"] == pytest.approx(1.2)
    assert summary["encode_ms"] == pytest.approx(0.4 * 1000 / 8)  # summed over ranks, per step and rank
    figures = dict(intra_gbit=2.0, latency_us=1000.0)
    inputs, preds = te.predict_from_summary(summary, figures, 1.0, 2048, 2, 2)
    # rates_from_run: the bytes sent as they are leave the codec's ratio and rates; compute = (train - a2a) per
    # rank-step; the gradient ratio from the gradient bytes
    assert inputs["forward_ratio"] == pytest.approx(2e9 / 0.1e9)
    assert inputs["encode_gb_s"] == pytest.approx(2e9 / 0.1 / 1e9)
    assert inputs["decode_gb_s"] == pytest.approx(2e9 / 0.05 / 1e9)
    assert inputs["compute_ms"] == pytest.approx((3.2 - 1.2) * 1e3 / 8)
    assert inputs["backward_ratio"] == pytest.approx(6.0)
    # The wait on the slowest rank: the launch's 150 ms of exchanges per rank-step (0.3 s per rank over 2 steps)
    # beyond the model's for its own policy, other_nodes (it passed forward bytes as they are). Per direction: the
    # codec on the two shares to the other node (20 GB/s encode, 40 decode; gradients at the same rates), then the
    # slower of one share raw over loopback (2 messages: the size exchange goes to every peer) and the node's four
    # shares to the other node at the direction's ratio (20 forward, 6 backward; 2 messages each, shared link).
    codec = 2 * SHARE / 20e9 * 1e3 + 2 * SHARE / 40e9 * 1e3
    loopback = 2.0 + 8 * SHARE / 2e9 * 1e3
    forward = codec + max(loopback, 4.0 + 8 * 2 * 2 * SHARE / 20 / 1e9 * 1e3)
    backward = codec + max(loopback, 4.0 + 8 * 2 * 2 * SHARE / 6 / 1e9 * 1e3)
    assert inputs["wait_ms"] == pytest.approx(150.0 - forward - backward)
    # FP32 to every peer, by hand: per direction the slower of one share over loopback (1 message, 2 Gbit/s per
    # rank) and the node's four shares to the other node (2 messages each rank, 1 Gbit/s per node), plus the wait
    intra = 1.0 + 8 * SHARE / 2e9 * 1e3
    inter = 2.0 + 8 * 4 * SHARE / 1e9 * 1e3
    assert inter > intra
    assert preds["none"].step_ms == pytest.approx(250.0 + inputs["wait_ms"] + 2 * inter)
    assert set(preds) == {"none", "all", "other_nodes"}


def _probe(same_s: float, other_s: float, tiny_s: float) -> dict:
    fast = dict(tiny_s=[tiny_s / 2] * 3, same_node_s=[same_s / 2] * 3, other_nodes_s=[other_s / 2] * 3,
                all_peers_s=[0.05] * 3)
    # the slowest rank per repeat counts; the median over repeats drops the one slow repeat
    slow = dict(tiny_s=[tiny_s, tiny_s, 1.0], same_node_s=[same_s, same_s, 1.0],
                other_nodes_s=[other_s, other_s, 1.0], all_peers_s=[0.1, 0.1, 1.0])
    return dict(share_bytes=SHARE, repeats=3, loadavg_1m=1.5, per_rank=[fast, slow, fast, fast])


def test_the_probe_gives_the_loopback_rate_per_rank_and_a_message_rounds_cost_per_peer() -> None:
    fig = te.probe_figures(_probe(8 * SHARE / 2e9, 8 * 4 * SHARE / 0.8e9, 0.003), 2, 2)
    assert fig["intra_gbit"] == pytest.approx(2.0) and fig["inter_gbit_measured"] == pytest.approx(0.8)
    assert fig["latency_us"] == pytest.approx(1000.0) and fig["all_peers_ms"] == pytest.approx(100.0)


def _launch(repeat: int, ms: float, summary: dict | None = None) -> dict:
    return dict(repeat=repeat, median_ms=ms, **({"run_summary": summary} if summary else {}))


def test_each_policys_prediction_is_judged_against_its_launches_within_15_percent_by_the_rule() -> None:
    cfg = dict(nodes=2, ranks_per_node=2, batch_size=2048)
    probes = {"1gbit": _probe(8 * SHARE / 2e9, 0.2, 0.003), "unthrottled": _probe(0.01, 0.01, 0.003)}
    # the source launches: repeat 2 ran with twice the compute, so its prediction is its own
    summaries = [te.run_summary([_dlac_rank([0.3, 0.5] if rep < 2 else [0.7, 0.9]) for _ in range(4)])
                 for rep in range(3)]
    pooled = te.run_summary([_dlac_rank([0.3, 0.5, 0.3, 0.5, 0.7, 0.9]) for _ in range(4)])
    figures = te.probe_figures(probes["1gbit"], 2, 2)
    inter = te.TCP_PAYLOAD_SHARE

    def predicted(summary: dict, policy: str) -> float:
        return te.predict_from_summary(summary, figures, inter, 2048, 2, 2)[1][policy].step_ms

    fp32 = [predicted(summaries[0], "none"), 1.3 * predicted(summaries[1], "none"), predicted(summaries[2], "none")]
    other = [1.5 * predicted(s, "other_nodes") for s in summaries]
    rows = [dict(rate="1gbit", variant="dlac_dlac_all", label="all", median_step_ms=predicted(pooled, "all") * 1.1,
                 run_summary=pooled, launches=[_launch(r, predicted(s, "all"), s) for r, s in enumerate(summaries)]),
            dict(rate="1gbit", variant="fp32", label="fp32", median_step_ms=predicted(pooled, "none"),
                 launches=[_launch(r, ms) for r, ms in enumerate(fp32)]),
            dict(rate="1gbit", variant="dlac_dlac_other_nodes", label="other",
                 median_step_ms=1.5 * predicted(pooled, "other_nodes"),
                 launches=[_launch(r, ms) for r, ms in enumerate(other)]),
            dict(rate="unthrottled", variant="dlac_dlac_all", label="all", median_step_ms=1.0, run_summary=pooled,
                 launches=[])]
    checks = {c["variant"]: c for c in te.check(rows, probes, cfg)}
    assert set(checks) == {"fp32", "dlac_dlac_all", "dlac_dlac_other_nodes"}  # no tbf rate unthrottled: no check
    assert all(c["rate"] == "1gbit" and c["threshold"] == 0.15 and not c["at_least"] for c in checks.values())
    assert checks["fp32"]["policy"] == "none" and checks["fp32"]["ratio"] == pytest.approx(1.0)
    assert checks["fp32"]["per_repeat_ratio"] == pytest.approx([1.0, 1 / 1.3, 1.0])
    assert checks["fp32"]["repeats_meeting"] == 2 and checks["fp32"]["met"]  # two thirds of the repeats
    assert checks["dlac_dlac_all"]["ratio"] == pytest.approx(1 / 1.1) and checks["dlac_dlac_all"]["met"]
    assert checks["dlac_dlac_other_nodes"]["ratio"] == pytest.approx(1 / 1.5)
    assert checks["dlac_dlac_other_nodes"]["repeats_meeting"] == 0 and not checks["dlac_dlac_other_nodes"]["met"]
    # the terms beside their measurements: the DLAC launch's own phase times, none for FP32
    all_terms = checks["dlac_dlac_all"]["measured_terms"]
    assert all_terms["forward_codec_ms"] == pytest.approx(pooled["encode_ms"] + pooled["decode_ms"])
    assert checks["fp32"]["measured_terms"]["compute_ms"] is None
    assert checks["fp32"]["inputs"]["inter_gbit"] == pytest.approx(1448 / 1514)
    rendered = te.table(list(checks.values()))
    assert rendered[2].startswith("| 1gbit | fp32 (`none`) |") and rendered[2].endswith("**met** (2 of 3 repeats) |")
    assert "| 0.67 (0.67) | **not met** (0 of 3 repeats) |" in rendered[4]
    assert rendered[5:] and te.table(list(checks.values()), terms=False) == rendered[:5]  # the terms only with them
