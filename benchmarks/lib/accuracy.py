"""The accuracy benchmark's variants and figures (``python -m benchmarks.adaptive_accuracy``): which compression each
variant name launches, the traffic meter every launch carries, the rows of a results file in one byte accounting,
the summary over seeds and the tables the renderer and the script print. The frontier of issue 33 item 3 is
benchmarks/lib/frontier.py's.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from benchmarks.lib.e2e import VARIANTS as E2E_VARIANTS
from benchmarks.lib.results import load_results

VARIANTS = ("uncompressed", "constant 0.01", "DLAC default", "DLAC gradient", "DLAC homogenization", "DLAC sensitivity",
            "DLAC both directions",
            "constant 0.05", "qcomm INT8/FP16")


# Issue 33's accuracy-bytes frontier: the constant bounds and TorchRec's codecs it sets against each other (any
# ``constant X`` and any qcomm label of benchmarks/e2e_bandwidth.py's VARIANTS is accepted; these are the issue's).
FRONTIER_CONSTANTS = ("constant 0.002", "constant 0.005", "constant 0.01", "constant 0.03", "constant 0.05")


FRONTIER_QCOMM = ("qcomm FP16/FP16", "qcomm INT8/FP16", "qcomm FP8/FP8", "qcomm MX4/MX4")


DATASETS = ("criteo", "synthetic", "planted", "synthetic_v2")


def constant_bound(variant: str) -> float | None:
    """The bound of a ``constant X`` variant (every table at eps X for the whole run), else None."""
    name, _, value = variant.partition(" ")
    if name != "constant":
        return None
    try:
        eps = float(value)
    except ValueError:
        return None
    return eps if 0 < eps < 1 else None


def qcomm_variant(variant: str) -> Any:
    """The end-to-end ``Variant`` (benchmarks/lib/e2e.py) of TorchRec's codec labelled ``variant`` (``qcomm FP8/FP8``,
    ...), else None."""
    if not variant.startswith("qcomm "):
        return None
    return next((v for v in E2E_VARIANTS.values() if v.kind == "qcomm" and v.label == variant), None)


def known_variant(variant: str) -> bool:
    """Whether this script can launch ``variant``: a name of VARIANTS, any ``constant X`` or a qcomm label."""
    return variant in VARIANTS or constant_bound(variant) is not None or qcomm_variant(variant) is not None


class TrafficMeter(pl.Callback):
    """All-to-all bytes of the training batches only (not validation), forward and backward, counted as DLAC's
    counters count them: traffic to other ranks (the block a rank keeps for itself is a local copy). From the
    strategy's counters; for the qcomm baseline from the counting wrappers of TorchRec's codecs, which see the whole
    send buffer, every destination's equal share included (so (W - 1) / W of it); for the uncompressed run, the
    float32 bytes of this rank's tables' pooled embeddings for the other ranks' rows (``dims``: each table's
    dimension), its fp32 reference."""

    def __init__(self, qcomm_codecs: Any = None, dims: dict[str, int] | None = None) -> None:
        self.steps = self.raw = self.sent = self.bwd_raw = self.bwd_sent = 0
        self._start = (0, 0, 0, 0)
        self._qcomm = qcomm_codecs
        self._dims = dims
        self._local_dim: int | None = None

    def _counts(self, trainer) -> tuple[int, int, int, int]:  # noqa: ANN001
        if self._qcomm is not None:
            fwd, bwd = self._qcomm
            return fwd.raw_bytes, fwd.sent_bytes, bwd.raw_bytes, bwd.sent_bytes
        s = trainer.strategy.total_comm_stats()
        return s.raw_bytes, s.sent_bytes, s.backward_raw_bytes, s.backward_sent_bytes

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self._start = self._counts(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        now = self._counts(trainer)
        delta = [b - a for a, b in zip(self._start, now)]
        world = trainer.world_size
        if self._qcomm is not None:
            delta = [d * (world - 1) // world for d in delta]
        elif self._dims is not None:  # uncompressed: float32 rows of every other rank's batch, this rank's tables
            if self._local_dim is None:
                rank = trainer.global_rank
                plan = trainer.strategy.sharding_plan.plan
                self._local_dim = sum(self._dims[t] for mp in plan.values() for t, spec in mp.items()
                                      if rank in (spec.ranks or []))
            fp32 = batch.labels.numel() * (world - 1) * self._local_dim * 4
            delta = [fp32] * 4
        self.steps += 1
        self.raw += delta[0]
        self.sent += delta[1]
        self.bwd_raw += delta[2]
        self.bwd_sent += delta[3]


def normalize_bytes(rows: list[dict[str, Any]], world_size: int = 2) -> list[dict[str, Any]]:
    """Rows of any results file in the remote-traffic accounting (``byte_accounting: "remote"``). Files written
    before it counted qcomm's bytes over the whole send buffer, a rank's own chunk included, and gave the
    uncompressed run no bytes: their qcomm rows are scaled by (W - 1) / W (exact: TorchRec sends every destination
    an equal share) and their uncompressed rows get the float32 bytes DLAC's rows of the same dataset and seed
    stood for (``fwd_raw_bytes``, the same by construction). Returns new row dicts."""
    fp32 = {(r["dataset"], r.get("seed", 0)): r["fwd_raw_bytes"] for r in rows
            if r["variant"] != "uncompressed" and not r["variant"].startswith("qcomm ") and r.get("fwd_raw_bytes")}
    out = []
    for r in rows:
        r = dict(r)
        if not str(r.get("byte_accounting", "")).startswith("remote"):
            if r["variant"].startswith("qcomm "):
                for key in ("fwd_raw_bytes", "fwd_sent_bytes", "bwd_raw_bytes", "bwd_sent_bytes"):
                    r[key] = r.get(key, 0) * (world_size - 1) // world_size
            elif r["variant"] == "uncompressed" and (r["dataset"], r.get("seed", 0)) in fp32:
                r["fwd_raw_bytes"] = r["fwd_sent_bytes"] = fp32[(r["dataset"], r.get("seed", 0))]
            r["byte_accounting"] = "remote (converted from a file written before issue 25's fix)"
        out.append(r)
    return out


def over_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, variant): the mean and sample standard deviation over seeds of the AUROC difference from the
    uncompressed run of the same seed, the mean AUROC and the mean forward bytes per step (relative to the constant
    0.01 run of the same seed)."""
    base = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "uncompressed"}
    const = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "constant 0.01"}
    fp32 = fp32_per_step(rows)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["variant"]), []).append(r)
    out = []
    for (dataset, variant), rs in groups.items():
        deltas = [r["val_auroc"] - base[(dataset, r.get("seed", 0))]["val_auroc"]
                  for r in rs if (dataset, r.get("seed", 0)) in base]
        vs_const = []
        for r in rs:
            c = const.get((dataset, r.get("seed", 0)))
            if c and c["fwd_sent_bytes"] and r["fwd_sent_bytes"]:
                vs_const.append((r["fwd_sent_bytes"] / r["steps"]) / (c["fwd_sent_bytes"] / c["steps"]))
        out.append({
            "dataset": dataset, "variant": variant, "seeds": [r.get("seed", 0) for r in rs], "steps": rs[0]["steps"],
            "val_auroc_mean": statistics.fmean(r["val_auroc"] for r in rs),
            "delta_mean": statistics.fmean(deltas) if deltas else float("nan"),
            "delta_sd": statistics.stdev(deltas) if len(deltas) > 1 else float("nan"),
            "vs_constant_mean": statistics.fmean(vs_const) if vs_const else float("nan"),
            "fwd_sent_per_step": statistics.fmean(r["fwd_sent_bytes"] / r["steps"] for r in rs),
            # float32 bytes over the bytes sent (the uncompressed run of the same seed is the reference)
            "fwd_ratio_mean": statistics.fmean(fp32[(dataset, r.get("seed", 0))] / (r["fwd_sent_bytes"] / r["steps"])
                                               for r in rs) if all((dataset, r.get("seed", 0)) in fp32
                                                                   and r["fwd_sent_bytes"] for r in rs) else None,
            "bwd_ratio": statistics.fmean(r["bwd_raw_bytes"] / r["bwd_sent_bytes"] for r in rs)
            if all(r.get("bwd_sent_bytes") for r in rs) else None,
        })
    return out


def seed_table(summary: list[dict[str, Any]]) -> list[str]:
    def num(v: float, fmt: str) -> str:
        return "-" if v != v else format(v, fmt)

    lines = [
        "| dataset | variant | seeds | steps | mean val AUROC | AUROC vs uncompressed: mean | spread (sd) |"
        " fwd bytes vs constant 0.01 | fwd ratio vs fp32 | backward ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        bwd = "-" if s["bwd_ratio"] is None else f"{s['bwd_ratio']:.1f}x"
        fwd = "-" if s.get("fwd_ratio_mean") is None else f"{s['fwd_ratio_mean']:.1f}x"
        lines.append(
            f"| {s['dataset']} | {s['variant']} | {len(s['seeds'])} | {s['steps']} | {s['val_auroc_mean']:.4f} |"
            f" {num(s['delta_mean'], '+.4f')} | {num(s['delta_sd'], '.4f')} | {num(s['vs_constant_mean'], '.2f')} |"
            f" {fwd} | {bwd} |"
        )
    return lines


def fp32_per_step(rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """The reference of every ratio: per (dataset, seed), the uncompressed run's float32 bytes per step."""
    return {(r["dataset"], r.get("seed", 0)): r["fwd_raw_bytes"] / r["steps"] for r in rows
            if r["variant"] == "uncompressed" and r.get("fwd_raw_bytes")}


def launch_table(rows: list[dict[str, Any]]) -> list[str]:
    fp32 = fp32_per_step(rows)
    base = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "uncompressed"}
    const = {(r["dataset"], r.get("seed", 0)): r for r in rows if r["variant"] == "constant 0.01"}
    lines = [
        "| dataset | seed | variant | val AUROC | vs uncompressed | val loss | fwd KiB/step (both ranks) | ratio |"
        " vs constant 0.01 | s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, key = r["dataset"], (r["dataset"], r.get("seed", 0))
        ref = fp32.get(key, 0.0)
        per_step = (r["fwd_sent_bytes"] / r["steps"]) if r["fwd_sent_bytes"] else ref
        ratio = ref / per_step if per_step else float("nan")
        delta = r["val_auroc"] - base[key]["val_auroc"] if key in base else float("nan")
        c = const.get(key)
        vs_const = per_step / (c["fwd_sent_bytes"] / c["steps"]) if c and c["fwd_sent_bytes"] else float("nan")
        lines.append(
            f"| {d} | {r.get('seed', 0)} | {r['variant']} | {r['val_auroc']:.4f} | {delta:+.4f} | {r['val_loss']:.4f} |"
            f" {f'{per_step / 1024:.1f}' if per_step else '-'} | {'-' if ratio != ratio else f'{ratio:.1f}x'} |"
            f" {'-' if vs_const != vs_const else f'{vs_const:.2f}'} | {r['seconds']:.0f} |"
        )
    return lines


def calibration_table(row: dict[str, Any]) -> list[str]:
    cands = list(row["calibration"][0]["ratio"])
    # The gradient statistic's columns appear where the run measured it (results from before it existed lack them).
    gradient = any(t.get("gradient_loss_change") for t in row["calibration"])
    heads = [f"ratio @ {c}" for c in cands] + [f"loss change @ {c}" for c in cands]
    heads += [f"gradient loss change @ {c}" for c in cands] if gradient else []
    lines = [
        "| table | rows | distinct vectors / chunk | homogenization index | vector index | class | eps | "
        + " | ".join(heads) + " |",
        "|---|---:|---:|---:|---:|---|---:|" + "---:|" * len(heads),
    ]
    order = sorted(row["calibration"], key=lambda r: int(r["table"].rsplit("_", 1)[1]))
    for t in order:
        cells = [f"{t['ratio'][c]:.1f}" for c in cands]
        cells += ["-" if t["loss_change"] is None else f"{t['loss_change'][c]:+.1e}" for c in cands]
        if gradient:
            grad = t.get("gradient_loss_change")
            cells += ["-" if grad is None else f"{grad[c]:.3f}" for c in cands]
        vector = f"{t['vector_homogenization_index']:.3f}" if "vector_homogenization_index" in t else "-"
        lines.append(
            f"| {t['table']} | {row['table_rows'].get(t['table'], '')} | {t['distinct_per_chunk']:.1f} |"
            f" {t['homogenization_index']:.3f} | {vector} | {t['class']} | {t['eps']} | {' | '.join(cells)} |"
        )
    return lines


def settings_lines(command: str, cfg: dict[str, Any], datasets: list[str]) -> list[str]:
    return [
        f"Command: `{command}`",
        "",
        f"Settings of {', '.join(datasets)}: DLRM dim {cfg['dim']}, tables capped at {cfg['max_rows']} rows, fused"
        f" Adagrad (lr 0.02) for the tables, dense Adagrad (lr 0.01). Criteo: {cfg['criteo_epochs']} epoch(s), batch"
        f" {cfg['criteo_batch']} per rank. Synthetic and planted: {cfg['synthetic_batches']} batches of"
        f" {cfg['synthetic_batch']} per rank. Calibration: {cfg['calibration_batches']} batches starting at"
        f" {cfg['calibration_start']:.0%} of training ({cfg.get('sensitivity_batches', 1)} probe batch(es) in"
        f" sensitivity mode); schedule step, c=2, T = half of training; backward eps {cfg.get('backward_eps', 0.01)}"
        f" for DLAC both directions. Seeds {', '.join(map(str, cfg.get('seeds', [0])))}. Machine load (1-minute"
        f" average) at the start: {cfg.get('load', '?')}.",
        "",
    ]


def markdown_lines(rows: list[dict[str, Any]], sources: list[tuple[str, dict[str, Any], list[str]]],
                   machine: str) -> list[str]:
    """The section's generated lines from ``rows``; ``sources`` holds the (command, settings, datasets) of each run
    that made them, ``machine`` what they ran on."""
    parts: list[str] = []
    for command, cfg, datasets in sources:
        parts += settings_lines(command, cfg, datasets)
    parts += [
        f"Machine: {machine}, 2 gloo ranks. Forward all-to-all bytes of the training batches to other ranks (as"
        " DLAC's counters count them), summed over both ranks, against the uncompressed run's float32 bytes;"
        " AUROC of the final validation.",
        "",
        "Over seeds (AUROC difference from the uncompressed run of the same seed):",
        "",
        *seed_table(over_seeds(rows)),
        "",
        "Every launch:",
        "",
        *launch_table(rows),
    ]
    first_seed = min((r.get("seed", 0) for r in rows), default=0)
    for variant in ("DLAC default", "DLAC gradient", "DLAC sensitivity", "DLAC homogenization"):
        for r in rows:
            if r["variant"] == variant and r.get("calibration") and r.get("seed", 0) == first_seed:
                parts += ["", f"Per-table calibration of the {r['dataset']} run, seed {first_seed} ({variant}):", "",
                          *calibration_table(r)]
    return parts


def load_rows(paths: list[Path]) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any], list[str]]], str]:
    """Rows (in the remote-traffic accounting), sources and machine of stored results files, e.g. one per dataset
    run with its own settings (a dataset in several files is named by each file)."""
    stored = [load_results(p) for p in paths]
    seen: dict[str, int] = {}
    for d in stored:
        for name in {r["dataset"] for r in d["results"]}:
            seen[name] = seen.get(name, 0) + 1
    for p, d in zip(paths, stored):  # one dataset run with different settings: name each run by its file
        for r in d["results"]:
            if seen[r["dataset"]] > 1:
                r["dataset"] = f"{r['dataset']} ({Path(p).stem.removeprefix('adaptive_accuracy_')})"
    rows = normalize_bytes([r for d in stored for r in d["results"]])
    sources = [(d["metadata"]["command"], d["config"], sorted({r["dataset"] for r in d["results"]})) for d in stored]
    meta = stored[0]["metadata"] if stored else {}
    machine = f"{meta.get('cores', '?')} CPU cores; torch {meta.get('versions', {}).get('torch', '?')}"
    return rows, sources, machine
