"""The family of worlds the table-wise level is judged on (benchmarks/calibration_data.py, issue 33 item 2): drawn
from a seed alone, within the issue's ranges, development and evaluation seeds apart; and the bench's per-world
judgement and summary (benchmarks/calibration_bench.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import calibration_data as data  # noqa: E402 - benchmarks/ is not a package


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
    import calibration_bench as bench

    roles = {"t_f0": "sensitive", "t_f1": "robust", "t_f2": "irrelevant"}
    runs = {"uncompressed": {"val_auroc": 0.80}, "all_tight": {"val_auroc": 0.80, "sent_bytes": 100},
            "all_loose": {"val_auroc": 0.79, "sent_bytes": 60},
            "default": {"val_auroc": 0.7995, "sent_bytes": 70, "roles": roles,
                        "table_bounds": {"t_f0": 0.01, "t_f1": 0.03, "t_f2": 0.05}}}
    w = bench.judge_world(runs, "default")
    assert w["true_positives"] == 1 and w["flagged_count"] == 2 and w["sensitive_count"] == 1
    assert w["bytes_vs_all_tight"] == pytest.approx(0.7) and w["auroc_vs_all_tight"] == pytest.approx(-0.0005)
    worse = {**w, "auroc_vs_all_tight": -0.02, "auroc_vs_all_loose": -0.01}
    summary = bench.summarize_worlds([{"default": w}, {"default": worse}], "default")
    assert summary == {"worlds": 2, "default_within_0001_of_all_tight": 0.5, "worse_than_all_loose": 1,
                       "recall": 1.0, "precision": 0.5, "bytes_vs_all_tight": pytest.approx(0.7)}


def test_the_noise_budget_is_fitted_by_the_p90_rule_on_development_runs() -> None:
    import calibration_bench as bench

    roles = {"t_a": "sensitive", "t_b": "robust", "t_c": "irrelevant"}
    runs = [{"world": w, "roles": roles,
             "noise_share": {"t_a": {"0.05": 5.0}, "t_b": {"0.05": 0.01 * (w + 1)}, "t_c": {"0.05": 0.001}}}
            for w in range(10)]
    fit = bench.fit_noise_budget(runs)
    # The non-sensitive sums are 0.011, 0.021, ..., 0.101: the 9th of 10 (nearest rank) is 0.091.
    assert fit["noise_budget"] == pytest.approx(0.091) and fit["quantile"] == 0.9
    assert fit["per_world"][0]["by_role"] == {"sensitive": [5.0], "robust": [0.01], "irrelevant": [0.001]}
