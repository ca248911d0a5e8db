"""README.md's headline: one row per claim with DLAC's figure, the strongest baseline of the same run, the targets
judged by the rule and the results file, each row linked to the section of docs/ that holds the run's details."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.lib.accuracy import load_rows, over_seeds
from benchmarks.lib.calibration_judgement import WORLD_NOISE
from benchmarks.lib.frontier import FRONTIER_TARGETS
from benchmarks.lib.plan import STEPS
from benchmarks.lib.rule import judge
from benchmarks.render.calibration import WORLD_TARGETS, world_target_met
from benchmarks.render.codec import codec_rows
from benchmarks.render.core import Block, Results, fmt_plain, fmt_range, fmt_x, pick, short_commit
from benchmarks.render.e2e import e2e_rows, race_targets, starved_targets
from benchmarks.render.frontier import FAMILY_FRONTIER_FILE, default_standing
from benchmarks.render.suite import describe, pinned_set, version_sets

BENCH = "docs/benchmarks.md"


def _verdict(t: dict[str, Any] | None) -> str:
    if t is None:
        return "-"
    return f"{t['target']}: **{'met' if t['met'] else 'not met'}** ({t['pooled']:.2f})"


def _fastest_qcomm(rows: list[dict[str, Any]], rate: str) -> dict[str, Any] | None:
    """The strongest TorchRec baseline of a run: its fastest qcomm variant that finished at this rate."""
    qcomm = [r for r in rows if r["rate"] == rate and r["variant"].startswith("qcomm")
             and r.get("speedup_vs_fp32") is not None]
    return max(qcomm, key=lambda r: r["speedup_vs_fp32"], default=None)


def _e2e_headline(rows: list[dict[str, Any]], targets: list[dict[str, Any]], rate: str, what: str,
                  source: str, link: str) -> list[str]:
    both, qcomm = pick(rows, rate, "dlac_dlac"), _fastest_qcomm(rows, rate)
    if both is None or both.get("speedup_vs_fp32") is None:
        return []
    base = "-" if qcomm is None else f"{qcomm['label']}: {qcomm['speedup_vs_fp32']:.2f}x"
    judged = "; ".join(_verdict(t) for t in targets if t["rate"] == rate) or "-"
    return [f"| [{what}]({link}) | {both['speedup_vs_fp32']:.2f}x FP32's speed (per repeat"
            f" {fmt_range(both['speedup_vs_fp32_per_repeat'])}) | {base} | {judged} | `{source}` |"]


def readme_headline(results: Results) -> list[str]:
    """The README's headline: one row per claim with DLAC's figure, the strongest baseline measured in the same
    run, the targets judged by the rule, and the results file; each row links to the section of docs/benchmarks.md
    (or docs/adaptive.md) that holds the command, commit and machine."""
    lines = ["| what | DLAC | strongest baseline, same run | target | results file |", "|---|---|---|---|---|"]
    used = []
    codec = results.get("codec_bench.json")
    crit = codec_rows(codec, "criteo") if codec else {}
    dlac = crit.get(("DLAC (native)", 0.01)) or next((r for (m, e), r in crit.items()
                                                       if m.startswith("DLAC") and e == 0.01), None)
    if dlac is not None:
        bounded = [r for (m, e), r in crit.items() if not m.startswith(("DLAC", "dedup", "memcpy"))
                   and e in (None, 0.01)]
        best = max(bounded, key=lambda r: r["ratio"], default=None)
        lines.append(f"| [Compression of Criteo pooled embeddings, eps 0.01]({BENCH}#codec) | {dlac['ratio']:.0f}x,"
                     f" bound {'held' if dlac['max_err_over_eb'] <= 1 else '**not held**'} |"
                     + (f" {best['method']}: {best['ratio']:.1f}x |" if best else " - |")
                     + " - | `codec_bench.json` |")
        used.append("codec_bench.json")
    rows, targets, _, sources = e2e_rows(results, "e2e_throttled.json", "e2e_unthrottled.json")
    link = f"{BENCH}#end-to-end-training-under-a-throttled-interconnect"
    for rate, what in (("1gbit", "Training step, 2 ranks at 1 Gbit/s, DLAC both ways"),
                       ("10gbit", "Training step, 2 ranks at 10 Gbit/s, DLAC both ways")):
        lines += _e2e_headline(rows, targets, rate, what, "e2e_throttled.json", link)
    auto = pick(rows, "unthrottled", "dlac_auto")
    if auto is not None and auto.get("speedup_vs_fp32") is not None:
        qcomm = _fastest_qcomm(rows, "unthrottled")
        judged = "; ".join(_verdict(t) for t in targets if t["rate"] == "unthrottled") or "-"
        lines.append(f"| [Unthrottled link, the uncompressed fallback (`auto_fallback=True`)]({link}) |"
                     f" {auto['speedup_vs_fp32']:.2f}x FP32's speed,"
                     f" {auto.get('uncompressed_share', 0):.0%} of steps uncompressed |"
                     + (f" {qcomm['label']}: {qcomm['speedup_vs_fp32']:.2f}x |" if qcomm else " - |")
                     + f" {judged} | `e2e_unthrottled.json` |")
    used += sources
    v2 = results.get("e2e_dlrm_v2.json")
    if v2 is not None:
        lines += _e2e_headline(v2["results"], v2.get("targets", []), "1gbit",
                               "DLRM v2 (DCNv2) training step at 1 Gbit/s, DLAC both ways", "e2e_dlrm_v2.json",
                               f"{BENCH}#dlrm-v2-end-to-end-under-a-throttled-interconnect")
        used.append("e2e_dlrm_v2.json")
    race_link = f"{BENCH}#the-exchange-phase-by-phase-and-every-torchrec-codec-issue-34"
    for name, what, judged in (
            ("e2e_qcomm_race.json", "Training step at 1 Gbit/s against every TorchRec codec (INT8/FP16, FP8, MX4),"
             " DLAC both ways", race_targets),
            ("e2e_qcomm_race_starved.json", "The same with every rank on one core (`--cpu-starved`), DLAC both ways",
             starved_targets)):
        race = results.get(name)
        if race is not None:
            lines += _e2e_headline(race["results"], judged(race["results"]), "1gbit", what, name, race_link)
            used.append(name)
    topo = results.get("e2e_topology.json")
    if topo is not None:
        trows = topo["results"]
        peer, everyone = pick(trows, "1gbit", "dlac_dlac_other_nodes"), pick(trows, "1gbit", "dlac_dlac_all")
        qcomm = _fastest_qcomm(trows, "1gbit")
        if peer is not None and peer.get("speedup_vs_fp32") is not None:
            base = [f"{b['label']}: {b['speedup_vs_fp32']:.2f}x" for b in (everyone, qcomm)
                    if b is not None and b.get("speedup_vs_fp32") is not None]
            judged = "; ".join(_verdict(t) for t in topo.get("targets", []) if t["rate"] == "1gbit") or "-"
            lines.append(f"| [Two emulated nodes x 2 ranks, 1 Gbit/s between them, DLAC to the other node only"
                         f" (`compress_peers`)]({BENCH}#two-nodes-per-peer-compression-on-an-emulated-network-issue-37)"
                         f" | {peer['speedup_vs_fp32']:.2f}x FP32's speed (per repeat"
                         f" {fmt_range(peer['speedup_vs_fp32_per_repeat'])}) | {'; '.join(base) or '-'} | {judged} |"
                         " `e2e_topology.json` |")
            used.append("e2e_topology.json")
    frontier = results.get("adaptive_frontier_criteo.json")
    if frontier is not None and frontier.get("frontier"):
        f = frontier["frontier"][0]
        points = {p["variant"]: p for p in f["points"]}
        default = points.get("DLAC default")
        qcomm = min((p for p in f["points"] if p["kind"] == "qcomm"), key=lambda p: p["fwd_bytes_per_step"],
                    default=None)
        if default is not None:
            cfg = frontier.get("config", {})
            judged = "; ".join(f"{t['target']}: **{'met' if t['met'] else 'not met'}**" for t in f["targets"])
            lines.append(
                f"| [Accuracy-bytes frontier against TorchRec's codecs, Criteo sample, {cfg.get('criteo_epochs')}"
                f" epochs x {len(cfg.get('seeds', []))} seeds](docs/adaptive.md#the-accuracy-bytes-frontier-against-"
                f"torchrecs-codecs) | `DLACCallback()`: {default['delta_mean']:+.4f} AUROC at"
                f" {default['fwd_bytes_per_step'] / 1024:.1f} KiB forward per step |"
                + (f" {qcomm['variant']} (fewest bytes): {qcomm['delta_mean']:+.4f} at"
                   f" {qcomm['fwd_bytes_per_step'] / 1024:.1f} KiB |" if qcomm else " - |")
                + f" {judged} (within noise; see the section) | `adaptive_frontier_criteo.json` |")
            used.append("adaptive_frontier_criteo.json")
    lines += _readme_family_row(results, used)
    lines += _readme_family_frontier_row(results, used)
    name = "adaptive_accuracy_criteo_1epoch.json"
    if results.get(name) is not None:
        acc_rows = [r for r in load_rows([results.directory / name])[0] if r["dataset"] == "criteo"]
        summary = {x["variant"]: x for x in over_seeds(acc_rows)}
        default, qcomm = summary.get("DLAC default"), summary.get("qcomm INT8/FP16")
        if default is not None:
            base = {r.get("seed", 0): r["val_auroc"] for r in acc_rows if r["variant"] == "uncompressed"}
            deltas = [r["val_auroc"] - base[r.get("seed", 0)] for r in acc_rows
                      if r["variant"] == "DLAC default" and r.get("seed", 0) in base]
            t = judge("AUROC within 0.002 of uncompressed", statistics.median(deltas), deltas, -0.002)
            lines.append(
                f"| [AUROC vs uncompressed, Criteo sample, `DLACCallback()`]({BENCH}#adaptive-error-bounds-"
                f"accuracy-and-traffic) | {default['delta_mean']:+.4f} at {default['fwd_ratio_mean']:.1f}x fewer"
                " forward bytes |"
                + (f" TorchRec INT8/FP16: {qcomm['delta_mean']:+.4f} at {qcomm['fwd_ratio_mean']:.1f}x |" if qcomm
                   else " - |")
                + f" {t['target']}: **{'met' if t['met'] else 'not met'}** ({t['pooled']:+.4f}) | `{name}` |")
            used.append(name)
    runs = []
    for n in dict.fromkeys(used):
        m = results.get(n)["metadata"]
        load = (f", load {m['loadavg_before'][0]:.1f} to {m['loadavg_after'][0]:.1f}"
                if m.get("loadavg_before") and m.get("loadavg_after") else "")
        runs.append(f"`{n}` commit {short_commit(m.get('git_commit'))}, {str(m.get('date'))[:10]}{load}")
    return [*lines, "", f"Runs ({results.shown}/; command, machine and versions in the linked sections): "
            + "; ".join(runs) + ". " + _versions_clause(results, list(dict.fromkeys(used)))]


def _versions_clause(results: Results, used: list[str]) -> str:
    """The library versions the rows' runs had, against the pinned set: a figure stands for its run's versions."""
    sets = "; ".join(f"{describe(versions)} ({len(names)} of the {len(used)} files)"
                     for versions, names in version_sets(results, used).items())
    return (f"Measured under {sets}; the pinned set is {pinned_set()}"
            " ([Library versions](docs/benchmarks.md#benchmarks) says which files were run under it).")


def _readme_family_row(results: Results, used: list[str]) -> list[str]:
    """The README row of the default's judgement on the family's settled evaluation worlds (issue 33 item 2), with
    every table at the loose bound, the cheapest fixed choice, as the baseline of the same runs."""
    name = "calibration_worlds_settled_relative.json"
    data = results.get(name)
    if data is None or not data.get("per_world"):
        return []
    d, per_world = data["summary"], data["per_world"]
    loose = sum(w["all_loose_vs_all_tight"] >= -WORLD_NOISE for w in per_world)
    judged, verdicts = d["worlds"] >= 20, []
    for key, label, threshold, at_least in WORLD_TARGETS:
        met = world_target_met(d[key], threshold, at_least)
        verdicts.append(f"{label}: **{'met' if met else 'not met'}**" if judged else
                        f"{label}: {'holds' if met else '**fails**'} so far")
    counted = "" if judged else f" ({d['worlds']} of the 20 worlds the issue judges on)"
    used.append(name)
    return [f"| [Table-wise calibration on the family's evaluation worlds, every arm trained until it settles]"
            f"(docs/adaptive.md#on-a-family-of-worlds-issue-33) | `DLACCallback()` within 0.001 AUROC of every table"
            f" at 0.01 on {d['default_within_0001_of_all_tight']:.0%} of {d['worlds']} worlds, recall"
            f" {d['recall']:.2f}, precision {d['precision']:.2f}, {d['bytes_vs_all_tight']:.2f}x the bytes |"
            f" every table at 0.05: within 0.001 on {loose} of {len(per_world)} |"
            f" {'; '.join(verdicts)}{counted} | `{name}` |"]


def _readme_family_frontier_row(results: Results, used: list[str]) -> list[str]:
    """The README row of the accuracy-bytes frontier on the family's evaluation worlds (issue 33 item 3), against
    the fewest-bytes qcomm point of the same worlds; "so far" until the worlds `make bench` plans are in, each with
    the paired seeds it plans."""
    data = results.get(FAMILY_FRONTIER_FILE)
    if data is None or not data.get("per_world"):
        return []
    (step,) = [s for s in STEPS if s.output == FAMILY_FRONTIER_FILE]
    planned, seeds_planned = step.count("--count"), step.count("--train-seeds") or 0
    d, seeds = data["summary"], data.get("config", {}).get("train_seeds", 0)
    short = [f"{d['worlds']} of the {planned} worlds"] if d["worlds"] < planned else []
    short += [f"{seeds} or more of the {seeds_planned} paired seeds per world"] if seeds < seeds_planned else []
    verdicts = [f"{target}: {fmt_plain(d[target], '.0%')} of worlds" + (" so far" if short else "")
                for target in FRONTIER_TARGETS]
    # "Near" is within the paired noise, which on a world whose arms do not settle is of the size of their swings.
    standing = default_standing(data["per_world"])
    near_only = [world for world, x in standing if x["met"] and not x["on_frontier"]]
    if near_only:
        verdicts[1] += (f", on it in {sum(x['on_frontier'] for _, x in standing)} and near it only within noise on"
                        f" world{'s' if len(near_only) > 1 else ''} {', '.join(map(str, near_only))}")
    counted = f" ({' and '.join(short)} `make bench` runs)" if short else ""
    used.append(FAMILY_FRONTIER_FILE)
    return [f"| [Accuracy-bytes frontier against TorchRec's codecs on the family's evaluation worlds, settled]"
            f"(docs/adaptive.md#the-same-frontier-on-the-family-of-worlds) | `DLACCallback()`: median"
            f" {fmt_plain(d['default_delta_median'], '+.4f')} AUROC at"
            f" {fmt_x(d['default_fwd_bytes_vs_fewest_qcomm_median'])} the forward bytes of the fewest-bytes qcomm"
            " point |"
            f" TorchRec's {', '.join(q.removeprefix('qcomm ') for q in d['qcomm_dominated'])} on the same worlds and"
            f" seeds | {'; '.join(verdicts)}{counted} |"
            f" `{FAMILY_FRONTIER_FILE}` |"]


BLOCKS = {
    "readme_headline": Block(("codec_bench.json", "e2e_throttled.json"), readme_headline,
                             optional=("e2e_unthrottled.json", "e2e_dlrm_v2.json", "e2e_qcomm_race.json",
                                       "e2e_qcomm_race_starved.json", "e2e_topology.json",
                                       "adaptive_frontier_criteo.json", "adaptive_accuracy_criteo_1epoch.json")),
}
