"""docs/adaptive.md's accuracy-bytes frontiers against TorchRec's codecs: on the Criteo sample and on the family's
evaluation worlds."""

from __future__ import annotations

from typing import Any

from benchmarks.lib.accuracy import load_rows
from benchmarks.lib.frontier import FRONTIER_DEFINITIONS, FRONTIER_TARGETS, frontier, frontier_lines
from benchmarks.render.calibration import settle_rule
from benchmarks.render.core import Block, Results, fmt_plain, fmt_x, source_line

FRONTIER_FILE = "adaptive_frontier_criteo.json"


def adaptive_frontier(results: Results) -> list[str]:
    """Per variant the AUROC difference from the uncompressed run (over seeds) and the forward and total bytes per
    step; per qcomm point the DLAC points that dominate it within noise; the two targets; the codecs TorchRec could
    not run here, with their errors."""
    data = results.get(FRONTIER_FILE)
    rows, _, _ = load_rows([results.directory / FRONTIER_FILE])
    cfg = data.get("config", {})
    seeds = ", ".join(map(str, cfg.get("seeds", [])))
    return [source_line(FRONTIER_FILE, data, results.shown), "",
            f"Criteo sample, {cfg.get('criteo_epochs')} epochs, batch {cfg.get('criteo_batch')} per rank, 2 gloo"
            f" ranks, seeds {seeds} (evaluation seeds: no bound was chosen on them).", "",
            FRONTIER_DEFINITIONS, "",
            *frontier_lines(frontier(rows), data.get("failed", []))]


FAMILY_FRONTIER_FILE = "frontier_worlds.json"


def frontier_worlds(results: Results, name: str = FAMILY_FRONTIER_FILE) -> list[str]:
    """The same frontier on worlds of the family (benchmarks/frontier_worlds.py): per world the default's point,
    the qcomm point with the fewest forward bytes, the qcomm points no DLAC point dominates and the two targets;
    then how many worlds meet each, and the codecs TorchRec could not run."""
    data = results.get(name)
    cfg, summary = data.get("config", {}), data["summary"]
    lines = [source_line(name, data, results.shown), "",
             f"{cfg.get('worlds')} worlds {cfg.get('seeds')}, " + settle_rule(cfg, data["results"])
             + f", {cfg.get('train_seeds')}"
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

        near = met.get(FRONTIER_TARGETS[1])
        standing = "-" if near is None else "on" if near["on_frontier"] else "near" if near["met"] else "no"
        seeds = len(points["uncompressed"]["seeds"]) if "uncompressed" in points else "-"
        # An arm that reached the cap unsettled is read wherever its AUROC was then: where few settle, the noise is
        # of the size of the runs' swings, and "within noise" admits more.
        runs = [r for r in data["results"] if r["world"] == w["world"]]
        settled = f"{sum(bool(r.get('settled')) for r in runs)} of {len(runs)}"
        lines.append(f"| {w['world']} | {w['spec'].get('tables')} | {seeds} | {settled} | {point(default)} |"
                     f" {point(qcomm[0]) if qcomm else '-'} ({qcomm[0]['variant'] if qcomm else 'none ran'}) |"
                     f" {', '.join(met[FRONTIER_TARGETS[0]]['not_dominated']) or 'none'} |"
                     f" {'yes' if met[FRONTIER_TARGETS[0]]['met'] else 'no'} | {standing} |")
    lines += _undominated_lines(data["per_world"])
    for world, near in default_standing(data["per_world"]):
        if near["met"] and not near["on_frontier"]:
            lines += ["", f"World {world}: the default is off the frontier and counts as near it only within noise: "
                      + "; ".join(f"{b['variant']} has no more forward bytes and {b['auroc_diff']:+.4f} AUROC over"
                                  f" it (noise {b['noise']:.4f}, {b['seeds']} paired seeds)" for b in near["beaten_by"])
                      + "."]
    dominated = ", ".join(f"{q} in {d['worlds']} of {d['of']}" for q, d in summary["qcomm_dominated"].items())
    worlds = f"{summary['worlds']} world{'s' if summary['worlds'] != 1 else ''}"
    lines += ["", f"Over {worlds}: every qcomm point dominated within noise in"
              f" {fmt_plain(summary[FRONTIER_TARGETS[0]], '.0%')} of them, the default on or near the frontier in"
              f" {fmt_plain(summary[FRONTIER_TARGETS[1]], '.0%')}; each qcomm point dominated: {dominated}. The"
              " default's median AUROC difference from uncompressed"
              f" {fmt_plain(summary['default_delta_median'], '+.4f')}, its median forward bytes"
              f" {fmt_x(summary['default_fwd_bytes_vs_fewest_qcomm_median'])} those of the fewest-bytes qcomm point."]
    for e in data.get("failed", []):
        lines += ["", f"{e['variant']}: TorchRec could not run it here (world {e['world']}, seed {e['seed']}; not"
                  f" launched again): `{e['error']}`"]
    return lines


def default_standing(per_world: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Each world's judgement of the second frontier target (the default on or near the frontier), with its world."""
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


BLOCKS = {
    "adaptive_frontier": Block((FRONTIER_FILE,), adaptive_frontier),
    "frontier_worlds": Block((FAMILY_FRONTIER_FILE,), frontier_worlds),
}
