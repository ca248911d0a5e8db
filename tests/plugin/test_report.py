"""The compression report against a baseline run (``dlac report LOG_DIR --baseline OTHER_LOG_DIR``): the baseline is
read from its dlac_run.json or its CSVLogger metrics.csv, the headline states the final differences, and the loss /
AUROC plot draws the baseline's curves beside the run's. In process, on hand-made run files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_dlac.commands.report import main
from lightning_dlac.plugin.report import REPORT_FILE, RUN_FILE, headline, load_baseline, write_report


def _run(final: dict[str, float], auc: list[float]) -> dict:
    """A dlac_run.json as DLACCallback writes it, for a 30-batch run on 2 ranks with metrics every 10 batches."""
    history = [{"batch": 10 * (i + 1), "step": 10 * (i + 1), "dlac/ratio": 20.0, "dlac/raw_bytes_per_step": 4e6,
                "dlac/sent_bytes_per_step": 2e5, "train/loss": 0.6 - 0.05 * i, "val/auroc": a}
               for i, a in enumerate(auc)]
    return {
        "mode": "homogenization", "schedule": {"kind": "step", "c": 2.0, "T": 15, "stages": 10},
        "table_bounds": {"t_cat_0": 0.05}, "classes": {"t_cat_0": "loose"}, "calibrated_at": 8,
        "calibrations": [{"at": 8, "tight": 0, "base": 0, "loose": 1}], "default_eps": 0.01, "max_eps": 0.5,
        "final_effective_bounds": {"t_cat_0": 0.05}, "calibration": [], "non_finite_tables": [],
        "summary": {"world_size": 2, "batches": 30, "raw_bytes": 120_000_000, "sent_bytes": 6_000_000,
                    "table_raw_bytes": {"t_cat_0": 120_000_000}, "table_sent_bytes": {"t_cat_0": 6_000_000},
                    "train_s": 10.0, "a2a_s": 2.0, "encode_ms": 1.0, "exchange_ms": 5.0, "decode_ms": 1.0,
                    "backward_ms": 3.0},
        "final_metrics": final, "history": history,
    }


@pytest.fixture
def compressed(tmp_path: Path) -> Path:
    d = tmp_path / "dlac"
    d.mkdir()
    (d / RUN_FILE).write_text(json.dumps(_run({"val/auroc": 0.7712, "val/loss": 0.4821, "train/loss": 0.45},
                                              [0.70, 0.75, 0.7712])))
    return d


@pytest.fixture
def uncompressed_csv(tmp_path: Path) -> Path:
    """What an uncompressed run leaves with a CSVLogger: metrics.csv only (the callback does nothing there)."""
    d = tmp_path / "fp32"
    d.mkdir()
    (d / "metrics.csv").write_text(
        "epoch,step,train/loss,val/auroc,val/loss\n"
        "0,9,0.61,,\n"
        "0,9,,0.705,0.50\n"
        "0,19,0.55,,\n"
        "0,19,,0.76,0.49\n"
        "0,29,0.449,,\n"
        "0,29,,0.7730,0.4800\n"
    )
    return d


def test_headline_states_the_final_differences_from_a_csv_baseline(compressed: Path, uncompressed_csv: Path) -> None:
    base = load_baseline(uncompressed_csv)
    assert base["final_metrics"] == {"train/loss": 0.449, "val/auroc": 0.773, "val/loss": 0.48}
    assert [r["batch"] for r in base["history"]] == [9, 9, 19, 19, 29, 29]
    run = json.loads((compressed / RUN_FILE).read_text())
    lines = headline(run, base)
    assert lines[:-1] == headline(run)  # the comparison is one more line, the rest unchanged
    assert lines[-1] == (f"vs baseline {uncompressed_csv}: val/auroc 0.7712 vs 0.7730 (-0.0018),"
                         " val/loss 0.4821 vs 0.4800 (+0.0021), train/loss 0.4500 vs 0.4490 (+0.0010)")


def test_a_dlac_run_json_baseline_is_read_from_its_run_file(compressed: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / RUN_FILE).write_text(json.dumps(_run({"val/auroc": 0.7800}, [0.71, 0.76, 0.78])))
    (other / "metrics.csv").write_text("epoch,step,val/auroc\n0,29,0.1\n")  # dlac_run.json takes precedence
    base = load_baseline(other)
    assert base["final_metrics"] == {"val/auroc": 0.78} and len(base["history"]) == 3
    run = json.loads((compressed / RUN_FILE).read_text())
    assert headline(run, base)[-1] == f"vs baseline {other}: val/auroc 0.7712 vs 0.7800 (-0.0088)"


def test_report_overlays_the_baseline_curves(compressed: Path, uncompressed_csv: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.axes

    drawn: dict[str, list] = {}
    plot = matplotlib.axes.Axes.plot

    def recording_plot(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        drawn[kwargs.get("label", "")] = list(args[0]) if args else []
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording_plot)
    path = write_report(compressed, baseline=uncompressed_csv)
    report = path.read_text()
    assert path == compressed / REPORT_FILE
    assert f"- vs baseline {uncompressed_csv}: val/auroc 0.7712 vs 0.7730 (-0.0018)" in report
    assert "![Loss and AUC](dlac_loss_auc.png)" in report
    assert (compressed / "dlac_loss_auc.png").read_bytes()[:4] == b"\x89PNG"
    # The run's curves at its metric writes, the baseline's at its logged steps.
    assert drawn["train/loss"] == [10, 20, 30] and drawn["val/auroc"] == [10, 20, 30]
    assert drawn["train/loss (baseline)"] == [9, 19, 29] and drawn["val/auroc (baseline)"] == [9, 19, 29]


def test_report_without_baseline_has_no_comparison(compressed: Path) -> None:
    report = write_report(compressed, plots=False).read_text()
    assert "vs baseline" not in report and "final metrics:" in report


def test_bad_baselines_are_named(compressed: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds neither dlac_run.json nor metrics.csv"):
        load_baseline(empty)
    (empty / "metrics.csv").write_text("epoch,step,val/auroc\n")
    with pytest.raises(ValueError, match="holds no metric rows"):
        load_baseline(empty)
    with pytest.raises(SystemExit):
        main([str(compressed), "--baseline", str(tmp_path / "missing"), "--no-plots"])
    assert "--baseline at the log directory of the reference run" in capsys.readouterr().err


def test_no_common_metric_is_said(compressed: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.csv").write_text("epoch,step,lr\n0,1,0.1\n")
    run = json.loads((compressed / RUN_FILE).read_text())
    assert headline(run, load_baseline(other))[-1] == f"vs baseline {other}: no final metric in common to compare"


def _fit_with_validation_between_writes(rank: int, world_size: int, log_dir: str) -> None:
    """12 training batches, metrics every 2, validation after batches 5 and 10 (inside metric intervals), a CSVLogger:
    the run files and the logger's metrics.csv of one real 2-rank run."""
    from lightning.pytorch.loggers import CSVLogger

    from lightning_dlac import DLACCallback
    from tests.conftest import small_data, small_dlrm, trainer

    dlac = DLACCallback(mode="off", c=1.0, log_every_n_steps=2, prog_bar=False)
    logger = CSVLogger(log_dir, name="run", version=0)
    trainer(world_size, callbacks=[dlac], logger=logger, max_steps=12, val_check_interval=5, limit_val_batches=3,
            num_sanity_val_steps=0, log_every_n_steps=2).fit(small_dlrm(), datamodule=small_data(train_batches=12))


@pytest.mark.slow
def test_plots_draw_each_series_where_it_was_measured(tmp_path: Path) -> None:
    """Validation traffic stays out of the bytes-per-step series (it used to jump where a validation fell into a
    metrics interval), and validation AUROC is a point at each validation only (it used to repeat the last value at
    every metrics write); both series equal what the logger's metrics.csv holds."""
    import csv

    from lightning_dlac.plugin.report import _series
    from lightning_dlac.testing import run_ranks

    run_ranks(_fit_with_validation_between_writes, 2, str(tmp_path), timeout=200)
    run_dir = tmp_path / "run" / "version_0"
    history = json.loads((run_dir / RUN_FILE).read_text())["history"]
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))

    def logged(key: str) -> list[tuple[int, float]]:
        return [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]

    batches, auc = _series(history, "val/auroc")
    assert batches == [5, 10], history  # after the 5th and the 10th training batch, nowhere else
    assert [round(v, 6) for v in auc] == [round(v, 6) for _, v in logged("val/auroc")]
    steps, sent = _series(history, "dlac/sent_bytes_per_step")
    assert [round(v) for v in sent] == [round(v) for _, v in logged("dlac/sent_bytes_per_step")]
    # Constant bounds and same-sized batches: the per-step bytes vary with the data only, not by whole validations.
    assert max(sent) < 1.3 * min(sent), list(zip(steps, sent))
    val_bytes = [row["dlac/val_sent_bytes"] for row in history if "dlac/val_sent_bytes" in row]
    assert len(val_bytes) == 2 and min(val_bytes) > 0.5 * max(sent), history  # counted apart, not lost


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, "bounds (homogenization): calibrated, 0 tight, 0 base, 1 loose tables (calibrated from batch 8)"),
        ({"state": "calibrated", "at": 8, "calibrations": 1}, "calibrated, 0 tight, 0 base, 1 loose tables"),
        ({"state": "constant"}, "bounds (homogenization): constant, the strategy's eps=0.01 for every table"),
        ({"state": "never_calibrated", "due": 40, "measured": 3, "needed": 8, "batches_run": 30},
         "never calibrated: calibration was due from training batch 40 (3 of its 8 batches measured) and training"
         " stopped after 30 batches"),
    ],
)
def test_the_headline_always_says_which_bounds_were_used_and_why(status: dict | None, expected: str) -> None:
    """Issue 33 (d): a run that never calibrated used to drop the bounds line; every run now has one."""
    run = _run({}, [0.7])
    if status is not None:
        run["bounds_status"] = status
    if status is not None and status["state"] != "calibrated":
        run.update(classes={}, table_bounds={}, calibrations=[])
    (line,) = [line for line in headline(run) if line.startswith("bounds (")]
    assert expected in line and line.endswith("schedule step c=2.0 T=15")


def test_the_bounds_line_says_the_rule_that_chose_them() -> None:
    from lightning_dlac import DLACCallback

    run = {**_run({}, [0.7]), "rule": DLACCallback(recalibrate_every=400).rule()}
    (line,) = [line for line in headline(run) if line.startswith("bounds (")]
    assert "chosen by at most 0.1 of the noise every table loose would add, measured again every 400 batches" in line
    assert DLACCallback(noise_budget=0.002, recalibrate_every=0).rule() == \
        "a noise budget of 0.002 of the loss's minibatch variance"
    assert DLACCallback(mode="gradient").rule() == "a gradient tolerance of 0.15"
    assert DLACCallback(mode="off").rule() is None


def test_tables_left_at_the_strategys_eps_by_a_calibration_are_counted() -> None:
    run = {**_run({}, [0.7]), "final_effective_bounds": {"t_cat_0": 0.05, "t_seq_0": 0.01}}
    (line,) = [line for line in headline(run) if line.startswith("bounds (")]
    assert "1 at the strategy's eps=0.01 (no measured loss gradient)" in line


def test_the_run_summary_records_what_the_gradient_exchange_sent() -> None:
    """``dlac estimate --from-run`` costs the backward at the run's own gradient ratio: the summary carries the
    gradient bytes, and of them those a per-peer plan sent as they are."""
    from lightning_dlac.comm import CommStats
    from lightning_dlac.plugin.metrics import CompressionMonitor

    monitor = CompressionMonitor(per_table=False, all_reduce=lambda tensor, op: tensor)
    monitor.totals = CommStats(calls=20, raw_bytes=4_000_000, sent_bytes=200_000, backward_calls=20,
                               backward_raw_bytes=4_000_000, backward_sent_bytes=1_500_000, backward_s=0.3,
                               table_backward_passed_bytes={"t_cat_0": 600_000, "t_cat_1": 400_000})
    monitor.batches = 10
    summary = monitor.summary(world_size=2)
    assert summary["backward_raw_bytes"] == 4_000_000
    assert summary["backward_sent_bytes"] == 1_500_000
    assert summary["backward_passed_bytes"] == 1_000_000  # both tables' gradients sent as they were
    assert summary["backward_ms"] == pytest.approx(0.3 / 20 * 1e3)  # per batch and rank: 15 ms
    json.dumps(summary)  # plain data, as dlac_run.json holds it


class _Group:
    """The two things CompressionMonitor asks of an ExchangeGroup, with no exchange behind them."""

    all_compressed_tables: list[str] = []

    def set_in_step(self, in_step: bool) -> None:
        pass

    def stats(self):  # noqa: ANN201
        from lightning_dlac.comm import CommStats

        return CommStats()


def test_the_run_summary_gives_the_median_training_step_of_every_rank_and_batch() -> None:
    """``step_ms``: the typical step, which a few slow ones do not pull up as they pull up the mean; it survives a
    checkpoint."""
    from lightning_dlac.plugin.metrics import CompressionMonitor

    ticks = iter([0.0, 0.1, 1.0, 1.3, 2.0, 2.2, 3.0, 3.25, 4.0, 9.0])  # batches of 0.1, 0.3, 0.2, 0.25 and 5 s
    monitor = CompressionMonitor(per_table=False, all_reduce=lambda tensor, op: tensor, clock=lambda: next(ticks))
    group = _Group()
    for written in (3, 2):  # two metric writes, after 3 and 2 batches
        for _ in range(written):
            monitor.batch_started(group)
            monitor.batch_ended(group)
        monitor.write(group, 1, lambda table: 0.01, 1.0)
    summary = monitor.summary(world_size=1)
    assert summary["step_ms"] == pytest.approx(250.0, rel=0.01)  # the median of the five, within half a 2% bin
    assert summary["train_s"] == pytest.approx(5.85)  # the mean (1.17 s) holds the one slow batch
    restored = CompressionMonitor(per_table=False, all_reduce=lambda tensor, op: tensor)
    restored.load_state_dict(monitor.state_dict())
    assert restored.summary(world_size=1)["step_ms"] == summary["step_ms"]
    assert CompressionMonitor(per_table=False, all_reduce=lambda tensor, op: tensor).summary(1)["step_ms"] is None


def test_a_many_table_run_plots_with_a_short_legend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 tables: the ratio and bound plots draw every table as a grey line under one legend entry (a legend of 200
    names pushed the axes off the figure), and name each table where there are few."""
    import warnings

    import matplotlib.axes

    legends: list[list[str]] = []
    original = matplotlib.axes.Axes.legend

    def recording_legend(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = original(self, *args, **kwargs)
        legends.append([t.get_text() for t in out.get_texts()])
        return out

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", recording_legend)
    for tables in (200, 3):
        run = _run({"val/auroc": 0.77}, [0.70, 0.75, 0.77])
        names = [f"t_cat_{k}" for k in range(tables)]
        run["table_bounds"] = dict.fromkeys(names, 0.05)
        for row in run["history"]:
            row.update({f"dlac/ratio/{n}": 20.0 + k for k, n in enumerate(names)})
        d = tmp_path / str(tables)
        d.mkdir()
        (d / RUN_FILE).write_text(json.dumps(run))
        legends.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Tight layout not applied" among them
            write_report(d)
        ratio, bounds = legends[0], legends[1]
        if tables == 200:
            assert ratio == ["each of 200 tables", "all tables"] and bounds == ["each of 200 tables", "calibrated"]
        else:
            assert ratio == [*names, "all tables"] and bounds == [*names, "calibrated"]
