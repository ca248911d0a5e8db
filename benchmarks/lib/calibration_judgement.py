"""Judging a calibration benchmark's runs: a world's noise floor from its paired training seeds, each calibrated
arm against the baselines (all-tight, all-loose, uncompressed), the tables it flagged against the planted sensitive
ones, the summary over worlds, the per-table ablation, the learning curves, and the development-world checks of the
default's rule (its drift along a run, the previous absolute budget's fit). Pure functions of results records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.lib.calibration_arms import ABLATE_PREFIX, BASELINES, LOOSE, PREVIOUS_NOISE_BUDGET
from benchmarks.lib.calibration_data import draw_world
from benchmarks.lib.results import load_results


def trace_summary(point: dict[str, Any], roles: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Smallest and largest gradient sensitivity (at the largest candidate) of each role at one calibration."""
    out = {}
    for role in ("sensitive", "robust", "irrelevant"):
        values = [v for t, v in point["sensitivity"].items() if roles.get(t) == role]
        if values:
            out[role] = (round(min(values), 3), round(max(values), 3))
    return out


WORLD_NOISE = 0.001  # AUROC: the within-tight margin of issue 33, and what "beyond noise" means for worse-than-loose


def judge_ablation(by_seed: list[dict[str, dict[str, Any]]], roles: dict[str, str]) -> dict[str, Any]:
    """Per table, the mean paired AUROC difference of its ablation arm to all-tight, whether it costs at least
    WORLD_NOISE (sensitive by ablation) and whether that cost is beyond the world's floor (FLOOR_Z standard errors of
    a mean of paired differences, the spread pooled over every ablation arm and all-loose); then the planted roles
    against it: the tables where planted-sensitive and sensitive-by-ablation disagree."""
    arms = [v for v in by_seed[0] if v.startswith(ABLATE_PREFIX)] + ["all_loose"]
    diffs = {v: [runs[v]["val_auroc"] - runs["all_tight"]["val_auroc"] for runs in by_seed] for v in arms}
    squares = sum(sum((d - statistics.fmean(ds)) ** 2 for d in ds) for ds in diffs.values())
    dof = sum(len(ds) - 1 for ds in diffs.values())
    floor = FLOOR_Z * math.sqrt(squares / dof) / math.sqrt(len(by_seed)) if dof > 0 else None
    tables = []
    for v in arms[:-1]:
        table = v.removeprefix(ABLATE_PREFIX)
        cost = -statistics.fmean(diffs[v])
        tables.append({"table": table, "role": roles[table], "cost": cost, "per_seed": diffs[v],
                       "sensitive_by_ablation": cost >= WORLD_NOISE,
                       "beyond_floor": None if floor is None else cost > floor})
    disagree = [t["table"] for t in tables if (t["role"] == "sensitive") != t["sensitive_by_ablation"]]
    out = {"floor": floor, "train_seeds": len(by_seed), "all_loose_cost": -statistics.fmean(diffs["all_loose"]),
           "tables": tables, "disagreements": disagree}
    if all("default" in runs for runs in by_seed):
        out["default"] = judge_default_by_ablation(by_seed, tables)
    return out


def judge_default_by_ablation(by_seed: list[dict[str, dict[str, Any]]],
                              tables: list[dict[str, Any]]) -> dict[str, Any]:
    """The default's flags (bound below LOOSE) in the ablation's own runs, per seed, counted against both yardsticks:
    the tables the ablation finds sensitive (the issue's definition) and the planted sensitive ones; recall and
    precision pool over the seeds, as on the family."""
    by_ablation = {t["table"] for t in tables if t["sensitive_by_ablation"]}
    planted = {t["table"] for t in tables if t["role"] == "sensitive"}
    flags = [flagged_tables(runs["default"]) for runs in by_seed]

    def against(sensitive: set[str]) -> dict[str, Any]:
        hits = sum(len(f & sensitive) for f in flags)
        flagged, wanted = sum(len(f) for f in flags), len(sensitive) * len(flags)
        return {"recall": hits / wanted if wanted else None, "precision": hits / flagged if flagged else None}

    return {"flagged": [sorted(f) for f in flags], "ablation": against(by_ablation), "planted": against(planted),
            "auroc_vs_all_tight": statistics.fmean(runs["default"]["val_auroc"] - runs["all_tight"]["val_auroc"]
                                                   for runs in by_seed),
            "bytes_vs_all_tight": _mean_or_none(bytes_per_step_ratio(runs["default"], runs["all_tight"])
                                                for runs in by_seed)}


def _mean_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def curve_summary(by_variant: dict[str, dict[str, Any]], reference: str) -> dict[str, Any]:
    """The learning curves of one world's arms under one training seed: each arm's validation AUROC at every
    validation step they share, each arm's difference from ``reference`` there, and each arm's gain over the last
    tenth of the run (how far from settled it still was when the run ended)."""
    steps = sorted(set.intersection(*(set(s for s, _ in r["curve"]) for r in by_variant.values())))
    auroc = {v: [dict(r["curve"])[s] for s in steps] for v, r in by_variant.items()}
    ref = auroc[reference]
    late = next((i for i, s in enumerate(steps) if s >= 0.9 * steps[-1]), len(steps) - 1) if steps else 0
    return {"steps": steps, "auroc": auroc,
            "difference": {v: [a - b for a, b in zip(series, ref)] for v, series in auroc.items() if v != reference},
            "last_tenth_gain": {v: series[-1] - series[max(late - 1, 0)] for v, series in auroc.items() if series}}


FIT_QUANTILE = 0.9  # the p90 rule of fit_noise_budget


def fit_noise_budget(runs: list[dict[str, Any]], eps: str = "0.05") -> dict[str, Any]:
    """The noise budget from development worlds' noise-mode runs (the p90 rule): per world, the summed noise share
    at the loose bound ``eps`` of the tables whose label effect is not sensitive (robust and irrelevant); the budget
    is the FIT_QUANTILE quantile (nearest rank) of those sums over worlds, so that on that share of development
    worlds every such table fits loose in it, and a sensitive table's larger share does not."""
    per_world = []
    for r in runs:
        shares = {t: s[eps] for t, s in (r.get("noise_share") or {}).items() if s}
        by_role: dict[str, list[float]] = {}
        for t, v in shares.items():
            by_role.setdefault(r["roles"][t], []).append(v)
        per_world.append({"world": r["world"], "others_loose": sum(v for t, v in shares.items()
                                                                   if r["roles"][t] != "sensitive"),
                          "by_role": {k: sorted(v) for k, v in by_role.items()}})
    sums = sorted(w["others_loose"] for w in per_world)
    rank = max(0, min(len(sums) - 1, math.ceil(FIT_QUANTILE * len(sums)) - 1))
    return {"noise_budget": sums[rank] if sums else None, "quantile": FIT_QUANTILE, "at_eps": float(eps),
            "worlds": [r["world"] for r in runs], "per_world": per_world}


DRIFT_FRACTIONS = (0.05, 0.1, 0.2)  # the default's noise_fraction and either side of it


def _auc(positive: Sequence[float], negative: Sequence[float]) -> float | None:
    """The probability that a positive value exceeds a negative one (ties count half); None without both."""
    if not positive or not negative:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def drift_check(runs: list[dict[str, Any]], eps: float = LOOSE) -> dict[str, Any]:
    """What the default's calibrations see on development worlds (``--drift``: one run per world, every calibration
    recorded): per calibration (by its index along the run), how well the noise share at ``eps`` orders the planted
    sensitive tables above the others within each world (median AUC over worlds), how far the level of the other
    tables' summed shares moves from world to world (its median and ninth decile), and which tables a budget would
    flag there: relative ones (DRIFT_FRACTIONS of the all-loose noise) and the absolute one the previous default used
    (PREVIOUS_NOISE_BUDGET), with recall and precision pooled over worlds and the median bytes against every table at
    0.01. Development data: it shows what the default's rule does where it may be developed, not how it is judged."""
    from lightning_dlac.adaptive import TableStats, noise_table_bounds, relative_noise_budget

    budgets = {f"fraction {f:g}": f for f in DRIFT_FRACTIONS} | {f"absolute {PREVIOUS_NOISE_BUDGET:g}": None}
    count = min(len(r["calibrations"]) for r in runs)
    points = []
    for k in range(count):
        aucs, sums, tallies = [], [], {name: [0, 0, 0, []] for name in budgets}
        for r in runs:
            stats = {t: TableStats.from_dict(d) for t, d in r["calibrations"][k]["stats"].items()}
            shares = {t: s.noise_share() for t, s in stats.items()}
            sensitive = {t for t, role in r["roles"].items() if role == "sensitive"}
            aucs.append(_auc([v[eps] for t, v in shares.items() if v and t in sensitive],
                             [v[eps] for t, v in shares.items() if v and t not in sensitive]))
            sums.append(sum(v[eps] for t, v in shares.items() if v and t not in sensitive))
            at = {c: i for i, c in enumerate(next(iter(stats.values())).candidates)}
            tight = sum(s.encoded_bytes[at[0.01]] for s in stats.values())
            for name, fraction in budgets.items():
                budget = PREVIOUS_NOISE_BUDGET if fraction is None else relative_noise_budget(stats, fraction)
                bounds = noise_table_bounds(stats, budget) if budget else {}
                flagged = {t for t, b in bounds.items() if b < eps}
                tally = tallies[name]
                tally[0] += len(flagged & sensitive)
                tally[1] += len(flagged)
                tally[2] += len(sensitive)
                tally[3].append(sum(stats[t].encoded_bytes[at[b]] for t, b in bounds.items()) / tight)
        ordered = sorted(sums)
        known = [a for a in aucs if a is not None]
        points.append({"batch": statistics.median(r["calibrations"][k]["batch"] for r in runs),
                       "auc_median": statistics.median(known) if known else None,
                       "auc_min": min(known) if known else None,
                       "others_sum_median": statistics.median(ordered),
                       "others_sum_p90": ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)],
                       "budgets": {name: {"recall": tp / n if n else None, "precision": tp / f if f else None,
                                          "bytes_vs_tight": statistics.median(b)}
                                   for name, (tp, f, n, b) in tallies.items()}})
    return {"eps": eps, "worlds": [r["world"] for r in runs], "calibrations": points}


def bytes_per_step_ratio(r: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """``r``'s forward bytes per training batch over ``reference``'s: per batch, because settled arms (``--settle``)
    stop after different numbers of batches, and their totals would count the length as well as the bounds."""
    if not reference["sent_bytes"] or not r["steps"] or not reference["steps"]:
        return None
    return (r["sent_bytes"] / r["steps"]) / (reference["sent_bytes"] / reference["steps"])


def flagged_tables(run: dict[str, Any]) -> set[str]:
    """The tables a calibrated run flagged: those whose bound ended below LOOSE."""
    return {t for t, eps in (run.get("table_bounds") or {}).items() if eps < LOOSE}


def judge_world(runs: dict[str, dict[str, Any]], variant: str) -> dict[str, Any]:
    """One world's figures of a calibrated ``variant`` under one training seed: its AUROC against all-tight and
    all-loose, its bytes per batch against all-tight's, and its flagged tables (bound below LOOSE) against the
    planted sensitive ones."""
    r, tight, loose = runs[variant], runs["all_tight"], runs["all_loose"]
    flagged = flagged_tables(r)
    sensitive = {t for t, role in r["roles"].items() if role == "sensitive"}
    return {"auroc_vs_all_tight": r["val_auroc"] - tight["val_auroc"],
            "auroc_vs_all_loose": r["val_auroc"] - loose["val_auroc"],
            "auroc_vs_uncompressed": r["val_auroc"] - runs["uncompressed"]["val_auroc"],
            "bytes_vs_all_tight": bytes_per_step_ratio(r, tight),
            "flagged": sorted(flagged), "true_positives": len(flagged & sensitive), "flagged_count": len(flagged),
            "sensitive_count": len(sensitive), "calibrated": bool(r.get("table_bounds"))}


# The noise floor of a world (issue 33's "within noise"): every arm of a world runs under the same training seeds,
# each seed fixing the model's initial weights and the draw and order of the training batches, so an arm's AUROC
# difference to another is taken per seed (paired) and averaged over seeds. How far such a mean moves by chance is
# read from the spread of the paired differences themselves: the floor is FLOOR_Z standard errors of a mean of
# paired differences, the standard deviation pooled over the world's comparisons (every arm against all-tight),
# each about its own mean, so that a real difference between arms does not count as noise.
FLOOR_Z = 2.0


FLOOR_COMPARISONS = ("uncompressed", "all_loose", "default", "gradient", "noise")  # each against all-tight, per seed


def at_step(by_seed: list[dict[str, dict[str, Any]]], step: int) -> list[dict[str, dict[str, Any]]]:
    """``by_seed`` with every arm's AUROC read from its learning curve at ``step`` (where it stopped, if earlier: a
    settled arm has stopped moving): the same runs judged as a fixed run of ``step`` batches would be."""
    def read(r: dict[str, Any]) -> float:
        before = [a for s, a in r["curve"] if s <= step]
        return before[-1] if before else r["val_auroc"]

    return [{v: dict(r, val_auroc=read(r)) for v, r in runs.items()} for runs in by_seed]


def noise_floor(by_seed: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The noise floor of one world from its runs under several training seeds (``by_seed[k][variant]``, every
    variant under seed ``k``): the paired AUROC differences of every arm in FLOOR_COMPARISONS against all-tight per
    seed, their pooled standard deviation (each comparison about its own mean) and the floor, FLOOR_Z standard
    errors of a mean over the seeds. With one seed there is no spread to read: the floor is None."""
    diffs = {v: [runs[v]["val_auroc"] - runs["all_tight"]["val_auroc"] for runs in by_seed]
             for v in FLOOR_COMPARISONS if all(v in runs for runs in by_seed)}
    squares = sum(sum((d - statistics.fmean(ds)) ** 2 for d in ds) for ds in diffs.values())
    dof = sum(len(ds) - 1 for ds in diffs.values())
    sd = math.sqrt(squares / dof) if dof > 0 else None
    seeds = len(by_seed)
    return {"train_seeds": seeds, "paired_sd": sd, "floor": None if sd is None else FLOOR_Z * sd / math.sqrt(seeds),
            "z": FLOOR_Z, "paired_differences": diffs}


def judge_world_seeds(by_seed: list[dict[str, dict[str, Any]]], variant: str,
                      floor: float | None = None) -> dict[str, Any]:
    """A calibrated ``variant``'s figures on one world over its training seeds (``by_seed[k][variant]``): the AUROC
    differences are the means over seeds of the paired (same-seed) differences, the bytes the mean ratio; flagged
    tables are counted under every seed (so recall and precision pool over seeds too); the median of the paired
    differences to all-tight is kept beside their mean. ``within_noise`` says, per
    AUROC comparison, whether the mean difference is within the world's ``floor`` (None without one)."""
    per_seed = [judge_world(runs, variant) for runs in by_seed]
    out = {k: statistics.fmean(r[k] for r in per_seed)
           for k in ("auroc_vs_all_tight", "auroc_vs_all_loose", "auroc_vs_uncompressed")}
    out.update({"bytes_vs_all_tight": _mean_or_none(r["bytes_vs_all_tight"] for r in per_seed),
                "flagged": sorted({t for r in per_seed for t in r["flagged"]}),
                **{k: sum(r[k] for r in per_seed) for k in ("true_positives", "flagged_count", "sensitive_count")},
                "calibrated": all(r["calibrated"] for r in per_seed),
                "auroc_vs_all_tight_per_seed": [r["auroc_vs_all_tight"] for r in per_seed],
                # A seed whose arms part into different states moves the mean by far more than the median.
                "auroc_vs_all_tight_median": statistics.median(r["auroc_vs_all_tight"] for r in per_seed),
                "within_noise": None if floor is None else {
                    k: abs(out[k]) <= floor for k in ("auroc_vs_all_tight", "auroc_vs_all_loose",
                                                       "auroc_vs_uncompressed")}})
    return out


def summarize_worlds(per_world: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    """The issue's summary of ``variant`` over worlds (recall and precision pooled over worlds), and, where the
    worlds carry a noise floor, the same two AUROC judgements with each world's margin widened to its floor when
    that is larger than WORLD_NOISE, and how many worlds' floors are within WORLD_NOISE (where a 0.001 difference can
    be told from noise at all)."""
    rows = [w[variant] for w in per_world]
    tp, flagged, sensitive = (sum(r[k] for r in rows) for k in ("true_positives", "flagged_count", "sensitive_count"))
    ratios = [r["bytes_vs_all_tight"] for r in rows if r["bytes_vs_all_tight"] is not None]
    out = {"worlds": len(rows),
           "default_within_0001_of_all_tight": sum(r["auroc_vs_all_tight"] >= -WORLD_NOISE for r in rows) / len(rows),
           "worse_than_all_loose": sum(r["auroc_vs_all_loose"] < -WORLD_NOISE for r in rows),
           "recall": tp / sensitive if sensitive else None, "precision": tp / flagged if flagged else None,
           "bytes_vs_all_tight": statistics.median(ratios) if ratios else None}
    floors = [(w.get("noise_floor") or {}).get("floor") for w in per_world]
    if all(f is not None for f in floors):
        margins = [max(WORLD_NOISE, f) for f in floors]
        out.update({"noise_floor_median": statistics.median(floors),
                    "worlds_floor_within_0001": sum(f <= WORLD_NOISE for f in floors),
                    "within_floor_of_all_tight": sum(r["auroc_vs_all_tight"] >= -m
                                                     for r, m in zip(rows, margins)) / len(rows),
                    "worse_than_all_loose_beyond_floor": sum(r["auroc_vs_all_loose"] < -m
                                                             for r, m in zip(rows, margins))})
    return out


def judge_world_entry(world: int, by_seed: list[dict[str, dict[str, Any]]], variants: Sequence[str],
                      cfg: dict[str, Any], verbose: bool = False) -> dict[str, Any]:
    """A world's entry of ``per_world``: its noise floor (and, under ``--settle``, the floor read at the fixed
    protocol's length and where each arm stopped), each calibrated variant's judgement and the baselines' gaps."""
    floor = noise_floor(by_seed)
    if verbose:
        print(f"  noise floor: {floor['floor']} (paired sd {floor['paired_sd']}, {floor['train_seeds']} seeds)",
              flush=True)
    settled = {}
    if cfg.get("settle"):
        fixed = noise_floor(at_step(by_seed, cfg["fixed_steps"]))
        settled = {"noise_floor_at_fixed_steps": fixed,
                   "unsettled": [f"{r['variant']}:{r['train_seed']}" for rs in by_seed for r in rs.values()
                                 if not r["settled"]],
                   "stopped_at": {v: [rs[v]["steps"] for rs in by_seed] for v in variants}}
        if verbose:
            print(f"  at {cfg['fixed_steps']} steps the floor was {fixed['floor']}; stopped at {settled['stopped_at']},"
                  f" unsettled {settled['unsettled']}", flush=True)
    return {"world": world, "spec": draw_world(world).summary(), "noise_floor": floor, **settled,
            **{v: judge_world_seeds(by_seed, v, floor["floor"]) for v in variants if v not in BASELINES},
            "all_loose_vs_all_tight": statistics.fmean(
                r["all_loose"]["val_auroc"] - r["all_tight"]["val_auroc"] for r in by_seed),
            "all_tight_vs_uncompressed": statistics.fmean(
                r["all_tight"]["val_auroc"] - r["uncompressed"]["val_auroc"] for r in by_seed)}


def worlds_summaries(per_world: list[dict[str, Any]], judged: Sequence[str]) -> dict[str, Any]:
    """The summary sections of a worlds results file: ``summary`` (the default's) and ``summary_<variant>``."""
    summaries = {v: summarize_worlds(per_world, v) for v in judged}
    extra = {"summary": summaries["default"]} if "default" in summaries else {}
    extra.update({f"summary_{v}": s for v, s in summaries.items() if v != "default"})
    return extra


def rejudge(path: Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """A ``--worlds`` results file judged again, from the runs it holds, by this code's judgement (``--rejudge``):
    every world's entry and the summaries are recomputed, the runs and the metadata of the run that made them are
    kept, and ``rejudged`` records when and by which commit. Returns the new file's content."""
    data = load_results(path)
    cfg = data["config"]
    if "per_world" not in data:
        raise SystemExit(f"--rejudge {path}: not a --worlds results file (it has no per_world)")
    variants = cfg["variants"]
    by_world: dict[int, dict[int, dict[str, dict[str, Any]]]] = {}
    for r in data["results"]:
        by_world.setdefault(r["world"], {}).setdefault(r.get("train_seed", 0), {})[r["variant"]] = r
    per_world = [judge_world_entry(w["world"], [runs for _, runs in sorted(by_world[w["world"]].items())], variants,
                                   cfg) for w in data["per_world"]]
    judged = [v for v in variants if v not in BASELINES]
    data = {k: v for k, v in data.items() if k not in ("per_world", "summary") and not k.startswith("summary_")}
    data.update(worlds_summaries(per_world, judged), per_world=per_world)
    data["rejudged"] = [*data.get("rejudged", []), {"commit": metadata.get("git_commit"),
                                                     "git_dirty": metadata.get("git_dirty"),
                                                     "date": metadata.get("date")}]
    return data
