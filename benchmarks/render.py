"""Render the figures of README.md and docs/ (benchmarks, strategy, multinode) from the results files.

Every figure block in those files sits between ``<!-- BEGIN render:NAME -->`` and ``<!-- END render:NAME -->`` and
is this script's output for block NAME: made from the results files it names (benchmarks/results/*.json, written by
the benchmark scripts; ``make bench-quick`` / ``make bench`` run them), or, while a file is missing, a line saying
which command writes it. Text outside the markers is written by hand and kept.

    python benchmarks/render.py                  # rewrite the blocks in place from benchmarks/results/
    python benchmarks/render.py --check          # exit 1 if a block differs from what the files give
    python benchmarks/render.py --results DIR --out DIR/rendered   # render copies from other results

After rendering it prints every judged target and every benchmark error in the results it used, and exits with
status 3 when a file records a benchmark error (e.g. a DLAC launch faster than its own ceiling), so a run that
produced one cannot pass for a clean one. tests/test_figures.py checks that the committed blocks agree with the
committed results files.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import HERE, REPO, RULE, judge, load_results, span, verdict_text

DOCS = ("README.md", "docs/benchmarks.md", "docs/adaptive.md", "docs/strategy.md", "docs/multinode.md",
        "docs/data.md", "docs/codec.md")
BLOCK = re.compile(r"<!-- BEGIN render:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- END render:(?P=name) -->", re.S)


class Results:
    """The results files of one directory, loaded once each; ``used`` collects those the blocks read."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        resolved = self.directory.resolve()
        self.shown = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)
        self._cache: dict[str, dict[str, Any] | None] = {}
        self.used: set[str] = set()

    def get(self, name: str) -> dict[str, Any] | None:
        if name not in self._cache:
            path = self.directory / name
            self._cache[name] = load_results(path) if path.is_file() else None
        if self._cache[name] is not None:
            self.used.add(name)
        return self._cache[name]


@dataclass(frozen=True)
class Block:
    """A rendered block: the results files it reads (all needed unless ``optional``) and what makes its lines."""

    files: tuple[str, ...]
    render: Callable[..., list[str]]
    optional: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------------------------
# Shared pieces


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "not recorded"


def source_line(name: str, data: dict[str, Any], where: str = "benchmarks/results") -> str:
    """Where a block's figures come from: the file, the commit, date, machine, load and depth of the run."""
    m = data["metadata"]
    if m.get("legacy"):
        torch = m.get("versions", {}).get("torch", "?")
        return (f"From `{where}/{name}` (written before results files carried their metadata; command:"
                f" `{m.get('command')}`; {m.get('cores', '?')} cores, torch {torch}).")
    load = ""
    if m.get("loadavg_before") and m.get("loadavg_after"):
        load = f", load average {m['loadavg_before'][0]:.1f} before and {m['loadavg_after'][0]:.1f} after"
    depth = f", `make bench{'' if m.get('depth') == 'full' else '-' + m['depth']}`" if m.get("depth") else ""
    versions = m.get("versions", {})
    dirty = " (with local changes)" if m.get("git_dirty") else ""
    resumed = "".join((f" It keeps (`--resume`) the {part['launches']} launches of worlds {part.get('worlds')} that"
                       f" the run of commit {_short(part.get('git_commit'))}, {part.get('date')}, made before it"
                       f" stopped" if "launches" in part else
                       f" It continues (`--resume`) the run of commit {_short(part.get('git_commit'))},"
                       f" {part.get('date')}, that wrote worlds {part.get('worlds')}")
                      + (f" under {part['train_seeds']} training seeds" if "train_seeds" in part else "")
                      + (f" (of {part['train_seeds_planned']} planned: stopped partway)"
                         if "train_seeds_planned" in part else "")
                      + f" (command: `{part.get('command')}`)."
                      for part in m.get("resumed_from", []))
    reused = m.get("baselines_from")
    if reused:
        resumed += (f" Its baseline arms (uncompressed, all-tight, all-loose) of worlds {reused.get('worlds')} are"
                    f" those of `{Path(reused.get('path', '?')).name}` (`--baselines-from`; commit"
                    f" {_short(reused.get('git_commit'))}, {reused.get('date')}), reused, not rerun.")
    resumed += "".join(f" Judged again from its runs (`--rejudge`) by commit {_short(part.get('commit'))}"
                       f"{' (with local changes)' if part.get('git_dirty') else ''}, {part.get('date')}."
                       for part in data.get("rejudged", []))
    return (f"From `{where}/{name}`: commit {_short(m.get('git_commit'))}{dirty}, {m.get('date')},"
            f" {m.get('cores')} cores ({m.get('cpu', '?')}){load}{depth}; torch {versions.get('torch', '?')},"
            f" torchrec {versions.get('torchrec', '?')}, lightning {versions.get('lightning', '?')}. Command:"
            f" `{m.get('command')}`.{resumed}")


def awaiting(files: list[str], short: bool = False) -> list[str]:
    """The block's text while results files are missing: which command writes each (``short``: one clause, for a
    part of a block)."""
    from suite import depth_writing

    commands = {"quick": "make bench-quick", "full": "make bench"}
    by_command: dict[str, list[str]] = {}
    for f in files:
        by_command.setdefault(commands.get(depth_writing(f), "its benchmark script"), []).append(f)
    parts = [f"`{cmd}` ({', '.join(f'`benchmarks/results/{f}`' for f in names)})" for cmd, names in by_command.items()]
    if short:
        return [f"(Further figures awaiting {' and '.join(parts)}.)"]
    return [f"*Awaiting {' and '.join(parts)}: these figures are rendered from those results files, which are not"
            " committed yet. Until then nothing here is presented as measured.*"]


def _x(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else f"{v:{fmt}}x"


def _plain(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else f"{v:{fmt}}"


def _range(values: list[float], fmt: str = ".2f") -> str:
    return span(values, fmt) if values else "-"


# ---------------------------------------------------------------------------------------------------------------------
# docs/benchmarks.md


def rule(results: Results) -> list[str]:
    return [f"**The rule for every \"met\" on this page and in the README: {RULE}** A *repeat* is one launch of each"
            " variant in a run that alternates their order (ABBA); a ratio is reported as the pooled medians' ratio"
            " with the range of the per-repeat ratios. Figures without repeats (compression ratios, which the same"
            " input always gives) are judged on their one value; codec speeds on the timed calls."]


def codec(results: Results) -> list[str]:
    import codec_bench

    data = results.get("codec_bench.json")
    return [source_line("codec_bench.json", data, results.shown), "", *codec_bench.markdown(data)]


def _codec_rows(data: dict[str, Any], payload: str) -> dict[tuple[str, Any], dict[str, Any]]:
    return {(r["method"], r["eps"]): r for r in data["results"] if r["payload"] == payload}


def dlrm_v2_codec(results: Results) -> list[str]:
    data = results.get("codec_bench.json")
    lines = [source_line("codec_bench.json", data, results.shown), "",
             "| payload | method | eps | ratio | err/eb | enc 1t GB/s | dec 1t GB/s | modes |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    found = False
    for r in data["results"]:
        if not r["payload"].startswith("dlrm_v2") or r["method"].startswith("memcpy"):
            continue
        found = True
        modes = " ".join(f"{k}:{v}" for k, v in r.get("modes", {}).items())
        err = "-" if r.get("max_err_over_eb") is None else f"{r['max_err_over_eb']:.3f}"
        enc = "-" if r.get("enc_gbps_1t") is None else f"{r['enc_gbps_1t']:.2f}"
        dec = "-" if r.get("dec_gbps_1t") is None else f"{r['dec_gbps_1t']:.2f}"
        lines.append(f"| {r['payload']} | {r['method']} | {r['eps'] if r['eps'] is not None else '-'} |"
                     f" {r['ratio']:.2f} | {err} | {enc} | {dec} | {modes} |")
    if not found:
        return [source_line("codec_bench.json", data, results.shown), "",
                "This run had no DLRM v2 payloads (`--no-dlrm-v2`)."]
    targets = [t for t in data.get("targets", []) if t["payload"].startswith("dlrm_v2") and t["eps"] == 0.03
               and "GB/s" not in t["target"]]
    lines += ["", "Issue 14's codec targets at eps 0.03:"]
    lines += [f"- {t['payload']}: {t['target']}: {verdict_text(t)}" for t in targets]
    return lines


def _e2e_rows(results: Results, *names: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                        list[dict[str, Any]], list[str]]:
    rows, targets, errors, sources = [], [], [], []
    for name in names:
        data = results.get(name)
        if data is None:
            continue
        rows += data["results"]
        targets += data.get("targets", [])
        errors += data.get("errors", [])
        sources.append(name)
    return rows, targets, errors, sources


def _ceiling_lines(rows: list[dict[str, Any]]) -> list[str]:
    from e2e_bandwidth import VARIANTS, paired

    lines = []
    for r in rows:
        source = VARIANTS.get(r["variant"]).ceiling_of if r["variant"] in VARIANTS else None
        found = paired(rows, r["rate"], source, r["variant"]) if source else None
        if found:
            pooled, reps = found
            dlac = _pick(rows, r["rate"], source)
            lines.append(f"- {r['rate']}: {VARIANTS[source].label} runs at {pooled:.2f} of its ceiling's speed"
                         f" (per repeat {_range(reps)}); per step forward / backward the ceiling sent"
                         f" {r['fwd_sent_bytes_per_step'] / 2**20:.3f} / {r['bwd_sent_bytes_per_step'] / 2**20:.3f}"
                         f" MiB, DLAC {dlac['fwd_sent_bytes_per_step'] / 2**20:.3f} /"
                         f" {dlac['bwd_sent_bytes_per_step'] / 2**20:.3f} MiB.")
    return lines


def _e2e_body(results: Results, names: tuple[str, ...]) -> list[str]:
    from e2e_bandwidth import table

    rows, targets, errors, sources = _e2e_rows(results, *names)
    lines = []
    for name in sources:
        data = results.get(name)
        cfg = data["config"]
        lines += [source_line(name, data, results.shown), "",
                  f"Batch {cfg['batch_size']} per rank, {cfg['world_size']} gloo ranks (one thread each), model"
                  f" `{cfg.get('model', 'dlrm')}`; {cfg['repeats']} repeat(s) of every variant in"
                  f" {cfg.get('order', 'round-robin')} order, {cfg['steps']} timed steps after {cfg['warmup']} warm-up"
                  " steps per launch; median over the pooled steps (per step, the slower rank), ranges over the"
                  " launches. Bytes are per rank and step, to other ranks.", ""]
    lines += [*table(rows), ""]
    lines += _ceiling_lines(rows)
    if targets:
        lines += ["", "Targets (the rule above):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    if errors:
        lines += ["", "**Benchmark errors in this run** (its ceiling figures are not results):", ""]
        lines += [f"- {e['message']}" for e in errors]
    return lines


def e2e(results: Results) -> list[str]:
    return _e2e_body(results, ("e2e_throttled.json", "e2e_unthrottled.json"))


def e2e_dlrm_v2(results: Results) -> list[str]:
    return _e2e_body(results, ("e2e_dlrm_v2.json",))


def scaling_validation(results: Results) -> list[str]:
    import scaling_model

    data = results.get("scaling_model.json")
    res = data["results"]
    checked = res["validation"]
    lines = [source_line("scaling_model.json", data, results.shown), "",
             f"TorchRec's INT8/FP16 cast rate timed in the same run: **{res['cast_gb_s']:.2f} GB/s** (one thread);"
             f" dense parameters {res['dense_params']:,}."]
    for source in dict.fromkeys(r["source"] for r in checked):
        rows = [r for r in checked if r["source"] == source]
        errors = [abs(r["error"]) for r in rows]
        within = sum(1 for e in errors if e <= 0.15)
        lines += ["", f"Calibrated from and predicting `{results.shown}/{source}`: |error| median"
                  f" {100 * statistics.median(errors):.0f}%, max {100 * max(errors):.0f}%; {within} of {len(errors)}"
                  " predictions within the 15% target.", "", *scaling_model._validation_table(rows)]
    return lines


def scaling_projection(results: Results) -> list[str]:
    import scaling_model

    data = results.get("scaling_model.json")
    cfg = data["config"]
    codecs = " or ".join(f"{g:g} GB/s" for g in cfg["gpu_codec_gbps"])
    return [source_line("scaling_model.json", data, results.shown), "",
            f"The inputs no measurement here supports, stated as assumptions: **{cfg['gpu_compute_ms']:g} ms of compute"
            f" per step on one GPU**, **TorchRec's INT8/FP16 casts at {cfg['gpu_cast_gbps']:g} GB/s**, and the **GPU"
            f" DLAC codec at {codecs}** (encode = decode, gradients alike).", "",
            *scaling_model._projection_table(data["results"]["projection"])]


def adaptive(results: Results) -> list[str]:
    import adaptive_accuracy

    names = [f for f in ADAPTIVE_FILES if results.get(f) is not None]
    rows, sources, machine = adaptive_accuracy.load_rows([results.directory / f for f in names])
    lines = []
    for f in names:
        lines += [source_line(f, results.get(f), results.shown), ""]
    return lines + adaptive_accuracy.markdown_lines(rows, sources, machine) + ["", *adaptive_targets(rows)]


def adaptive_targets(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 16's targets per dataset and DLAC variant, judged by the rule with the seeds as the repeats: the
    AUROC no more than 0.002 below the uncompressed run of the same seed, and fewer forward bytes than the constant
    eps = 0.01 run of the same seed."""
    base = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "uncompressed"}
    const = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "constant 0.01"}
    lines = ["Targets (the rule at the top; the seeds are the repeats):", ""]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for variant in ("DLAC default", "DLAC gradient", "DLAC homogenization", "DLAC sensitivity",
                        "DLAC both directions"):
            runs = [r for r in rows if r["dataset"] == dataset and r["variant"] == variant
                    and (dataset, r.get("seed", 0)) in base and (dataset, r.get("seed", 0)) in const]
            if not runs:
                continue
            deltas = [r["val_auroc"] - base[(dataset, r.get("seed", 0))]["val_auroc"] for r in runs]
            vs = [(r["fwd_sent_bytes"] / r["steps"]) / (c["fwd_sent_bytes"] / c["steps"])
                  for r in runs for c in [const[(dataset, r.get("seed", 0))]]]
            auroc = judge("AUROC within 0.002 of uncompressed", statistics.median(deltas), deltas, -0.002)
            fewer = judge("fewer forward bytes than constant 0.01", statistics.median(vs), vs, 1.0, at_least=False)
            lines.append(f"- {dataset}, {variant}: AUROC difference >= -0.002: {verdict_text(auroc, '+.4f')};"
                         f" forward bytes / constant 0.01's < 1: {verdict_text(fewer)}")
    return lines if len(lines) > 2 else []


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
        precision = _plain(d["precision"]) if flagged else "- (none flagged)"
        lines.append(f"| {label.format(mode=default_described(data))} | {precision} | {_plain(d['recall'])} |"
                     f" {_plain(d['robust_loose_share'], '.0%')} |"
                     f" {d['auroc_delta']:+.4f} ({d['auroc_delta_sd']:.4f}) |"
                     f" {_x(d['bytes_vs_all_tight'])} | {share} |")
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
    from calibration_bench import trace_summary

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


def readme_calibration(results: Results) -> list[str]:
    name = "calibration_bench.json"
    data = results.get(name)
    from calibration_bench import default_rule

    d, seeds = data["default"], len(data["per_seed"])
    then, now = default_described(data), default_rule()
    who = "`DLACCallback()`" if then == now else \
        f"`DLACCallback()` as it was when this ran ({then}; it is now the {now}, docs/adaptive.md)"
    text = (f"On a benchmark where every table has the same size and id distribution and only the label's dependence"
            f" differs (`benchmarks/calibration_bench.py`, {seeds} seed(s)), {who} kept the sensitive tables tight"
            f" or base with"
            f" precision {d['precision']:.2f} and recall {d['recall']:.2f}, put {d['robust_loose_share']:.0%} of the"
            f" others loose, and ended {d['auroc_delta']:+.4f} AUROC from the uncompressed run (all tables loose:"
            f" {data['all_loose']['auroc_delta']:+.4f}) at {d['bytes_vs_all_tight']:.2f}x the bytes of all tables"
            f" tight, calibration taking {d['calibration_share']:.1%} of the run (docs/adaptive.md).")
    return [text, "", source_line(name, data, results.shown)]


def adaptive_dlrm_v2(results: Results) -> list[str]:
    import adaptive_accuracy

    name = "adaptive_accuracy_dlrm_v2.json"
    rows, sources, machine = adaptive_accuracy.load_rows([results.directory / name])
    return [source_line(name, results.get(name), results.shown), "",
            *adaptive_accuracy._seed_table(adaptive_accuracy._over_seeds(rows)), "",
            *adaptive_accuracy._table(rows)]


def suite_duration(results: Results) -> list[str]:
    """How long the last ``make bench-quick`` took, step by step, from its own record."""
    d = results.get("suite_quick.json")
    record = d.get("results", d)  # files from before the suite wrote metadata keep the record at the top
    steps = record["steps"]
    slowest = sorted(steps, key=lambda st: -st["seconds"])[:3]
    failed = [st["output"] for st in steps if st["returncode"]]
    return [source_line("suite_quick.json", d, results.shown), "",
            f"The last `make bench-quick` took **{record['seconds'] / 60:.1f} minutes** for {len(steps)} steps"
            + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else "") + "; the longest: "
            + ", ".join(f"`{st['output']}` {st['seconds'] / 60:.1f} min" for st in slowest) + "."]


def data(results: Results) -> list[str]:
    import data_bench

    d = results.get("data_bench.json")
    cfg = d["config"]
    imported = [r["baseline_rss_mib"] for r in d["results"] if "baseline_rss_mib" in r]
    libraries = (f"; peak RSS includes the {min(imported):.0f}-{max(imported):.0f} MiB a process holds after importing"
                 " its libraries, before converting" if imported else "")
    return [source_line("data_bench.json", d, results.shown), "",
            f"Input: {cfg['source']}. Each conversion in its own process (wall time including the line count, the"
            f" dense log pass and fsync{libraries}). The loader reads files still in the page cache from being"
            " written.", "", *data_bench.tables(d["results"])]


# Rows of the full data sets the data path is projected to (docs/data.md): Criteo Kaggle's train.txt and one day of
# the Criteo 1TB click logs (about 180M rows a day: 4.37 billion over 24 days).
KAGGLE_ROWS, ONE_TB_DAY_ROWS = 45_840_617, 180_000_000


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 \
        else f"{seconds / 3600:.1f} h"


def data_projection(results: Results) -> list[str]:
    """What the measured data-path rates mean for the full data sets, from the same results file."""
    d = results.get("data_bench.json")
    pre = {r["name"]: r for r in d["results"] if "name" in r}
    loaders = [r for r in d["results"] if "batches_per_second" in r and not r["mmap_mode"]]
    step = next((r["step_seconds"] for r in d["results"] if "step_seconds" in r), None)
    lines = [source_line("data_bench.json", d, results.shown), "",
             "| what | measured | so for a full data set |", "|---|---|---|"]
    for name, r in pre.items():
        lines.append(f"| {name} | {r['rate'] / 1e3:,.0f}k rows/s, {r['vs_torchrec']:.1f}x TorchRec's converter in the"
                     f" same run; peak RSS {r['maxrss_mib']:.0f} MiB | Kaggle's {KAGGLE_ROWS / 1e6:.1f}M rows in"
                     f" {_duration(KAGGLE_ROWS / r['rate'])}; a 1TB day ({ONE_TB_DAY_ROWS / 1e6:.0f}M rows) in"
                     f" {_duration(ONE_TB_DAY_ROWS / r['rate'])} |")
    if loaders:
        rates = [r["batches_per_second"] for r in loaders]
        batch = d["config"]["batch_size"]
        vs = f" ({min(rates) * step:.0f}-{max(rates) * step:.0f}x the demo model's training step)" if step else ""
        lines.append(f"| `CriteoBinaryDataModule`, per rank, batch {batch}, one thread | {min(rates):,.0f}-"
                     f"{max(rates):,.0f} batches/s{vs} |"
                     + (" reading keeps ahead of a training step |" if step and min(rates) * step > 1 else
                        " reading is slower than a training step here: more DataLoader workers |"))
    return lines


def checkpoint(results: Results) -> list[str]:
    import checkpoint_bench

    d = results.get("checkpoint_bench.json")
    return [source_line("checkpoint_bench.json", d, results.shown), "", *checkpoint_bench.tables(d["results"])]


# ---------------------------------------------------------------------------------------------------------------------
# docs/multinode.md


def multinode_restart(results: Results) -> list[str]:
    import checkpoint_bench

    d = results.get("checkpoint_bench.json")
    return [source_line("checkpoint_bench.json", d, results.shown) + " Checkpoints on local disk; the load average"
            " says how busy the machine was (a loaded machine's times are well above an idle node's).", "",
            *checkpoint_bench.multinode_lines(d["results"])]


# An example job's mean time between failures of the whole job, for the checkpoint interval (an assumption, stated as
# one: a rank lost every 4 hours).
EXAMPLE_MTBF_S = 4 * 3600


def restart_interval(results: Results) -> list[str]:
    """Young's checkpoint interval for an example job, with the save and restart times measured here."""
    import checkpoint_bench

    d = results.get("checkpoint_bench.json")
    scales = checkpoint_bench._per_scale(d["results"])
    restarts = checkpoint_bench._restarts(d["results"])
    if not scales or not restarts:
        return [source_line("checkpoint_bench.json", d, results.shown), "", "(This run measured no save or restart.)"]
    big = max(scales, key=lambda sc: sc["scale"])
    c = big["save_s"]
    r = statistics.median(x["kill_to_first_step_s"] for x in restarts)
    m = EXAMPLE_MTBF_S
    t = (2 * c * m) ** 0.5
    return [source_line("checkpoint_bench.json", d, results.shown), "",
            f"For example, with the save measured here for the {checkpoint_bench._name(big['scale'])} model,"
            f" `C = {c:.2f} s`, and the restart measured here (kill to the first resumed step), `R = {r:.1f} s`, on a"
            f" job that loses a rank every {m / 3600:.0f} hours (`M = {m:,} s`, an assumption): `T = {t:.0f} s`,"
            f" costing {c / t:.2%} of the time in saves and {t / 2 / m:.2%} in replayed steps, plus `R / M`"
            f" ({r / m:.2%}) for restarts."]


# ---------------------------------------------------------------------------------------------------------------------
# README.md


def readme_codec(results: Results) -> list[str]:
    d = results.get("codec_bench.json")
    crit = _codec_rows(d, "criteo")
    if not crit:
        return ["The codec run in `benchmarks/results/codec_bench.json` had no Criteo payload (the sample file was"
                " missing)."]
    eps = sorted(e for (m, e) in crit if m.startswith("DLAC") and e is not None)
    dlac = [crit[(m, e)] for e in eps for (m, e2) in crit if m.startswith("DLAC") and e2 == e]
    ratios = " / ".join(f"{r['ratio']:.0f}x" for r in dlac)
    held = all(r["max_err_over_eb"] <= 1.0 for r in dlac)
    ent = [r["ratio"] / crit[("dedup + order-0 entropy", r["eps"])]["ratio"] for r in dlac
           if ("dedup + order-0 entropy", r["eps"]) in crit]
    parts = [f"On pooled embeddings of a DLRM trained on the real Criteo sample, the codec compresses **{ratios} at eps"
             f" {' / '.join(f'{e:g}' for e in eps)}** with the bound {'held on every element' if held else 'NOT held'}"]
    others = []
    sz3 = [crit.get(("SZ3 (pysz, ABS)", e)) for e in eps]
    if all(sz3):
        others.append("SZ3 at the same bound: " + " / ".join(f"{r['ratio']:.1f}x" for r in sz3))
    if ("fbgemm INT8 row-wise", None) in crit:
        others.append(f"fbgemm INT8 row-wise: {crit[('fbgemm INT8 row-wise', None)]['ratio']:.1f}x with no bound")
    others.append(f"FP16: {crit[('FP16 cast', None)]['ratio']:.0f}x")
    text = parts[0] + f" ({'; '.join(others)})"
    if ent:
        text += f", within {100 * min(ent):.0f}-{100 * max(ent):.0f}% of the dedup + order-0 entropy figure"
    timed = [r for p in ("zipf", "criteo") for r in _codec_rows(d, p).values()
             if r["method"].startswith("DLAC") and r.get("enc_gbps_1t")]
    if timed:
        enc = [r["enc_gbps_1t"] for r in timed]
        dec = [r["dec_gbps_1t"] for r in timed]
        text += (f". Native single-thread speed (median call, Zipf and Criteo payloads): {_range(enc, '.1f')} GB/s to"
                 f" compress and {_range(dec, '.1f')} GB/s to decompress (targets 1 / 1.5 GB/s)")
    return [text + ".", "", source_line("codec_bench.json", d, results.shown)]


CODEC_PAYLOADS = {"zipf": "Zipf lookups, one 4096x64 chunk", "criteo": "Criteo DLRM pooled embeddings, 26 chunks",
                  "gradient": "their gradients (the backward payload), 26 chunks"}


def codec_summary(results: Results) -> list[str]:
    """The native codec per payload, one thread: the modes it chose, the ratio at each eps and its speed."""
    d = results.get("codec_bench.json")
    lines = [source_line("codec_bench.json", d, results.shown), "",
             "| payload | eps | modes | ratio | native encode GB/s | native decode GB/s |", "|---|---|---|---|---|---|"]
    for payload, label in CODEC_PAYLOADS.items():
        rows = sorted((r for r in _codec_rows(d, payload).values() if r["method"] == "DLAC (native)"),
                      key=lambda r: r["eps"])
        if not rows:
            continue
        modes = ", ".join(sorted({m for r in rows for m in r.get("modes", {})}))
        enc = [r["enc_gbps_1t"] for r in rows if r.get("enc_gbps_1t")]
        dec = [r["dec_gbps_1t"] for r in rows if r.get("dec_gbps_1t")]
        eps = " / ".join(format(r["eps"], "g") for r in rows)
        ratios = " / ".join(format(r["ratio"], ".1f") for r in rows)
        lines.append(f"| {label} | {eps} | {modes} | {ratios} | {_range(enc, '.1f') if enc else '-'} |"
                     f" {_range(dec, '.1f') if dec else '-'} |")
    return lines


def _pick(rows: list[dict[str, Any]], rate: str, variant: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["rate"] == rate and r["variant"] == variant), None)


def _speed(r: dict[str, Any] | None) -> str:
    if r is None or r.get("speedup_vs_fp32") is None:
        return "(not in this run)"
    return f"**{r['speedup_vs_fp32']:.2f}x** (per repeat {_range(r['speedup_vs_fp32_per_repeat'])})"


def readme_e2e(results: Results) -> list[str]:
    from e2e_bandwidth import paired

    rows, targets, errors, sources = _e2e_rows(results, "e2e_throttled.json", "e2e_unthrottled.json")
    cfg = results.get(sources[0])["config"]
    bf16, int8 = _pick(rows, "1gbit", "dlac_bf16"), _pick(rows, "1gbit", "qcomm_int8_fp16")
    both = _pick(rows, "1gbit", "dlac_dlac")
    clauses = []
    if bf16 is not None:
        clauses.append(f"DLAC forward + bf16 backward runs at {_speed(bf16)} the speed of uncompressed FP32 and sends"
                       f" {bf16['fwd_ratio']:.0f}x fewer forward bytes")
    if int8 is not None:
        clauses.append(f"TorchRec's INT8/FP16 qcomm at {_speed(int8)}")
    if both is not None:
        clauses.append(f"DLAC in both directions at {_speed(both)} the speed of FP32")
    text = (f"End to end ({cfg['world_size']} ranks, batch {cfg['batch_size']} each, loopback throttled to 1 Gbit/s,"
            f" {cfg['repeats']} launches per variant in ABBA order; ratios are pooled medians with the per-repeat"
            f" range): {'; '.join(clauses)}")
    ceiling = paired(rows, "1gbit", "dlac_dlac", "ceiling_dlac_dlac")
    if ceiling:
        text += (f", {ceiling[0]:.2f} of its like-for-like ceiling (per repeat {_range(ceiling[1])}; the null codec"
                 " in the same exchange, sending DLAC's bytes)")
    auto, fixed = _pick(rows, "unthrottled", "dlac_auto"), _pick(rows, "unthrottled", "dlac_bf16")
    if auto is not None:
        text += (f". On a fast link (unthrottled), `DLACStrategy(compress=\"auto\")` runs at {_speed(auto)} the speed"
                 f" of FP32 with {auto.get('uncompressed_share', 0):.0%} of its steps uncompressed")
        if fixed is not None:
            text += f", where fixed compression (DLAC + bf16) runs at {_speed(fixed)}"
    lines = [text + ".", ""]
    if targets:
        lines += ["Targets (by the rule of docs/benchmarks.md):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
        lines.append("")
    if errors:
        lines += ["**Benchmark errors in this run:** " + " ".join(e["message"] + "." for e in errors), ""]
    lines += [" ".join(source_line(n, results.get(n), results.shown) for n in sources)]
    return lines


def readme_adaptive(results: Results) -> list[str]:
    """The default policy on the Criteo sample against every baseline of the same run (uncompressed, a constant
    0.01, every table loose and TorchRec's INT8/FP16), with its 0.002 AUROC target judged by the rule."""
    import adaptive_accuracy

    name = "adaptive_accuracy_criteo_1epoch.json"
    rows, _, _ = adaptive_accuracy.load_rows([results.directory / name])
    rows = [r for r in rows if r["dataset"] == "criteo"]
    summary = {s["variant"]: s for s in adaptive_accuracy._over_seeds(rows)}
    dlac = summary["DLAC default"]
    base = {r.get("seed", 0): r["val_auroc"] for r in rows if r["variant"] == "uncompressed"}
    deltas = [r["val_auroc"] - base[r.get("seed", 0)] for r in rows
              if r["variant"] == "DLAC default" and r.get("seed", 0) in base]
    target = judge("AUROC within 0.002 of uncompressed", statistics.median(deltas), deltas, -0.002)

    def point(variant: str, label: str) -> str | None:
        s = summary.get(variant)
        if s is None:
            return None
        ratio = f", {s['fwd_ratio_mean']:.1f}x fewer forward bytes than fp32" if s.get("fwd_ratio_mean") else ""
        return f"{label} {s['delta_mean']:+.4f} (sd {s['delta_sd']:.4f}{ratio})"

    others = [p for p in (point("constant 0.01", "every table at 0.01"),
                          point("constant 0.05", "every table loose (0.05)"),
                          point("qcomm INT8/FP16", "TorchRec's INT8/FP16 qcomm")) if p]
    text = (f"Adaptive bounds on the Criteo sample (2 ranks, 1 epoch, {len(dlac['seeds'])} seeds; AUROC difference"
            " from the uncompressed run of the same seed, mean and sd over seeds): the default policy"
            f" (`DLACCallback()`) ends {dlac['delta_mean']:+.4f} (sd {dlac['delta_sd']:.4f}) at"
            f" {dlac['fwd_ratio_mean']:.1f}x fewer forward bytes than fp32; in the same run "
            + "; ".join(others) + f". Its target, AUROC within 0.002 of uncompressed: {verdict_text(target, '+.4f')}.")
    return [text, "", source_line(name, results.get(name), results.shown)]


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
    both, qcomm = _pick(rows, rate, "dlac_dlac"), _fastest_qcomm(rows, rate)
    if both is None or both.get("speedup_vs_fp32") is None:
        return []
    base = "-" if qcomm is None else f"{qcomm['label']}: {qcomm['speedup_vs_fp32']:.2f}x"
    judged = "; ".join(_verdict(t) for t in targets if t["rate"] == rate) or "-"
    return [f"| [{what}]({link}) | {both['speedup_vs_fp32']:.2f}x FP32's speed (per repeat"
            f" {_range(both['speedup_vs_fp32_per_repeat'])}) | {base} | {judged} | `{source}` |"]


def readme_headline(results: Results) -> list[str]:
    """The README's headline: one row per claim with DLAC's figure, the strongest baseline measured in the same
    run, the targets judged by the rule, and the results file; each row links to the section of docs/benchmarks.md
    (or docs/adaptive.md) that holds the command, commit and machine."""
    import adaptive_accuracy

    lines = ["| what | DLAC | strongest baseline, same run | target | results file |", "|---|---|---|---|---|"]
    used = []
    codec = results.get("codec_bench.json")
    crit = _codec_rows(codec, "criteo") if codec else {}
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
    rows, targets, _, sources = _e2e_rows(results, "e2e_throttled.json", "e2e_unthrottled.json")
    link = f"{BENCH}#end-to-end-training-under-a-throttled-interconnect"
    for rate, what in (("1gbit", "Training step, 2 ranks at 1 Gbit/s, DLAC both ways"),
                       ("10gbit", "Training step, 2 ranks at 10 Gbit/s, DLAC both ways")):
        lines += _e2e_headline(rows, targets, rate, what, "e2e_throttled.json", link)
    auto = _pick(rows, "unthrottled", "dlac_auto")
    if auto is not None and auto.get("speedup_vs_fp32") is not None:
        qcomm = _fastest_qcomm(rows, "unthrottled")
        judged = "; ".join(_verdict(t) for t in targets if t["rate"] == "unthrottled") or "-"
        lines.append(f"| [Unthrottled link, `compress=\"auto\"`]({link}) | {auto['speedup_vs_fp32']:.2f}x FP32's speed,"
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
             " DLAC both ways", _race_targets),
            ("e2e_qcomm_race_starved.json", "The same with every rank on one core (`--cpu-starved`), DLAC both ways",
             _starved_targets)):
        race = results.get(name)
        if race is not None:
            lines += _e2e_headline(race["results"], judged(race["results"]), "1gbit", what, name, race_link)
            used.append(name)
    topo = results.get("e2e_topology.json")
    if topo is not None:
        trows = topo["results"]
        peer, everyone = _pick(trows, "1gbit", "dlac_dlac_other_nodes"), _pick(trows, "1gbit", "dlac_dlac_all")
        qcomm = _fastest_qcomm(trows, "1gbit")
        if peer is not None and peer.get("speedup_vs_fp32") is not None:
            base = [f"{b['label']}: {b['speedup_vs_fp32']:.2f}x" for b in (everyone, qcomm)
                    if b is not None and b.get("speedup_vs_fp32") is not None]
            judged = "; ".join(_verdict(t) for t in topo.get("targets", []) if t["rate"] == "1gbit") or "-"
            lines.append(f"| [Two emulated nodes x 2 ranks, 1 Gbit/s between them, DLAC to the other node only"
                         f" (`compress_peers`)]({BENCH}#two-nodes-per-peer-compression-on-an-emulated-network-issue-37)"
                         f" | {peer['speedup_vs_fp32']:.2f}x FP32's speed (per repeat"
                         f" {_range(peer['speedup_vs_fp32_per_repeat'])}) | {'; '.join(base) or '-'} | {judged} |"
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
        acc_rows = [r for r in adaptive_accuracy.load_rows([results.directory / name])[0] if r["dataset"] == "criteo"]
        summary = {x["variant"]: x for x in adaptive_accuracy._over_seeds(acc_rows)}
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
        runs.append(f"`{n}` commit {_short(m.get('git_commit'))}, {str(m.get('date'))[:10]}{load}")
    return [*lines, "", f"Runs ({results.shown}/; command, machine and versions in the linked sections): "
            + "; ".join(runs) + "."]


def _readme_family_row(results: Results, used: list[str]) -> list[str]:
    """The README row of the default's judgement on the family's settled evaluation worlds (issue 33 item 2), with
    every table at the loose bound, the cheapest fixed choice, as the baseline of the same runs."""
    from calibration_bench import WORLD_NOISE

    name = "calibration_worlds_settled_relative.json"
    data = results.get(name)
    if data is None or not data.get("per_world"):
        return []
    d, per_world = data["summary"], data["per_world"]
    loose = sum(w["all_loose_vs_all_tight"] >= -WORLD_NOISE for w in per_world)
    judged, verdicts = d["worlds"] >= 20, []
    for key, label, threshold, at_least in WORLD_TARGETS:
        met = _world_target_met(d[key], threshold, at_least)
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
    from adaptive_accuracy import FRONTIER_TARGETS
    from suite import STEPS

    data = results.get(FAMILY_FRONTIER_FILE)
    if data is None or not data.get("per_world"):
        return []
    (step,) = [s for s in STEPS if s.output == FAMILY_FRONTIER_FILE]
    planned, seeds_planned = step.count("--count"), step.count("--train-seeds") or 0
    d, seeds = data["summary"], data.get("config", {}).get("train_seeds", 0)
    short = [f"{d['worlds']} of the {planned} worlds"] if d["worlds"] < planned else []
    short += [f"{seeds} or more of the {seeds_planned} paired seeds per world"] if seeds < seeds_planned else []
    verdicts = [f"{target}: {_plain(d[target], '.0%')} of worlds" + (" so far" if short else "")
                for target in FRONTIER_TARGETS]
    # "Near" is within the paired noise, which on a world whose arms do not settle is of the size of their swings.
    standing = _default_standing(data["per_world"])
    near_only = [world for world, x in standing if x["met"] and not x["on_frontier"]]
    if near_only:
        verdicts[1] += (f", on it in {sum(x['on_frontier'] for _, x in standing)} and near it only within noise on"
                        f" world{'s' if len(near_only) > 1 else ''} {', '.join(map(str, near_only))}")
    counted = f" ({' and '.join(short)} `make bench` runs)" if short else ""
    used.append(FAMILY_FRONTIER_FILE)
    return [f"| [Accuracy-bytes frontier against TorchRec's codecs on the family's evaluation worlds, settled]"
            f"(docs/adaptive.md#the-same-frontier-on-the-family-of-worlds) | `DLACCallback()`: median"
            f" {_plain(d['default_delta_median'], '+.4f')} AUROC at"
            f" {_x(d['default_fwd_bytes_vs_fewest_qcomm_median'])} the forward bytes of the fewest-bytes qcomm point |"
            f" TorchRec's {', '.join(q.removeprefix('qcomm ') for q in d['qcomm_dominated'])} on the same worlds and"
            f" seeds | {'; '.join(verdicts)}{counted} |"
            f" `{FAMILY_FRONTIER_FILE}` |"]


def _dlrm_v2_reading(both: dict[str, Any]) -> str:
    """What the DLRM v2 end-to-end figures say, chosen by them: the exchanges' share of a DLAC step (its measured
    phases) and the speed against FP32."""
    a2a = (both.get("fwd_a2a_ms") or 0.0) + (both.get("bwd_a2a_ms") or 0.0)
    if not a2a:
        return ""
    share = a2a / both["median_step_ms"]
    pays = (both.get("speedup_vs_fp32") or 1.0) >= 1.1
    if share < 0.5 and not pays:
        return (f": the exchanges take {share:.0%} of a DLAC step, the DCN's compute the rest, so the bytes saved"
                " barely show here")
    if pays:
        return f": the exchanges take {share:.0%} of a DLAC step, and the bytes saved show"
    return f": the exchanges still take {share:.0%} of a DLAC step, so the codec's own time is what holds it back"


def readme_dlrm_v2(results: Results) -> list[str]:
    import adaptive_accuracy

    d = results.get("codec_bench.json")
    lines = []
    per_id, iid = _codec_rows(d, "dlrm_v2"), _codec_rows(d, "dlrm_v2_iid")
    if per_id and iid:
        eps = sorted(e for (m, e) in per_id if m.startswith("DLAC"))

        def ratios(rows: dict) -> str:
            return " / ".join(f"{rows[(m, e)]['ratio']:.0f}x" for e in eps for (m, e2) in rows
                              if m.startswith("DLAC") and e2 == e)

        int8 = per_id.get(("fbgemm INT8 row-wise", None))
        lines.append(
            "DLRM v2 (MLPerf's DLRM-DCNv2: DCN cross layers, dim 128, multi-hot features with MLPerf's pooling"
            " factors): on the multi-hot pooled embeddings of a trained `DLRM_DCN` the codec compresses"
            f" **{ratios(per_id)} at eps {' / '.join(f'{e:g}' for e in eps)}** when bags are a function of the id (as"
            f" MLPerf materialises them), and {ratios(iid)} when every id of a bag is drawn independently"
            + (f"; fbgemm INT8 row-wise is {int8['ratio']:.1f}x" if int8 else "") + ".")
    acc = results.get("adaptive_accuracy_dlrm_v2.json")
    if acc is not None:
        rows, _, _ = adaptive_accuracy.load_rows([results.directory / "adaptive_accuracy_dlrm_v2.json"])
        s = {x["variant"]: x for x in adaptive_accuracy._over_seeds(rows)}.get("DLAC homogenization")
        if s:
            lines.append(f"Trained through DLACStrategy ({len(s['seeds'])} seeds, {s['steps']} steps), the dual-level"
                         f" policy ends {s['delta_mean']:+.4f} AUROC from uncompressed on average (sd"
                         f" {s['delta_sd']:.4f}) with {s['fwd_ratio_mean']:.1f}x fewer forward bytes.")
    else:
        lines += awaiting(["adaptive_accuracy_dlrm_v2.json"], short=True)
    e2e_v2 = results.get("e2e_dlrm_v2.json")
    if e2e_v2 is not None:
        fp32 = _pick(e2e_v2["results"], "1gbit", "fp32")
        both = _pick(e2e_v2["results"], "1gbit", "dlac_dlac")
        if fp32 and both:
            lines.append(f"End to end at 1 Gbit/s on these CPUs a step takes {fp32['median_step_ms']:.0f} ms"
                         f" uncompressed and {both['median_step_ms']:.0f} ms with DLAC both ways"
                         f" ({_speed(both)}){_dlrm_v2_reading(both)}.")
    else:
        lines += awaiting(["e2e_dlrm_v2.json"], short=True)
    used = [n for n in ("codec_bench.json", "adaptive_accuracy_dlrm_v2.json", "e2e_dlrm_v2.json")
            if results.get(n) is not None]
    return [" ".join(lines), "", " ".join(source_line(n, results.get(n), results.shown) for n in used)]


# ---------------------------------------------------------------------------------------------------------------------
# docs/strategy.md


def pipeline(results: Results) -> list[str]:
    """The sparse-dist pipeline against unpipelined training (issue 29): each pipelined variant beside its twin
    (separate launches) with the phases that explain it and the target, then the same within one launch."""
    from e2e_pipeline import pipeline_lines, pipeline_table

    data = results.get("e2e_pipeline.json")
    cfg = data["config"]
    rows = data["results"]
    lines = [source_line("e2e_pipeline.json", data, results.shown), "",
             f"Batch {cfg['batch_size']} per rank, {cfg['world_size']} gloo ranks, model `{cfg.get('model', 'dlrm')}`;"
             f" every variant its own launch, {cfg['repeats']} repeat(s) in {cfg.get('order', 'round-robin')} order,"
             f" {cfg['steps']} timed steps after {cfg['warmup']} warm-up steps per launch. Steps: median over the"
             " pooled steps (per step, the slower rank); speed: the unpipelined step over the pipelined one (above 1"
             " the pipeline pays), per-repeat range in brackets; phases per step, mean over ranks.", "",
             *(pipeline_table(rows) or ["This run had no pipelined variant beside its unpipelined twin."])]
    targets = [t for t in data.get("targets", []) if "pipelined" in t["variant"]]
    if targets:
        lines += ["", "Target (by the rule of docs/benchmarks.md):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    alternate = results.get("e2e_pipeline_alternate.json")
    if alternate is None:
        return [*lines, "", *awaiting(["e2e_pipeline_alternate.json"], short=True)]
    acfg = alternate["config"]
    return [*lines, "", source_line("e2e_pipeline_alternate.json", alternate, results.shown), "",
            f"Within one launch ({acfg['repeats']} launches per variant, batch {acfg['batch_size']}, {acfg['warmup']}"
            f" warm-up and {acfg['steps']} timed steps in blocks unpipelined and pipelined in turn): the steps whose"
            " ids were sent during the step before against the unpipelined steps of the same launch, and each kind's"
            " phases per step:", "", *pipeline_lines(alternate["results"])]


# The two `dlac estimate` runs of docs/strategy.md's pipeline model: a GPU cluster, and a machine like this one.
PIPELINE_MODEL_CLUSTER = ("--world-sizes 8,64,512 --gbit 100 --latency-us 5 --compute-ms 5 --encode-gbps 100"
                          " --decode-gbps 100 --cast-gbps 500 --forward-ratio 29 --backward-ratio 9 --ids-per-sample 26"
                          " --pipeline sparse_dist")
PIPELINE_MODEL_HERE = ("--shared --world-sizes 2 --gbit 1 --compute-ms 700 --encode-gbps 100 --decode-gbps 100"
                       " --cast-gbps 500 --forward-ratio 29 --backward-ratio 9 --ids-per-sample 26"
                       " --pipeline sparse_dist")


def _estimate(args: str) -> list[str]:
    """What `dlac estimate ARGS` prints (its rank-zero log lines)."""
    import logging

    from lightning_dlac.commands.estimate import main as estimate

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.extend(record.getMessage().splitlines())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        estimate(args.split())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    return lines


def pipeline_model(results: Results) -> list[str]:
    """The model's outputs for the pipeline (not measurements), computed by `dlac estimate` itself."""
    cluster, here = _estimate(PIPELINE_MODEL_CLUSTER), _estimate(PIPELINE_MODEL_HERE)
    gains = [float(x) for line in here if "pipelined over unpipelined step:" in line
             for x in re.findall(r"([\d.]+)x", line.split("pipelined over unpipelined step:", 1)[1])]
    verdict = ("beside that much compute, the pipeline cannot reach the 1.1x target however much of the input dist it"
               " hides" if gains and max(gains) < 1.1 else "the model says the pipeline can pay even here")
    return ["The model's outputs for the inputs given (computed by `dlac estimate` when this page is rendered; not"
            " measurements). A GPU cluster, 100 Gbit/s per GPU, 5 us per message, 5 ms of compute, the DLRM's"
            " compression ratios assumed:", "", f"    dlac estimate {PIPELINE_MODEL_CLUSTER}", "", cluster[0], "",
            *cluster[1:], "",
            "A machine like this one, one loopback shared by 2 ranks at 1 Gbit/s and a step of the order of a second:",
            "", f"    dlac estimate {PIPELINE_MODEL_HERE}", "", *[line for line in here if line.startswith("- ")], "",
            f"So {verdict}."]


def overlap_default(results: Results) -> list[str]:
    """Why gloo's default is synchronous: the overlapped exchanges against the synchronous ones (the default) at each
    rate, launch for launch, from the pipeline run (which launches both); the sentence follows the figures."""
    from e2e_bandwidth import paired

    data = results.get("e2e_pipeline.json")
    rows, parts, faster = data["results"], [], []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        found = paired(rows, rate, "dlac_dlac_overlap", "dlac_dlac")
        if found is None:
            continue
        pooled, per = found
        parts.append(f"at {rate} the overlapped exchanges ran at **{pooled:.2f}x** (per repeat {span(per)}) the speed"
                     f" of the synchronous ones")
        faster.append(pooled > 1 and sum(v > 1 for v in per) * 3 >= 2 * len(per))
    if not parts:
        return [source_line("e2e_pipeline.json", data, results.shown), "",
                "This run launched no `dlac_dlac_overlap` beside `dlac_dlac`."]
    if not any(faster):
        verdict = ("so on gloo the synchronous exchange stays the default: here the loopback transfer is CPU work on"
                   " the same cores, and launching it early makes it compete with the step's compute.")
    elif all(faster):
        verdict = ("so overlapping paid at every rate of this run: the gloo default (synchronous) should be"
                   " revisited.")
    else:
        verdict = "so neither way wins at every rate of this run; the gloo default (synchronous) stands until one does."
    return [source_line("e2e_pipeline.json", data, results.shown), "",
            "DLAC both directions on 2 gloo ranks, unpipelined: " + "; ".join(parts) + ", " + verdict]


# ---------------------------------------------------------------------------------------------------------------------
# The registry

ADAPTIVE_FILES = ("adaptive_accuracy_synthetic_2000.json", "adaptive_accuracy_planted.json",
                  "adaptive_accuracy_synthetic.json", "adaptive_accuracy_criteo_1epoch.json",
                  "adaptive_accuracy_criteo_2epochs.json")

BLOCKS: dict[str, Block] = {
    "rule": Block((), rule),
    "codec": Block(("codec_bench.json",), codec),
    "dlrm_v2_codec": Block(("codec_bench.json",), dlrm_v2_codec),
    "e2e": Block(("e2e_throttled.json",), e2e, optional=("e2e_unthrottled.json",)),
    "e2e_dlrm_v2": Block(("e2e_dlrm_v2.json",), e2e_dlrm_v2),
    "scaling_validation": Block(("scaling_model.json",), scaling_validation),
    "scaling_projection": Block(("scaling_model.json",), scaling_projection),
    "adaptive_accuracy": Block(("adaptive_accuracy_criteo_1epoch.json",), adaptive, optional=ADAPTIVE_FILES),
    "adaptive_dlrm_v2": Block(("adaptive_accuracy_dlrm_v2.json",), adaptive_dlrm_v2),
    "data": Block(("data_bench.json",), data),
    "checkpoint": Block(("checkpoint_bench.json",), checkpoint),
    "multinode_restart": Block(("checkpoint_bench.json",), multinode_restart),
    "codec_headline": Block(("codec_bench.json",), readme_codec),
    "e2e_summary": Block(("e2e_throttled.json",), readme_e2e, optional=("e2e_unthrottled.json",)),
    "readme_headline": Block(("codec_bench.json", "e2e_throttled.json"), readme_headline,
                             optional=("e2e_unthrottled.json", "e2e_dlrm_v2.json", "e2e_qcomm_race.json",
                                       "e2e_qcomm_race_starved.json", "e2e_topology.json",
                                       "adaptive_frontier_criteo.json", "adaptive_accuracy_criteo_1epoch.json")),
    "adaptive_summary": Block(("adaptive_accuracy_criteo_1epoch.json",), readme_adaptive),
    "calibration_modes": Block(("calibration_bench.json",), calibration_modes,
                               optional=("calibration_bench_quick.json",)),
    "calibration_summary": Block(("calibration_bench.json",), readme_calibration),
    "calibration_trace": Block(("calibration_trace.json",), calibration_trace),
    "dlrm_v2_summary": Block(("codec_bench.json",), readme_dlrm_v2,
                            optional=("adaptive_accuracy_dlrm_v2.json", "e2e_dlrm_v2.json")),
    "pipeline": Block(("e2e_pipeline.json",), pipeline, optional=("e2e_pipeline_alternate.json",)),
    "overlap_default": Block(("e2e_pipeline.json",), overlap_default),
    "pipeline_model": Block((), pipeline_model),
    "suite_duration": Block(("suite_quick.json",), suite_duration),
    "data_projection": Block(("data_bench.json",), data_projection),
    "codec_summary": Block(("codec_bench.json",), codec_summary),
    "restart_interval": Block(("checkpoint_bench.json",), restart_interval),
}


def render_block(name: str, results: Results) -> str:
    """The body of block ``name`` (between its markers) from ``results``."""
    if name not in BLOCKS:
        raise KeyError(f"no renderer for block {name!r}; known: {sorted(BLOCKS)}")
    block = BLOCKS[name]
    missing = [f for f in block.files if results.get(f) is None]
    lines = awaiting(missing + [f for f in block.optional if results.get(f) is None]) if missing \
        else block.render(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def render_text(text: str, results: Results) -> str:
    """``text`` with every block re-rendered."""
    def one(m: re.Match) -> str:
        name = m["name"]
        return f"<!-- BEGIN render:{name} -->\n{render_block(name, results)}<!-- END render:{name} -->"

    return BLOCK.sub(one, text)


def blocks_in(text: str) -> dict[str, str]:
    """Block name -> body of every marked block of ``text``."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def summary(results: Results) -> tuple[list[str], list[str]]:
    """Every judged target and every benchmark error in the results files the blocks used."""
    targets, errors = [], []
    for name in sorted(results.used):
        data = results.get(name)
        judged = data.get("targets") or []
        # calibration_bench.json keeps its thresholds under "targets" (a mapping); its block judges them itself.
        # e2e_topology.json judges dlac estimate's predictions apart from its speed targets (estimate_check).
        for t in [*(judged if isinstance(judged, list) else []), *(data.get("estimate_check") or [])]:
            where = t.get("rate") or f"{t.get('payload')} eps {t.get('eps')}"
            targets.append(f"{name}: {where}: {t['target']}: {'met' if t['met'] else 'NOT met'}")
        for e in data.get("errors", []) or []:
            errors.append(f"{name}: {e['message']}")
    return targets, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=HERE / "results", help="directory of the results files")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the rendered files under this directory instead of in place")
    args = parser.parse_args()
    results = Results(args.results)
    stale = []
    for doc in DOCS:
        path = REPO / doc
        text = path.read_text()
        rendered = render_text(text, results)
        if args.check:
            old, new = blocks_in(text), blocks_in(rendered)
            stale += [f"{doc}: block {n}" for n in old if old[n] != new[n]]
            continue
        target = path if args.out is None else args.out / doc
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(rendered)
        print(f"rendered {len(blocks_in(text))} block(s) of {doc} into {target}")
    targets, errors = summary(results)
    for line in targets:
        print(line)
    for line in errors:
        print(f"BENCHMARK ERROR {line}")
    if stale:
        sys.exit("blocks that differ from the results files (run benchmarks/render.py):\n  " + "\n  ".join(stale))
    if errors and not args.check:
        sys.exit(3)



# =====================================================================================================================
# Issue 34: the exchange phase by phase (exchange_profile.json), every TorchRec codec in the race
# (e2e_qcomm_race.json, e2e_qcomm_race_starved.json) and their codec rows (codec_bench_qcomm.json)

QCOMM_RACE = ("qcomm_int8_fp16", "qcomm_fp8", "qcomm_mx4", "qcomm_mx4_bf16")


# Issue 34's target for each phase of the exchange: within 1.5x of its kernel's own time for the same bytes.
PHASE_TARGET = 1.5
CEILING_TARGET = 0.95  # issue 34: DLAC both directions against its like-for-like ceiling


def exchange_profile(results: Results) -> list[str]:
    """Per backward encoding and direction: each phase's wall and CPU time and page faults, the kernels' own time for
    the same bytes and the phase / kernel ratios."""
    data = results.get("exchange_profile.json")
    lines = [source_line("exchange_profile.json", data, results.shown), ""]
    for backward, s in data["results"].items():
        b = s["bytes"]
        lines += [f"DLAC forward + {backward} backward, per call and rank: forward"
                  f" {b['forward_raw_bytes'] / 2**20:.1f} -> {b['forward_sent_bytes'] / 2**20:.2f} MiB, backward"
                  f" {b['backward_raw_bytes'] / 2**20:.1f} -> {b['backward_sent_bytes'] / 2**20:.2f} MiB.", "",
                  "| direction | phase | wall ms | CPU ms | page faults |", "|---|---|---:|---:|---:|"]
        for direction in ("forward", "backward"):
            d = s[direction]
            for phase, v in d["phases"].items():
                lines.append(f"| {direction} | {phase} | {v['wall_ms']:.2f} | {v['cpu_ms']:.2f} |"
                             f" {v['page_faults']:.0f} |")
            for op, k in d["kernels"].items():
                lines.append(f"| {direction} | *{op} kernel alone* | {k['ms']:.2f} | {k['cpu_ms']:.2f} | - |")
                if "one_address_ms" in k:
                    lines.append(f"| {direction} | *{op} kernel alone, one input tensor replayed* |"
                                 f" {k['one_address_ms']:.2f} | {k['one_address_cpu_ms']:.2f} | - |")
            lines.append(f"| {direction} | **step** | {d['wall_ms']:.2f} | {d['cpu_ms']:.2f} | - |")
        lines.append("")
        for direction in ("forward", "backward"):
            ratios = s[direction]["phase_over_kernel"]["cpu"]
            text = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None)
            phases = {k: v for k, v in ratios.items() if v is not None and k != "direction"}
            met = [k for k, v in phases.items() if v <= PHASE_TARGET]
            missed = [k for k, v in phases.items() if v > PHASE_TARGET]
            verdict = (f"within {PHASE_TARGET}x: {', '.join(met) or 'none'}"
                       + (f"; above it: {', '.join(missed)}" if missed else ""))
            lines.append(f"- {direction}, CPU time over the kernels' own: {text} ({verdict}).")
            encode = s[direction]["kernels"].get("encode", {})
            if "one_address_cpu_ms" in encode and "encode" in ratios:
                replay = encode["one_address_cpu_ms"] / encode["cpu_ms"]
                lines.append(f"- {direction}: the encode kernel replayed on one input tensor took {replay:.2f} of"
                             f" its CPU time on a new tensor each call; over that replay the encode phase would read"
                             f" {ratios['encode'] / replay:.2f}x.")
        lines.append("")
    return lines


def _against_every_qcomm(rows: list[dict[str, Any]], variants: tuple[str, ...], name: str) -> list[dict[str, Any]]:
    """Each of ``variants`` judged at >= 1.0x every qcomm variant that ran at each rate of ``rows`` (launches paired
    by repeat); ``name`` is formatted with ``variant`` and ``q``."""
    from e2e_bandwidth import paired

    judged = []
    for rate in sorted({r["rate"] for r in rows}):
        for variant in variants:
            for q in [q for q in QCOMM_RACE if _pick(rows, rate, q)]:
                found = paired(rows, rate, variant, q)
                if found:
                    judged.append(judge(name.format(variant=variant, q=q), found[0], found[1], 1.0, rate=rate))
    return judged


def _race_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 34's targets of a race at full CPU (e2e_qcomm_race.json) at each of its rates, judged by the rule."""
    from e2e_bandwidth import paired

    targets = []
    for rate in sorted({r["rate"] for r in rows}):
        ran = [q for q in QCOMM_RACE if _pick(rows, rate, q)]
        fastest = min(ran, key=lambda q: _pick(rows, rate, q)["median_step_ms"]) if ran else None
        for variant, reference, threshold, name in (
            ("dlac_dlac", "ceiling_dlac_dlac", CEILING_TARGET, f"DLAC both directions >= {CEILING_TARGET} of its"
             " ceiling"),
            ("dlac_dlac", fastest, 1.15, f"DLAC both directions >= 1.15x the fastest qcomm variant ({fastest})"),
            ("dlac_bf16", "qcomm_int8_fp16", 1.0, "DLAC fwd + BF16 bwd ahead of qcomm INT8/FP16"),
        ):
            found = paired(rows, rate, variant, reference) if reference else None
            if found:
                targets.append(judge(name, found[0], found[1], threshold, rate=rate))
    return targets


def _starved_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _against_every_qcomm(rows, ("dlac_dlac",), "CPU-starved: DLAC both directions ahead of {q}")


def qcomm_race(results: Results) -> list[str]:
    """The race of every TorchRec codec against DLAC, its starved twin, the codecs' own rows and issue 34's targets
    judged by the rule."""
    lines = _e2e_body(results, ("e2e_qcomm_race.json",))
    failed = results.get("e2e_qcomm_race.json").get("failed", [])
    if failed:
        lines += ["", "Could not run here (TorchRec's error):", ""]
        lines += [f"- {f['rate']}: {f['label']}: `{f['error']}`" for f in failed]
    targets = _race_targets(results.get("e2e_qcomm_race.json")["results"])
    fast = results.get("e2e_qcomm_race_10gbit.json")
    if fast is not None:
        lines += ["", "At 10 Gbit/s, against the fastest qcomm variant of the race above:", ""]
        lines += _e2e_body(results, ("e2e_qcomm_race_10gbit.json",))
        targets += _against_every_qcomm(fast["results"], ("dlac_dlac", "dlac_bf16"), "{variant} no slower than {q}")
    starved = results.get("e2e_qcomm_race_starved.json")
    if starved is not None:
        lines += ["", "With `--cpu-starved` (every rank's threads on one core):", ""]
        lines += _e2e_body(results, ("e2e_qcomm_race_starved.json",))
        targets += _starved_targets(starved["results"])
    lines += ["", "Issue 34's targets (the rule above):", ""]
    lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    codecs = results.get("codec_bench_qcomm.json")
    if codecs is not None:
        lines += ["", source_line("codec_bench_qcomm.json", codecs, results.shown), "",
                  "| payload | method | eps | ratio | max error / chunk range | enc GB/s (1 thread) |"
                  " dec GB/s (1 thread) |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in codecs["results"]:
            if r["method"].startswith(("TorchRec", "fbgemm", "DLAC", "FP16")):
                eps = "-" if r["eps"] is None else f"{r['eps']:g}"
                lines.append(f"| {r['payload']} | {r['method']} | {eps} | {r['ratio']:.2f} |"
                             f" {r['max_err_over_range']:.2e} | {r['enc_gbps_1t']:.2f} | {r['dec_gbps_1t']:.2f} |")
    return lines


PIECE_VARIANTS = (("dlac_dlac", "ceiling_dlac_dlac"), ("dlac_dlac_pieces", "ceiling_dlac_dlac_pieces"))


def e2e_pieces(results: Results) -> list[str]:
    """The exchange whole and in 4 pieces, each with its own ceiling: the race table, where each step's exchange
    time goes, and the pieces' speed against the whole exchange (launches paired by repeat)."""
    from e2e_bandwidth import paired

    lines = _e2e_body(results, ("e2e_pieces.json",))
    rows = results.get("e2e_pieces.json")["results"]
    lines += ["", "Per step (medians over the pooled steps, the slower rank), ms: the exchange's phases, and what DLAC"
              " spends beyond its ceiling in them (its codec, and what waits on it):", "",
              "| rate | variant | fwd encode | fwd exchange | fwd decode | bwd exchange | step |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for rate in sorted({r["rate"] for r in rows}):
        for pair in PIECE_VARIANTS:
            for name in pair:
                r = _pick(rows, rate, name)
                if r is not None:
                    lines.append(f"| {rate} | {r['label']} | {r['fwd_encode_ms']:.1f} | {r['fwd_exchange_ms']:.1f} |"
                                 f" {r['fwd_decode_ms']:.1f} | {r['bwd_a2a_ms']:.1f} | {r['median_step_ms']:.0f} |")
    lines.append("")
    # The codec kernels' own time for one step's bytes (the same model and batch: exchange_profile.py), and below, per
    # rate, the time beyond the ceiling that issue 34's target leaves DLAC. Not a bound on the race: the profile is
    # another run, its upstream gradient is random, and the ceiling's own copies are not taken off.
    profile = results.get("exchange_profile.json")
    kernel_ms = None
    if profile is not None and "dlac" in profile["results"]:
        kernels = profile["results"]["dlac"]
        kernel_ms = sum(kernels[d]["kernels"][op]["ms"] for d in ("forward", "backward") for op in ("encode", "decode"))
    for rate in sorted({r["rate"] for r in rows}):
        for variant, ceiling in PIECE_VARIANTS:
            a, c = _pick(rows, rate, variant), _pick(rows, rate, ceiling)
            if a is not None and c is not None:
                fwd = sum(a[k] - c[k] for k in ("fwd_encode_ms", "fwd_exchange_ms", "fwd_decode_ms"))
                lines.append(f"- {rate}: {a['label']} beyond its ceiling: forward {fwd:.1f} ms, backward"
                             f" {a['bwd_a2a_ms'] - c['bwd_a2a_ms']:.1f} ms, step"
                             f" {a['median_step_ms'] - c['median_step_ms']:.0f} ms.")
        ceiling = _pick(rows, rate, "ceiling_dlac_dlac")
        if kernel_ms is not None and ceiling is not None:
            budget = ceiling["median_step_ms"] * (1 / CEILING_TARGET - 1)
            lines.append(f"- {rate}: at {CEILING_TARGET} of this ceiling DLAC both directions may spend"
                         f" {budget:.1f} ms per step beyond it; the codec kernels alone take {kernel_ms:.1f} ms per"
                         f" step and rank for these bytes (encode and decode, both directions, each encode on a new"
                         f" input; exchange_profile.json, one thread, its random upstream gradient)"
                         + (f": {kernel_ms - budget:.1f} ms of them would have to overlap the transfer."
                            if kernel_ms > budget else "."))
        for variant, reference, what in (("dlac_dlac_pieces", "dlac_dlac", "DLAC in 4 pieces against the whole"
                                          " exchange"),
                                         ("ceiling_dlac_dlac_pieces", "ceiling_dlac_dlac", "the null codec in 4"
                                          " pieces against the whole exchange")):
            found = paired(rows, rate, variant, reference)
            if found:
                per = ", ".join(f"{x:.2f}" for x in found[1])
                lines.append(f"- {rate}: {what}: speed {found[0]:.2f}x (per repeat {per}).")
    return lines


def e2e_topology(results: Results) -> list[str]:
    """The two-node run (issue 37): the e2e table, and the bytes each rank sent per link class."""
    from e2e_bandwidth import paired

    rows = results.get("e2e_topology.json")["results"]
    lines = _e2e_body(results, ("e2e_topology.json",))
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
    checks = _estimate_checks(results.get("e2e_topology.json"))
    if checks:
        import topology_estimate

        lines += ["", "`dlac estimate`'s prediction for these launches (issue 37 item 3;"
                  " benchmarks/topology_estimate.py, whose docstring says where each input comes from; target: within"
                  " 15% of the measured step, by the rule):", ""]
        for rate in dict.fromkeys(c["rate"] for c in checks):
            lines += [topology_estimate.inputs_line(next(c for c in checks if c["rate"] == rate)), ""]
        lines += topology_estimate.table(checks)
    return lines


def _estimate_checks(data: dict) -> list[dict] | None:
    """The estimate check of an e2e_topology results file, computed again from its launches and probes by today's
    model (the file's ``estimate_check`` is the model of the run's commit); the recorded one where it has no probe."""
    import topology_estimate

    if not data.get("estimate_check") or not data.get("probes"):
        return data.get("estimate_check")
    return topology_estimate.check(data["results"], data["probes"], data["config"])


def topology_estimate_check(results: Results) -> list[str]:
    """docs/multinode.md: `dlac estimate`'s prediction against the emulated two-node launches (issue 37 item 3)."""
    import topology_estimate

    data = results.get("e2e_topology.json")
    checks = _estimate_checks(data)
    if not checks:
        return [source_line("e2e_topology.json", data, results.shown), "",
                "This run predates the check: `python benchmarks/e2e_topology.py` records it."]
    lines = [source_line("e2e_topology.json", data, results.shown), ""]
    for rate in dict.fromkeys(c["rate"] for c in checks):
        lines += [topology_estimate.inputs_line(next(c for c in checks if c["rate"] == rate)), ""]
    return lines + topology_estimate.table(checks, terms=False)


BLOCKS.update({
    "e2e_topology": Block(("e2e_topology.json",), e2e_topology),
    "topology_estimate": Block(("e2e_topology.json",), topology_estimate_check),
    "exchange_profile": Block(("exchange_profile.json",), exchange_profile),
    "e2e_pieces": Block(("e2e_pieces.json",), e2e_pieces, optional=("exchange_profile.json",)),
    "qcomm_race": Block(("e2e_qcomm_race.json",), qcomm_race,
                        optional=("e2e_qcomm_race_10gbit.json", "e2e_qcomm_race_starved.json",
                                  "codec_bench_qcomm.json")),
})


# ---------------------------------------------------------------------------------------------------------------------
# The family of worlds (issue 33 item 2): docs/adaptive.md's calibration_worlds block. Kept apart, at the end.

WORLD_TARGETS = (  # issue 33's targets on the evaluation worlds: (key, name, threshold, at least)
    ("default_within_0001_of_all_tight", "within 0.001 AUROC of all-tight on >= 90% of worlds", 0.9, True),
    ("recall", "recall of sensitive tables >= 0.9", 0.9, True),
    ("precision", "precision of sensitive tables >= 0.8", 0.8, True),
    ("bytes_vs_all_tight", "median bytes <= 0.8x all-tight", 0.8, False),
)


def _world_target_met(value: float | None, threshold: float, at_least: bool) -> bool:
    """Whether a summary figure of the worlds meets its target of WORLD_TARGETS."""
    return value is not None and (value >= threshold if at_least else value <= threshold)


def _world_labels() -> dict[str, str]:
    """The calibrated variants of a worlds run, in table order, and their labels (as calibration_bench runs them)."""
    from calibration_bench import PREVIOUS_NOISE_BUDGET

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
             + (_settle_rule(cfg) if cfg.get("settle") else f"{cfg.get('steps')} training batches per rank each")
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
                         f" {r['flagged_count']} ({r['true_positives']}) | {_x(r['bytes_vs_all_tight'])} |")
    floored = "within_floor_of_all_tight" in data["summary"]  # runs before paired training seeds have no floor
    lines += ["", "| summary | worlds | within 0.001 of all-tight | worse than all-loose |"
              + (" within the floor of all-tight | worse than all-loose beyond the floor |" if floored else "")
              + " recall | precision | median bytes vs all-tight |",
              "|---|---|---|---|" + ("---|---|" if floored else "") + "---|---|---|"]
    for variant in judged:
        d = data["summary" if variant == "default" else f"summary_{variant}"]
        label = labels[variant].format(mode=default_described(data))
        lines.append(f"| {label} | {d['worlds']} | {_plain(d['default_within_0001_of_all_tight'], '.0%')} |"
                     f" {d['worse_than_all_loose']} |"
                     + (f" {_plain(d['within_floor_of_all_tight'], '.0%')} |"
                        f" {d['worse_than_all_loose_beyond_floor']} |" if floored else "")
                     + f" {_plain(d['recall'])} | {_plain(d['precision'])} | {_x(d['bytes_vs_all_tight'])} |")
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
                  + ", ".join(f"{w['world']} {_plain(f, '.4f')}" for w, f in zip(data["per_world"], floors)) + "."]
    if cfg.get("settle"):
        fixed = [w["noise_floor_at_fixed_steps"]["floor"] for w in data["per_world"]]
        unsettled = [f"{w['world']} {u}" for w in data["per_world"] for u in w["unsettled"]]
        lines += ["", f"The same runs read at {cfg['fixed_steps']} batches (the fixed protocol) had the floors "
                  + ", ".join(f"{w['world']} {_plain(f, '.4f')}" for w, f in zip(data["per_world"], fixed))
                  + "; arms that reached the cap unsettled (world, arm:seed): " + (", ".join(unsettled) or "none")
                  + "."]
    if cfg.get("worlds") != "eval":
        return lines
    d = data["summary"]
    lines += ["", f"Targets of the default (issue 33; judged on at least 20 evaluation worlds, here {d['worlds']}):",
              ""]
    for key, label, threshold, at_least in WORLD_TARGETS:
        v = d[key]
        met = _world_target_met(v, threshold, at_least)
        shown = "-" if v is None else (f"{v:.0%}" if key.startswith("default_") else f"{v:.2f}")
        judged = "met" if met else "**not met**"
        lines.append(f"- {label}: {judged} on these worlds ({shown})" + ("" if d["worlds"] >= 20 else
                                                                         "; too few worlds to count"))
    return lines


def _settle_rule(cfg: dict[str, Any]) -> str:
    """How a ``--settle`` run trained its arms, from its configuration."""
    return (f"every arm trained until its validation AUROC settled (validated every {cfg['val_every']} batches,"
            f" stopped at the first validation gaining less than {cfg['settle_delta']:g} AUROC; at most"
            f" {cfg['steps']} batches per rank)")


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


BLOCKS["calibration_worlds"] = Block(("calibration_worlds_quick.json",),
                                     lambda results: calibration_worlds(results) + _calibration_fit_line(results),
                                     optional=("calibration_worlds_fit.json",))
def calibration_perturb(results: Results) -> list[str]:
    """One training seed of one world at all-tight's bound and one percent either side: how far the trajectory
    alone moves the AUROC, beside the worlds' floors."""
    from calibration_bench import WORLD_NOISE

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


BLOCKS["calibration_perturb"] = Block(("calibration_perturb.json",), calibration_perturb)


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


BLOCKS["calibration_curves"] = Block(("calibration_curves.json",), calibration_curves)


def calibration_settle(results: Results) -> list[str]:
    """The settle protocol on development worlds: every arm trained until its AUROC settles, its paired differences
    and floor beside those the same runs had at the fixed protocol's length."""
    name = "calibration_settle_dev.json"
    data = results.get(name)
    cfg = data["config"]
    fixed = cfg["fixed_steps"]
    lines = [source_line(name, data, results.shown), "",
             f"{cfg['worlds']} worlds {cfg['seeds']}, {cfg['train_seeds']} paired training seeds; {_settle_rule(cfg)}.",
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


BLOCKS["calibration_settle"] = Block(("calibration_settle_dev.json",), calibration_settle)
# The evaluation worlds with every arm trained until it settles (--settle), the default among the arms.
BLOCKS["calibration_worlds_settled"] = Block(("calibration_worlds_settled.json",),
                                             lambda results: calibration_worlds(results,
                                                                                "calibration_worlds_settled.json"))


# The evaluation worlds under the full protocol (1000 batches, 5 paired training seeds): what judges the accuracy
# targets the quick run's floors cannot.
BLOCKS["calibration_worlds_full"] = Block(("calibration_worlds.json",),
                                          lambda results: calibration_worlds(results, "calibration_worlds.json"))


CAPPED = "†"  # a settled arm that reached the cap (SETTLE_MAX) without settling


def calibration_ablation(results: Results, name: str = "calibration_ablation.json") -> list[str]:
    """The per-table ablation of one world (issue 33 item 2): what a loose bound on each table alone costs against
    all-tight, the planted roles against it, and the default's flags against both where it ran beside the arms."""
    from calibration_bench import ABLATE_PREFIX, flagged_tables

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
             f" {_settle_rule(cfg) if cfg.get('settle') else str(cfg['steps']) + ' training batches per rank'},"
             f" {ab['train_seeds']} paired training seeds; every table at"
             f" 0.01 except the one ablated, at 0.05. All tables loose cost {ab['all_loose_cost']:+.4f} AUROC; the"
             f" world's floor (two standard errors of a mean of paired differences, pooled over the arms) is"
             f" {_plain(ab['floor'], '.4f')}.", "",
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
                  f" {_x(d['bytes_vs_all_tight'])} its bytes; recall {_plain(d['ablation']['recall'])} and precision"
                  f" {_plain(d['ablation']['precision'])} against the ablation's sensitive tables, recall"
                  f" {_plain(d['planted']['recall'])} and precision {_plain(d['planted']['precision'])} against the"
                  " planted ones (pooled over the seeds)."]
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
        cells = [f"{_plain(v['recall'])}, {_plain(v['precision'])}, {_x(v['bytes_vs_tight'])}"
                 for v in p["budgets"].values()]
        lines.append(f"| {p['batch']:g} | {_plain(p['auc_median'])} ({_plain(p['auc_min'])}) |"
                     f" {p['others_sum_median']:.2g}, {p['others_sum_p90']:.2g} | " + " | ".join(cells) + " |")
    return lines


BLOCKS["calibration_drift"] = Block(("calibration_drift_dev.json",), calibration_drift)


# The development worlds the default mode was chosen on (issue 33: the noise mode against the gradient mode).
BLOCKS["calibration_worlds_dev"] = Block(("calibration_worlds_dev.json",),
                                         lambda results: calibration_worlds(results, "calibration_worlds_dev.json"))
# The same development worlds run again here with the relative, recalibrating default (and the previous one).
BLOCKS["calibration_worlds_dev_relative"] = Block(
    ("calibration_worlds_dev_relative.json",),
    lambda results: calibration_worlds(results, "calibration_worlds_dev_relative.json"))
# The evaluation worlds under --settle with the relative, recalibrating default, against the settled run's baselines.
BLOCKS["calibration_worlds_settled_relative"] = Block(
    ("calibration_worlds_settled_relative.json",),
    lambda results: calibration_worlds(results, "calibration_worlds_settled_relative.json"))
BLOCKS["calibration_ablation"] = Block(("calibration_ablation.json",), calibration_ablation,
                                       optional=("calibration_worlds_dev.json",))
# The same ablation on the first evaluation world, judged after the default's constants were fixed.
ABLATION_EVAL_FILE = "calibration_ablation_eval.json"
BLOCKS["calibration_ablation_eval"] = Block((ABLATION_EVAL_FILE,),
                                            lambda results: calibration_ablation(results, ABLATION_EVAL_FILE))
# And on an evaluation world whose runs settle (1000's ablation measured its plateau): suite.py says why 1014.
BLOCKS["calibration_ablation_eval_1014"] = Block(
    ("calibration_ablation_eval_1014.json",),
    lambda results: calibration_ablation(results, "calibration_ablation_eval_1014.json"))


# ---------------------------------------------------------------------------------------------------------------------
# The accuracy-bytes frontier against TorchRec's codecs on the Criteo sample (issue 33 item 3): docs/adaptive.md's
# adaptive_frontier block. Kept apart, at the end.

FRONTIER_FILE = "adaptive_frontier_criteo.json"


def adaptive_frontier(results: Results) -> list[str]:
    """Per variant the AUROC difference from the uncompressed run (over seeds) and the forward and total bytes per
    step; per qcomm point the DLAC points that dominate it within noise; the two targets; the codecs TorchRec could
    not run here, with their errors."""
    import adaptive_accuracy

    data = results.get(FRONTIER_FILE)
    rows, _, _ = adaptive_accuracy.load_rows([results.directory / FRONTIER_FILE])
    cfg = data.get("config", {})
    seeds = ", ".join(map(str, cfg.get("seeds", [])))
    return [source_line(FRONTIER_FILE, data, results.shown), "",
            f"Criteo sample, {cfg.get('criteo_epochs')} epochs, batch {cfg.get('criteo_batch')} per rank, 2 gloo"
            f" ranks, seeds {seeds} (evaluation seeds: no bound was chosen on them).", "",
            adaptive_accuracy.FRONTIER_DEFINITIONS, "",
            *adaptive_accuracy.frontier_lines(adaptive_accuracy.frontier(rows), data.get("failed", []))]


BLOCKS["adaptive_frontier"] = Block((FRONTIER_FILE,), adaptive_frontier)

FAMILY_FRONTIER_FILE = "frontier_worlds.json"


def frontier_worlds(results: Results, name: str = FAMILY_FRONTIER_FILE) -> list[str]:
    """The same frontier on worlds of the family (benchmarks/frontier_worlds.py): per world the default's point,
    the qcomm point with the fewest forward bytes, the qcomm points no DLAC point dominates and the two targets;
    then how many worlds meet each, and the codecs TorchRec could not run."""
    from adaptive_accuracy import FRONTIER_TARGETS as TARGETS

    data = results.get(name)
    cfg, summary = data.get("config", {}), data["summary"]
    lines = [source_line(name, data, results.shown), "",
             f"{cfg.get('worlds')} worlds {cfg.get('seeds')}, " + _settle_rule(cfg) + f", {cfg.get('train_seeds')}"
             + (f" paired training seeds each; the default is `{cfg.get('default_rule')}`."
                if "train_seeds_planned" not in cfg else
                f" or more paired training seeds each ({cfg['train_seeds_planned']} planned: a run adding seeds"
                f" stopped before every world had them); the default is `{cfg.get('default_rule')}`.")
             + " Each world is judged as the Criteo sample above (same arms, same definitions); AUROC differences"
             " are from the uncompressed run of the same seed, bytes are forward bytes per step.", "",
             "| world | tables | paired seeds | arms settled | default: AUROC, KiB/step | fewest-bytes qcomm point:"
             " AUROC, KiB/step | not dominated | every qcomm point dominated | default on or near the frontier |",
             "|---|---:|---:|---:|---|---|---|---|---|"]
    for w in data["per_world"]:
        f = w["frontier"]
        points = {p["variant"]: p for p in f["points"]}
        qcomm = sorted((p for p in f["points"] if p["kind"] == "qcomm"), key=lambda p: p["fwd_bytes_per_step"])
        default = points.get("DLAC default")
        met = {t["target"]: t for t in f["targets"]}

        def point(p: dict[str, Any] | None) -> str:
            return "-" if p is None else f"{p['delta_mean']:+.4f}, {p['fwd_bytes_per_step'] / 1024:.1f}"

        near = met.get(TARGETS[1])
        standing = "-" if near is None else "on" if near["on_frontier"] else "near" if near["met"] else "no"
        seeds = len(points["uncompressed"]["seeds"]) if "uncompressed" in points else "-"
        # An arm that reached the cap unsettled is read wherever its AUROC was then: where few settle, the noise is
        # of the size of the runs' swings, and "within noise" admits more.
        runs = [r for r in data["results"] if r["world"] == w["world"]]
        settled = f"{sum(bool(r.get('settled')) for r in runs)} of {len(runs)}"
        lines.append(f"| {w['world']} | {w['spec'].get('tables')} | {seeds} | {settled} | {point(default)} |"
                     f" {point(qcomm[0]) if qcomm else '-'} ({qcomm[0]['variant'] if qcomm else 'none ran'}) |"
                     f" {', '.join(met[TARGETS[0]]['not_dominated']) or 'none'} |"
                     f" {'yes' if met[TARGETS[0]]['met'] else 'no'} | {standing} |")
    lines += _undominated_lines(data["per_world"])
    for world, near in _default_standing(data["per_world"]):
        if near["met"] and not near["on_frontier"]:
            lines += ["", f"World {world}: the default is off the frontier and counts as near it only within noise: "
                      + "; ".join(f"{b['variant']} has no more forward bytes and {b['auroc_diff']:+.4f} AUROC over"
                                  f" it (noise {b['noise']:.4f}, {b['seeds']} paired seeds)" for b in near["beaten_by"])
                      + "."]
    dominated = ", ".join(f"{q} in {d['worlds']} of {d['of']}" for q, d in summary["qcomm_dominated"].items())
    worlds = f"{summary['worlds']} world{'s' if summary['worlds'] != 1 else ''}"
    lines += ["", f"Over {worlds}: every qcomm point dominated within noise in"
              f" {_plain(summary[TARGETS[0]], '.0%')} of them, the default on or near the frontier in"
              f" {_plain(summary[TARGETS[1]], '.0%')}; each qcomm point dominated: {dominated}. The default's median"
              f" AUROC difference from uncompressed {_plain(summary['default_delta_median'], '+.4f')}, its median"
              " forward bytes"
              f" {_x(summary['default_fwd_bytes_vs_fewest_qcomm_median'])} those of the fewest-bytes qcomm point."]
    for e in data.get("failed", []):
        lines += ["", f"{e['variant']}: TorchRec could not run it here (world {e['world']}, seed {e['seed']}; not"
                  f" launched again): `{e['error']}`"]
    return lines


def _default_standing(per_world: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Each world's judgement of the second frontier target (the default on or near the frontier), with its world."""
    from adaptive_accuracy import FRONTIER_TARGETS

    return [(w["world"], x) for w in per_world for x in w["frontier"]["targets"] if x["target"] == FRONTIER_TARGETS[1]]


def _undominated_lines(per_world: list[dict[str, Any]]) -> list[str]:
    """For each qcomm point no DLAC point dominates, by how much it is missed: the DLAC point with no more forward
    bytes that comes closest (the largest paired AUROC difference plus its noise), its bytes, difference and noise."""
    lines = []
    for w in per_world:
        points = {p["variant"]: p for p in w["frontier"]["points"]}
        for pair in w["frontier"]["pairs"]:
            if pair["dominated_by"]:
                continue
            q = points[pair["qcomm"]]
            head = (f"- world {w['world']}, {pair['qcomm']} ({q['delta_mean']:+.5f} AUROC from uncompressed,"
                    f" {q['fwd_bytes_per_step'] / 1024:.1f} KiB/step): not dominated;")
            fewer = [c for c in pair["candidates"] if c["no_more_fwd_bytes"] and c["seeds"]]
            if not fewer:
                lines.append(f"{head} no DLAC point sends as few forward bytes.")
                continue
            c = max(fewer, key=lambda c: c["auroc_diff"] + c["noise"])
            d = points[c["dlac"]]
            lines.append(f"{head} the closest DLAC point with no more bytes, {c['dlac']} ({d['delta_mean']:+.5f},"
                         f" {d['fwd_bytes_per_step'] / 1024:.1f} KiB/step), is {c['auroc_diff']:+.5f} AUROC from it"
                         f" over {c['seeds']} paired seeds, beyond the noise {c['noise']:.5f}.")
    return ["", *lines] if lines else []


BLOCKS["frontier_worlds"] = Block((FAMILY_FRONTIER_FILE,), frontier_worlds)


# Results a lent GPU makes (benchmarks/gpu_session.sh, stage 4), not `make bench`: no CPU depth can write them.
GPU_RESULTS = ("cuda_codec_bench.json",)
GPU_TARGET_GBPS = 100.0  # docs/benchmarks.md, "Codec on GPU": each way, on an H200, for the realistic payloads
SYNC_COUNT_FIXED = "2026-12-04T15"  # cuda_codec_bench.py reads the sync debug mode's stderr from this session on


def cuda_codec(results: Results) -> list[str]:
    """The CUDA kernels on the lent GPU: every row of the run, and the 100 GB/s target judged per DLAC row."""
    from cuda_codec_bench import COLUMNS, Table

    data = results.get("cuda_codec_bench.json")
    rows = data["results"]
    cfg = data.get("config", {})
    # Runs before the bench read the sync debug mode's stderr counted only its Python warnings (the mode's own
    # notice, no synchronization): their column is left out rather than shown wrong.
    counted = data["metadata"].get("date", "") >= SYNC_COUNT_FIXED
    cols = COLUMNS if counted else COLUMNS[:-1]
    lines = [source_line("cuda_codec_bench.json", data, results.shown), "",
             f"{cfg.get('device')}, payloads of {cfg.get('batch')} rows per destination; GB/s of float32 input as the"
             " exchange calls the codec (op: the kernels alone), CUDA events; parity against the CPU kernels"
             + ("; synchronizations per encode / decode." if counted else ". The synchronizations per call are"
                " tests/codec/test_codec_cuda.py's (encode 1, decode 2, passed on the same machine): this run's own"
                " count read the wrong channel, so its column is left out."), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(Table.cells(r)[: len(cols)]) + " |" for r in rows]
    if data.get("not_measured"):  # a baseline that could not run there (no fbgemm, no Triton): said, not dropped
        lines += ["", *Table.not_measured_lines(data["not_measured"])]
    dlac = [r for r in rows if str(r["codec"]).startswith("dlac") and "host copies" not in r["codec"]
            and r.get("encode_gbps")]
    if dlac:
        enc = statistics.median(r["encode_gbps"] for r in dlac)
        dec = statistics.median(r["decode_gbps"] for r in dlac)
        met = sum(r["encode_gbps"] >= GPU_TARGET_GBPS and r["decode_gbps"] >= GPU_TARGET_GBPS for r in dlac)
        parity = sum(str(r.get("parity", "")).startswith("bytes+bits equal") for r in dlac)
        lines += ["", f"Target {GPU_TARGET_GBPS:.0f} GB/s each way: **{'met' if met == len(dlac) else 'not met'}**"
                  f" ({met} of {len(dlac)} DLAC rows; median encode {enc:.1f} GB/s, decode {dec:.1f} GB/s)."
                  f" Byte and bit parity with the CPU kernels: {parity} of {len(dlac)} rows."]
    return lines


BLOCKS["cuda_codec"] = Block(("cuda_codec_bench.json",), cuda_codec)


def gpu_projection(results: Results) -> list[str]:
    """The projection's cluster at the GPU kernel rates cuda_codec_bench.json measured (issue 34 item 2): the step
    model of ``dlac estimate --device-rates`` with TorchRec's MX4 beside the other methods, the compute and dense
    parameters of the projection above, DLAC's ratios from its validated run."""
    import scaling_model

    from lightning_dlac.commands.estimate import Codec, Link, Workload, device_rates, predict_all

    bench, model = results.get("cuda_codec_bench.json"), results.get("scaling_model.json")
    rates = device_rates(results.directory / "cuda_codec_bench.json")
    cfg, res = model["config"], model["results"]
    two = [r for r in res["validation"] if r["world"] == 2 and r["method"] == "dlac_dlac"]
    ratios = (two[0]["forward_ratio"], two[0]["backward_ratio"])
    workload = Workload(cfg["batch"], scaling_model.DIMS, cfg["gpu_compute_ms"], res["dense_params"],
                        cfg["gpu_allreduce_hidden"])
    codec = Codec(ratios[0], ratios[1], rates.encode_gb_s, rates.decode_gb_s, rates.backward_encode_gb_s,
                  rates.backward_decode_gb_s, rates.cast_gb_s, mx4_encode_gb_s=rates.mx4_encode_gb_s,
                  mx4_decode_gb_s=rates.mx4_decode_gb_s)
    methods = codec.methods()
    lines = [source_line("cuda_codec_bench.json", bench, results.shown),
             source_line("scaling_model.json", model, results.shown), "",
             f"Rates measured on the {rates.device} (GB/s of float32, the criteo payload at eps 0.01 as the exchange"
             f" calls the codec): DLAC encode {rates.encode_gb_s:.1f} / decode {rates.decode_gb_s:.1f}, gradients"
             f" {rates.backward_encode_gb_s:.1f} / {rates.backward_decode_gb_s:.1f}; FP16 cast"
             f" {rates.cast_gb_s:.0f}"
             + (f"; MX4 {rates.mx4_encode_gb_s:.0f} / {rates.mx4_decode_gb_s:.0f}" if codec.has_mx4 else
                f"; MX4 not measured ({rates.mx4_missing})")
             + f". DLAC's ratios {ratios[0]:.1f}x forward / {ratios[1]:.1f}x gradients (the validated 2-rank run);"
             f" MX4 {workload.mx4_ratio:.2f}x, INT8 {workload.int8_ratio:.2f}x from the dims. Still assumed:"
             f" **{cfg['gpu_compute_ms']:g} ms of compute per step**.", "",
             "| link | GPUs | FP32 ms | " + " | ".join(f"{scaling_model.METHOD_LABELS.get(m, m)} speedup"
                                                      for m in methods[1:]) + " | fastest |",
             "|---|---:|---:|" + "---:|" * (len(methods) - 1) + "---|"]
    for name, gbit, latency in (("25 Gbit/s Ethernet", 25.0, cfg["eth_latency_us"]),
                                ("100 Gbit/s Ethernet", 100.0, cfg["eth_latency_us"]),
                                ("400 Gbit/s InfiniBand", 400.0, cfg["ib_latency_us"])):
        link = Link(gbit, latency, "per_gpu")
        for world in (8, 64, 512):
            preds = predict_all(workload, codec, link, world)
            fp32 = preds["fp32"].step_ms
            best = min(methods, key=lambda m: preds[m].step_ms)
            lines.append(f"| {name} | {world} | {fp32:.1f} | "
                         + " | ".join(f"{fp32 / preds[m].step_ms:.2f}x" for m in methods[1:])
                         + f" | {scaling_model.METHOD_LABELS.get(best, best)} |")
    return lines


BLOCKS["gpu_projection"] = Block(("cuda_codec_bench.json", "scaling_model.json"), gpu_projection)


if __name__ == "__main__":
    main()
