"""Does ``dlac estimate`` predict the emulated two-node runs? (issue 37 item 3). ``python -m benchmarks.e2e_topology``
calls :func:`check` at the end of a run, and with ``--recheck FILE`` prints the check of a results file again.

The inputs are the ones a user would give ``dlac estimate --nodes 2 --ranks-per-node 2 --intra-gbit X --inter-gbit Y
--from-run dlac_run.json --backward-ratio R --latency-us A``, each measured apart from the launches it is judged
against:

- the run (``--from-run``): the ``dlac_run.json`` summary of the DLAC-to-every-peer launch (``SOURCE``: the run a user
  has before choosing a policy), built from that launch's counters and step times as ``DLACCallback`` builds it
  (:func:`run_summary`) and read by estimate's own :func:`~lightning_dlac.commands.estimate.rates_from_summary`: the
  forward and gradient ratios, the codec rates (gradients at the forward's, as the command assumes: the summary
  times the gradient exchange as one phase) and the compute per step, of the median step (``step_ms``: the median
  of the launch's per-rank step times; results written before the summary had it get it from their launches'
  ``step_s_per_rank``); and, as the command does with ``--nodes``
  and ``--from-run``, the wait on the slowest rank (:func:`~lightning_dlac.commands.estimate.wait_from_run`: the
  launch's exchange time per step beyond the model's own ``all`` on the links below);
- ``--inter-gbit``: the ``tbf`` rate on the veth, as TCP payload: tbf meters whole Ethernet frames, so a 1500-byte
  MTU carries ``1448 / 1514`` of its rate as payload (20 bytes of IP header, 32 of TCP with timestamps, 14 of
  Ethernet header) (:data:`TCP_PAYLOAD_SHARE`, from the protocols' header sizes, not from any timing);
- ``--intra-gbit`` and ``--latency-us``: a probe launch at set-up (:func:`probe_figures`), on the same namespaces and
  at the same rate, before the first variant: the two ranks of each node exchange one peer's share of a step (raw
  float32) with each other, both nodes at once, over their loopback, whose TCP costs CPU time on these shared cores
  (so it is far from infinite); a one-float all-to-all of the four ranks gives the cost of a message round, charged
  as ``W - 1`` messages as the model counts them. The probe also times the share to the other node alone and a whole
  float32 all-to-all, recorded to see the wire terms apart from the steps (not used by the prediction).

The prediction for each policy (``none``, ``all``, ``other_nodes``) is compared with the measured step of the launch
that runs it (:data:`CHECKED`: ``fp32``, ``dlac_dlac_all``, ``dlac_dlac_other_nodes``): pooled (the inputs from every
``SOURCE`` launch together, against the variant's pooled median step) and per repeat (the inputs from that repeat's
``SOURCE`` launch, against that repeat's launch median). The target, per variant, judged by the rule of
benchmarks/lib/rule.py: ``|predicted / measured - 1| <= 0.15``. The ``all`` row is the least independent check: its
compute and codec rates are its own launch's, so only its wire terms are predicted. Each record also sets the
prediction's terms beside what the launches measured of them (compute, forward codec, forward exchange, backward),
so a miss can be traced to a term; nothing here is fitted to the launches it judges.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from typing import Any

from benchmarks.lib.rule import judge, span
from lightning_dlac.commands.estimate import (
    Codec,
    Topology,
    Workload,
    predict_policies,
    rates_from_summary,
    wait_from_run,
)

# tbf meters Ethernet frames; TCP payload per 1500-byte MTU frame: 1500 - 20 (IP) - 32 (TCP with timestamps), of the
# 1500 + 14 (Ethernet header) bytes the qdisc counts.
TCP_PAYLOAD_SHARE = (1500 - 20 - 32) / (1500 + 14)
SOURCE = "dlac_dlac_all"  # the launch whose dlac_run.json summary feeds the model
CHECKED = {"none": "fp32", "all": "dlac_dlac_all", "other_nodes": "dlac_dlac_other_nodes"}
TOLERANCE = 0.15
TARGET = "estimate within 15% of measured"
DIMS = (64,) * 26  # the end-to-end DLRM (benchmarks/lib/e2e.py): 26 tables of dim 64


def tc_rate_gbit(rate: str) -> float | None:
    """A tc rate (``1gbit``, ``500mbit``, ``100mbps``: bytes) in Gbit/s; ``None`` for ``unthrottled``."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)(bit|bps)", rate)
    if found is None:
        return None
    value, prefix, unit = found.groups()
    scale = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}[prefix] * (8 if unit == "bps" else 1)
    return float(value) * scale / 1e9


def run_summary(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``summary`` of ``dlac_run.json`` (``CompressionMonitor.summary``) for a launch's (or pooled launches')
    per-rank records of :func:`benchmarks.lib.e2e.train_rank`: counters and seconds summed over ranks, times per step
    and rank, gradient bytes included."""
    world, batches = len(per_rank), len(per_rank[0]["times"])

    def total(key: str) -> float:
        return sum(r.get(key, 0) for r in per_rank)

    ms = 1000.0 / (batches * world)
    return dict(
        world_size=world, batches=batches, raw_bytes=total("fwd_raw_bytes"), sent_bytes=total("fwd_sent_bytes"),
        forward_passed_bytes=total("fwd_passed_bytes"),
        train_s=sum(sum(r["times"]) for r in per_rank),
        a2a_s=sum(r["fwd_encode_s"] + r["fwd_exchange_s"] + r["fwd_decode_s"] + r["bwd_s"] for r in per_rank),
        encode_ms=total("fwd_encode_s") * ms, exchange_ms=total("fwd_exchange_s") * ms,
        decode_ms=total("fwd_decode_s") * ms, backward_ms=total("bwd_s") * ms,
        backward_raw_bytes=total("bwd_raw_bytes"), backward_sent_bytes=total("bwd_sent_bytes"),
        backward_passed_bytes=total("bwd_passed_bytes"),
        step_ms=median_step_ms([r["times"] for r in per_rank]),
    )


def median_step_ms(times_per_rank: list[list[float]]) -> float:
    """``dlac_run.json``'s ``step_ms``: the median batch wall time over ranks and steps, in ms."""
    return statistics.median(t for times in times_per_rank for t in times) * 1e3


def _with_step(summary: dict[str, Any], launches: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary`` with its ``step_ms`` from the launches' per-rank step times where it was recorded without one
    (results written before the summary had it)."""
    if "step_ms" in summary or not all("step_s_per_rank" in x for x in launches):
        return summary
    return dict(summary, step_ms=median_step_ms([t for x in launches for t in x["step_s_per_rank"]]))


def probe_figures(probe: dict[str, Any], nodes: int, ranks_per_node: int) -> dict[str, float]:
    """What the set-up probe measured, as the model's inputs: each timed exchange's time is the slowest rank's per
    repeat, median over repeats. ``intra_gbit`` per rank (``8 (G - 1) S / t``), ``inter_gbit_measured`` per node
    (``8 G (W - G) S / t``; recorded, not used), ``latency_us`` (a one-float all-to-all over ``W - 1``)."""
    world = nodes * ranks_per_node
    share = probe["share_bytes"]

    def seconds(key: str) -> float:
        per_rank = probe["per_rank"]
        return statistics.median(max(r[key][i] for r in per_rank) for i in range(len(per_rank[0][key])))

    same, other, tiny, full = (seconds(k) for k in ("same_node_s", "other_nodes_s", "tiny_s", "all_peers_s"))
    return dict(
        share_bytes=share,
        intra_gbit=8 * (ranks_per_node - 1) * share / same / 1e9,
        inter_gbit_measured=8 * ranks_per_node * (world - ranks_per_node) * share / other / 1e9,
        latency_us=tiny / (world - 1) * 1e6,
        same_node_ms=same * 1e3, other_nodes_ms=other * 1e3, all_peers_ms=full * 1e3, message_round_ms=tiny * 1e3,
    )


def predict_from_summary(summary: dict[str, Any], figures: dict[str, float], inter_gbit: float, batch: int,
                         nodes: int, ranks_per_node: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, predictions by policy) of ``dlac estimate`` for the run ``summary`` on these links: the summary is
    read by :func:`rates_from_summary`, as ``--from-run`` reads a ``dlac_run.json``'s."""
    rates = rates_from_summary(summary)
    backward_ratio = rates.backward_ratio
    workload = Workload(batch, DIMS, rates.compute_ms)
    codec = Codec(rates.forward_ratio, backward_ratio, rates.encode_gb_s, rates.decode_gb_s)
    topology = Topology(nodes, ranks_per_node, figures["intra_gbit"], inter_gbit, figures["latency_us"])
    wait = wait_from_run(rates, workload, codec, topology) or 0.0
    inputs = dict(compute_ms=rates.compute_ms, forward_ratio=rates.forward_ratio, backward_ratio=backward_ratio,
                  encode_gb_s=rates.encode_gb_s, decode_gb_s=rates.decode_gb_s, intra_gbit=figures["intra_gbit"],
                  inter_gbit=inter_gbit, latency_us=figures["latency_us"], wait_ms=wait)
    return inputs, predict_policies(replace(workload, wait_ms=wait), codec, topology)


def _terms(pred: Any) -> dict[str, float]:
    p = pred.parts
    return dict(compute_ms=pred.compute_ms, wait_ms=pred.wait_ms, forward_codec_ms=p["forward_codec_ms"],
                forward_wire_ms=max(p["forward_same_node_ms"], p["forward_other_nodes_ms"]),
                backward_ms=pred.backward_ms, step_ms=pred.step_ms)


def _measured_terms(row: dict[str, Any]) -> dict[str, float | None]:
    """What the launches measured of the same terms (DLAC variants: from their exchanges' phase times; FP32: only the
    step, whose exchanges are not timed by phase)."""
    summary = row.get("run_summary")
    out: dict[str, float | None] = dict(step_ms=row["median_step_ms"], compute_ms=None, wait_ms=None,
                                        forward_codec_ms=None, forward_wire_ms=None, backward_ms=None)
    if summary:
        rank_steps = summary["batches"] * summary["world_size"]
        out.update(compute_ms=(summary["train_s"] - summary["a2a_s"]) * 1e3 / rank_steps,
                   forward_codec_ms=summary["encode_ms"] + summary["decode_ms"],
                   forward_wire_ms=summary["exchange_ms"], backward_ms=summary["backward_ms"])
    return out


def check(rows: list[dict[str, Any]], probes: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Per throttled rate with a probe and a ``SOURCE`` row, per policy whose variant ran: predicted and measured step
    (pooled and per repeat), their ratio, the terms side by side, and the target judged by the rule."""
    nodes, per_node, batch = cfg["nodes"], cfg["ranks_per_node"], cfg["batch_size"]
    out = []
    for rate, probe in probes.items():
        gbit = tc_rate_gbit(rate)
        by_variant = {r["variant"]: r for r in rows if r["rate"] == rate}
        source = by_variant.get(SOURCE)
        if gbit is None or source is None or "run_summary" not in source:
            continue
        inter = gbit * TCP_PAYLOAD_SHARE
        figures = probe_figures(probe, nodes, per_node)
        summary = _with_step(source["run_summary"], source["launches"])
        inputs, pooled = predict_from_summary(summary, figures, inter, batch, nodes, per_node)
        per_repeat = {x["repeat"]: predict_from_summary(_with_step(x["run_summary"], [x]), figures, inter, batch,
                                                        nodes, per_node)[1]
                      for x in source["launches"]}
        for policy, variant in CHECKED.items():
            row = by_variant.get(variant)
            if row is None:
                continue
            predicted, measured = pooled[policy].step_ms, row["median_step_ms"]
            pairs = [(per_repeat[x["repeat"]][policy].step_ms, x["median_ms"]) for x in row["launches"]
                     if x["repeat"] in per_repeat]
            verdict = judge(f"{TARGET}: {row['label']}", abs(predicted / measured - 1),
                            [abs(p / m - 1) for p, m in pairs], TOLERANCE, at_least=False, rate=rate,
                            variant=variant, policy=policy)
            out.append(dict(
                verdict, label=row["label"], predicted_ms=predicted, measured_ms=measured, ratio=predicted / measured,
                per_repeat_predicted_ms=[p for p, _ in pairs], per_repeat_measured_ms=[m for _, m in pairs],
                per_repeat_ratio=[p / m for p, m in pairs], launch_loadavg_1m=row.get("launch_loadavg_1m"),
                inputs=inputs, probe=figures, probe_loadavg_1m=probe.get("loadavg_1m"),
                predicted_terms=_terms(pooled[policy]), measured_terms=_measured_terms(row),
                parts=pooled[policy].parts,
            ))
    return out


def lines(checks: list[dict[str, Any]]) -> list[str]:
    """The check as printed lines: inputs once per rate, then one line per variant."""
    out, seen = [], set()
    for c in checks:
        if c["rate"] not in seen:
            seen.add(c["rate"])
            i, p = c["inputs"], c["probe"]
            out.append(f"{c['rate']}: dlac estimate's inputs: compute {i['compute_ms']:.1f} ms, wait on the slowest"
                       f" rank {i.get('wait_ms', 0.0):.1f} ms, ratios"
                       f" {i['forward_ratio']:.1f} / {i['backward_ratio']:.1f}, codec {i['encode_gb_s']:.2f} /"
                       f" {i['decode_gb_s']:.2f} GB/s (from {SOURCE}); within a node {i['intra_gbit']:.2f} Gbit/s per"
                       f" rank (probe), across {i['inter_gbit']:.3f} Gbit/s per node (tbf as TCP payload),"
                       f" {i['latency_us']:.0f} us per message (probe); probe: float32 all-to-all"
                       f" {p['all_peers_ms']:.1f} ms, to the other node alone {p['other_nodes_ms']:.1f} ms"
                       f" ({p['inter_gbit_measured']:.3f} Gbit/s per node)")
        reps = ", ".join(f"{r:.2f}" for r in c["per_repeat_ratio"])
        out.append(f"{'MET    ' if c['met'] else 'NOT MET'} {c['rate']}: {c['target']}: predicted"
                   f" {c['predicted_ms']:.0f} ms, measured {c['measured_ms']:.0f} ms, ratio {c['ratio']:.2f}"
                   f" (per repeat {reps}; {c['repeats_meeting']} of {c['repeats']} within 15%)")
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def inputs_line(check_: dict[str, Any]) -> str:
    """The model's inputs of one rate, and what the probe measured beside them, as a sentence."""
    i, p = check_["inputs"], check_["probe"]
    load = check_.get("probe_loadavg_1m")
    return (f"At {check_['rate']}, `dlac estimate --nodes 2 --ranks-per-node 2` with: from the `dlac_run.json` summary"
            f" of the DLAC-to-every-peer launches, compute {i['compute_ms']:.1f} ms per step, wait on the slowest rank"
            f" {i.get('wait_ms', 0.0):.1f} ms per step (their exchange time beyond the model's for `all` on these"
            " links), forward ratio"
            f" {i['forward_ratio']:.1f}, encode {i['encode_gb_s']:.2f} GB/s, decode {i['decode_gb_s']:.2f} GB/s"
            f" (gradients at the same rates), gradient ratio {i['backward_ratio']:.1f}; across nodes"
            f" {i['inter_gbit']:.3f} Gbit/s per node (the tbf rate as TCP payload); from the set-up probe"
            + ("" if load is None else f" (load average {load:.1f})")
            + f", within a node {i['intra_gbit']:.2f} Gbit/s per rank (loopback TCP on the shared cores) and"
            f" {i['latency_us']:.0f} us per message. The probe's float32 all-to-all took {p['all_peers_ms']:.1f} ms,"
            f" its share to the other node alone {p['other_nodes_ms']:.1f} ms ({p['inter_gbit_measured']:.3f}"
            " Gbit/s per node).")


def table(checks: list[dict[str, Any]], terms: bool = True) -> list[str]:
    """The markdown of the check: predicted against measured per variant with the verdict, then (``terms``) each
    term's prediction beside its measurement."""
    out = ["| rate | variant (policy) | predicted ms | measured ms (launch medians) | predicted / measured (per"
           " repeat) | within 15% |", "|---|---|---:|---:|---:|---|"]
    for c in checks:
        launches = c["per_repeat_measured_ms"]
        spread = f" ({min(launches):.0f}-{max(launches):.0f})" if launches else ""
        reps = span(c["per_repeat_ratio"]) if c["per_repeat_ratio"] else "-"
        word = "met" if c["met"] else "not met"
        out.append(f"| {c['rate']} | {c['label']} (`{c['policy']}`) | {c['predicted_ms']:.0f} |"
                   f" {c['measured_ms']:.0f}{spread} | {c['ratio']:.2f} ({reps}) | **{word}**"
                   f" ({c['repeats_meeting']} of {c['repeats']} repeats) |")
    if not terms:
        return out
    out += ["", "Term by term, predicted / measured ms per step (measured: the launches' own `dlac_run.json`"
            " figures, whose exchange times hold the wait on the slowest rank, which no launch times apart; FP32's"
            " exchanges are not timed by phase):", "",
            "| rate | variant | compute | wait | forward codec | forward exchange | backward (codec + exchange) |"
            " step |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        p, m = c["predicted_terms"], c["measured_terms"]
        cells = [f"{_ms(p.get(k))} / {_ms(m.get(k))}" for k in ("compute_ms", "wait_ms", "forward_codec_ms",
                                                                  "forward_wire_ms", "backward_ms", "step_ms")]
        out.append(f"| {c['rate']} | {c['label']} | " + " | ".join(cells) + " |")
    return out
