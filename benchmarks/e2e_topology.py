"""End-to-end DLRM training step time on an emulated two-node network (issue 37 item 2): 4 gloo CPU ranks as
2 nodes x 2 ranks, the link between the nodes throttled and the links within a node not, so that what DLAC should
compress depends on the peer. It measures whether compressing only to the other node's ranks
(``compress_peers="other_nodes"``) pays against compressing to every peer (``"all"``) and against TorchRec's qcomm
codecs, and how close it comes to its like-for-like ceiling; prints a table and the targets, writes JSON.

Run as root on Linux (needs ``ip netns``, veth and ``tc``), from the repository root:

    python -m benchmarks.e2e_topology --rates 1gbit,10gbit --batch-size 4096 --steps 6 --warmup 2 --repeats 4

The network. Two network namespaces (``dlac<pid>a`` / ``dlac<pid>b``, unique per run, deleted when the run ends,
however it ends) are the two nodes, joined by a veth pair: ``10.78.0.1/24`` on node A's end, ``10.78.0.2/24`` on node
B's, each namespace's ``lo`` up. Both veth ends carry ``tc qdisc replace dev <veth> root tbf rate <R> burst 1mb
latency 20ms`` (each rate of ``--rates`` in turn; nothing for ``unthrottled``), so each direction between the nodes
runs at ``R``. Ranks 0 and 1 run in namespace A, ranks 2 and 3 in B, each its own ``ip netns exec <ns> python ...``
process (a new session, killed as a process group on failure or timeout, as lightning_dlac/testing/launch.py does),
with the environment torchrun would give it: ``RANK``, ``WORLD_SIZE=4``, ``LOCAL_RANK``, ``GROUP_RANK`` (the node: 0
or 1), ``LOCAL_WORLD_SIZE=2``, ``MASTER_ADDR=10.78.0.1`` (rank 0 hosts the store; a fresh port per launch) and
``GLOO_SOCKET_IFNAME`` = its node's veth, one thread per rank.

Why the traffic within a node is not throttled: with ``GLOO_SOCKET_IFNAME`` every rank binds and advertises its veth
address, so both ranks of node A listen on 10.78.0.1. A connection from rank 0 to rank 1 goes to an address that is
local to namespace A, which the kernel routes through the local table over that namespace's ``lo`` and never hands to
the veth (so never to its ``tbf``); only connections to the other node's address leave by the veth. Each launch
records the bytes that left both veths and both loopbacks (``link_bytes``, whole launch: set-up, warm-up and the DDP
all-reduce of the dense gradients, which crosses the nodes too, included). Measured (FP32, batch 512, 3 steps): the
two loopbacks carried 26 MiB, the veths 47 MiB, where the all-to-all's shares were 19 MiB to same-node peers and
38 MiB to the other node's: the same-node pairs went over ``lo``; over the veth they would have left ``lo`` nearly
idle and put 57 MiB or more on the veths.

The step loop is the end-to-end benchmarks' (benchmarks/lib/e2e.py's ``train_rank``: TorchRec's DLRM, 26 tables of
dim 64, table-wise sharding, fused Adagrad, one-hot Zipf ids), on its variants (``VARIANTS``):

- ``fp32``: TorchRec, uncompressed; ``qcomm_int8_fp16``: TorchRec's fastest qcomm codec in e2e_qcomm_race.json;
- ``dlac_dlac_all``: DLAC both directions, to every peer (``compress_peers="all"``);
- ``dlac_dlac_other_nodes``: DLAC both directions to the other node's ranks, the same node's pair uncompressed
  (``compress_peers="other_nodes"``, what ``"auto"`` picks on two GPU nodes; on gloo it compresses for every peer);
- ``ceiling_dlac_dlac_other_nodes``: its like-for-like ceiling: the null codec (lightning_dlac/comm/null_codec.py)
  sending the bytes of the ``dlac_dlac_other_nodes`` launch of its repeat, launched right after it, no encode or
  decode; a launch faster than its ceiling by more than 5% is a benchmark error (``ceiling_checks``).

Each variant is launched ``--repeats`` times (4 by default) in ABBA order, its steps pooled (median step, the slowest
rank per step); ratios are the pooled medians' with the per-repeat ratios of the launches of the same repeat. Each
rank records the payload bytes it sent to the peers of each link class (forward + backward): for DLAC from its
``CommStats`` (``same_node_sent_bytes``, ``other_nodes_sent_bytes``), for FP32 and qcomm each peer's equal share of
what the rank sent. The targets (``TARGETS``, judged by the rule of benchmarks/lib/rule.py): at 1 Gbit/s between the
nodes, DLAC to other nodes only >= 1.1x DLAC to every peer, and ahead of every qcomm variant that ran.

``dlac estimate`` against these launches (issue 37 item 3): each rate starts with a probe launch (``probe_rank``:
a node's two ranks exchanging one peer's share over their loopback, the share to the other node alone, a whole
float32 all-to-all and a one-float message round, recorded under ``probes``), each DLAC launch records the
``dlac_run.json`` summary ``DLACCallback`` would write (``run_summary``), and the run ends with
benchmarks/lib/estimate_check.py's check of each policy's predicted step against its launches (``estimate_check``; its
docstring says where each input comes from). ``--recheck FILE`` prints that check of a results file again, by
today's model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib import estimate_check
from benchmarks.lib.e2e import (
    VARIANTS,
    ceiling_checks,
    ceilings_after_sources,
    launch_order,
    paired,
    pool_launches,
    speedups,
    spread,
    summarize,
    train_rank,
)
from benchmarks.lib.launch import is_tc_rate
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import load_results, start_run, write_results
from benchmarks.lib.rule import judge

NODES, RANKS_PER_NODE = 2, 2
WORLD_SIZE = NODES * RANKS_PER_NODE
SUBNET = "10.78.0"  # node n's veth end is SUBNET.(n + 1)/24
BASE_PORT = 29500  # the store's port in a fresh namespace: nothing else listens there; one port per launch
DEFAULT_VARIANTS = ("fp32", "qcomm_int8_fp16", "dlac_dlac_all", "dlac_dlac_other_nodes",
                    "ceiling_dlac_dlac_other_nodes")
# The issue-37 targets, each judged by the rule: (rate, name, variant, reference, threshold). "ahead of every qcomm
# variant" is one target per qcomm variant that ran (qcomm_targets).
TARGETS = (
    ("1gbit", "DLAC to other nodes only >= 1.1x DLAC to every peer", "dlac_dlac_other_nodes", "dlac_dlac_all", 1.1),
)
TARGET_RATE = "1gbit"
PROBE = "probe"  # the set-up launch that measures the links for benchmarks/lib/estimate_check.py (not a variant)
PROBE_REPEATS = 5


# --------------------------------------------------------------------------------------------------------------
# The emulated network


@dataclass(frozen=True)
class Topology:
    """Two namespaces joined by a veth pair, named after ``run_id`` (unique per run: the parent's pid)."""

    run_id: int

    def namespace(self, node: int) -> str:
        return f"dlac{self.run_id}{'ab'[node]}"

    def veth(self, node: int) -> str:
        return f"dlv{self.run_id}{'ab'[node]}"  # at most 15 characters (IFNAMSIZ) for any pid

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @staticmethod
    def node_of(rank: int) -> int:
        return rank // RANKS_PER_NODE


def setup_commands(topo: Topology) -> list[list[str]]:
    """The command lines that build the two nodes: namespaces, the veth pair moved into them, addresses, links up."""
    a, b = topo.namespace(0), topo.namespace(1)
    cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
            ["ip", "link", "add", topo.veth(0), "type", "veth", "peer", "name", topo.veth(1)]]
    for node, ns in enumerate((a, b)):
        cmds += [["ip", "link", "set", topo.veth(node), "netns", ns],
                 ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{topo.address(node)}/24", "dev", topo.veth(node)],
                 ["ip", "netns", "exec", ns, "ip", "link", "set", topo.veth(node), "up"],
                 ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    return cmds


def rate_commands(topo: Topology, rate: str) -> list[list[str]]:
    """The command lines that throttle both veth ends to ``rate`` (or lift the throttle: ``unthrottled``)."""
    cmds = []
    for node in range(NODES):
        head = ["ip", "netns", "exec", topo.namespace(node), "tc", "qdisc"]
        if rate == "unthrottled":
            cmds.append([*head, "del", "dev", topo.veth(node), "root"])  # fails harmlessly where there is none
        else:
            cmds.append([*head, "replace", "dev", topo.veth(node), "root", "tbf", "rate", rate, "burst", "1mb",
                         "latency", "20ms"])
    return cmds


def teardown_commands(topo: Topology) -> list[list[str]]:
    """The command lines that delete both namespaces (and with them the veth pair)."""
    return [["ip", "netns", "del", topo.namespace(node)] for node in range(NODES)]


def rank_env(topo: Topology, rank: int, port: int) -> dict[str, str]:
    """What torchrun would put in rank ``rank``'s environment on this topology, and gloo's interface."""
    node = topo.node_of(rank)
    return dict(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank % RANKS_PER_NODE),
                GROUP_RANK=str(node), LOCAL_WORLD_SIZE=str(RANKS_PER_NODE), MASTER_ADDR=topo.address(0),
                MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=topo.veth(node), OMP_NUM_THREADS="1")


def rank_command(topo: Topology, rank: int, spec: Path, out: Path) -> list[str]:
    """The command line of rank ``rank``: this script's rank entry point inside its node's namespace."""
    return ["ip", "netns", "exec", topo.namespace(topo.node_of(rank)), sys.executable, "-m", "benchmarks.e2e_topology",
            "--_rank-spec", str(spec), "--_rank-out", str(out)]


def _run(cmds: list[list[str]], check: bool = True) -> None:
    for cmd in cmds:
        subprocess.run(cmd, check=check, capture_output=not check)


def link_counters(topo: Topology) -> dict[str, int]:
    """Bytes sent so far by each node's veth end and loopback (``a_veth``, ``a_lo``, ``b_veth``, ``b_lo``)."""
    out = {}
    for node in range(NODES):
        for key, dev in (("veth", topo.veth(node)), ("lo", "lo")):
            text = subprocess.run(["ip", "netns", "exec", topo.namespace(node), "cat",
                                   f"/sys/class/net/{dev}/statistics/tx_bytes"],
                                  check=True, capture_output=True, text=True).stdout
            out[f"{'ab'[node]}_{key}"] = int(text)
    return out


# --------------------------------------------------------------------------------------------------------------
# One launch: 4 rank processes in 2 namespaces


def _rank_main(spec_path: Path, out: Path) -> None:
    """A rank process: rank and world from the environment, the end-to-end step loop, its result to ``out``."""
    import torch

    torch.set_num_threads(1)

    spec = json.loads(spec_path.read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if spec["variant"] == PROBE:
        result = probe_rank(rank, world, spec["cfg"]["share_bytes"], spec["cfg"]["probe_repeats"])
    else:
        result = train_rank(rank, world, spec["variant"], spec["cfg"])
    out.write_text(json.dumps(result))
    # As lightning_dlac/testing/launch.py: skip the interpreter's teardown, where gloo's threads occasionally abort.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def probe_rank(rank: int, world: int, share_bytes: int, repeats: int) -> dict[str, Any]:
    """A rank of the set-up probe (the link inputs of benchmarks/lib/estimate_check.py): seconds per repeat, after one
    untimed round, of a one-float all-to-all of all ranks (``tiny_s``), the two ranks of each node exchanging
    ``share_bytes`` with each other, both nodes at once (``same_node_s``: loopback), every rank sending ``share_bytes``
    to each rank of the other node only (``other_nodes_s``: the veth) and a whole float32 all-to-all (``all_peers_s``),
    each started after a barrier."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        node, elems = Topology.node_of(rank), share_bytes // 4
        groups = [dist.new_group(list(range(n * RANKS_PER_NODE, (n + 1) * RANKS_PER_NODE))) for n in range(NODES)]
        splits = [0 if Topology.node_of(peer) == node else elems for peer in range(world)]

        def timed(send: torch.Tensor, **kwargs: Any) -> list[float]:
            recv, out = torch.empty_like(send), []
            for i in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_to_all_single(recv, send, **kwargs)
                if i:
                    out.append(time.perf_counter() - t0)
            return out

        return dict(
            tiny_s=timed(torch.zeros(world)),
            same_node_s=timed(torch.zeros(RANKS_PER_NODE * elems), group=groups[node]),
            other_nodes_s=timed(torch.zeros(sum(splits)), output_split_sizes=splits, input_split_sizes=splits),
            all_peers_s=timed(torch.zeros(world * elems)),
        )
    finally:
        dist.destroy_process_group()


class LaunchFailed(RuntimeError):
    """A rank exited with an error or did not finish in time (the message holds the ranks' output tails)."""


def launch(topo: Topology, variant: str, cfg: dict[str, Any], port: int, timeout: float) -> list[dict[str, Any]]:
    """Run ``variant`` on the 4 ranks; their results by rank. Fails fast: the first rank to exit with an error, or
    the timeout, kills every rank's process group and raises :class:`LaunchFailed` with their output tails."""
    with tempfile.TemporaryDirectory(prefix="dlac-topo-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps(dict(variant=variant, cfg=cfg)))
        base = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_USE_AGENT_STORE", "NODE_RANK")}
        procs, logs = [], []
        try:
            for rank in range(WORLD_SIZE):
                logs.append(open(Path(tmp) / f"rank{rank}.log", "w+b"))  # noqa: SIM115 - closed below
                procs.append(subprocess.Popen(rank_command(topo, rank, spec, Path(tmp) / f"rank{rank}.json"),
                                              env={**base, **rank_env(topo, rank, port)}, cwd=REPO,
                                              stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + timeout
            problem = None
            while problem is None and any(p.poll() is None for p in procs):
                failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
                if failed:
                    problem = f"rank(s) {failed} exited with {[procs[r].returncode for r in failed]}"
                elif time.monotonic() > deadline:
                    problem = f"a rank did not finish within {timeout:.0f} s"
                time.sleep(0.1)
            if problem is None and any(p.returncode != 0 for p in procs):
                problem = f"exit codes {[p.returncode for p in procs]}"
        finally:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for p in procs:
                p.wait(10)
        if problem is not None:
            tails = []
            for rank, log in enumerate(logs):
                log.seek(0)
                tails.append(f"--- rank {rank} ---\n" + log.read().decode(errors="replace")[-3000:])
            raise LaunchFailed(f"{variant}: {problem}\n" + "\n".join(tails))
        for log in logs:
            log.close()
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]


# --------------------------------------------------------------------------------------------------------------
# The figures


def link_bytes_per_step(variant: str, per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, the payload bytes per step sent to the same node's peers and to the other node's, forward +
    backward: DLAC's from its statistics, FP32's and qcomm's as each peer's equal share of what the rank sent
    (``source`` says which)."""
    out = []
    for rank, r in enumerate(per_rank):
        steps = len(r["times"])
        if VARIANTS[variant].kind in ("dlac", "null"):
            same, other, source = r["same_node_sent_bytes"], r["other_nodes_sent_bytes"], "CommStats"
        else:  # TorchRec's all-to-all sends every peer the same share
            share = (r["fwd_sent_bytes"] + r["bwd_sent_bytes"]) / (WORLD_SIZE - 1)
            same, other = share * (RANKS_PER_NODE - 1), share * (WORLD_SIZE - RANKS_PER_NODE)
            source = "equal share per peer"
        out.append(dict(rank=rank, node=Topology.node_of(rank), source=source, same_node=same / steps,
                        other_nodes=other / steps))
    return out


def qcomm_targets(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str, float]]:
    """"DLAC to other nodes only ahead of <qcomm variant>" at :data:`TARGET_RATE`, one per qcomm variant that ran."""
    return [(TARGET_RATE, f"DLAC to other nodes only ahead of {r['label']}", "dlac_dlac_other_nodes", r["variant"],
             1.0) for r in rows if r["rate"] == TARGET_RATE and VARIANTS[r["variant"]].kind == "qcomm"]


def judge_targets(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:data:`TARGETS` and :func:`qcomm_targets` whose variants ran, judged by the rule (speed of ``variant`` over
    ``reference``, pooled and per repeat). They are speed targets, judged as e2e_bandwidth judges its own: a launch
    that beat its ceiling at the rate does not void them, but each verdict counts those launches
    (``ceiling_errors``): noise of that size is noise in the pair compared too."""
    out = []
    for rate, name, variant, reference, threshold in (*TARGETS, *qcomm_targets(rows)):
        found = paired(rows, rate, variant, reference)
        if found is None:
            continue
        out.append(judge(name, *found, threshold, rate=rate, variant=variant, reference=reference,
                         ceiling_errors=sum(1 for e in errors if e["rate"] == rate)))
    return out


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _ratio(rows: list[dict[str, Any]], row: dict[str, Any], reference: str) -> str:
    found = paired(rows, row["rate"], row["variant"], reference)
    if found is None:
        return "-"
    pooled, reps = found
    return f"{pooled:.2f}x" + (f" ({spread(reps, '.2f')})" if len(reps) > 1 else "")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the rows: step times, speeds, bytes per step and rank by link class, veth bytes."""
    lines = [
        "| rate | variant | median step ms | launch medians ms | vs FP32 (per repeat) | vs DLAC to every peer |"
        " MiB/step/rank to other node | to same node | veth MiB/launch | final loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        links = r["link_bytes_per_step"]
        other, same = (statistics.fmean(x[k] for x in links) for k in ("other_nodes", "same_node"))
        veth = statistics.fmean(b["a_veth"] + b["b_veth"] for b in r["launch_link_bytes"])
        lines.append(f"| {r['rate']} | {r['label']} | {r['median_step_ms']:.0f} | {spread(r['launch_median_ms'])} |"
                     f" {_ratio(rows, r, 'fp32')} | {_ratio(rows, r, 'dlac_dlac_all')} | {_mib(other)} |"
                     f" {_mib(same)} | {_mib(veth)} | {r['final_loss']:.4f} |")
    return lines


# --------------------------------------------------------------------------------------------------------------
# Parent


def run_rate(topo: Topology, rate: str, variants: list[str], cfg: dict[str, Any],
             port: int) -> tuple[list[dict], dict[str, Any], int]:
    """The set-up probe, then every variant ``cfg["repeats"]`` times at ``rate`` (ABBA, each ceiling right after its
    source); the rows, the probe and the next free port."""
    _run(rate_commands(topo, rate), check=rate != "unthrottled")
    # The links as the model sees them, measured before the first variant: one peer's float32 share of a step.
    share = cfg["batch_size"] * sum(estimate_check.DIMS) * 4 // WORLD_SIZE
    load = os.getloadavg()[0]
    probe_ranks = launch(topo, PROBE, dict(share_bytes=share, probe_repeats=PROBE_REPEATS), port, cfg["timeout"])
    port += 1
    probe = dict(share_bytes=share, repeats=PROBE_REPEATS, loadavg_1m=load, per_rank=probe_ranks)
    fig = estimate_check.probe_figures(probe, NODES, RANKS_PER_NODE)
    print(f"  [{rate}] probe: within a node {fig['intra_gbit']:.2f} Gbit/s per rank, to the other node"
          f" {fig['inter_gbit_measured']:.3f} Gbit/s per node, {fig['latency_us']:.0f} us per message", flush=True)
    launches: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for rep in range(cfg["repeats"]):
        for position, name in enumerate(ceilings_after_sources(launch_order(variants, rep))):
            launch_cfg = dict(cfg)
            source = VARIANTS[name].ceiling_of
            if source is not None:  # the bytes per exchange, per rank and table, of its source's launch of this repeat
                launch_cfg["null_bytes"] = [r["bytes_per_call"] for r in launches[source][-1]["per_rank"]]
            t0, load, before = time.perf_counter(), os.getloadavg()[0], link_counters(topo)
            per_rank = launch(topo, name, launch_cfg, port, cfg["timeout"])
            port += 1
            after = link_counters(topo)
            median = summarize(VARIANTS[name], rate, per_rank, cfg)["median_step_ms"]
            launches[name].append(dict(repeat=rep, position=position, loadavg_1m=load, median_ms=median,
                                       link_bytes={k: after[k] - before[k] for k in after}, per_rank=per_rank))
            if VARIANTS[name].kind == "dlac":  # what DLACCallback would write as dlac_run.json (dlac estimate's input)
                launches[name][-1]["run_summary"] = estimate_check.run_summary(per_rank)
            print(f"  [{rate}] {name} (repeat {rep + 1}/{cfg['repeats']}): {median:.0f} ms/step"
                  f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for name in variants:
        pooled = pool_launches([launch["per_rank"] for launch in launches[name]])
        row = summarize(VARIANTS[name], rate, pooled, cfg)
        row.update(
            launch_median_ms=[x["median_ms"] for x in launches[name]],
            launch_loadavg_1m=[x["loadavg_1m"] for x in launches[name]],
            launch_link_bytes=[x["link_bytes"] for x in launches[name]],  # whole launch, set-up included
            link_bytes_per_step=link_bytes_per_step(name, pooled),
            launches=[dict(repeat=x["repeat"], position=x["position"], median_ms=x["median_ms"],
                           link_bytes=x["link_bytes"], step_s_per_rank=[r["times"] for r in x["per_rank"]],
                           **({"run_summary": x["run_summary"]} if "run_summary" in x else {}))
                      for x in launches[name]],
        )
        if VARIANTS[name].kind == "dlac":
            row["run_summary"] = estimate_check.run_summary(pooled)
        rows.append(row)
    return rows, probe, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1gbit,10gbit",
                        help="comma-separated tc rates between the nodes (e.g. 1gbit, 500mbit) or 'unthrottled'")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per launch")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=4,
                        help="launches per variant, in ABBA order over the repeats; their steps are pooled")
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--max-rows", type=int, default=10_000, help="cap on every table's rows")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated subset of the end-to-end variants (default {DEFAULT_VARIANTS})")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a launch may take")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "e2e_topology.json")
    parser.add_argument("--recheck", type=Path, default=None, metavar="FILE",
                        help="run nothing: print dlac estimate's check of the launches of results file FILE again")
    parser.add_argument("--_rank-spec", type=Path, default=None, help=argparse.SUPPRESS)  # a rank process
    parser.add_argument("--_rank-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._rank_spec is not None:
        _rank_main(args._rank_spec, args._rank_out)
        return
    if args.recheck is not None:
        data = load_results(args.recheck)
        if not data.get("probes"):
            sys.exit(f"{args.recheck} has no set-up probe (written before issue 37 item 3): run this benchmark again.")
        checked = estimate_check.check(data["results"], data["probes"], data["config"])
        print("\n".join(estimate_check.lines(checked)))
        return

    metadata = start_run(__spec__.name, vars(args))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    for name in variants:
        v = VARIANTS[name]
        if v.pipeline is not None or v.classes or v.auto_fallback:
            parser.error(f"{name}: benchmarks.e2e_topology runs the plain step with fixed bounds only")
        if v.ceiling_of is not None and v.ceiling_of not in variants:
            parser.error(f"{name} sends the bytes of the latest {v.ceiling_of} launch: add {v.ceiling_of}")
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1 or args.repeats < 1:
        parser.error("--steps, --batch-size and --repeats must be >= 1, --warmup >= 0")
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    for r in rates:
        if not is_tc_rate(r):
            parser.error(f"rate {r!r} is not a tc rate like '1gbit' or '500mbit' (or 'unthrottled')")
    if sys.platform != "linux" or os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        sys.exit("benchmarks.e2e_topology emulates two nodes with `ip netns`, a veth pair and `tc`: run it as root on"
                 " Linux.")

    from lightning_dlac.codec import native_available

    # Build the native codec once here (a JIT build) so that no rank builds it while being timed.
    if not native_available():
        print("warning: the native DLAC codec did not build; the DLAC variants run the (slow) reference codec.")
    cfg = dict(batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, max_rows=args.max_rows,
               world_size=WORLD_SIZE, nodes=NODES, ranks_per_node=RANKS_PER_NODE, model="dlrm",
               timeout=args.timeout, repeats=args.repeats, variants=variants,
               order="ABBA (reversed every other repeat; each ceiling right after the launch whose bytes it sends)",
               network="2 namespaces joined by a veth pair, tbf on both ends; same-node pairs over lo")

    topo = Topology(os.getpid())
    rows: list[dict[str, Any]] = []
    probes: dict[str, dict[str, Any]] = {}
    try:
        _run(setup_commands(topo))
        port = BASE_PORT
        for rate in rates:
            print(f"rate {rate} between the nodes: {len(variants)} variant(s), {args.repeats} repeat(s)", flush=True)
            found, probes[rate], port = run_rate(topo, rate, variants, cfg, port)
            rows += found
    finally:
        _run(teardown_commands(topo), check=False)

    speedups(rows)
    errors = ceiling_checks(rows)
    targets = judge_targets(rows, errors)
    print()
    print("\n".join(table(rows)))
    print()
    for r in rows:
        links = ", ".join(f"rank {x['rank']}: {_mib(x['other_nodes'])} / {_mib(x['same_node'])}"
                          for x in r["link_bytes_per_step"])
        print(f"{r['rate']} {r['variant']}: MiB per step to other node / same node: {links}")
    for t in targets:
        reps = ", ".join(f"{v:.2f}" for v in t["per_repeat"])
        noisy = f" ({t['ceiling_errors']} launch(es) at this rate beat their ceiling)" if t["ceiling_errors"] else ""
        print(f"{'MET    ' if t['met'] else 'NOT MET'} {t['rate']}: {t['target']}: {t['pooled']:.2f} pooled,"
              f" per repeat {reps}{noisy}")
    for e in errors:
        print(f"BENCHMARK ERROR {e['message']}")
    checked = estimate_check.check(rows, probes, cfg)
    print("\n".join(estimate_check.lines(checked)))
    write_results(args.json_out, metadata, cfg, rows, targets=targets, errors=errors, probes=probes,
                  estimate_check=checked)
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
