"""docs/adaptive.md's table-wise calibration: every mode on the fair benchmark, the traced statistic, the family of
worlds (development and evaluation, fixed length and settled), a world's floor, learning curves and ablations, and
the default's drift along a run."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.lib.calibration_arms import ABLATE_PREFIX, PREVIOUS_NOISE_BUDGET
from benchmarks.lib.calibration_judgement import WORLD_NOISE, flagged_tables, trace_summary
from benchmarks.lib.rule import judge, verdict_text
from benchmarks.render.core import Block, Results, fmt_plain, fmt_x, source_line

CALIBRATION_VARIANTS = {
    "default": "`DLACCallback()` (defaults: {mode})",
    "gradient": '`mode="gradient"`',
    "homogenization": '`mode="homogenization"` (`index="vector"`, the paper\'s)',
    "homogenization_value": '`mode="homogenization", index="value"`',
    "sensitivity": '`mode="sensitivity"` (4 probe batches)',
}


# issue 26's targets for the default on the fair benchmark: (key, name, threshold, at least).
CALIBRATION_TARGETS = (
    ("precision", "precision of sensitive = tight or base >= 0.9", 0.9, True),
    ("recall", "recall of sensitive = tight or base >= 0.9", 0.9, True),
    ("robust_loose_share", "robust and irrelevant tables loose in >= 90% of cases", 0.9, True),
    ("auroc_delta", "AUROC within 0.001 of uncompressed", -0.001, True),
    ("bytes_vs_all_tight", "forward bytes <= 0.7x all-tight", 0.7, False),
    ("calibration_share", "calibration <= 5% of the run's time", 0.05, False),
)


def default_described(data: dict[str, Any]) -> str:
    """What ``DLACCallback()`` did in a calibration run, for labels: the rule recorded in its config since the
    relative budget; before it, the noise mode's absolute budget with one calibration, or the gradient mode."""
    cfg = data.get("config", {})
    if cfg.get("default_rule"):
        return cfg["default_rule"]
    mode = default_mode_of(data)
    return "noise mode, absolute budget, calibrating once" if mode == "noise" else f"{mode} mode"


def default_mode_of(data: dict[str, Any]) -> str:
    """The mode ``DLACCallback()`` had in a calibration run: recorded in its config since the default became the
    noise mode (issue 33); the gradient mode before."""
    return data.get("config", {}).get("default_mode", "gradient")


def calibration_modes(results: Results) -> list[str]:
    """Every table-wise mode on the fair calibration benchmark, the baselines that show the set is informative, and
    the default's targets judged by the rule with the seeds as the repeats."""
    name = "calibration_bench.json"
    data = results.get(name)
    per_seed = data["per_seed"]
    lines = [source_line(name, data, results.shown), "",
             "| variant | precision | recall | robust / irrelevant loose | AUROC vs uncompressed, mean (sd) |"
             " bytes vs all-tight | calibration share |", "|---|---|---|---|---|---|---|"]
    for v, label in CALIBRATION_VARIANTS.items():
        if v not in data:
            continue
        d = data[v]
        share = "-" if d["calibration_share"] is None else f"{d['calibration_share']:.1%}"
        # Precision is vacuous (1 by convention) where a mode flagged no table in any seed: say so instead.
        flagged = sum(s[v]["counts"]["tight"] + s[v]["counts"]["base"] for s in per_seed if v in s)
        precision = fmt_plain(d["precision"]) if flagged else "- (none flagged)"
        lines.append(f"| {label.format(mode=default_described(data))} | {precision} | {fmt_plain(d['recall'])} |"
                     f" {fmt_plain(d['robust_loose_share'], '.0%')} |"
                     f" {d['auroc_delta']:+.4f} ({d['auroc_delta_sd']:.4f}) |"
                     f" {fmt_x(d['bytes_vs_all_tight'])} | {share} |")
    for v, label in (("all_tight", "every table tight (0.01)"), ("all_loose", "every table loose (0.05)")):
        lines.append(f"| {label} | | | | {data[v]['auroc_delta']:+.4f} ({data[v]['sd']:.4f}) | | |")
    loose, tight = data["all_loose"], data["all_tight"]
    informative = "shows" if data["set_is_informative"] else "does **not** show"
    lines += ["", f"Over {len(per_seed)} seed(s) the set {informative} that calibration matters: all tables loose"
              f" lose {-loose['auroc_delta']:.4f} AUROC (sd {loose['sd']:.4f}; needed: at least 0.005 and more than 3"
              f" sd), all tables tight {tight['auroc_delta']:+.4f} AUROC (needed: a loss under 0.001)."]
    if "default" in data and all("default" in s for s in per_seed):
        lines += ["", "Targets of the default (the rule at the top of docs/benchmarks.md; the seeds are the repeats):",
                  ""]
        for key, label, threshold, at_least in CALIBRATION_TARGETS:
            values = [s["default"][key] for s in per_seed if s["default"][key] is not None]
            if not values:
                continue
            verdict = judge(label, statistics.median(values), values, threshold, at_least=at_least)
            fmt = {"calibration_share": ".1%", "auroc_delta": "+.4f"}.get(key, ".2f")
            lines.append(f"- {label}: {verdict_text(verdict, fmt)}")
    quick = results.get("calibration_bench_quick.json")
    if quick is not None and "default" in quick:
        d, steps = quick["default"], quick.get("config", {}).get("steps")
        order = "the same order as" if quick["all_loose"]["auroc_delta"] < d["auroc_delta"] else "**not** the order of"
        lines += ["", f"The quick run (`make bench-quick`: {len(quick['seeds'])} seed, {steps} steps, baselines and the"
                  f" default, then {default_described(quick)}): all loose"
                  f" {quick['all_loose']['auroc_delta']:+.4f}, all tight"
                  f" {quick['all_tight']['auroc_delta']:+.4f}, the default {d['auroc_delta']:+.4f} AUROC against"
                  f" uncompressed ({order} the full run's), precision {d['precision']:.2f}, recall {d['recall']:.2f},"
                  f" others loose {d['robust_loose_share']:.0%}, {d['bytes_vs_all_tight']:.2f}x the bytes of all"
                  f" tight; calibration {d['calibration_share']:.1%} of the run.", "",
                  source_line("calibration_bench_quick.json", quick, results.shown)]
    return lines


def calibration_trace(results: Results) -> list[str]:
    """The gradient sensitivity of each role at every calibration of the traced runs (smallest-largest)."""
    name = "calibration_trace.json"
    data = results.get(name)
    lines = [source_line(name, data, results.shown), "",
             "| seed | batch | sensitive tables | robust tables | irrelevant tables |", "|---|---:|---|---|---|"]
    for run in data["results"]:
        for point in run["trace"]:
            roles = trace_summary(point, run["roles"])
            cells = [f"{lo:.3f}-{hi:.3f}" if (lo, hi) != (None, None) else "-"
                     for lo, hi in (roles.get(r, (None, None)) for r in ("sensitive", "robust", "irrelevant"))]
            lines.append(f"| {run['seed']} | {point['batch']} | {' | '.join(cells)} |")
    lines += ["", "(gradient sensitivity at eps 0.05, smallest-largest over the tables of each role; the default"
              " tolerance is 0.15)"]
    return lines


WORLD_TARGETS = (  # issue 33's targets on the evaluation worlds: (key, name, threshold, at least)
    ("default_within_0001_of_all_tight", "within 0.001 AUROC of all-tight on >= 90% of worlds", 0.9, True),
    ("recall", "recall of sensitive tables >= 0.9", 0.9, True),
    ("precision", "precision of sensitive tables >= 0.8", 0.8, True),
    ("bytes_vs_all_tight", "median bytes <= 0.8x all-tight", 0.8, False),
)


def world_target_met(value: float | None, threshold: float, at_least: bool) -> bool:
    """Whether a summary figure of the worlds meets its target of WORLD_TARGETS."""
    return value is not None and (value >= threshold if at_least else value <= threshold)


def _world_labels() -> dict[str, str]:
    """The calibrated variants of a worlds run, in table order, and their labels (as calibration_bench runs them)."""
    return {"default": "default (`DLACCallback()`: {mode})", "gradient": '`mode="gradient"`',
            "noise": '`mode="noise"`', "noise_recal": '`mode="noise", recalibrate_every=steps // 5`',
            "noise_absolute": f'`mode="noise", noise_budget={PREVIOUS_NOISE_BUDGET:g}, recalibrate_every=0`'
                              " (the previous default)"}


def calibration_worlds(results: Results, name: str = "calibration_worlds_quick.json") -> list[str]:
    """The calibrated variants of a run on worlds of the family: per world, the AUROC against all-tight and
    all-loose, the flagged tables against the planted sensitive ones and the bytes; then the issue's summary and,
    on evaluation worlds, its targets (a target needs at least 20 worlds to be judged)."""
    data = dict(results.get(name))
    # In world order (a resumed run appends the worlds it reran, world 1000 of the settled runs among them).
    data["per_world"] = sorted(data["per_world"], key=lambda w: w["world"])
    cfg = dict(data.get("config", {}))
    cfg["seeds"] = sorted(cfg.get("seeds", []))
    lines = [source_line(name, data, results.shown), "",
             f"{cfg.get('worlds')} worlds {cfg.get('seeds')}, "
             + (settle_rule(cfg, data.get("results")) if cfg.get("settle")
                else f"{cfg.get('steps')} training batches per rank each")
             + (f" (the run was stopped after {len(cfg['seeds'])} of the {len(cfg['seeds_planned'])} worlds it"
                " planned)" if cfg.get("seeds_planned") else "") + ".", "",
             "| world | tables (sensitive) | dim | all-tight vs uncompressed | all-loose vs all-tight | variant |"
             " vs all-tight, mean (median) over seeds | vs all-loose | flagged (of them sensitive) |"
             " bytes vs all-tight |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    labels = _world_labels()
    judged = [v for v in labels if v in data["per_world"][0]]
    for w in data["per_world"]:
        spec = w["spec"]
        for variant in judged:
            r = w[variant]
            tight = r["auroc_vs_uncompressed"] - r["auroc_vs_all_tight"]  # all-tight's AUROC minus uncompressed's
            head = (f"| {w['world']} | {spec['tables']} ({spec['roles']['sensitive']}) | {spec['dim']} |"
                    f" {tight:+.4f} | {w['all_loose_vs_all_tight']:+.4f} |") if variant == judged[0] else "| | | | | |"
            median = r.get("auroc_vs_all_tight_median")  # one seed per arm before paired training seeds
            lines.append(f"{head} {variant} | {r['auroc_vs_all_tight']:+.4f}"
                         + ("" if median is None else f" ({median:+.4f})")
                         + f" | {r['auroc_vs_all_loose']:+.4f} |"
                         f" {r['flagged_count']} ({r['true_positives']}) | {fmt_x(r['bytes_vs_all_tight'])} |")
    floored = "within_floor_of_all_tight" in data["summary"]  # runs before paired training seeds have no floor
    lines += ["", "| summary | worlds | within 0.001 of all-tight | worse than all-loose |"
              + (" within the floor of all-tight | worse than all-loose beyond the floor |" if floored else "")
              + " recall | precision | median bytes vs all-tight |",
              "|---|---|---|---|" + ("---|---|" if floored else "") + "---|---|---|"]
    for variant in judged:
        d = data["summary" if variant == "default" else f"summary_{variant}"]
        label = labels[variant].format(mode=default_described(data))
        lines.append(f"| {label} | {d['worlds']} | {fmt_plain(d['default_within_0001_of_all_tight'], '.0%')} |"
                     f" {d['worse_than_all_loose']} |"
                     + (f" {fmt_plain(d['within_floor_of_all_tight'], '.0%')} |"
                        f" {d['worse_than_all_loose_beyond_floor']} |" if floored else "")
                     + f" {fmt_plain(d['recall'])} | {fmt_plain(d['precision'])} | {fmt_x(d['bytes_vs_all_tight'])} |")
    shares = {v: [r["calibration_s"] / r["seconds"] for r in data["results"]
                  if r.get("variant") == v and r.get("calibration_s") is not None and r.get("seconds")]
              for v in judged}
    if all(shares.values()):
        lines += ["", "Calibration's share of an arm's training time (the callback's own measure: observers,"
                  " reductions), median (range) over its runs: " + "; ".join(
                      f"{v} {statistics.median(x):.1%} ({min(x):.1%}-{max(x):.1%})" for v, x in shares.items()) + "."]
    floors = [(w.get("noise_floor") or {}).get("floor") for w in data["per_world"]]
    if any(f is not None for f in floors):  # runs before paired training seeds have none
        seeds = data["per_world"][0]["noise_floor"]["train_seeds"]
        lines += ["", f"Noise floor per world ({seeds} paired training seeds; two standard errors of a mean of paired"
                  " differences; a difference within it is within noise): "
                  + ", ".join(f"{w['world']} {fmt_plain(f, '.4f')}" for w, f in zip(data["per_world"], floors)) + "."]
    if cfg.get("settle"):
        fixed = [w["noise_floor_at_fixed_steps"]["floor"] for w in data["per_world"]]
        unsettled = [f"{w['world']} {u}" for w in data["per_world"] for u in w["unsettled"]]
        lines += ["", f"The same runs read at {cfg['fixed_steps']} batches (the fixed protocol) had the floors "
                  + ", ".join(f"{w['world']} {fmt_plain(f, '.4f')}" for w, f in zip(data["per_world"], fixed))
                  + "; arms that reached the cap unsettled (world, arm:seed): " + (", ".join(unsettled) or "none")
                  + "."]
    if cfg.get("worlds") != "eval":
        return lines
    d = data["summary"]
    lines += ["", f"Targets of the default (issue 33; judged on at least 20 evaluation worlds, here {d['worlds']}):",
              ""]
    for key, label, threshold, at_least in WORLD_TARGETS:
        v = d[key]
        met = world_target_met(v, threshold, at_least)
        shown = "-" if v is None else (f"{v:.0%}" if key.startswith("default_") else f"{v:.2f}")
        judged = "met" if met else "**not met**"
        lines.append(f"- {label}: {judged} on these worlds ({shown})" + ("" if d["worlds"] >= 20 else
                                                                         "; too few worlds to count"))
    return lines


def settle_rule(cfg: dict[str, Any], runs: list[dict[str, Any]] | None = None) -> str:
    """How a ``--settle`` run trained its arms, from its configuration, and how many of ``runs`` (its arms' records)
    settled: an arm that reached the cap is read where its AUROC was then, not where it would have settled."""
    share = ""
    if runs and all("settled" in r for r in runs):
        settled = sum(bool(r["settled"]) for r in runs)
        share = f"; {settled} of {len(runs)} arms settled, {len(runs) - settled} reached the cap unsettled"
    return (f"every arm trained until its validation AUROC settled or it reached the cap (validated every"
            f" {cfg['val_every']} batches, stopped at the first validation gaining less than"
            f" {cfg['settle_delta']:g} AUROC; at most {cfg['steps']} batches per rank{share})")


def _calibration_fit_line(results: Results) -> list[str]:
    """Where the noise mode's one constant comes from: the fit on development worlds, if its file is there."""
    fit_file = results.get("calibration_worlds_fit.json")
    if fit_file is None:
        return []
    fit, cfg = fit_file["fit"], fit_file.get("config", {})
    return ["", f"The noise budget, {fit['noise_budget']:.4f}, is the {fit['quantile']:.0%} quantile over"
            f" {len(cfg.get('seeds', []))} {cfg.get('worlds')} worlds (none of them an evaluation world) of the noise"
            f" share of the tables at eps {fit['at_eps']:g}. "
            + source_line("calibration_worlds_fit.json", fit_file, results.shown)]


def calibration_perturb(results: Results) -> list[str]:
    """One training seed of one world at all-tight's bound and one percent either side: how far the trajectory
    alone moves the AUROC, beside the worlds' floors."""
    name = "calibration_perturb.json"
    data = results.get(name)
    p = data["perturb"]
    lines = [source_line(name, data, results.shown), "",
             f"World {p['world']} ({data['config']['worlds']} split), training seed {p['train_seed']},"
             f" {data['config']['steps']} training batches per rank; every table at one constant bound.", "",
             "| every table at | val AUROC | vs uncompressed |", "|---|---:|---:|",
             f"| uncompressed | {p['uncompressed']:.4f} | |"]
    lines += [f"| {c['eps']:g} | {c['val_auroc']:.4f} | {c['val_auroc'] - p['uncompressed']:+.4f} |"
              for c in p["constants"]]
    lines += ["", f"A one-percent change of the bound moves this run's AUROC by up to {p['spread']:.4f}"
              f" ({p['spread'] / WORLD_NOISE:.0f}x the {WORLD_NOISE:g} the issue judges)."]
    return lines


def calibration_curves(results: Results) -> list[str]:
    """Learning curves of a world's arms (``--curves``): the validation AUROC along the run, where arms part."""
    name = "calibration_curves.json"
    data = results.get(name)
    ref = data["reference"]
    lines = [source_line(name, data, results.shown), ""]
    for c in data["curves"]:
        lines += [f"World {c['world']} ({c['split']} split), training seed {c['train_seed']}: validation AUROC after"
                  " each number of training batches per rank.", "",
                  "| arm | " + " | ".join(str(s) for s in c["steps"]) + " |",
                  "|---|" + "---:|" * len(c["steps"])]
        lines += [f"| {v} | " + " | ".join(f"{a:.3f}" for a in series) + " |" for v, series in c["auroc"].items()]
        lines += [f"| {v} vs {ref} | " + " | ".join(f"{d:+.3f}" for d in series) + " |"
                  for v, series in c["difference"].items()]
        gains = c.get("last_tenth_gain") or {}
        if gains:  # how far each arm still was from settled when the run ended
            lines += ["", "AUROC gained over the last tenth of the run: "
                      + ", ".join(f"{v} {g:+.4f}" for v, g in gains.items()) + "."]
        lines.append("")
    return lines[:-1]


def calibration_settle(results: Results) -> list[str]:
    """The settle protocol on development worlds: every arm trained until its AUROC settles, its paired differences
    and floor beside those the same runs had at the fixed protocol's length."""
    name = "calibration_settle_dev.json"
    data = results.get(name)
    cfg = data["config"]
    fixed = cfg["fixed_steps"]
    lines = [source_line(name, data, results.shown), "",
             f"{cfg['worlds']} worlds {cfg['seeds']}, {cfg['train_seeds']} paired training seeds;"
             f" {settle_rule(cfg, data['results'])}.",
             "",
             f"| world | tables (sensitive) | dim | arm | vs all-tight per seed, at {fixed} batches | vs all-tight per"
             " seed, settled | stopped at (batches per rank) |", "|---|---|---|---|---|---|---|"]
    for w in data["per_world"]:
        spec, floor, at_fixed = w["spec"], w["noise_floor"], w["noise_floor_at_fixed_steps"]
        for i, (v, settled) in enumerate(floor["paired_differences"].items()):
            head = f"| {w['world']} | {spec['tables']} ({spec['roles']['sensitive']}) | {spec['dim']} |" if i == 0 \
                else "| | | |"
            lines.append(f"{head} {v} | " + ", ".join(f"{d:+.4f}" for d in at_fixed["paired_differences"][v])
                         + " | " + ", ".join(f"{d:+.4f}" for d in settled) + " | "
                         + ", ".join(str(n) for n in w["stopped_at"][v]) + " |")
        lines.append(f"| | | | all_tight | | | {', '.join(str(n) for n in w['stopped_at']['all_tight'])} |")
    lines += ["", "| world | floor at " + f"{fixed} batches | floor settled | arms unsettled at the cap |",
              "|---|---:|---:|---|"]
    lines += [f"| {w['world']} | {w['noise_floor_at_fixed_steps']['floor']:.4f} | {w['noise_floor']['floor']:.4f} |"
              f" {', '.join(w['unsettled']) or 'none'} |" for w in data["per_world"]]
    return lines


CAPPED = "†"  # a settled arm that reached the cap (SETTLE_MAX) without settling


def calibration_ablation(results: Results, name: str = "calibration_ablation.json") -> list[str]:
    """The per-table ablation of one world (issue 33 item 2): what a loose bound on each table alone costs against
    all-tight, the planted roles against it, and the default's flags against both where it ran beside the arms."""
    data = results.get(name)
    if "ablation" not in data:  # written arm by arm, and stopped before its last arm
        return [source_line(name, data, results.shown), "",
                f"*The run is incomplete ({len(data['results'])} arms so far): `--resume` finishes it. Nothing here"
                " is judged until then.*"]
    cfg, ab = data.get("config", {}), data["ablation"]
    spec = data.get("spec", {})
    world = cfg["seeds"][0]
    lines = [source_line(name, data, results.shown)]
    if "default" in ab:  # the default ran in the ablation's own runs
        flags = [r for r in data["results"] if r["variant"] == "default"]
        flagged_by = f"flagged by the default ({cfg.get('default_rule')}), seeds"
    else:  # how often the noise mode flagged each table in the development comparison, if it ran there
        dev = results.get("calibration_worlds_dev.json")
        noise = "default" if dev is not None and default_mode_of(dev) == "noise" else "noise"
        flags = [r for r in (dev or {}).get("results", []) if r["world"] == world and r["variant"] == noise]
        flagged_by = "flagged by the noise mode (development comparison, seeds)"
        if flags:
            lines.append(source_line("calibration_worlds_dev.json", dev, results.shown))
    split = "Development" if cfg.get("worlds", "dev") == "dev" else "Evaluation"
    lines += ["",
             f"{split} world {world} ({spec.get('tables')} tables, dim {spec.get('dim')}),"
             f" {settle_rule(cfg, data['results']) if cfg.get('settle') else str(cfg['steps']) + ' training batches'}"
             f"{'' if cfg.get('settle') else ' per rank'},"
             f" {ab['train_seeds']} paired training seeds; every table at"
             f" 0.01 except the one ablated, at 0.05. All tables loose cost {ab['all_loose_cost']:+.4f} AUROC; the"
             f" world's floor (two standard errors of a mean of paired differences, pooled over the arms) is"
             f" {fmt_plain(ab['floor'], '.4f')}.", "",
             "| table | planted role | AUROC cost of it alone loose | per seed | >= 0.001 (sensitive) |"
             " beyond the floor |" + (f" {flagged_by} |" if flags else ""),
             "|---|---|---:|---|---|---|" + ("---|" if flags else "")]
    # Under --settle, a seed's cost is marked where its arm reached the cap without settling: on a world whose runs
    # climb from a plateau, such an arm may not have finished the climb, and its cost is then the plateau's.
    seeds = sorted({r["train_seed"] for r in data["results"]})
    capped = {(r["variant"], r["train_seed"]) for r in data["results"] if cfg.get("settle") and not r.get("settled")}

    def per_seed(t: dict[str, Any]) -> str:
        return ", ".join(f"{-d:+.4f}{CAPPED if (ABLATE_PREFIX + t['table'], seed) in capped else ''}"
                         for d, seed in zip(t["per_seed"], seeds))

    for t in sorted(ab["tables"], key=lambda t: -t["cost"]):
        flagged = sum(t["table"] in flagged_tables(r) for r in flags)
        lines.append(f"| {t['table']} | {t['role']} | {t['cost']:+.4f} | {per_seed(t)} |"
                     f" {'yes' if t['sensitive_by_ablation'] else 'no'} |"
                     f" {'-' if t['beyond_floor'] is None else ('yes' if t['beyond_floor'] else 'no')} |"
                     + (f" {flagged} of {len(flags)} |" if flags else ""))
    if any((ABLATE_PREFIX + t["table"], seed) in capped for t in ab["tables"] for seed in seeds):
        tight = [str(x) for x in seeds if ("all_tight", x) in capped]
        lines += ["", f"{CAPPED}: the arm reached the cap without settling."
                  + (f" All-tight did so under seed(s) {', '.join(tight)}." if tight else "")]
    planted = sum(t["role"] == "sensitive" for t in ab["tables"])
    found = sum(t["sensitive_by_ablation"] for t in ab["tables"])
    lines += ["", f"Planted sensitive: {planted} tables; sensitive by the ablation: {found}; where they disagree:"
              f" {', '.join(ab['disagreements']) or 'nowhere'}."]
    if "default" in ab:
        d = ab["default"]
        lines += ["", f"The default in the same runs: {d['auroc_vs_all_tight']:+.4f} AUROC against all-tight at"
                  f" {fmt_x(d['bytes_vs_all_tight'])} its bytes; recall {fmt_plain(d['ablation']['recall'])} and"
                  f" precision {fmt_plain(d['ablation']['precision'])} against the ablation's sensitive tables, recall"
                  f" {fmt_plain(d['planted']['recall'])} and precision {fmt_plain(d['planted']['precision'])} against"
                  " the planted ones (pooled over the seeds)."]
    return lines


def calibration_drift(results: Results) -> list[str]:
    """What the default's calibrations see along a run on development worlds (``--drift``): how well the noise share
    orders the planted-sensitive tables first within each world, how far its level moves from world to world, and
    what relative and absolute budgets would flag at each calibration."""
    name = "calibration_drift_dev.json"
    data = results.get(name)
    cfg, drift = data.get("config", {}), data["drift"]
    budgets = list(drift["calibrations"][0]["budgets"])
    lines = [source_line(name, data, results.shown), "",
             f"Development worlds {drift['worlds'][0]}-{drift['worlds'][-1]} ({len(drift['worlds'])} worlds), one"
             f" training seed each, {cfg.get('steps')} training batches per rank, `{cfg.get('default_rule')}`; every"
             f" calibration of each run, read at eps {drift['eps']:g}. *Order*: the probability that a planted-"
             "sensitive table's noise share exceeds another table's, within a world (median and smallest over"
             " worlds). *Level*: the summed share of the other tables, median and ninth decile over worlds. Then, per"
             " budget, the tables it would flag at that calibration: recall and precision against the planted roles"
             " (pooled over worlds) and the median bytes against every table at 0.01.", "",
             "| calibration at batch | order: median (smallest) | level: median, ninth decile | "
             + " | ".join(f"{b}: recall, precision, bytes" for b in budgets) + " |",
             "|---|---|---|" + "---|" * len(budgets)]
    for p in drift["calibrations"]:
        cells = [f"{fmt_plain(v['recall'])}, {fmt_plain(v['precision'])}, {fmt_x(v['bytes_vs_tight'])}"
                 for v in p["budgets"].values()]
        lines.append(f"| {p['batch']:g} | {fmt_plain(p['auc_median'])} ({fmt_plain(p['auc_min'])}) |"
                     f" {p['others_sum_median']:.2g}, {p['others_sum_p90']:.2g} | " + " | ".join(cells) + " |")
    return lines


# The same ablation on the first evaluation world, judged after the default's constants were fixed.
ABLATION_EVAL_FILE = "calibration_ablation_eval.json"


def _worlds(name: str) -> Block:
    """The block of a results file of worlds of the family."""
    return Block((name,), lambda results: calibration_worlds(results, name))


def _ablation(name: str) -> Block:
    """The block of a per-table ablation's results file."""
    return Block((name,), lambda results: calibration_ablation(results, name))


BLOCKS = {
    "calibration_modes": Block(("calibration_bench.json",), calibration_modes,
                               optional=("calibration_bench_quick.json",)),
    "calibration_trace": Block(("calibration_trace.json",), calibration_trace),
    # The quick evaluation worlds, with where the previous default's one constant came from.
    "calibration_worlds": Block(("calibration_worlds_quick.json",),
                                lambda results: calibration_worlds(results) + _calibration_fit_line(results),
                                optional=("calibration_worlds_fit.json",)),
    # The evaluation worlds under the full protocol (1000 batches, 5 paired training seeds): what judges the accuracy
    # targets the quick run's floors cannot.
    "calibration_worlds_full": _worlds("calibration_worlds.json"),
    # The development worlds the default mode was chosen on (issue 33: the noise mode against the gradient mode), and
    # the same worlds run again with the relative, recalibrating default (and the previous one).
    "calibration_worlds_dev": _worlds("calibration_worlds_dev.json"),
    "calibration_worlds_dev_relative": _worlds("calibration_worlds_dev_relative.json"),
    # The evaluation worlds with every arm trained until it settles (--settle), the default among the arms; and with
    # the relative, recalibrating default against the settled run's baselines.
    "calibration_worlds_settled": _worlds("calibration_worlds_settled.json"),
    "calibration_worlds_settled_relative": _worlds("calibration_worlds_settled_relative.json"),
    "calibration_perturb": Block(("calibration_perturb.json",), calibration_perturb),
    "calibration_curves": Block(("calibration_curves.json",), calibration_curves),
    "calibration_settle": Block(("calibration_settle_dev.json",), calibration_settle),
    "calibration_drift": Block(("calibration_drift_dev.json",), calibration_drift),
    "calibration_ablation": Block(("calibration_ablation.json",), calibration_ablation,
                                  optional=("calibration_worlds_dev.json",)),
    # The same ablation on the first evaluation world, judged after the default's constants were fixed, and on an
    # evaluation world whose runs settle (1000's ablation measured its plateau; benchmarks/lib/plan.py says why 1014).
    "calibration_ablation_eval": _ablation(ABLATION_EVAL_FILE),
    "calibration_ablation_eval_1014": _ablation("calibration_ablation_eval_1014.json"),
}
