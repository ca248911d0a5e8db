"""The family of worlds the table-wise level is judged on (benchmarks/lib/calibration_data.py, issue 33 item 2):
drawn from a seed alone, within the issue's ranges, development and evaluation seeds apart; the per-world judgement
and summary of ``python -m benchmarks.calibration_bench`` (benchmarks/lib/calibration_judgement.py), its resumes and
reused baselines (benchmarks/lib/calibration_resume.py), and the family frontier (``python -m
benchmarks.frontier_worlds``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import benchmarks.frontier_worlds as fw
from benchmarks.calibration_bench import main_ablation
from benchmarks.lib import calibration_arms, calibration_resume
from benchmarks.lib import calibration_data as data
from benchmarks.lib.calibration_arms import BASELINES, run_arms, run_world, training_seed
from benchmarks.lib.calibration_judgement import (
    at_step,
    curve_summary,
    fit_noise_budget,
    judge_ablation,
    judge_world,
    judge_world_entry,
    judge_world_seeds,
    noise_floor,
    rejudge,
    summarize_worlds,
)
from benchmarks.lib.calibration_resume import resumed_worlds, reused_baselines, spot_check_baselines
from benchmarks.lib.frontier import frontier
from benchmarks.lib.results import write_results
from benchmarks.render import frontier as render_frontier
from benchmarks.render.core import Results


def test_development_and_evaluation_worlds_are_apart_and_the_quick_run_evaluates() -> None:
    assert not set(data.DEV_WORLDS) & set(data.EVAL_WORLDS)
    assert len(data.EVAL_WORLDS) >= 20 and data.QUICK_EVAL_WORLDS == data.EVAL_WORLDS[:3]


def test_worlds_are_drawn_from_their_seed_within_the_issues_ranges() -> None:
    worlds = [data.draw_world(seed) for seed in (*data.DEV_WORLDS[:30], *data.EVAL_WORLDS[:30])]
    assert data.draw_world(1000) == data.draw_world(1000) and data.draw_world(1000) != data.draw_world(1001)
    for w in worlds:
        assert 8 <= len(w.tables) <= 40 and w.dim in data.DIMS and w.batch_size in data.BATCH_SIZES
        assert all(data.MIN_ROWS <= r <= data.MAX_ROWS for r in w.drawn_rows)
        assert all(data.MIN_ROWS <= t.rows <= r for t, r in zip(w.tables, w.drawn_rows))
        # The cap, give or take the tables raised back to MIN_ROWS.
        assert sum(t.rows for t in w.tables) * w.dim <= data.PARAM_CAP + len(w.tables) * data.MIN_ROWS * w.dim
        assert any(t.role == "sensitive" for t in w.tables)
    tables = [t for w in worlds for t in w.tables]
    # Every kind the issue lists occurs in the family.
    assert {t.label_model for t in tables} == set(data.LABEL_MODELS) and {t.role for t in tables} == set(data.ROLES)
    assert any(t.max_hot > 1 for t in tables) and any(t.max_hot == 1 for t in tables)
    assert any(t.zipf_alpha is None for t in tables) and any(t.zipf_alpha for t in tables)
    assert any(t.outliers for t in tables) and len({w.dim for w in worlds}) == len(data.DIMS)


def test_a_worlds_batches_are_a_function_of_seed_split_and_index() -> None:
    world = data.draw_world(data.EVAL_WORLDS[0])
    dm = data.WorldDataModule(world, num_train_batches=4, num_val_batches=2)
    a, b = dm.read_batch("train", 1), dm.read_batch("train", 1)
    assert (a.labels == b.labels).all() and (a.sparse_features.values() == b.sparse_features.values()).all()
    assert not (dm.read_batch("val", 1).dense_features == a.dense_features).all()
    lengths = a.sparse_features.lengths().view(len(world.tables), world.batch_size)
    for t, per_sample in zip(world.tables, lengths):
        assert 1 <= int(per_sample.min()) and int(per_sample.max()) <= t.max_hot
    assert set(dm.table_roles.values()) <= set(data.ROLES) and 0 < float(a.labels.mean()) < 1


def test_the_world_judgement_and_summary_follow_the_issues_interface() -> None:

    roles = {"t_f0": "sensitive", "t_f1": "robust", "t_f2": "irrelevant"}
    runs = {"uncompressed": {"val_auroc": 0.80}, "all_tight": {"val_auroc": 0.80, "sent_bytes": 100, "steps": 10},
            "all_loose": {"val_auroc": 0.79, "sent_bytes": 60, "steps": 10},
            "default": {"val_auroc": 0.7995, "sent_bytes": 70, "steps": 10, "roles": roles,
                        "table_bounds": {"t_f0": 0.01, "t_f1": 0.03, "t_f2": 0.05}}}
    w = judge_world(runs, "default")
    assert w["true_positives"] == 1 and w["flagged_count"] == 2 and w["sensitive_count"] == 1
    assert w["bytes_vs_all_tight"] == pytest.approx(0.7) and w["auroc_vs_all_tight"] == pytest.approx(-0.0005)
    worse = {**w, "auroc_vs_all_tight": -0.02, "auroc_vs_all_loose": -0.01}
    summary = summarize_worlds([{"default": w}, {"default": worse}], "default")
    assert summary == {"worlds": 2, "default_within_0001_of_all_tight": 0.5, "worse_than_all_loose": 1,
                       "recall": 1.0, "precision": 0.5, "bytes_vs_all_tight": pytest.approx(0.7)}


def test_the_noise_budget_is_fitted_by_the_p90_rule_on_development_runs() -> None:

    roles = {"t_a": "sensitive", "t_b": "robust", "t_c": "irrelevant"}
    runs = [{"world": w, "roles": roles,
             "noise_share": {"t_a": {"0.05": 5.0}, "t_b": {"0.05": 0.01 * (w + 1)}, "t_c": {"0.05": 0.001}}}
            for w in range(10)]
    fit = fit_noise_budget(runs)
    # The non-sensitive sums are 0.011, 0.021, ..., 0.101: the 9th of 10 (nearest rank) is 0.091.
    assert fit["noise_budget"] == pytest.approx(0.091) and fit["quantile"] == 0.9
    assert fit["per_world"][0]["by_role"] == {"sensitive": [5.0], "robust": [0.01], "irrelevant": [0.001]}


def test_a_training_seed_redraws_the_training_batches_and_keeps_the_validation_ones() -> None:

    world = data.draw_world(data.DEV_WORLDS[1])
    own = data.WorldDataModule(world, num_train_batches=4, num_val_batches=2)
    same = data.WorldDataModule(world, num_train_batches=4, num_val_batches=2, train_seed=0)
    other = data.WorldDataModule(world, num_train_batches=4, num_val_batches=2, train_seed=1)
    assert (own.read_batch("train", 2).labels == same.read_batch("train", 2).labels).all()
    assert not (own.read_batch("train", 2).dense_features == other.read_batch("train", 2).dense_features).all()
    assert (own.read_batch("val", 1).dense_features == other.read_batch("val", 1).dense_features).all()
    # Seed 0 keeps the runs taken before training seeds existed; the others start from their own weights.
    assert training_seed(7, 0) == 7
    assert len({training_seed(7, k) for k in range(4)}) == 4 and training_seed(7, 1) < 1 << 31


def _seed_runs(tight: float, deltas: dict[str, float], roles: dict[str, str]) -> dict[str, dict]:
    """One training seed's runs of a world: all-tight's AUROC, every other arm's as a difference to it."""
    runs = {"all_tight": {"val_auroc": tight, "sent_bytes": 100, "steps": 10}}
    for v, d in deltas.items():
        runs[v] = {"val_auroc": tight + d, "sent_bytes": 50 if v == "all_loose" else 70, "steps": 10, "roles": roles,
                   "table_bounds": {"t_f0": 0.01, "t_f1": 0.05}}
    return runs


def test_the_noise_floor_is_read_from_paired_differences_and_judges_a_world() -> None:

    roles = {"t_f0": "sensitive", "t_f1": "irrelevant"}
    # Three seeds whose AUROC levels differ by 0.02 (an unpaired spread) while the paired differences to all-tight
    # move by +-0.001 about each arm's own mean (uncompressed +0.002, all-loose -0.010, default -0.0005).
    wobble = (-0.001, 0.0, 0.001)
    by_seed = [_seed_runs(0.80 + 0.02 * k, {"uncompressed": 0.002 + w, "all_loose": -0.010 - w, "default": -0.0005 + w,
                                            "noise": -0.0005 - w}, roles) for k, w in enumerate(wobble)]
    floor = noise_floor(by_seed)
    # Each comparison's deviations are -0.001, 0, +0.001: pooled sd 0.001 (8 degrees of freedom), so the floor is
    # 2 * 0.001 / sqrt(3); the 0.02 spread of the levels and the arms' own means do not count.
    assert floor["train_seeds"] == 3 and floor["paired_sd"] == pytest.approx(0.001)
    assert floor["floor"] == pytest.approx(2 * 0.001 / 3**0.5)
    assert floor["paired_differences"]["all_loose"] == pytest.approx([-0.009, -0.010, -0.011])
    w = judge_world_seeds(by_seed, "default", floor["floor"])
    assert w["auroc_vs_all_tight"] == pytest.approx(-0.0005) and w["auroc_vs_all_loose"] == pytest.approx(0.0095)
    assert w["auroc_vs_all_tight_per_seed"] == pytest.approx([-0.0015, -0.0005, 0.0005])
    parted = [dict(r) for r in by_seed]
    third = parted[2]
    parted[2] = {**third, "default": {**third["default"], "val_auroc": third["all_tight"]["val_auroc"] + 0.03}}
    moved = judge_world_seeds(parted, "default")
    assert moved["auroc_vs_all_tight"] == pytest.approx(0.0093333, abs=1e-6)  # one parted seed moves the mean
    assert moved["auroc_vs_all_tight_median"] == pytest.approx(-0.0005)  # and not the median
    assert w["within_noise"] == {"auroc_vs_all_tight": True, "auroc_vs_all_loose": False,
                                 "auroc_vs_uncompressed": False}
    # Flags are counted under every seed: recall and precision pool over seeds as over worlds.
    assert (w["true_positives"], w["flagged_count"], w["sensitive_count"]) == (3, 3, 3)
    assert w["bytes_vs_all_tight"] == pytest.approx(0.7) and w["flagged"] == ["t_f0"]
    # One seed has no spread to read: no floor, and nothing said about noise.
    assert noise_floor(by_seed[:1])["floor"] is None
    assert judge_world_seeds(by_seed[:1], "default")["within_noise"] is None

    # The summary keeps the issue's keys and reads every world against max(0.001, its floor).
    noisy = {**w, "auroc_vs_all_tight": -0.003, "auroc_vs_all_loose": -0.002}
    worlds = [{"default": w, "noise_floor": floor}, {"default": noisy, "noise_floor": {"floor": 0.004}}]
    s = summarize_worlds(worlds, "default")
    assert s["default_within_0001_of_all_tight"] == 0.5 and s["worse_than_all_loose"] == 1
    assert s["within_floor_of_all_tight"] == 1.0 and s["worse_than_all_loose_beyond_floor"] == 0
    assert s["worlds_floor_within_0001"] == 0 and s["noise_floor_median"] == pytest.approx((floor["floor"] + 0.004) / 2)
    # Worlds without a floor (one seed, or results taken before floors) give the issue's summary alone.
    assert "noise_floor_median" not in summarize_worlds([{"default": w}], "default")


def test_the_ablation_judges_each_table_by_what_its_loose_bound_alone_costs() -> None:
    """Issue 33's definition of a sensitive table (a loose bound on it alone costs >= 0.001 AUROC), measured per
    table against all-tight under paired seeds, and the planted roles checked against it."""

    def seed(tight: float, a: float, b: float, loose: float) -> dict:
        return {"all_tight": {"val_auroc": tight}, "all_loose": {"val_auroc": loose},
                "loose:t_f0": {"val_auroc": a}, "loose:t_f1": {"val_auroc": b}}

    # t_f0 costs 0.003 under both seeds, t_f1 0.0002 and 0.0004: planted t_f1 sensitive disagrees with the ablation.
    by_seed = [seed(0.80, 0.797, 0.7998, 0.790), seed(0.81, 0.807, 0.8096, 0.800)]
    out = judge_ablation(by_seed, {"t_f0": "robust", "t_f1": "sensitive"})
    costs = {t["table"]: t for t in out["tables"]}
    assert costs["t_f0"]["cost"] == pytest.approx(0.003) and costs["t_f0"]["sensitive_by_ablation"]
    assert costs["t_f1"]["cost"] == pytest.approx(0.0003) and not costs["t_f1"]["sensitive_by_ablation"]
    assert out["disagreements"] == ["t_f0", "t_f1"] and out["all_loose_cost"] == pytest.approx(0.01)
    # The floor pools the paired spread of every arm: only t_f1's pair differs (0.0002 vs 0.0004).
    assert out["floor"] == pytest.approx(2 * (0.0001 * 2**0.5 / 3**0.5) / 2**0.5)
    # t_f1's cost is real (beyond the floor) but under 0.001: not sensitive by the issue's definition.
    assert costs["t_f0"]["beyond_floor"] and costs["t_f1"]["beyond_floor"]
    by_seed[1]["loose:t_f1"]["val_auroc"] = 0.8104  # now it gains under one seed: its cost is within the floor
    out = judge_ablation(by_seed, {"t_f0": "robust", "t_f1": "sensitive"})
    assert [t["beyond_floor"] for t in out["tables"]] == [True, False]
    assert "default" not in out  # no default arm ran


def test_the_default_beside_an_ablation_is_judged_against_both_yardsticks() -> None:
    """Run beside the ablation's arms, the default's flags count against the tables the ablation finds sensitive
    and against the planted ones, pooled over seeds."""

    def seed(default_bounds: dict, default_auroc: float) -> dict:
        sent = {"all_tight": 100, "default": 70}
        return {"all_tight": {"val_auroc": 0.80, "sent_bytes": sent["all_tight"], "steps": 10},
                "all_loose": {"val_auroc": 0.79},
                "loose:t_f0": {"val_auroc": 0.797}, "loose:t_f1": {"val_auroc": 0.7998},
                "loose:t_f2": {"val_auroc": 0.8001},
                "default": {"val_auroc": default_auroc, "sent_bytes": sent["default"], "steps": 10,
                            "table_bounds": default_bounds}}

    # Ablation: t_f0 sensitive only. Planted: t_f1 sensitive only. Seed 0 flags t_f0 and t_f1, seed 1 t_f0.
    by_seed = [seed({"t_f0": 0.01, "t_f1": 0.02, "t_f2": 0.05}, 0.7995), seed({"t_f0": 0.005, "t_f1": 0.05}, 0.8003)]
    d = judge_ablation(by_seed, {"t_f0": "irrelevant", "t_f1": "sensitive", "t_f2": "robust"})["default"]
    assert d["flagged"] == [["t_f0", "t_f1"], ["t_f0"]]
    assert d["ablation"] == {"recall": 1.0, "precision": 2 / 3} and d["planted"] == {"recall": 0.5, "precision": 1 / 3}
    assert d["auroc_vs_all_tight"] == pytest.approx(-0.0001) and d["bytes_vs_all_tight"] == pytest.approx(0.7)


def test_learning_curves_are_read_at_a_step_and_summarized_against_a_reference() -> None:
    """The settle protocol's evidence: an arm's AUROC read off its curve at a fixed run's length (its last value if
    it stopped before), and the curves of a world's arms side by side."""

    fast = {"variant": "uncompressed", "val_auroc": 0.95, "curve": [(500, 0.90), (1000, 0.94), (1500, 0.95)]}
    slow = {"variant": "all_tight", "val_auroc": 0.95, "curve": [(500, 0.80), (1000, 0.85), (1500, 0.93),
                                                                (2000, 0.95)]}
    read = at_step([{"uncompressed": fast, "all_tight": slow}], 1000)[0]
    assert read["uncompressed"]["val_auroc"] == 0.94 and read["all_tight"]["val_auroc"] == 0.85
    assert at_step([{"a": fast}], 4000)[0]["a"]["val_auroc"] == 0.95  # stopped (settled) before 4000
    assert fast["val_auroc"] == 0.95  # the runs themselves are not changed
    summary = curve_summary({"uncompressed": fast, "all_tight": slow}, "uncompressed")
    assert summary["steps"] == [500, 1000, 1500]  # the validations both arms had
    assert summary["difference"]["all_tight"] == pytest.approx([-0.10, -0.09, -0.02])
    assert summary["last_tenth_gain"] == pytest.approx({"uncompressed": 0.01, "all_tight": 0.08})


@pytest.mark.slow
def test_a_settling_arm_stops_at_the_first_validation_that_gains_too_little() -> None:
    """--settle on 2 gloo ranks: with a gain no validation can reach, an arm stops at its second validation and
    says it settled; its AUROC is its curve's last point."""

    from lightning_dlac.testing import run_ranks

    cfg = dict(world=data.DEV_WORLDS[30], train_seed=0, steps=60, val_batches=4, lr=0.015, val_every=10,
               settle=True, settle_delta=1.0)
    r = run_ranks(run_world, 2, "all_tight", cfg, timeout=300)[0]
    assert r["settled"] and r["steps"] == 20 and [s for s, _ in r["curve"]] == [10, 20]
    assert r["val_auroc"] == r["curve"][-1][1]
    capped = run_ranks(run_world, 2, "all_tight", dict(cfg, steps=20, settle_delta=0.0), timeout=300)[0]
    assert r["curve"][0] == capped["curve"][0]  # validating along the way leaves the run as it was


def test_a_long_world_run_resumes_from_its_own_file_and_refuses_another(tmp_path: Path) -> None:
    """--resume keeps the worlds an earlier part of the same protocol wrote, records that part in the metadata, and
    refuses a file written under other options or holding a world the run does not plan."""

    path = tmp_path / "worlds.json"
    cfg = dict(worlds="eval", seeds=[1000, 1001, 1002], steps=6000, settle=True, variants=["uncompressed"])
    assert resumed_worlds(path, cfg, {}) == ([], [])  # nothing yet: a fresh run
    runs = [{"variant": "uncompressed", "train_seed": 0, "val_auroc": 0.9}]
    first = {"command": "python first.py", "git_commit": "abc", "date": "2026-12-05T02:00:00+00:00"}
    write_results(path, first, dict(cfg, seeds=[1000]), runs, per_world=[{"world": 1000}])

    metadata: dict = {}
    per_world, kept = resumed_worlds(path, cfg, metadata)
    assert per_world == [{"world": 1000}] and kept == runs
    earlier = metadata["resumed_from"][0]
    assert earlier["command"] == "python first.py" and earlier["worlds"] == [1000]
    with pytest.raises(SystemExit, match="steps differ"):
        resumed_worlds(path, dict(cfg, steps=1000), {})
    with pytest.raises(SystemExit, match=r"worlds \[1000\]"):
        resumed_worlds(path, dict(cfg, seeds=[1001, 1002]), {})


def test_a_new_variant_is_judged_against_the_baselines_of_an_earlier_run(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--baselines-from takes the three baseline arms of every world (and every training seed) an earlier run of the
    same protocol wrote, marks where they came from, and refuses a file of another protocol; a world missing a
    baseline under any seed runs all of its arms again."""

    path = tmp_path / "earlier.json"
    cfg = dict(worlds="eval", seeds=[1000, 1001], steps=6000, settle=True, train_seeds=2,
               variants=["uncompressed", "all_tight", "all_loose", "default"], default_mode="noise")
    runs = [{"variant": v, "world": w, "train_seed": k, "val_auroc": 0.9 + 0.01 * k, "steps": 100}
            for w in (1000, 1001) for k in (0, 1) for v in (*BASELINES, "default")]
    runs = [r for r in runs if not (r["world"] == 1001 and r["train_seed"] == 1 and r["variant"] == "all_loose")]
    earlier = {"command": "python earlier.py", "git_commit": "abc", "date": "2026-12-05T02:00:00+00:00",
               "cpu": "Intel Xeon", "resumed_from": [{"command": "python first.py", "worlds": [1000]}]}
    write_results(path, earlier, dict(cfg, default_mode="gradient"), runs,
                  per_world=[{"world": 1000}, {"world": 1001}])

    metadata: dict = {"cpu": "Intel Xeon"}
    reused = reused_baselines(path, dict(cfg, variants=["uncompressed", "all_tight", "all_loose", "noise"]),
                                    metadata)
    assert sorted(reused) == [1000] and sorted(reused[1000]) == [0, 1]  # 1001 lacks all-loose under seed 1
    assert sorted(reused[1000][1]) == sorted(BASELINES)  # the earlier default is not a baseline
    assert reused[1000][1]["all_tight"]["val_auroc"] == 0.91 and reused[1000][1]["all_tight"]["reused_from"] == "abc"
    assert metadata["baselines_from"]["git_commit"] == "abc" and metadata["baselines_from"]["worlds"] == [1000]
    # The first part did not record its processor: its world is spot-checked before anything is reused.
    assert metadata["baselines_from"]["unrecorded_cpu_worlds"] == [[1000]]
    with pytest.raises(SystemExit, match="steps differ"):
        reused_baselines(path, dict(cfg, steps=1000), {"cpu": "Intel Xeon"})
    with pytest.raises(SystemExit, match="one kind of processor only"):  # runs repeat on one processor only
        reused_baselines(path, cfg, {"cpu": "AMD EPYC"})

    # run_arms launches only what is not given, and keeps the pairing per training seed.
    launched = []

    def fake_run_ranks(fn, n, variant, run_cfg, timeout):  # noqa: ANN001, ANN202
        launched.append((variant, run_cfg["train_seed"]))
        return [{"variant": variant, "val_auroc": 0.5, "sent_bytes": 1, "steps": 1, "seconds": 0.0}]

    monkeypatch.setattr(calibration_arms, "run_ranks", fake_run_ranks)
    by_seed = run_arms(cfg, 1000, (*BASELINES, "default"), range(2), 10.0, given=reused[1000])
    assert launched == [("default", 0), ("default", 1)]
    assert [by_variant["all_tight"]["val_auroc"] for by_variant in by_seed] == [0.9, 0.91]
    assert list(by_seed[0]) == [*BASELINES, "default"]

    # The spot check reruns world 1000's uncompressed arm: the same figures pass (and are recorded), others refuse.
    launched.clear()
    monkeypatch.setattr(calibration_resume, "run_ranks", lambda fn, n, variant, run_cfg, timeout: [
        {"val_auroc": 0.9, "steps": 100}])
    assert spot_check_baselines(cfg, reused, metadata, 10.0) == reused
    assert metadata["baselines_from"]["spot_checks"][0]["same"] and \
        metadata["baselines_from"]["spot_checks"][0]["world"] == 1000
    # A part that reruns differently ran elsewhere: its worlds are not reused (every arm of them runs here).
    monkeypatch.setattr(calibration_resume, "run_ranks",
                        lambda fn, n, variant, run_cfg, timeout: [{"val_auroc": 0.8, "steps": 1}])
    assert spot_check_baselines(cfg, reused, metadata, 10.0) == {}
    assert metadata["baselines_from"]["dropped_worlds"] == [1000] and metadata["baselines_from"]["worlds"] == []
    # A part whose worlds a resumed file already holds is not checked: nothing of it is still to run.
    monkeypatch.setattr(calibration_resume, "run_ranks",
                        lambda *a, **k: pytest.fail("spot-checked a world already done"))
    assert spot_check_baselines(cfg, reused, metadata, 10.0, done=[1000]) == reused


def test_the_family_frontier_judges_each_world_as_the_criteo_frontier_and_counts_the_worlds() -> None:
    """benchmarks.frontier_worlds: each world's rows go through benchmarks/lib/frontier.py's frontier() unchanged, and
    the summary counts, over worlds, where each target holds and which qcomm points a DLAC point dominates."""

    def rows(world: int, default_auroc: float, mx4_auroc: float, mx4_bytes: int) -> list[dict]:
        points = {"uncompressed": (0.80, 1000), "constant 0.01": (0.80, 120), "DLAC default": (default_auroc, 80),
                  "qcomm MX4/MX4": (mx4_auroc, mx4_bytes)}
        return [{"dataset": f"world {world}", "variant": v, "seed": s, "val_auroc": a + s * 0.01, "steps": 10,
                 "fwd_sent_bytes": b * 10, "bwd_sent_bytes": b * 10} for v, (a, b) in points.items() for s in (0, 1)]

    # World 1: MX4 loses 0.002 at more bytes than either DLAC point: dominated by both. World 2: MX4 sends fewer
    # bytes than constant 0.01 and more than the default, which loses 0.005 to it: not dominated; the default is
    # still on the frontier (nothing at its bytes or fewer beats it).
    per_world = [{"world": w, "frontier": frontier(rows(w, d, m, b))[0]}
                 for w, d, m, b in ((1, 0.80, 0.798, 150), (2, 0.795, 0.80, 100))]
    s = fw.summarize(per_world)
    assert s["worlds"] == 2 and s["qcomm_dominated"] == {"qcomm MX4/MX4": {"worlds": 1, "of": 2}}
    assert s["every qcomm point dominated within noise by a DLAC point"] == 0.5
    assert s["the default on or near the frontier"] == 1.0  # nothing with fewer bytes than the default beats it
    assert s["default_delta_median"] == pytest.approx(-0.0025)
    assert s["default_fwd_bytes_vs_fewest_qcomm_median"] == pytest.approx((80 / 150 + 80 / 100) / 2)
    assert set(fw.ARMS.values()) >= {"uncompressed", "constant 0.002", "constant 0.005", "constant 0.01",
                                     "constant 0.03", "constant 0.05", "DLAC default", "qcomm MX4/MX4"}


def test_bytes_are_judged_per_batch_and_a_file_is_judged_again_from_its_runs(tmp_path: Path) -> None:
    """Settled arms stop after different numbers of batches: bytes compare per batch, not as totals. --rejudge
    recomputes a worlds file's judgement from its runs (here: a file judged by totals) and says so."""


    roles = {"t_f0": "sensitive", "t_f1": "irrelevant"}

    def run(variant: str, seed: int, auroc: float, steps: int, per_step: int, **extra) -> dict:
        return {"variant": variant, "world": 1000, "train_seed": seed, "val_auroc": auroc, "steps": steps,
                "sent_bytes": steps * per_step, "roles": roles, **extra}

    # The default sends 70 bytes a batch against all-tight's 100, but stopped after half as many batches.
    runs = [r for seed in (0, 1) for r in (
        run("uncompressed", seed, 0.90, 4000, 0), run("all_tight", seed, 0.90 + seed * 1e-4, 4000, 100),
        run("all_loose", seed, 0.89, 4000, 50),
        run("default", seed, 0.8995, 2000, 70, table_bounds={"t_f0": 0.01, "t_f1": 0.05}))]
    by_seed = [{r["variant"]: r for r in runs if r["train_seed"] == seed} for seed in (0, 1)]
    assert judge_world(by_seed[0], "default")["bytes_vs_all_tight"] == pytest.approx(0.7)
    cfg = {"worlds": "eval", "seeds": [1000], "variants": [*BASELINES, "default"], "steps": 4000}
    entry = judge_world_entry(1000, by_seed, cfg["variants"], cfg)
    stale = json.loads(json.dumps(entry))
    stale["default"]["bytes_vs_all_tight"] = 0.35  # what totals said
    path = tmp_path / "worlds.json"
    path.write_text(json.dumps({"metadata": {"git_commit": "abc", "date": "then"}, "config": cfg, "results": runs,
                                "per_world": [stale], "summary": summarize_worlds([stale], "default")}))
    data = rejudge(path, {"git_commit": "def", "git_dirty": False, "date": "now"})
    assert data["per_world"][0]["default"]["bytes_vs_all_tight"] == pytest.approx(0.7)
    assert data["summary"]["bytes_vs_all_tight"] == pytest.approx(0.7) and data["summary"]["recall"] == 1.0
    assert json.loads(json.dumps(data["per_world"][0])) == json.loads(json.dumps(entry))  # the rest unchanged
    assert data["metadata"] == {"git_commit": "abc", "date": "then"} and data["results"] == runs
    assert data["rejudged"] == [{"commit": "def", "git_dirty": False, "date": "now"}]


def test_an_ablation_writes_every_arm_as_it_ends_and_resume_runs_only_the_rest(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A settled ablation is tens of launches: each is written as it ends, and --resume launches only the arms the
    file lacks, then judges all of them."""
    import argparse


    tables = [f"t_f{i}" for i in range(len(data.draw_world(30).tables))]
    launched: list[tuple[str, int]] = []

    def fake_run_ranks(fn, n, variant, cfg, timeout):  # noqa: ANN001, ANN202
        if len(launched) == 5 and not cfg.get("_resumed"):
            raise RuntimeError("the machine went away")
        launched.append((variant, cfg["train_seed"]))
        return [{"variant": variant, "world": 30, "train_seed": cfg["train_seed"], "val_auroc": 0.8, "steps": 10,
                 "sent_bytes": 100, "seconds": 1.0, "roles": dict.fromkeys(tables, "irrelevant"),
                 "table_bounds": dict.fromkeys(tables, 0.05)}]

    monkeypatch.setattr(calibration_arms, "run_ranks", fake_run_ranks)
    out = tmp_path / "ablation.json"
    args = argparse.Namespace(ablate=30, steps=10, val_batches=8, lr=None, train_seeds=2, settle=False,
                              val_every=None, timeout=10.0, resume=False, json_out=out)
    with pytest.raises(RuntimeError, match="went away"):
        main_ablation(args, {"git_commit": "abc", "date": "2026-12-05T00:00:00+00:00"})
    partial = json.loads(out.read_text())
    assert partial["incomplete"] and len(partial["results"]) == 5 and "ablation" not in partial
    first = list(launched)
    launched.clear()
    monkeypatch.setattr(calibration_arms, "run_ranks", lambda fn, n, variant, cfg, timeout: fake_run_ranks(
        fn, n, variant, dict(cfg, _resumed=True), timeout))
    main_ablation(argparse.Namespace(**{**vars(args), "resume": True}),
                  {"git_commit": "def", "date": "2026-12-05T01:00:00+00:00"})
    done = json.loads(out.read_text())
    arms = 2 * (3 + len(tables))  # all-tight, all-loose, the default and every table, under both seeds
    assert len(first) + len(launched) == arms and not set(first) & set(launched)
    assert len(done["results"]) == arms and "incomplete" not in done and done["ablation"]["tables"]
    assert done["metadata"]["resumed_from"][0]["git_commit"] == "abc"


def _frontier_launch(world: int, arm: str, train_seed: int) -> dict:
    """A made-up launch of frontier_worlds.run_arm: MX4 below uncompressed and all-tight, each seed a little above
    the last, every arm its own forward bytes."""

    auroc = {"uncompressed": 0.9, "all_tight": 0.9, "qcomm:MX4/MX4": 0.898}[arm] + 0.001 * train_seed
    per_step = {"uncompressed": 100, "all_tight": 20, "qcomm:MX4/MX4": 30}[arm]
    return {"dataset": f"world {world}", "world": world, "variant": fw.ARMS[arm], "arm": arm, "seed": train_seed,
            "val_auroc": auroc, "steps": 10, "seconds": 1.0, "fwd_sent_bytes": 10 * per_step,
            "bwd_sent_bytes": 10 * per_step}


def test_the_family_frontier_grows_its_seeds_running_only_the_launches_its_file_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks.frontier_worlds --resume with a larger --train-seeds keeps every launch the file holds, runs each arm
    under the new seeds only, and judges every world again over all its seeds; a run stopped partway says so in its
    file; a codec TorchRec cannot run is listed once per launch not made; a smaller count is refused (runs would be
    dropped), and a file already holding every planned launch runs nothing."""


    arms = ("uncompressed", "all_tight", "qcomm:MX4/MX4", "qcomm:FP8/FP8")
    worlds = list(data.EVAL_WORLDS[:2])
    launched: list[tuple[int, str, int]] = []
    stop_at: list[tuple[int, int]] = []  # (world, seed) whose launch stops the run, as a lost rank would

    def run_arm(cfg: dict, world: int, arm: str, train_seed: int, timeout: float) -> dict:
        if (world, train_seed) in stop_at:
            raise RuntimeError("a rank was lost")
        launched.append((world, arm, train_seed))
        if arm == "qcomm:FP8/FP8":
            raise RuntimeError("Tensor 'input' must have 2 dimension(s)")
        return _frontier_launch(world, arm, train_seed)

    monkeypatch.setattr(fw, "run_arm", run_arm)
    monkeypatch.setattr(fw, "start_run", lambda module, args: {"command": f"python -m {module}", "git_commit": "abc",
                                                                     "date": "2026-12-05T19:00:00+00:00"})
    out = tmp_path / "frontier.json"

    def main(seeds: int) -> dict:
        monkeypatch.setattr(sys, "argv", ["frontier_worlds", "--count", "2", "--train-seeds", str(seeds),
                                          "--arms", ",".join(arms), "--resume", "--json-out", str(out)])
        fw.main()
        return json.loads(out.read_text())

    def launches(seeds: tuple[int, ...]) -> list[tuple[int, str, int]]:
        return sorted((w, a, s) for w in worlds for a in arms[:3] for s in seeds)

    first = main(1)
    assert sorted(x for x in launched if "FP8" not in x[1]) == launches((0,))
    assert [x for x in launched if "FP8" in x[1]] == [(worlds[0], "qcomm:FP8/FP8", 0)]  # launched once, never again
    launched.clear()
    stop_at.append((worlds[1], 1))  # the grown run stops in the second world
    with pytest.raises(RuntimeError, match="lost"):
        main(3)
    stopped = json.loads(out.read_text())
    assert stopped["config"]["train_seeds"] == 1 and stopped["config"]["train_seeds_planned"] == 3

    (tmp_path / "shown").mkdir()
    (tmp_path / "shown" / render_frontier.FAMILY_FRONTIER_FILE).write_text(json.dumps(stopped))
    text = "\n".join(render_frontier.frontier_worlds(Results(tmp_path / "shown")))
    assert "1 or more paired training seeds each (3 planned: a run adding seeds stopped" in text
    rows = {line.split(" | ")[0]: line.split(" | ")[2] for line in text.splitlines() if line.startswith("| 10")}
    assert rows == {f"| {worlds[0]}": "3", f"| {worlds[1]}": "1"}  # each world says how many seeds judged it
    stop_at.clear()
    launched.clear()
    grown = main(3)
    assert sorted(launched) == sorted((worlds[1], a, s) for a in arms[:3] for s in (1, 2))  # only what it lacked
    assert grown["results"][:len(first["results"])] == first["results"]  # the file's launches kept as they were
    assert [w["world"] for w in grown["per_world"]] == worlds
    assert grown["config"]["train_seeds"] == 3 and "train_seeds_planned" not in grown["config"]
    for w in grown["per_world"]:
        (mx4,) = w["frontier"]["pairs"]
        assert [c["seeds"] for c in mx4["candidates"]] == [3]  # judged over all three seeds
    (fp8,) = grown["failed"]
    skipped = [(w, s) for w in worlds for s in range(3) if (w, s) != (worlds[0], 0)]
    assert sorted(map(tuple, fp8["not_launched"])) == skipped  # each launch not made, once
    assert [(part["train_seeds"], part.get("train_seeds_planned")) for part in grown["metadata"]["resumed_from"]] \
        == [(1, None), (1, 3)]  # the first run's seed, then the part that stopped on its way to three
    launched.clear()
    assert main(3)["results"] == grown["results"] and launched == []  # nothing left to run
    with pytest.raises(SystemExit, match="train_seeds differ"):
        main(2)


def test_the_family_frontier_keeps_a_stopped_worlds_launches_as_each_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks.frontier_worlds writes its file once a world is judged; each launch is kept in a log beside it as it
    finishes, so a run stopped mid-world resumes with only the launches it had not made (and records the stopped
    run), a launch cut off mid-line runs again, a run stopped between its last launch and the write only writes;
    a log from another configuration or another kind of processor is refused, and a run without --resume
    discards it."""


    arms = ("uncompressed", "all_tight", "qcomm:MX4/MX4")
    world = data.EVAL_WORLDS[0]
    launched: list[tuple[str, int]] = []
    stop_at: list[tuple[str, int]] = []  # the launch that stops the run, as a lost rank would
    cpu = ["Intel(R) Xeon(R) Processor"]

    def run_arm(cfg: dict, world: int, arm: str, train_seed: int, timeout: float) -> dict:
        if (arm, train_seed) in stop_at:
            raise RuntimeError("a rank was lost")
        launched.append((arm, train_seed))
        return _frontier_launch(world, arm, train_seed)

    monkeypatch.setattr(fw, "run_arm", run_arm)
    monkeypatch.setattr(fw, "start_run", lambda module, args: {"command": f"python -m {module}", "git_commit": "abc",
                                                                     "date": "2026-12-06T01:00:00+00:00",
                                                                     "cpu": cpu[0]})
    out = tmp_path / "frontier.json"
    log = tmp_path / "frontier.launches.jsonl"

    def main(*extra: str, resume: bool = True) -> None:
        monkeypatch.setattr(sys, "argv", ["frontier_worlds", "--count", "1", "--train-seeds", "2", "--arms",
                                          ",".join(arms), "--json-out", str(out), *(["--resume"] if resume else []),
                                          *extra])
        fw.main()

    main(resume=False)  # the reference: one run that is never stopped
    whole = json.loads(out.read_text())
    assert not log.exists() and len(launched) == 6
    out.unlink()
    launched.clear()
    stop_at.append(("all_tight", 1))  # after seed 0's three launches and seed 1's uncompressed
    with pytest.raises(RuntimeError, match="lost"):
        main()
    assert not out.exists() and [json.loads(line).get("launch", {}).get("arm") for line in
                                 log.read_text().splitlines()] == [None, *arms, "uncompressed"]
    stop_at.clear()
    launched.clear()
    main()
    assert launched == [("all_tight", 1), ("qcomm:MX4/MX4", 1)]  # only what the stopped run had not made
    resumed = json.loads(out.read_text())
    assert resumed["results"] == whole["results"] and resumed["per_world"] == whole["per_world"]
    assert resumed["metadata"]["resumed_from"] == [
        {"command": "python -m benchmarks.frontier_worlds", "git_commit": "abc", "date": "2026-12-06T01:00:00+00:00",
         "cpu": cpu[0], "launches": 4, "worlds": [world]}]
    assert not log.exists()  # every launch it held is in the file
    (tmp_path / "shown").mkdir()
    (tmp_path / "shown" / render_frontier.FAMILY_FRONTIER_FILE).write_text(json.dumps(resumed))
    assert (f"It keeps (`--resume`) the 4 launches of worlds [{world}] that the run of commit abc,"
            " 2026-12-06T01:00:00+00:00, made before it stopped") in render_frontier.frontier_worlds(
                Results(tmp_path / "shown"))[0]

    # Stopped as it wrote its last launch: that launch runs again, the others are kept.
    out.unlink()
    launched.clear()
    stop_at.append(("qcomm:MX4/MX4", 1))
    with pytest.raises(RuntimeError, match="lost"):
        main()
    log.write_text(log.read_text() + '{"launch": {"world": ')
    stop_at.clear()
    launched.clear()
    main()
    assert launched == [("qcomm:MX4/MX4", 1)] and "last line was cut off" in capsys.readouterr().out
    assert json.loads(out.read_text())["results"] == whole["results"]

    # Stopped after its last launch, before writing the file: the resumed run only judges and writes.
    out.unlink()
    launched.clear()
    write = fw.write_results
    monkeypatch.setattr(fw, "write_results", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        main()
    monkeypatch.setattr(fw, "write_results", write)
    launched.clear()
    main()
    assert launched == [] and json.loads(out.read_text())["results"] == whole["results"] and not log.exists()

    # A log made under other options, or on another kind of processor, is refused; without --resume it is discarded.
    stop_at.append(("all_tight", 0))
    with pytest.raises(RuntimeError, match="lost"):
        main(resume=False)
    stop_at.clear()
    with pytest.raises(SystemExit, match="steps differ"):
        main("--steps", "7")
    cpu[0] = "AMD EPYC 9654"
    with pytest.raises(SystemExit, match="was made on 'Intel.*this run is on 'AMD EPYC 9654'"):
        main()
    launched.clear()
    main(resume=False)
    assert "discarding 1 launches an earlier run left" in capsys.readouterr().out and len(launched) == 6
    assert not log.exists()


def test_a_frontier_launch_keeps_what_reads_an_unsettled_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    """frontier_worlds.run_arm: bytes summed over the ranks (each counts what it sends), rank 0's AUROC, and its
    validation curve and bounds kept: an arm that reaches the cap unsettled is read from where the cap caught it."""

    curve = [[500, 0.84], [1000, 0.85], [1500, 0.91]]

    def run_ranks(fn, n: int, arm: str, cfg: dict, timeout: float) -> list[dict]:
        assert n == 2 and cfg["world"] == 1002 and cfg["train_seed"] == 4 and cfg["traffic"]
        return [{"val_auroc": 0.91, "steps": 1500, "seconds": 9.0, "settled": False, "curve": curve,
                 "table_bounds": {"t_f0": 0.05}, "fwd_raw_bytes": 40, "fwd_sent_bytes": 10 * (rank + 1),
                 "bwd_raw_bytes": 40, "bwd_sent_bytes": 20} for rank in range(n)]

    monkeypatch.setattr(fw, "run_ranks", run_ranks)
    row = fw.run_arm({"steps": 6000}, 1002, "default", 4, 60.0)
    assert row["variant"] == "DLAC default" and row["fwd_sent_bytes"] == 30 and row["bwd_sent_bytes"] == 40
    assert row["curve"] == curve and row["table_bounds"] == {"t_f0": 0.05} and row["settled"] is False
