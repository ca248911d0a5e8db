"""The two-node benchmark's pure parts (benchmarks/e2e_topology.py, issue 37 item 2), in-process: the command lines
that build and throttle the emulated network, each rank's namespace and torchrun environment, the launch order, the
bytes per link class and the targets judged by the rule. The namespaces themselves need root and run in the
benchmark, not here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import e2e_topology as topo  # noqa: E402 - benchmarks/ is not a package
from e2e_bandwidth import VARIANTS, ceilings_after_sources, launch_order  # noqa: E402


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
