"""The end-of-run compression report: a markdown summary and PNG plots in the run's log directory.

``DLACCallback`` hands its run summary (metrics history, calibration and totals) to :func:`save_run` at the end of
fit on rank 0, which writes ``dlac_run.json`` and the report made from it. ``dlac report LOG_DIR``
(:mod:`lightning_dlac.commands.report`) rebuilds the report from that file alone, e.g. after changing the plots.

``dlac report LOG_DIR --baseline OTHER_LOG_DIR`` compares the run with a reference run, typically the same training
uncompressed (``DLACStrategy(compression=CompressionOptions(enabled=False))``): the loss and AUROC plot overlays the
reference's curves and the headline states the final differences. The reference is read from its ``dlac_run.json``
if it has one, else from the ``metrics.csv`` of Lightning's CSVLogger (an uncompressed run has no ``dlac_run.json``:
the callback does nothing there).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUN_FILE = "dlac_run.json"
METRICS_CSV = "metrics.csv"
REPORT_FILE = "dlac_report.md"
# Final metrics compared with a baseline, in this order, when both runs have them.
COMPARED = ("val/auroc", "val/loss", "train/loss", "test/auroc", "test/loss")
PLOTS = {
    "ratio": "dlac_ratio_per_table.png",
    "bounds": "dlac_bounds.png",
    "bytes": "dlac_bytes_per_step.png",
    "quality": "dlac_loss_auc.png",
}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _series(history: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in history:
        v = row.get(key)
        if v is not None and isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(row["batch"])
            ys.append(v)
    return xs, ys


def _table_order(names: Sequence[str]) -> list[str]:
    def key(name: str) -> tuple[str, int]:
        head, _, tail = name.rpartition("_")
        return (head, int(tail)) if tail.isdigit() else (name, -1)

    return sorted(names, key=key)


def load_baseline(log_dir: str | Path) -> dict[str, Any]:
    """The reference run of ``log_dir`` as ``{"name", "history", "final_metrics"}``: from its ``dlac_run.json``,
    else from the ``metrics.csv`` of Lightning's CSVLogger (``batch`` is then Lightning's ``step``, the same count
    for one optimizer step per batch; the final value of a metric is its last logged one)."""
    log_dir = Path(log_dir)
    run_file, csv_file = log_dir / RUN_FILE, log_dir / METRICS_CSV
    if run_file.is_file():
        run = json.loads(run_file.read_text())
        return {"name": str(log_dir), "history": run.get("history") or [], "final_metrics": run.get("final_metrics")
                or {}}
    if not csv_file.is_file():
        raise FileNotFoundError(
            f"the baseline {log_dir} holds neither {RUN_FILE} nor {METRICS_CSV}: point --baseline at the log"
            " directory of the reference run (e.g. logs/dlrm_synthetic/version_1), trained with a CSVLogger."
        )
    history: list[dict[str, Any]] = []
    final: dict[str, float] = {}
    with csv_file.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                step = int(float(row.get("step") or ""))
            except ValueError:
                continue  # a row without a step cannot be placed on the curve
            values = {}
            for key, text in row.items():
                if key in ("step", "epoch") or not text:
                    continue
                try:
                    values[key] = float(text)
                except ValueError:
                    continue
            if values:
                history.append({"batch": step, **values})
                final.update(values)
    if not history:
        raise ValueError(f"{csv_file} holds no metric rows: the baseline run logged nothing to compare with.")
    return {"name": str(log_dir), "history": history, "final_metrics": final}


def baseline_lines(run: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The headline's comparison with a baseline: the final value of each metric both runs have, and the
    difference (this run minus the baseline)."""
    mine, ref = run.get("final_metrics") or {}, baseline.get("final_metrics") or {}
    keys = [k for k in COMPARED if k in mine and k in ref]
    if not keys:
        return [f"vs baseline {baseline['name']}: no final metric in common to compare"]
    parts = [f"{k} {mine[k]:.4f} vs {ref[k]:.4f} ({mine[k] - ref[k]:+.4f})" for k in keys]
    return [f"vs baseline {baseline['name']}: " + ", ".join(parts)]


def headline(run: dict[str, Any], baseline: dict[str, Any] | None = None) -> list[str]:
    """The few lines printed at the end of fit (and, given a baseline from :func:`load_baseline`, the final
    differences from it)."""
    s = run["summary"]
    raw, sent = s["raw_bytes"], s["sent_bytes"]
    lines = [
        f"forward all-to-all: {_mib(sent)} sent instead of {_mib(raw)} ({raw / sent if sent else 1.0:.1f}x smaller,"
        f" {_mib(raw - sent)} saved) over {s['batches']} training batches on {s['world_size']} ranks",
    ]
    links = link_line(s)
    if links:
        lines.append(links)
    if s.get("train_s"):
        lines.append(
            f"all-to-all share of training time: {s['a2a_s'] / s['train_s']:.0%} (encode {s['encode_ms']:.1f} ms,"
            f" exchange {s['exchange_ms']:.1f} ms, decode {s['decode_ms']:.1f} ms, backward {s['backward_ms']:.1f} ms"
            " per batch and rank)"
        )
    lines.append(bounds_line(run))
    if run.get("calibration_share") is not None:
        lines.append(f"calibration: {run['calibration_s']:.1f} s on rank 0, {run['calibration_share']:.1%} of its"
                     " training time (statistics, compressed sizes, probes, reductions)")
    final = run.get("final_metrics") or {}
    if final:
        lines.append("final metrics: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(final.items())))
    if baseline is not None:
        lines += baseline_lines(run, baseline)
    return lines


def link_line(summary: dict[str, Any]) -> str | None:
    """Both directions' payload bytes by link class, where the run had peers the plan sent as they are or peers on
    another node (``None`` on a single node that compressed for everyone: the forward line says it all)."""
    same, other = summary.get("same_node_sent_bytes", 0), summary.get("other_nodes_sent_bytes", 0)
    passed = summary.get("passed_bytes", 0)
    if not (other or passed):
        return None
    return (f"by link (both directions): {_mib(other)} to other nodes, {_mib(same)} within nodes, of which"
            f" {_mib(passed)} sent as is (compress_peers: uncompressed where the plan does not compress)")


def never_calibrated_reason(status: dict[str, Any], default_eps: float | None) -> str:
    """Why a run's tables kept the strategy's eps (``status["state"] == "never_calibrated"``, from
    :meth:`~lightning_dlac.adaptive.Calibrator.status`), with the fix; no final full stop."""
    measured = f" ({status['measured']} of its {status['needed']} batches measured)" if status["measured"] else ""
    return (
        f"never calibrated: calibration was due from training batch {status['due']}{measured} and training stopped"
        f" after {status['batches_run']} batches (an early stop, or a length the Trainer could not know in advance),"
        f" so every table kept the strategy's eps={default_eps}; set calibration_start within the run"
    )


def bounds_line(run: dict[str, Any]) -> str:
    """Which bounds the run used and why: the calibrated classes, the strategy's eps for every table because
    calibration never ran (and when it was due), or the strategy's eps by choice (``mode="off"``); then the
    iteration-wise schedule. Runs summarised before ``bounds_status`` existed say what their classes say."""
    schedule = run["schedule"]
    tail = f"; schedule {schedule['kind']} c={schedule['c']} T={schedule['T']}"
    status = run.get("bounds_status") or {"state": "calibrated" if run.get("classes") else "unknown"}
    default = run.get("default_eps")
    if status["state"] == "constant":
        return (f"bounds ({run['mode']}): constant, the strategy's eps={default} for every table (no table-wise"
                f" level){tail}")
    if status["state"] == "never_calibrated":
        return f"bounds ({run['mode']}): {never_calibrated_reason(status, default)}{tail}"
    if status["state"] != "calibrated":
        return f"bounds ({run['mode']}): not recorded in this run summary{tail}"
    classes = run.get("classes") or {}
    counts = {c: sum(1 for v in classes.values() if v == c) for c in ("tight", "base", "loose")}
    calibrations = run.get("calibrations") or []
    again = ""
    if len(calibrations) > 1:
        again = f" (calibrated {len(calibrations)} times, last from batch {calibrations[-1]['at']})"
    elif calibrations:
        again = f" (calibrated from batch {calibrations[-1]['at']})"
    kept = sorted(set(run.get("final_effective_bounds") or {}) - set(run.get("table_bounds") or {}))
    kept_note = f", {len(kept)} at the strategy's eps={default} (no measured loss gradient)" if kept else ""
    rule = f", chosen by {run['rule']}" if run.get("rule") else ""  # recorded since the relative noise budget
    return (f"bounds ({run['mode']}): calibrated, {counts['tight']} tight, {counts['base']} base, {counts['loose']}"
            f" loose tables{kept_note}{rule}{again}{tail}")


def _markdown(run: dict[str, Any], plots: dict[str, str], baseline: dict[str, Any] | None = None) -> str:
    s = run["summary"]
    out = ["# DLAC compression report", ""]
    out += [f"- {line}" for line in headline(run, baseline)]
    out += ["", "## Tables", ""]
    calib = {row["table"]: row for row in run.get("calibration") or []}
    table_raw, table_sent = s.get("table_raw_bytes", {}), s.get("table_sent_bytes", {})
    names = _table_order(set(table_raw) | set(calib) | set(run.get("table_bounds") or {}))
    if names:
        cands = list(next(iter(calib.values()))["ratio"]) if calib else []
        out.append(
            "| table | class | bound | final bound x m(t) | homogenization index | ratio over the run |"
            + "".join(f" ratio @ {c} |" for c in cands)
        )
        out.append("|---|---|---:|---:|---:|---:|" + "---:|" * len(cands))
        final_eps = run.get("final_effective_bounds") or {}
        for n in names:
            c = calib.get(n, {})
            raw, sent = table_raw.get(n, 0), table_sent.get(n, 0)
            ratio = f"{raw / sent:.1f}x" if sent else "-"
            bound = (run.get("table_bounds") or {}).get(n)
            h = c.get("homogenization_index")
            out.append(
                f"| {n} | {(run.get('classes') or {}).get(n, '-')} | {bound if bound is not None else '-'} |"
                f" {final_eps.get(n, '-')} | {'-' if h is None else f'{h:.3f}'} | {ratio} |"
                + "".join(f" {c['ratio'][k]:.1f} |" if c else " - |" for k in cands)
            )
    else:
        out.append("No compressed table was measured.")
    out += [
        "",
        "## Time split (per training batch, mean over ranks)",
        "",
        "| encode | exchange | decode | backward | all-to-all share |",
        "|---:|---:|---:|---:|---:|",
        f"| {s['encode_ms']:.2f} ms | {s['exchange_ms']:.2f} ms | {s['decode_ms']:.2f} ms | {s['backward_ms']:.2f} ms |"
        f" {s['a2a_s'] / s['train_s'] if s.get('train_s') else 0.0:.1%} |",
        "",
        "Byte and codec-time counters include validation exchanges; the share counts training batches only.",
    ]
    if plots:
        out += ["", "## Plots", ""]
        titles = {"ratio": "Compression ratio per table", "bounds": "Bound schedule", "bytes": "Bytes per step",
                  "quality": "Loss and AUC"}
        for key, file in plots.items():
            out += [f"![{titles[key]}]({file})", ""]
    return "\n".join(out).rstrip() + "\n"


# Tables the ratio and bound plots name one by one in their legends (Criteo's 26 and a little more).
MAX_NAMED_TABLES = 40


def _table_style(table: str, k: int, count: int) -> dict[str, Any]:
    """How table ``k`` of ``count`` is drawn: its own line and legend entry up to :data:`MAX_NAMED_TABLES`, beyond
    that a thin grey line, the first of them standing for all in the legend."""
    if count <= MAX_NAMED_TABLES:
        return {"label": table}
    return {"color": "0.6", "alpha": 0.4, "label": f"each of {count} tables" if k == 0 else None}


def _plot(run: dict[str, Any], log_dir: Path, baseline: dict[str, Any] | None = None) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_dlac.adaptive import DecaySchedule  # here, not at the top: `dlac report --help` stays instant

    history = run.get("history") or []
    if not history:
        return {}
    written: dict[str, str] = {}
    keys = set().union(*(row.keys() for row in history))
    tables = _table_order([k.split("/", 2)[2] for k in keys if k.startswith("dlac/ratio/")])

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(log_dir / PLOTS[name], dpi=110)
        plt.close(fig)
        written[name] = PLOTS[name]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, t in enumerate(tables):
        ax.plot(*_series(history, f"dlac/ratio/{t}"), linewidth=1, **_table_style(t, k, len(tables)))
    ax.plot(*_series(history, "dlac/ratio"), color="black", linewidth=2.5, label="all tables")
    ax.set(xlabel="training batch", ylabel="raw / sent bytes", title="Forward all-to-all compression ratio",
           yscale="log")
    ax.legend(fontsize=6, ncol=3 if 10 < len(tables) <= MAX_NAMED_TABLES else 1, loc="best")
    save(fig, "ratio")

    # The schedule is a function of the batch: draw it exactly, not only at the metrics writes.
    m = DecaySchedule(**run["schedule"])
    steps = list(range(max(run["summary"]["batches"], 1)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.step(steps, [m(t) for t in steps], where="post", color="black")
    top.set(ylabel="m(t)", title="Iteration-wise multiplier m(t) and each table's effective bound")
    bounds, start = run.get("table_bounds") or {}, run.get("calibrated_at")
    default, cap = run.get("default_eps") or 0.01, run.get("max_eps") or 0.5
    for k, t in enumerate(_table_order(bounds) or ["all tables"]):
        eps = [min((bounds.get(t, default) if start is not None and i >= start else default) * m(i), cap)
               for i in steps]
        bottom.step(steps, eps, where="post", linewidth=1, **_table_style(t, k, len(bounds)))
    if start is not None and start > 0:
        bottom.axvline(start, color="grey", linestyle=":", label="calibrated")
    bottom.set(xlabel="training batch", ylabel="effective eps")
    bottom.legend(fontsize=6, ncol=3 if 10 < len(bounds) <= MAX_NAMED_TABLES else 1, loc="best")
    save(fig, "bounds")

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(*_series(history, "dlac/raw_bytes_per_step"), label="float32 (uncompressed)")
    ax.plot(*_series(history, "dlac/sent_bytes_per_step"), label="sent")
    ax.set(xlabel="training batch", ylabel="bytes per step (all ranks)", title="Forward all-to-all bytes per step",
           yscale="log")
    ax.legend()
    save(fig, "bytes")

    loss = _series(history, "train/loss")
    auc = _series(history, "val/auroc")
    ref_history = baseline["history"] if baseline is not None else []
    ref_loss, ref_auc = _series(ref_history, "train/loss"), _series(ref_history, "val/auroc")
    if loss[0] or auc[0] or ref_loss[0] or ref_auc[0]:
        fig, ax = plt.subplots(figsize=(8, 4))
        handles = []
        if loss[0]:
            handles += ax.plot(*loss, color="tab:blue", label="train/loss")
        if ref_loss[0]:
            handles += ax.plot(*ref_loss, color="tab:blue", linestyle="--", alpha=0.7, label="train/loss (baseline)")
        ax.set_ylabel("train/loss")
        ax.set_xlabel("training batch")
        if auc[0] or ref_auc[0]:
            ax2 = ax.twinx()
            if auc[0]:
                handles += ax2.plot(*auc, color="tab:orange", marker="o", label="val/auroc")
            if ref_auc[0]:
                handles += ax2.plot(*ref_auc, color="tab:orange", marker="x", linestyle="--", alpha=0.7,
                                    label="val/auroc (baseline)")
            ax2.set_ylabel("val/auroc")
        if baseline is not None:
            ax.legend(handles=handles, fontsize=7, loc="best")
        title = "Training loss and validation AUC"
        ax.set_title(title + (f" (dashed: baseline {Path(baseline['name']).name})" if baseline is not None else ""))
        save(fig, "quality")
    return written


def save_run(run: dict[str, Any], log_dir: str | Path) -> Path:
    """Write ``run`` (plain data: what ``DLACCallback.run_summary`` returns) as ``dlac_run.json`` into ``log_dir``
    (created if missing) and the report made from it; return the report's path."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / RUN_FILE).write_text(json.dumps(run, indent=1))
    return write_report(log_dir)


def write_report(log_dir: str | Path, plots: bool = True, baseline: str | Path | None = None) -> Path:
    """Write ``dlac_report.md`` (and the PNG plots) into ``log_dir`` from its ``dlac_run.json``; return the
    report's path.

    Args:
        log_dir: The run's log directory.
        plots: Whether to draw the PNG plots.
        baseline: Log directory of a reference run (see :func:`load_baseline`) whose loss and AUROC curves the
            plots overlay and whose final metrics the headline compares with.
    """
    log_dir = Path(log_dir)
    run_file = log_dir / RUN_FILE
    if not run_file.is_file():
        raise FileNotFoundError(
            f"{run_file} does not exist: point at the log directory of a run trained with DLACCallback (the"
            " directory that holds its metrics, e.g. logs/dlrm_synthetic/version_0)."
        )
    run = json.loads(run_file.read_text())
    ref = load_baseline(baseline) if baseline is not None else None
    written = _plot(run, log_dir, ref) if plots else {}
    path = log_dir / REPORT_FILE
    path.write_text(_markdown(run, written, ref))
    return path
