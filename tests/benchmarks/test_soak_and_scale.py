"""The soak's sampler and judgement, the cluster-shape benchmark's launch and figures, and the figures' fingerprints
(benchmarks/lib/soak.py, benchmarks/lib/cluster_scale.py, benchmarks/render/figures.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.lib import cluster_scale, soak
from benchmarks.render.core import Results
from benchmarks.render.figures import fingerprint, stale, write_figure
from benchmarks.render.reliability import FIGURES
from benchmarks.render.reliability import soak as soak_block

# ------------------------------------------------------------------------------------------------------------ soak


def _rank(rank: int, rss_per_step: float = 0.0, fds_step: int | None = None, slow_after: int | None = None,
          busy_after: int | None = None) -> dict:
    """A rank's measurements over 4,000 steps: 100 MB of memory growing by ``rss_per_step``, 20 files (one more
    from ``fds_step``), steps of 10 ms CPU time (12 ms from ``slow_after``) with a 2 s checkpoint every 500 steps,
    their wall time the same at a load average of 1, or twice it (load 3) from ``busy_after``."""
    steps = 4000
    cpu = [0.012 if slow_after is not None and k >= slow_after else 0.010 for k in range(steps)]
    busy = [busy_after is not None and k >= busy_after for k in range(steps)]
    wall = [c * (2 if b else 1) for c, b in zip(cpu, busy)]
    marked = list(range(500, steps, 500))
    for k in marked:
        wall[k - 1] = cpu[k - 1] = 2.0
    samples = [{"step": s, "rss": int(100e6 + rss_per_step * s), "fds": 20 + (fds_step is not None and s >= fds_step),
                "threads": 6, "load": 3.0 if busy_after is not None and s >= busy_after else 1.0}
               for s in range(0, steps + 1, 100)]  # fmt: skip
    return {"rank": rank, "step_s": wall, "step_cpu_s": cpu, "marked": marked, "samples": samples}


def test_theil_sen_ignores_a_few_outliers_that_a_least_squares_fit_would_follow() -> None:
    xs = list(range(20))
    ys = [2.0 * x + 1 for x in xs]
    ys[5], ys[17] = 500.0, -300.0
    assert soak.theil_sen(xs, ys) == pytest.approx(2.0)


def test_flat_runs_meet_every_target_and_a_leak_or_a_slowdown_or_an_open_file_misses_its_own() -> None:
    flat = soak.judge([_rank(0), _rank(1)], warmup=1000)
    assert [t["met"] for t in flat["targets"]] == [True, True, True, True, True], flat["targets"]
    # The checkpoint steps are marked and left out: the step time is the 10 ms of the others.
    assert flat["per_rank"][0]["step_cpu_s"]["median"] == pytest.approx(0.010)

    leak = soak.judge([_rank(0, rss_per_step=500.0), _rank(1)], warmup=1000)  # +5 MB per 10k steps on 100 MB
    assert leak["per_rank"][0]["rss"]["growth"] == pytest.approx(0.05, rel=0.05)
    assert [t["met"] for t in leak["targets"]] == [False, True, True, True, True]
    slower = soak.judge([_rank(0), _rank(1, slow_after=2500)], warmup=1000)
    assert [t["met"] for t in slower["targets"]] == [True, False, False, True, True]
    opened = soak.judge([_rank(0, fds_step=3000), _rank(1)], warmup=1000)
    assert [t["met"] for t in opened["targets"]] == [True, True, True, False, True]
    assert opened["targets"][3]["values"] == [1, 0]


def test_a_busier_machine_slows_the_wall_time_but_not_the_judged_cpu_time() -> None:
    busy = soak.judge([_rank(0, busy_after=2500), _rank(1, busy_after=2500)], warmup=1000)
    cpu, wall = busy["targets"][1], busy["targets"][2]
    assert cpu["met"] is True and max(wall["values"]) > 0.5
    assert wall["met"] is None and wall["not_judged"] == (
        "the machine's load average varied from 1.0 to 3.0 (median 3.0)"
    )
    assert "| step wall time growth after warm-up < 2% per 10,000 steps |" in "\n".join(soak.table(busy))


def test_the_sampler_times_steps_marks_checkpoints_and_reads_this_process() -> None:
    sampler = soak.Sampler(every=2)
    trainer = SimpleNamespace(global_step=0)
    for step in range(1, 6):
        trainer.global_step = step
        sampler.on_train_batch_end(trainer)
        if step == 2:  # Lightning saves after the other callbacks' batch-end hooks: the save counts in step 3's time
            sampler.on_save_checkpoint()
    out = sampler.result(0)
    # step_s[k] is step k + 2's time (from step k + 1's end); marked names step_s index + 1, as step_windows reads it.
    assert len(out["step_s"]) == 4 and out["marked"] == [2]
    assert [s["step"] for s in out["samples"]] == [2, 4]
    proc = out["samples"][0]
    assert proc["rss"] > 10 * 2**20 and proc["fds"] >= 3 and proc["threads"] >= 1


def _soak_results(directory: Path) -> Results:
    ranks = [_rank(0), _rank(1, rss_per_step=10.0)]
    judgement = soak.judge(ranks, warmup=1000)
    data = {"metadata": {"command": "python -m benchmarks.soak", "git_commit": "0" * 40, "date": "2026-12-07",
                         "cores": 2, "cpu": "test", "versions": {}},
            "config": {"steps": 4000, "warmup": 1000, "checkpoint_every": 500, "epoch_batches": 2000,
                       "batch_size": 256, "calibration_start": 500, "recalibrate_every": 2500, "world_size": 2,
                       "model": "the demo's"},
            "results": [{"rank": r["rank"], "samples": r["samples"], "marked_steps": len(r["marked"]),
                         "step_windows": soak.step_windows(r["step_s"], r["marked"]),
                         "step_cpu_windows": soak.step_windows(r["step_cpu_s"], r["marked"])} for r in ranks],
            "judgement": judgement, "targets": judgement["targets"],
            "outcome": {"steps": [4000, 4000], "report_written": True, "checkpoints": ["last.ckpt"]}}  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "soak.json").write_text(json.dumps(data))
    return Results(directory)


def test_the_soak_block_and_its_figure_come_from_the_results_file(tmp_path: Path) -> None:
    results = _soak_results(tmp_path / "results")
    text = "\n".join(soak_block(results))
    assert "4,000 training steps on 2 ranks" in text and "the report was written" in text
    assert "| resident memory growth after warm-up < 2% per 10,000 steps | +0.00%, +0.10% | **met** |" in text
    assert "| step CPU time growth after warm-up < 2% per 10,000 steps | +0.00%, +0.00% | **met** |" in text
    figure = FIGURES["docs/figures/soak.svg"]
    svg = tmp_path / "soak.svg"
    assert stale(figure, results, svg) == "missing"
    write_figure(figure, results, svg)
    assert stale(figure, results, svg) is None
    assert fingerprint(results, figure.files) in svg.read_text()
    # Drawn twice from the same file: the same bytes (no date, fixed hash salt).
    again = tmp_path / "again.svg"
    write_figure(figure, results, again)
    assert again.read_bytes() == svg.read_bytes()
    # Another results file: the committed figure is stale.
    other = _soak_results(tmp_path / "other")
    data = json.loads((tmp_path / "other" / "soak.json").read_text())
    data["config"]["warmup"] = 500
    (tmp_path / "other" / "soak.json").write_text(json.dumps(data))
    assert stale(figure, Results(tmp_path / "other"), svg) == "drawn from other results files"
    shutil.copy(svg, tmp_path / "plain.svg")
    (tmp_path / "plain.svg").write_text(svg.read_text().replace("sha256", "sha-256"))
    assert stale(figure, other, tmp_path / "plain.svg") == "carries no fingerprint of its results files"


# ----------------------------------------------------------------------------------------------- cluster shape


@pytest.mark.slow  # a real 2-rank launch (about 20 s here)
def test_one_launch_alternates_dlac_and_a_ceiling_that_sends_dlac_s_bytes() -> None:
    from benchmarks.lib.launch import run_ranks

    cfg = dict(tables=5, rows=500, dim=8, batch_size=64, eps=0.01, warmup=1, block=2, repeats=2)
    per_rank = run_ranks(cluster_scale.scale_rank, 2, cfg, timeout=240)
    assert per_rank[0]["kinds"] == ["warmup", "dlac", "dlac", "ceiling", "ceiling", "ceiling", "ceiling", "dlac",
                                    "dlac"]  # fmt: skip
    for r in per_rank:
        blocks = {b["index"]: b for b in r["blocks"]}
        assert [blocks[i]["kind"] for i in sorted(blocks)] == ["warmup", "dlac", "ceiling", "dlac"]
        # The ceiling's block sends, per exchange, the bytes per exchange of the DLAC block before it.
        # (Both repeats' ceiling blocks follow each other: one block of 4 exchanges.)
        dlac, ceiling = blocks[1], blocks[2]
        assert (dlac["calls"], ceiling["calls"]) == (2, 4)
        for key in ("sent_bytes", "backward_sent_bytes"):
            assert ceiling[key] / 4 == pytest.approx(dlac[key] / 2, rel=0.01), (key, dlac, ceiling)
        assert dlac["encode_s"] > 0 and dlac["raw_bytes"] > 5 * dlac["sent_bytes"] > 0
    row = cluster_scale.summarize(2, 5, per_rank, cfg)
    assert row["chunks_per_exchange"] == 5  # every table, to the one peer
    assert 5 < row["total_ratio"] and 0 < row["metadata_share"] < 0.5
    assert len(row["of_ceiling_per_repeat"]) == 2 and row["of_ceiling"] > 0


def _row(world: int, tables: int, ratio: float, of_ceiling: list[float]) -> dict:
    return {"world_size": world, "tables": tables, "total_ratio": ratio,
            "of_ceiling": sorted(of_ceiling)[len(of_ceiling) // 2], "of_ceiling_per_repeat": of_ceiling}


def test_the_targets_compare_500_tables_at_16_ranks_with_26_tables_and_with_the_ceiling() -> None:
    met = cluster_scale.targets([_row(16, 26, 10.0, [0.9, 0.9]), _row(16, 500, 9.5, [0.86, 0.9, 0.88])])
    assert [t["met"] for t in met] == [True, True] and met[0]["pooled"] == pytest.approx(0.95)
    missed = cluster_scale.targets([_row(16, 26, 10.0, [0.9]), _row(16, 500, 8.5, [0.8, 0.9, 0.7])])
    assert [t["met"] for t in missed] == [False, False]
    # A ratio 10% above the 26-table one misses as surely as one below (within 10%, both ways).
    assert not cluster_scale.targets([_row(16, 26, 10.0, [0.9]), _row(16, 500, 11.5, [0.9])])[0]["met"]
    assert cluster_scale.targets([_row(8, 26, 10.0, [0.9])]) == []  # nothing at 16 ranks: nothing judged
