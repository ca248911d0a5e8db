"""The headline: one row per claim with DLAC's figure, the baselines of the same run (those that beat DLAC named as
such), every target its results file records with its verdict, and the file; each row linked to the section of docs/
that holds the run's details. README.md shows at most :data:`README_ROWS` of the rows with the two plots;
docs/benchmarks.md shows every row."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.accuracy import load_rows, over_seeds
from benchmarks.lib.calibration_judgement import WORLD_NOISE
from benchmarks.lib.frontier import FRONTIER_TARGETS
from benchmarks.lib.plan import STEPS
from benchmarks.lib.rule import judge
from benchmarks.render.calibration import WORLD_TARGETS, world_target_met
from benchmarks.render.codec import codec_rows
from benchmarks.render.core import Block, Results, fmt_plain, fmt_range, fmt_x, pick, short_commit
from benchmarks.render.e2e import fast_targets, race_targets, starved_targets
from benchmarks.render.frontier import FAMILY_FRONTIER_FILE, FRONTIER_FILE, default_standing
from benchmarks.render.plots import FRONTIER_SVG, SPEED_SVG
from benchmarks.render.suite import describe, pinned_set, version_sets

BENCH = "docs/benchmarks.md"
README_ROWS = 8  # issue 55 item 7: README's headline stays short; docs/benchmarks.md holds every row
# A row whose file records more targets than this counts the met ones and names every missed one: README, docs.
SHOWN_TARGETS = (3, 8)
RACE_LINK = f"{BENCH}#the-exchange-phase-by-phase-and-every-torchrec-codec-issue-34"
E2E_LINK = f"{BENCH}#end-to-end-training-under-a-throttled-interconnect"
RATES = {"1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "unthrottled": "unthrottled"}


@dataclass(frozen=True)
class Targets:
    """A row's targets cell as docs/benchmarks.md shows it (``full``) and as README does (``short``: more targets
    counted); text added on either side goes to both."""

    full: str
    short: str

    def __add__(self, text: str) -> Targets:
        return Targets(self.full + text, self.short + text)

    def __radd__(self, text: str) -> Targets:
        return Targets(text + self.full, text + self.short)


@dataclass(frozen=True)
class Row:
    """One claim of the headline."""

    what: str  # the claim, linked to the section that holds the run
    dlac: str  # DLAC's figure
    baseline: str  # the baselines of the same run: each that beats DLAC named as such, else the strongest
    targets: Targets  # every target the file records (and any the renderer judges from it), with its verdict
    files: tuple[str, ...]  # the results files the row is rendered from
    readme: bool  # one of README's rows


# ---------------------------------------------------------------------------------------------------------------------
# Cells


def _verdict(t: dict[str, Any], key: str | None = None) -> str:
    word = "not judged (benchmark error)" if t.get("invalid") else "met" if t["met"] else "not met"
    figure = f" ({t['pooled']:.2f})" if isinstance(t.get("pooled"), float) else ""
    if t["met"] and t.get("on_frontier") is False:  # the frontier's second target: met by being near it
        figure += " (off the frontier, near it only within noise)"
    return f"{key or t['target']}: **{word}**{figure}"


def _where(t: dict[str, Any]) -> str:
    return RATES.get(t.get("rate"), t.get("rate")) if t.get("rate") else f"{t.get('payload')} eps {t.get('eps')}"


def targets_cell(targets: list[dict[str, Any]], where: bool = False) -> Targets:
    """Every target with its verdict (prefixed with its rate or payload where ``where`` or where the same name is
    judged at several); beyond :data:`SHOWN_TARGETS` the met ones counted and every missed one named."""
    return Targets(*(_targets_text(targets, where, limit) for limit in reversed(SHOWN_TARGETS)))


def _targets_text(targets: list[dict[str, Any]], where: bool, limit: int) -> str:
    if not targets:
        return "-"
    places: dict[str, set[str]] = {}
    for t in targets:
        places.setdefault(t["target"], set()).add(_where(t))
    keyed = [(t, f"{_where(t)}: {t['target']}" if where or len(places[t["target"]]) > 1 else t["target"])
             for t in targets]
    if len(targets) <= limit:
        return "; ".join(_verdict(t, key) for t, key in keyed)
    missed = [_verdict(t, key) for t, key in keyed if not t["met"]]
    return "; ".join([f"{sum(t['met'] for t in targets)} of {len(targets)} targets met", *missed])


def _times(v: float, other: float) -> tuple[str, str]:
    """``v`` and ``other`` as speed-ups, with as many decimals as it takes to tell them apart (up to 4)."""
    digits = next((d for d in (2, 3, 4) if f"{v:.{d}f}" != f"{other:.{d}f}"), 4)
    return f"{v:.{digits}f}x", f"{other:.{digits}f}x"


def _qcomm(rows: list[dict[str, Any]], rate: str) -> list[dict[str, Any]]:
    return sorted((r for r in rows if r["rate"] == rate and r["variant"].startswith("qcomm")
                   and r.get("speedup_vs_fp32") is not None), key=lambda r: -r["speedup_vs_fp32"])


def baseline_cell(rows: list[dict[str, Any]], rate: str, dlac: dict[str, Any]) -> str:
    """Every qcomm variant of the run faster than DLAC at ``rate``, named as such; else the fastest one."""
    qcomm = _qcomm(rows, rate)
    if not qcomm:
        return "-"
    faster = [q for q in qcomm if q["speedup_vs_fp32"] > dlac["speedup_vs_fp32"]]
    if not faster:
        return f"{qcomm[0]['label']} {qcomm[0]['speedup_vs_fp32']:.2f}x"
    parts = []
    for q in faster:
        theirs, ours = _times(q["speedup_vs_fp32"], dlac["speedup_vs_fp32"])
        parts.append(f"{q['label']} {theirs}: **faster than DLAC** ({ours})")
    return "; ".join(parts)


def _failed(data: dict[str, Any]) -> str:
    """The codecs of a run that could not run, named."""
    labels = dict.fromkeys(f.get("label") or f.get("variant") for f in data.get("failed") or [])
    return "".join(f"; {label} could not run (TorchRec's error on this machine)" for label in labels)


def _speed(r: dict[str, Any]) -> str:
    return f"{r['speedup_vs_fp32']:.2f}x FP32 ({fmt_range(r['speedup_vs_fp32_per_repeat'])})"


# The accuracy runs, and the arm of adaptive_accuracy.py that sends DLAC-compressed gradients (issue 55 item 2).
ACCURACY_FILES = ("adaptive_accuracy_criteo_1epoch.json", FRONTIER_FILE, FAMILY_FRONTIER_FILE)
BOTH_WAYS_ARM = "DLAC both directions"


def _both_ways_accuracy(results: Results) -> str:
    """What the accuracy runs say of DLAC-compressed gradients, for the rows that time DLAC both ways."""
    having = [n for n in ACCURACY_FILES if results.get(n) is not None
              and any(r.get("variant") == BOTH_WAYS_ARM for r in results.get(n)["results"])]
    if having:
        return f"; accuracy with DLAC gradients: {', '.join(f'`{n}`' for n in having)}"
    return "; accuracy with DLAC gradients not measured yet"


def _best_dlac(points: list[dict[str, Any]], default: dict[str, Any], fwd: str) -> dict[str, Any] | None:
    """The DLAC point of the same run that beats the default on both axes (no lower AUROC difference and no more
    forward bytes, one of them strictly), the best AUROC first; None where none does."""
    better = [p for p in points if p["kind"] == "dlac" and p is not default
              and p["delta_mean"] >= default["delta_mean"] and p[fwd] <= default[fwd]
              and (p["delta_mean"] > default["delta_mean"] or p[fwd] < default[fwd])]
    return max(better, key=lambda p: (p["delta_mean"], -p[fwd]), default=None)


# ---------------------------------------------------------------------------------------------------------------------
# Rows


def _codec_row(results: Results) -> list[Row]:
    codec = results.get("codec_bench.json")
    crit = codec_rows(codec, "criteo")
    dlac = crit.get(("DLAC (native)", 0.01)) or next((r for (m, e), r in crit.items()
                                                       if m.startswith("DLAC") and e == 0.01), None)
    if dlac is None:
        return []
    bounded = [r for (m, e), r in crit.items() if not m.startswith(("DLAC", "dedup", "memcpy")) and e in (None, 0.01)]
    best = max(bounded, key=lambda r: r["ratio"], default=None)
    payloads = dict.fromkeys(r["payload"] for r in codec["results"])
    ratios = {p: r["ratio"] for p in payloads for (m, e), r in codec_rows(codec, p).items()
              if m == dlac["method"] and e == 0.01}
    low = min(ratios, key=ratios.get)
    return [Row(f"[Compression of Criteo-sample pooled embeddings, eps 0.01]({BENCH}#codec)",
                f"{dlac['ratio']:.0f}x, bound {'held' if dlac['max_err_over_eb'] <= 1 else '**not held**'}; over the"
                f" {len(ratios)} payloads {min(ratios.values()):.1f}-{max(ratios.values()):.0f}x ({low}"
                f" {ratios[low]:.1f}x)",
                f"{best['method']}: {best['ratio']:.1f}x" if best else "-",
                targets_cell(codec.get("targets") or []), ("codec_bench.json",), True)]


def _throttled_row(results: Results) -> list[Row]:
    data = results.get("e2e_throttled.json")
    rows = data["results"]
    rates = [rate for rate in RATES if (r := pick(rows, rate, "dlac_dlac")) and r.get("speedup_vs_fp32")]
    if not rates:
        return []
    both = [pick(rows, rate, "dlac_dlac") for rate in rates]
    return [Row(f"[Training step, 2 ranks, DLAC both ways, at {' / '.join(RATES[r] for r in rates)}]({E2E_LINK})",
                " / ".join(_speed(b) for b in both) + _both_ways_accuracy(results),
                "; ".join(f"{RATES[rate]}: {baseline_cell(rows, rate, b)}" for rate, b in zip(rates, both)),
                targets_cell(data.get("targets") or [], where=len(rates) > 1) + _failed(data),
                ("e2e_throttled.json",), True)]


def _unthrottled_row(results: Results) -> list[Row]:
    data = results.get("e2e_unthrottled.json")
    auto = pick(data["results"], "unthrottled", "dlac_auto") if data else None
    if auto is None or auto.get("speedup_vs_fp32") is None:
        return []
    return [Row(f"[Unthrottled link, the uncompressed fallback (`auto_fallback=True`)]({E2E_LINK})",
                f"{_speed(auto)}, {auto.get('uncompressed_share', 0):.0%} of steps uncompressed",
                baseline_cell(data["results"], "unthrottled", auto), targets_cell(data.get("targets") or []),
                ("e2e_unthrottled.json",), True)]


def _speed_row(results: Results, name: str, what: str, link: str, readme: bool,
               judged: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
               rate: str = "1gbit") -> list[Row]:
    """A run's DLAC-both-ways row at one rate: its recorded targets and those judged from its launches."""
    data = results.get(name)
    if data is None:
        return []
    both = pick(data["results"], rate, "dlac_dlac")
    if both is None or both.get("speedup_vs_fp32") is None:
        return []
    ran = ", ".join(r["label"].removeprefix("qcomm ") for r in data["results"] if r["rate"] == rate
                    and r["variant"].startswith("qcomm") and r.get("speedup_vs_fp32") is not None)
    targets = [*(data.get("targets") or []), *(judged(data["results"]) if judged else [])]
    return [Row(f"[{what.format(ran=ran)}{_failed(data)}]({link})", _speed(both) + _both_ways_accuracy(results),
                baseline_cell(data["results"], rate, both), targets_cell(targets), (name,), readme)]


def _topology_row(results: Results) -> list[Row]:
    topo = results.get("e2e_topology.json")
    if topo is None:
        return []
    rows = topo["results"]
    peer, everyone = pick(rows, "1gbit", "dlac_dlac_other_nodes"), pick(rows, "1gbit", "dlac_dlac_all")
    if peer is None or peer.get("speedup_vs_fp32") is None:
        return []
    base = [f"{everyone['label']}: {everyone['speedup_vs_fp32']:.2f}x"] if everyone else []
    return [Row(f"[Two emulated nodes x 2 ranks, 1 Gbit/s between them, DLAC to the other node only"
                f" (`compress_peers`)]({BENCH}#two-nodes-per-peer-compression-on-an-emulated-network-issue-37)",
                _speed(peer) + _both_ways_accuracy(results), "; ".join([*base, baseline_cell(rows, "1gbit", peer)]),
                targets_cell(topo.get("targets") or []), ("e2e_topology.json",), False)]


def _frontier_row(results: Results) -> list[Row]:
    data = results.get(FRONTIER_FILE)
    if data is None or not data.get("frontier"):
        return []
    f = data["frontier"][0]
    points = {p["variant"]: p for p in f["points"]}
    default = points.get("DLAC default")
    if default is None:
        return []
    cfg = data.get("config", {})
    qcomm = min((p for p in f["points"] if p["kind"] == "qcomm"), key=lambda p: p["total_bytes_per_step"],
                default=None)

    def at(p: dict[str, Any]) -> str:
        return (f"{p['delta_mean']:+.4f} at {p['fwd_bytes_per_step'] / 1024:.1f} /"
                f" {p['total_bytes_per_step'] / 1024:.1f} KiB")

    best = _best_dlac(f["points"], default, "fwd_bytes_per_step")
    dlac = (f"`DLACCallback()`: AUROC {default['delta_mean']:+.4f} at {default['fwd_bytes_per_step'] / 1024:.1f} KiB"
            f" forward / {default['total_bytes_per_step'] / 1024:.1f} KiB both ways per step") + (
        f"; {best['variant']}: {at(best)}, better on both axes" if best else "")
    base = "-" if qcomm is None else (
        f"{qcomm['variant']}: {at(qcomm)}, the fewest bytes both ways"
        f" ({qcomm['total_bytes_per_step'] / default['total_bytes_per_step']:.2f}x the default's)")
    return [Row(f"[Accuracy-bytes frontier against TorchRec's codecs, Criteo sample, {cfg.get('criteo_epochs')} epochs"
                f" x {len(cfg.get('seeds', []))} seeds{_failed(data)}](docs/adaptive.md#the-accuracy-bytes-frontier-"
                "against-torchrecs-codecs)", dlac, base,
                targets_cell(f["targets"]) + " (judged on forward bytes; total bytes await DLAC-gradient arms)",
                (FRONTIER_FILE,), True)]


def _family_frontier_row(results: Results) -> list[Row]:
    """The accuracy-bytes frontier on the family's evaluation worlds (issue 33 item 3), against the qcomm points of
    the same worlds; "so far" until the worlds `make bench` plans are in, each with the paired seeds it plans."""
    data = results.get(FAMILY_FRONTIER_FILE)
    if data is None or not data.get("per_world"):
        return []
    (step,) = [s for s in STEPS if s.output == FAMILY_FRONTIER_FILE]
    planned, seeds_planned = step.count("--count"), step.count("--train-seeds") or 0
    d, seeds = data["summary"], data.get("config", {}).get("train_seeds", 0)
    short = [f"{d['worlds']} of the {planned} worlds"] if d["worlds"] < planned else []
    short += [f"{seeds} or more of the {seeds_planned} paired seeds per world"] if seeds < seeds_planned else []
    judged = [t for w in data["per_world"] for t in w["frontier"]["targets"]]
    verdicts = [f"{target}: met in {sum(t['met'] for t in judged if t['target'] == target)} of"
                f" {sum(t['target'] == target for t in judged)} worlds" + (" so far" if short else "")
                for target in FRONTIER_TARGETS]
    # "Near" is within the paired noise, which on a world whose arms do not settle is of the size of their swings.
    standing = default_standing(data["per_world"])
    near_only = [world for world, x in standing if x["met"] and not x["on_frontier"]]
    if near_only:
        verdicts[1] += (f", on it in {sum(x['on_frontier'] for _, x in standing)} and near it only within noise on"
                        f" world{'s' if len(near_only) > 1 else ''} {', '.join(map(str, near_only))}")
    counted = f" ({' and '.join(short)} `make bench` runs)" if short else ""
    runs = data["results"]
    capped = sum(not r.get("settled") for r in runs)
    settled = f"{len(runs) - capped} of {len(runs)} arms settled, {capped} stopped at the cap unsettled"
    beaten = []  # worlds where a DLAC point of the same world beats the default on both axes
    for w in data["per_world"]:
        default = next((p for p in w["frontier"]["points"] if p["variant"] == "DLAC default"), None)
        best = _best_dlac(w["frontier"]["points"], default, "fwd_bytes_per_step") if default else None
        if best:
            beaten.append(f"world {w['world']}: {best['variant']} {best['delta_mean']:+.4f} at"
                          f" {best['fwd_bytes_per_step'] / 1024:.1f} KiB against the default's"
                          f" {default['delta_mean']:+.4f} at {default['fwd_bytes_per_step'] / 1024:.1f}")
    better = (f"; a DLAC point of the same world better on both axes in {len(beaten)} of {len(data['per_world'])}"
              f" ({'; '.join(beaten)})") if beaten else ""
    cheaper: dict[str, list[float]] = {}  # per qcomm point, its total bytes over the default's where fewer
    for w in data["per_world"]:
        points = {p["variant"]: p for p in w["frontier"]["points"]}
        default = points.get("DLAC default")
        for p in points.values():
            if default and p["kind"] == "qcomm" and p["total_bytes_per_step"] < default["total_bytes_per_step"]:
                cheaper.setdefault(p["variant"], []).append(p["total_bytes_per_step"] / default["total_bytes_per_step"])
    both_ways = "".join(f"; counted both ways {q} sends fewer bytes than the default in {len(v)} of"
                        f" {len(data['per_world'])} worlds ({fmt_range(v)}x)" for q, v in cheaper.items())
    return [Row(f"[Accuracy-bytes frontier on the family's evaluation worlds ({settled})"
                f"{_failed(data)}](docs/adaptive.md#the-same-frontier-on-the-family-of-worlds)",
                f"`DLACCallback()`: median {fmt_plain(d['default_delta_median'], '+.4f')} AUROC at"
                f" {fmt_x(d['default_fwd_bytes_vs_fewest_qcomm_median'])} the forward bytes of the fewest-bytes qcomm"
                f" point{better}",
                f"TorchRec's {', '.join(q.removeprefix('qcomm ') for q in d['qcomm_dominated'])} on the same worlds"
                f" and seeds{both_ways}",
                Targets("", "") + f"{'; '.join(verdicts)}{counted} (forward bytes)", (FAMILY_FRONTIER_FILE,),
                True)]


def _family_row(results: Results) -> list[Row]:
    """The default's judgement on the family's evaluation worlds (issue 33 item 2), with every table at the loose
    bound, the cheapest fixed choice, as the baseline of the same runs."""
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
    runs = data["results"]
    capped = sum(not r.get("settled") for r in runs)
    return [Row(f"[Table-wise calibration on the family's evaluation worlds, each arm trained until it settles or"
                f" reaches the cap ({capped} of {len(runs)} arms reached it unsettled)]"
                "(docs/adaptive.md#on-a-family-of-worlds-issue-33)",
                f"`DLACCallback()` within 0.001 AUROC of every table at 0.01 on"
                f" {d['default_within_0001_of_all_tight']:.0%} of {d['worlds']} worlds, recall {d['recall']:.2f},"
                f" precision {d['precision']:.2f}, {d['bytes_vs_all_tight']:.2f}x the bytes",
                f"every table at 0.05: within 0.001 on {loose} of {len(per_world)}",
                Targets("", "") + f"{'; '.join(verdicts)}{counted}", (name,), False)]


def _accuracy_row(results: Results) -> list[Row]:
    name = "adaptive_accuracy_criteo_1epoch.json"
    data = results.get(name)
    if data is None:
        return []
    acc_rows = [r for r in load_rows([results.directory / name])[0] if r["dataset"] == "criteo"]
    summary = {x["variant"]: x for x in over_seeds(acc_rows)}
    default, qcomm = summary.get("DLAC default"), summary.get("qcomm INT8/FP16")
    if default is None:
        return []
    base = {r.get("seed", 0): r["val_auroc"] for r in acc_rows if r["variant"] == "uncompressed"}
    deltas = [r["val_auroc"] - base[r.get("seed", 0)] for r in acc_rows
              if r["variant"] == "DLAC default" and r.get("seed", 0) in base]
    t = judge("AUROC within 0.002 of uncompressed", statistics.median(deltas), deltas, -0.002)
    points = [dict(x, kind="dlac" if not x["variant"].startswith(("qcomm", "uncompressed")) else "other",
                   fwd=-x["fwd_ratio_mean"]) for x in summary.values() if x.get("fwd_ratio_mean") is not None]
    mine = next(p for p in points if p["variant"] == "DLAC default")
    best = _best_dlac(points, mine, "fwd")
    recorded = [x for f in data.get("frontier") or [] for x in f["targets"]]
    return [Row(f"[AUROC vs uncompressed, Criteo sample, 1 epoch x {len(base)} seeds]"
                f"({BENCH}#adaptive-error-bounds-accuracy-and-traffic)",
                f"`DLACCallback()`: {default['delta_mean']:+.4f} at {default['fwd_ratio_mean']:.1f}x fewer forward"
                " bytes" + (f"; {best['variant']} of the same run: {best['delta_mean']:+.4f} at"
                            f" {best['fwd_ratio_mean']:.1f}x, better on both axes" if best else ""),
                f"TorchRec INT8/FP16: {qcomm['delta_mean']:+.4f} at {qcomm['fwd_ratio_mean']:.1f}x" if qcomm else "-",
                f"{t['target']}: **{'met' if t['met'] else 'not met'}** ({t['pooled']:+.4f}); "
                + targets_cell(recorded) + _failed(data), (name,), False)]


def headline_rows(results: Results) -> list[Row]:
    """Every headline row, README's first."""
    return [
        *_codec_row(results),
        *_throttled_row(results),
        *_unthrottled_row(results),
        *_speed_row(results, "e2e_qcomm_race.json", "Training step at 1 Gbit/s against TorchRec's {ran}, DLAC both"
                    " ways", RACE_LINK, True, race_targets),
        *_speed_row(results, "e2e_qcomm_race_starved.json", "The same with every rank on one core (`--cpu-starved`)"
                    " against {ran}", RACE_LINK, True, starved_targets),
        *_speed_row(results, "e2e_dlrm_v2.json", "DLRM v2 (DCNv2) training step at 1 Gbit/s against {ran}, DLAC both"
                    " ways", f"{BENCH}#dlrm-v2-end-to-end-under-a-throttled-interconnect", True),
        *_frontier_row(results),
        *_family_frontier_row(results),
        *_speed_row(results, "e2e_qcomm_race_10gbit.json", "Training step at 10 Gbit/s against {ran}, DLAC both ways",
                    RACE_LINK, False, fast_targets, rate="10gbit"),
        *_topology_row(results),
        *_family_row(results),
        *_accuracy_row(results),
    ]


def _table(rows: list[Row], short: bool) -> list[str]:
    return ["| what | DLAC | baselines of the same run | targets | results file |", "|---|---|---|---|---|",
            *(f"| {r.what} | {r.dlac} | {r.baseline} | {r.targets.short if short else r.targets.full} |"
              f" {', '.join(f'`{f}`' for f in r.files)} |" for r in rows)]


def _runs(results: Results, rows: list[Row]) -> str:
    used = list(dict.fromkeys(f for r in rows for f in r.files))
    runs = []
    for n in used:
        m = results.get(n)["metadata"]
        load = (f", load {m['loadavg_before'][0]:.1f} to {m['loadavg_after'][0]:.1f}"
                if m.get("loadavg_before") and m.get("loadavg_after") else "")
        runs.append(f"`{n}` commit {short_commit(m.get('git_commit'))}, {str(m.get('date'))[:10]}{load}")
    return (f"Runs ({results.shown}/; command, machine and versions in the linked sections): " + "; ".join(runs)
            + ". " + _versions_clause(results, used))


def readme_headline(results: Results) -> list[str]:
    """README's headline: its rows, a line on the rows only docs/benchmarks.md shows (with their missed targets),
    the runs and the two plots."""
    rows = headline_rows(results)
    shown = [r for r in rows if r.readme][:README_ROWS]
    rest = [r for r in rows if r not in shown]
    lines = _table(shown, short=True)
    if rest:
        missed = [part for r in rest for part in r.targets.full.split("; ")
                  if "**not met**" in part or "**fails**" in part]
        lines += ["", f"[docs/benchmarks.md](docs/benchmarks.md#every-headline-row) has these rows and {len(rest)} more"
                  f" ({'; '.join(r.what.split('](')[0].lstrip('[') for r in rest)}), every one with all its targets"
                  + (f"; not met among them: {'; '.join(missed)}." if missed else "; all of theirs are met.")]
    return [*lines, "", _runs(results, shown), "", *_plots("docs/figures")]


def headline(results: Results) -> list[str]:
    """docs/benchmarks.md's headline: every row, README's first, the runs and the two plots."""
    rows = headline_rows(results)
    # The rows link from the repository root, as README does; here they link from docs/.
    relink = [line.replace(f"]({BENCH}#", "](#").replace("](docs/", "](") for line in _table(rows, short=False)]
    return [*relink, "", _runs(results, rows).replace("](docs/benchmarks.md#", "](#"), "", *_plots("figures")]


def _plots(where: str) -> list[str]:
    return [f"![Training-step speed against FP32 by link rate: FP32, TorchRec's codecs and DLAC]({where}/{SPEED_SVG})",
            "",
            f"![AUROC difference from uncompressed against bytes per step, every arm and codec of the Criteo-sample"
            f" frontier]({where}/{FRONTIER_SVG})"]


def _versions_clause(results: Results, used: list[str]) -> str:
    """The library versions the rows' runs had, against the pinned set: a figure stands for its run's versions."""
    sets = "; ".join(f"{describe(versions)} ({len(names)} of the {len(used)} files)"
                     for versions, names in version_sets(results, used).items())
    return (f"Measured under {sets}; the pinned set is {pinned_set()}"
            " ([Library versions](docs/benchmarks.md#benchmarks) says which files were run under it).")


_OPTIONAL = ("e2e_unthrottled.json", "e2e_dlrm_v2.json", "e2e_qcomm_race.json", "e2e_qcomm_race_starved.json",
             "e2e_qcomm_race_10gbit.json", "e2e_topology.json", FRONTIER_FILE, FAMILY_FRONTIER_FILE,
             "calibration_worlds_settled_relative.json", "adaptive_accuracy_criteo_1epoch.json")
BLOCKS = {
    "readme_headline": Block(("codec_bench.json", "e2e_throttled.json"), readme_headline, optional=_OPTIONAL),
    "headline": Block(("codec_bench.json", "e2e_throttled.json"), headline, optional=_OPTIONAL),
}
