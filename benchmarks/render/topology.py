"""The two emulated nodes (issue 37): docs/benchmarks.md's two-node section (the race, the bytes per link class) and
docs/multinode.md's check of ``dlac estimate`` against those launches."""

from __future__ import annotations

from benchmarks.lib import estimate_check
from benchmarks.lib.e2e import paired
from benchmarks.render.core import Block, Results, source_line
from benchmarks.render.e2e import e2e_body


def e2e_topology(results: Results) -> list[str]:
    """The two-node run (issue 37): the e2e table, and the bytes each rank sent per link class."""
    rows = results.get("e2e_topology.json")["results"]
    lines = e2e_body(results, ("e2e_topology.json",))
    for rate in sorted({r["rate"] for r in rows}):
        found = paired(rows, rate, "ceiling_dlac_dlac_other_nodes", "dlac_dlac_all")
        if found is None:
            continue
        if found[0] < 1.1:
            lines += ["", f"At {rate}, the ceiling of \"other nodes only\", which leaves out nothing but codec time,"
                      f" runs at {found[0]:.2f}x DLAC to every peer: no codec could reach the 1.1x target on these"
                      " ranks. The same-node share sent as float32 costs more loopback (CPU) time than encoding it for"
                      " that peer did; on GPU nodes that share would cross NVLink instead."]
        else:
            lines += ["", f"At {rate}, the ceiling of \"other nodes only\" runs at {found[0]:.2f}x DLAC to every peer:"
                      " the room the 1.1x target needs is there, and the gap to it is codec time."]
    lines += ["", "Bytes per step and rank to each link class (forward + backward payloads; DLAC from its counters,"
              " FP32 and qcomm each peer's equal share), and what left each node over its throttled veth and over"
              " its loopback in the last launch (the whole launch: set-up, warm-up and the dense all-reduce too):",
              "", "| rate | variant | to the other node, MiB (ranks 0-3) | within the node, MiB (ranks 0-3) |"
              " node A veth / lo, MB | node B veth / lo, MB |", "|---|---|---|---|---:|---:|"]
    for r in rows:
        if "link_bytes_per_step" not in r:
            continue
        other = " / ".join(f"{x['other_nodes'] / 2**20:.1f}" for x in r["link_bytes_per_step"])
        same = " / ".join(f"{x['same_node'] / 2**20:.1f}" for x in r["link_bytes_per_step"])
        last = (r.get("launch_link_bytes") or [{}])[-1]
        nodes = [f"{last[f'{n}_veth'] / 1e6:.1f} / {last[f'{n}_lo'] / 1e6:.1f}" if f"{n}_veth" in last else "-"
                 for n in ("a", "b")]
        lines.append(f"| {r['rate']} | {r['label']} | {other} | {same} | {nodes[0]} | {nodes[1]} |")
    checks = estimate_checks(results.get("e2e_topology.json"))
    if checks:
        lines += ["", "`dlac estimate`'s prediction for these launches (issue 37 item 3;"
                  " benchmarks/lib/estimate_check.py, whose docstring says where each input comes from; target: within"
                  " 15% of the measured step, by the rule):", ""]
        for rate in dict.fromkeys(c["rate"] for c in checks):
            lines += [estimate_check.inputs_line(next(c for c in checks if c["rate"] == rate)), ""]
        lines += estimate_check.table(checks)
    return lines


def estimate_checks(data: dict) -> list[dict] | None:
    """The estimate check of an e2e_topology results file, computed again from its launches and probes by today's
    model (the file's ``estimate_check`` is the model of the run's commit); the recorded one where it has no probe."""
    if not data.get("estimate_check") or not data.get("probes"):
        return data.get("estimate_check")
    return estimate_check.check(data["results"], data["probes"], data["config"])


def topology_estimate_check(results: Results) -> list[str]:
    """docs/multinode.md: `dlac estimate`'s prediction against the emulated two-node launches (issue 37 item 3)."""
    data = results.get("e2e_topology.json")
    checks = estimate_checks(data)
    if not checks:
        return [source_line("e2e_topology.json", data, results.shown), "",
                "This run predates the check: `python -m benchmarks.e2e_topology` records it."]
    lines = [source_line("e2e_topology.json", data, results.shown), ""]
    for rate in dict.fromkeys(c["rate"] for c in checks):
        lines += [estimate_check.inputs_line(next(c for c in checks if c["rate"] == rate)), ""]
    return lines + estimate_check.table(checks, terms=False)


BLOCKS = {
    "e2e_topology": Block(("e2e_topology.json",), e2e_topology),
    "topology_estimate": Block(("e2e_topology.json",), topology_estimate_check),
}
