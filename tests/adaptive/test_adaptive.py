"""The error-bound policy (lightning_dlac.adaptive): schedules, calibration statistics, classification, and the
calibrator's state machine, all without processes."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dlac.adaptive import (
    Calibration,
    CalibrationSettings,
    CalibrationStats,
    Calibrator,
    ClassBounds,
    DecaySchedule,
    HomogenizationThresholds,
    ProbeBounds,
    TableClass,
    TableStats,
    class_table_bounds,
    classify,
    homogenization_counts,
    homogenization_index,
    sensitivity_classes,
    sensitivity_table_bounds,
    value_homogenization_counts,
    value_homogenization_index,
)
from lightning_dlac.codec import decode, encode

# ---------------------------------------------------------------------------------------------------- schedules


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # T = 100, c = 2: (t, m(t))
        ("step", {0: 2.0, 9: 2.0, 10: 1.9, 55: 1.5, 99: 1.1, 100: 1.0, 10_000: 1.0}),
        ("linear", {0: 2.0, 25: 1.75, 50: 1.5, 99: 1.01, 100: 1.0}),
        ("log", {0: 2.0, 100: 1.0, 500: 1.0}),
        ("constant", {0: 2.0, 50: 2.0, 99: 2.0, 100: 1.0}),
    ],
)
def test_schedule_values_at_chosen_steps(kind: str, expected: dict[int, float]) -> None:
    m = DecaySchedule(kind, c=2.0, T=100)
    for t, value in expected.items():
        assert m(t) == pytest.approx(value, abs=1e-12), (kind, t)


def test_log_schedule_falls_fast_then_slowly() -> None:
    m = DecaySchedule("log", c=2.0, T=100)
    assert m(9) == pytest.approx(2.0 - math.log(10) / math.log(101))
    assert m(9) < DecaySchedule("linear", c=2.0, T=100)(9)  # most of the decay happens early
    values = [m(t) for t in range(101)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_step_schedule_has_the_requested_plateaus_and_c_one_is_off() -> None:
    m = DecaySchedule("step", c=3.0, T=40, stages=4)
    assert sorted({m(t) for t in range(40)}, reverse=True) == [3.0, 2.5, 2.0, 1.5]
    kinds = ("step", "linear", "log", "constant")
    assert all(DecaySchedule(k, c=1.0, T=10)(t) == 1.0 for k in kinds for t in range(12))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "cosine"}, "schedule='cosine' is not supported"),
        ({"T": 0}, "T=0 must be a positive"),
        ({"T": -5}, "T=-5 must be a positive"),
        ({"T": 2.5}, "T=2.5 must be a positive whole number"),
        ({"c": 0.5}, "c=0.5 must be >= 1"),
        ({"c": float("nan")}, "must be a finite number"),
        ({"stages": 0}, "stages=0 must be a positive"),
    ],
)
def test_invalid_schedules_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecaySchedule(**kwargs)


# ---------------------------------------------------------------------------------------------------- statistics


def test_homogenization_counts_merge_vectors_within_one_bin() -> None:
    # Range 0..1, eps 0.05: bins are 0.1 wide. Rows 0 and 1 differ by 0.001 (merge), row 2 is far away.
    chunk = torch.tensor([[0.5, 0.5], [0.501, 0.5], [0.0, 1.0], [1.0, 0.0]])
    assert homogenization_counts(chunk, 0.05) == (4, 3)
    assert homogenization_index(chunk, 0.05) == pytest.approx(0.75)
    # A tight enough bound keeps them apart.
    assert homogenization_counts(chunk, 1e-4) == (4, 4)
    # Duplicates count once on both sides; constant and empty chunks are trivially homogeneous.
    assert homogenization_counts(torch.cat([chunk, chunk]), 0.05) == (4, 3)
    assert homogenization_counts(torch.ones(5, 3), 0.05) == (1, 1)
    assert homogenization_counts(torch.zeros(0, 3), 0.05) == (0, 0)
    assert homogenization_index(torch.zeros(0, 3), 0.05) == 1.0


def test_observe_measures_what_the_codec_sends() -> None:
    gen = torch.Generator().manual_seed(0)
    chunks = [torch.randn(32, 8, generator=gen) for _ in range(3)]
    stats = CalibrationStats([0.01, 0.05], index_eps=0.05)
    for c in chunks:
        stats.observe("t", c)
    s = stats.tables["t"]
    assert s.chunks == 3 and s.elements == 3 * 32 * 8
    assert s.min == pytest.approx(min(float(c.min()) for c in chunks))
    assert s.max == pytest.approx(max(float(c.max()) for c in chunks))
    for i, eps in enumerate((0.01, 0.05)):
        assert s.encoded_bytes[i] == sum(encode(c, eps=eps).numel() for c in chunks)
    assert s.ratios()[0.05] > s.ratios()[0.01] > 1
    counts = [homogenization_counts(c, 0.05) for c in chunks]
    assert (s.distinct_raw, s.distinct_quantized) == tuple(map(sum, zip(*counts)))
    counts = [value_homogenization_counts(c, 0.05) for c in chunks]
    assert (s.distinct_raw_values, s.distinct_quantized_values) == tuple(map(sum, zip(*counts)))
    assert s.homogenization_index == s.distinct_quantized_values / s.distinct_raw_values


def test_value_homogenization_counts_merge_values_within_one_bin_per_column() -> None:
    # Column 0: -1, 0, 0.001, 1 (0 and 0.001 share a bin at eps 0.05); column 1: four values far apart.
    chunk = torch.tensor([[-1.0, -1.0], [0.0, -0.3], [0.001, 0.3], [1.0, 1.0]])
    assert value_homogenization_counts(chunk, 0.05) == (8, 7)
    assert value_homogenization_index(chunk, 0.05) == pytest.approx(7 / 8)
    # No two whole rows share every bin, so the paper's vector index sees nothing to merge.
    assert homogenization_counts(chunk, 0.05) == (4, 4)
    assert value_homogenization_counts(torch.cat([chunk, chunk]), 0.05) == (8, 7)  # repeats are not distinct
    assert value_homogenization_counts(torch.ones(5, 3), 0.05) == (3, 3)
    assert value_homogenization_counts(torch.zeros(0, 3), 0.05) == (0, 0)
    assert value_homogenization_index(torch.zeros(0, 3), 0.05) == 1.0
    # Many distinct values crowd into 1 / (2 eps) bins: a diverse table has a low index even when rows differ.
    diverse = torch.randn(512, 16, generator=torch.Generator().manual_seed(0))
    assert value_homogenization_index(diverse, 0.03) < 0.1 and homogenization_index(diverse, 0.03) == 1.0


def test_non_finite_chunks_are_counted_and_sent_raw() -> None:
    stats = CalibrationStats([0.01], index_eps=0.01)
    x = torch.randn(4, 4)
    x[1, 2] = float("nan")
    stats.observe("t", x)
    s = stats.tables["t"]
    assert s.non_finite_chunks == 1 and s.encoded_bytes == [64] and s.distinct_raw == 0
    assert s.homogenization_index == 1.0


def test_sensitivity_is_the_rms_relative_loss_change() -> None:
    stats = CalibrationStats([0.01, 0.05], index_eps=0.05)
    stats.record_loss("t", 2.0, [2.0, 2.2])
    stats.record_loss("t", 1.0, [1.0, 0.9])  # the signed changes cancel: their mean says nothing about the table
    s = stats.tables["t"]
    rms = math.sqrt((0.2**2 + 0.1**2) / 2) / 1.5
    assert s.sensitivity() == pytest.approx({0.01: 0.0, 0.05: rms})
    assert s.mean_loss_change() == pytest.approx({0.01: 0.0, 0.05: 0.1 / 3.0})
    assert CalibrationStats([0.01], 0.01).table("u").sensitivity() is None
    # Statistics saved before the squares were kept (no loss_delta_sq) fall back to |mean change| / mean loss.
    old = s.as_dict()
    del old["loss_delta_sq"], old["distinct_raw_values"], old["distinct_quantized_values"]
    assert TableStats.from_dict(old).sensitivity() == pytest.approx({0.01: 0.0, 0.05: 0.1 / 3.0})
    with pytest.raises(ValueError, match="one probed loss per candidate"):
        stats.record_loss("t", 1.0, [1.0])


def test_statistics_reduce_across_ranks_through_tensors() -> None:
    """Two ranks' statistics summed (min/max-ed) as the all-reduce does give the statistics of all the chunks."""
    gen = torch.Generator().manual_seed(1)
    a, b, both = (CalibrationStats([0.01, 0.03], 0.03) for _ in range(3))
    chunks_a = [("t0", torch.randn(16, 4, generator=gen)), ("t1", torch.rand(16, 4, generator=gen) * 9)]
    chunks_b = [("t1", torch.randn(8, 4, generator=gen) - 5), ("t2", torch.randn(16, 4, generator=gen))]
    for name, c in chunks_a:
        a.observe(name, c)
        both.observe(name, c)
    for name, c in chunks_b:
        b.observe(name, c)
        both.observe(name, c)
    a.record_loss("t0", 1.0, [1.1, 1.2])
    b.record_loss("t0", 3.0, [3.0, 3.3])
    both.record_loss("t0", 1.0, [1.1, 1.2])
    both.record_loss("t0", 3.0, [3.0, 3.3])
    names = ["t0", "t1", "t2", "t3"]  # t3 exists nowhere: it must stay empty, not break the reduction
    ta, tb = a.to_tensors(names), b.to_tensors(names)
    reduced = {
        "sum": ta["sum"] + tb["sum"],
        "min": torch.minimum(ta["min"], tb["min"]),
        "max": torch.maximum(ta["max"], tb["max"]),
    }
    a.load_tensors(names, reduced)
    for name in ("t0", "t1", "t2"):
        got, want = a.tables[name].as_dict(), both.tables[name].as_dict()
        assert got.pop("loss_delta") == pytest.approx(want.pop("loss_delta"))
        assert got.pop("loss_delta_sq") == pytest.approx(want.pop("loss_delta_sq"))
        assert got.pop("base_loss") == pytest.approx(want.pop("base_loss"))
        assert got == want, name
    assert a.tables["t3"].chunks == 0 and a.tables["t3"].homogenization_index == 1.0


def test_table_stats_round_trip_as_plain_data() -> None:
    s = TableStats((0.01, 0.05), chunks=3, elements=99, min=-1.0, max=2.0, distinct_raw=7, distinct_quantized=5,
                   encoded_bytes=[40, 20], probes=2, base_loss=1.5, loss_delta=[0.0, 0.1])
    assert TableStats.from_dict(s.as_dict()) == s
    assert s.value_range == 3.0 and s.homogenization_index == pytest.approx(5 / 7)


@pytest.mark.parametrize("candidates", [[], [0.05, 0.01], [0.01, 0.01], [0.0, 0.1], [1.5]])
def test_invalid_candidates_are_rejected(candidates: list[float]) -> None:
    with pytest.raises(ValueError):
        CalibrationStats(candidates, 0.01)


# ---------------------------------------------------------------------------------------------------- classes


def _stats_with_index(h: float, probes: dict[float, float] | None = None) -> TableStats:
    s = TableStats((0.01, 0.03, 0.05), distinct_raw=1000, distinct_quantized=round(1000 * h))
    if probes:
        s.probes, s.base_loss = 1, 1.0
        s.loss_delta = [probes[e] for e in s.candidates]
    return s


def test_classification_by_homogenization_index() -> None:
    stats = {
        "diverse_merged": _stats_with_index(0.38),  # the bound erases differences: tight
        "edge_tight": _stats_with_index(0.899),
        "edge_base": _stats_with_index(0.9),
        "middle": _stats_with_index(0.95),
        "edge_loose": _stats_with_index(0.99),
        "kept_apart": _stats_with_index(1.0),  # every vector stays distinct: loose
        "unseen": TableStats((0.01, 0.03, 0.05)),
    }
    classes = classify(stats, HomogenizationThresholds(0.9, 0.99))
    assert classes == {
        "diverse_merged": TableClass.TIGHT,
        "edge_tight": TableClass.TIGHT,
        "edge_base": TableClass.BASE,
        "middle": TableClass.BASE,
        "edge_loose": TableClass.LOOSE,
        "kept_apart": TableClass.LOOSE,
        "unseen": TableClass.LOOSE,
    }
    bounds = class_table_bounds(classes, ClassBounds(0.01, 0.03, 0.05))
    assert bounds["diverse_merged"] == 0.01 and bounds["middle"] == 0.03 and bounds["kept_apart"] == 0.05


def test_sensitivity_choice_takes_the_largest_safe_prefix() -> None:
    stats = {
        "robust": _stats_with_index(1.0, {0.01: 0.0, 0.03: 1e-4, 0.05: -5e-4}),
        "fragile": _stats_with_index(1.0, {0.01: 2e-3, 0.03: 5e-3, 0.05: 9e-3}),
        "middle": _stats_with_index(1.0, {0.01: 1e-4, 0.03: 8e-4, 0.05: 3e-3}),
        # 0.03 hurts; 0.05 looking fine is noise and must not be picked over it.
        "noisy": _stats_with_index(1.0, {0.01: 1e-4, 0.03: 4e-3, 0.05: 1e-4}),
        "unprobed": _stats_with_index(1.0),
    }
    chosen = sensitivity_table_bounds(stats, tolerance=1e-3)
    assert chosen == {"robust": 0.05, "fragile": 0.01, "middle": 0.03, "noisy": 0.01}
    classes = sensitivity_classes(chosen, ClassBounds())
    assert classes == {"robust": "loose", "fragile": "tight", "middle": "base", "noisy": "tight"}
    with pytest.raises(ValueError, match="sensitivity_tolerance=0 must be > 0"):
        sensitivity_table_bounds(stats, tolerance=0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ClassBounds(0.05, 0.03, 0.01), "tight_eps <= base_eps <= loose_eps"),
        (lambda: ClassBounds(-0.01, 0.03, 0.05), "tight_eps=-0.01 is out of range"),
        (lambda: ClassBounds(0.01, 0.03, float("inf")), "loose_eps=inf must be a finite number"),
        (lambda: HomogenizationThresholds(0.99, 0.9), "tight_below=0.99 must be <= loose_from=0.9"),
        (lambda: HomogenizationThresholds(-0.1, 0.9), "tight_below=-0.1 must be a number in"),
    ],
)
def test_invalid_class_settings_are_rejected(make, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        make()


# ---------------------------------------------------------------------------------------------------- calibrator


def _two_tables(rows: int = 64) -> dict[str, torch.Tensor]:
    """``diverse``: distinct rows crowded within one quantization bin of each other (the bound would erase their
    differences: tight); ``repeated``: 4 distinct rows whose values lie a third of the range apart in every column
    (the bound keeps them apart: loose)."""
    g = torch.Generator().manual_seed(3)
    crowd = torch.randn(1, 8, generator=g) + 1e-4 * torch.randn(rows - 2, 8, generator=g)
    levels = torch.linspace(-1.0, 1.0, 4)
    four = torch.stack([levels[torch.randperm(4, generator=g)] for _ in range(8)], dim=1)
    return {"diverse": torch.cat([torch.full((1, 8), -5.0), torch.full((1, 8), 5.0), crowd]),
            "repeated": four[torch.arange(rows) % 4]}


def test_calibrator_measures_from_calibration_start_and_applies_bounds_after_its_batches() -> None:
    settings = CalibrationSettings(mode="homogenization", batches=2, start=3, sensitivity_batches=0, index_eps=0.03)
    cal = Calibrator(settings)
    cal.begin()
    assert [cal.measuring(step) for step in range(5)] == [False, False, False, True, True]
    assert not cal.wants_probe and not cal.calibrated
    for _ in range(2):
        for name, chunk in _two_tables().items():
            cal.observe(name, chunk)
        cal.batch_measured()
    assert cal.complete
    result = cal.finish(first_batch=5, tables=["diverse", "repeated"])
    assert result == Calibration(at=5, batches=2, counts={"tight": 1, "base": 0, "loose": 1}, again=False)
    assert cal.classes == {"diverse": TableClass.TIGHT, "repeated": TableClass.LOOSE}
    assert cal.table_bounds == {"diverse": 0.01, "repeated": 0.05}
    assert cal.table_stats["repeated"].chunks == 2 and cal.calibrations == [{"at": 5, **result.counts}]
    assert not cal.measuring(6)  # no recalibration scheduled


def test_calibrator_reduces_with_the_given_all_reduce_so_ranks_agree() -> None:
    # Rank 0 saw only "diverse", rank 1 only "repeated": after the reduction both classify both tables alike.
    reduced: dict[str, torch.Tensor] = {}  # what the all-reduce returns, filled once both ranks have measured
    ranks = [Calibrator(CalibrationSettings(mode="homogenization", batches=1, sensitivity_batches=0),
                        lambda t, op: reduced[op])
             for _ in range(2)]
    tables = _two_tables()
    for cal, name in zip(ranks, tables):
        cal.begin()
        cal.observe(name, tables[name])
        cal.batch_measured()
    names = sorted(tables)
    sent = [cal._stats.to_tensors(names) for cal in ranks]
    combine = {"sum": lambda a, b: a + b, "min": torch.minimum, "max": torch.maximum}
    reduced.update({op: combine[op](sent[0][op], sent[1][op]) for op in ("sum", "min", "max")})
    for cal in ranks:
        cal.finish(0, names)
    assert ranks[0].table_bounds == ranks[1].table_bounds == {"diverse": 0.01, "repeated": 0.05}


def test_calibrator_probe_measures_each_table_at_each_candidate_off_the_exchange() -> None:
    settings = CalibrationSettings(mode="sensitivity", candidates=(0.01, 0.05), batches=1, sensitivity_batches=1,
                                   sensitivity_tolerance=0.01)
    cal = Calibrator(settings)
    cal.begin()
    seen = []

    def loss_at(bounds: ProbeBounds) -> float:
        eps = bounds.effective_many(["fragile", "sturdy"]).tolist()
        seen.append(eps)
        return 1.0 + 10.0 * eps[0] + 0.01 * eps[1]  # "fragile" changes the loss 1000x more than "sturdy"

    assert cal.wants_probe
    cal.probe(["fragile", "sturdy"], loss_at)
    assert not cal.wants_probe  # one probe batch asked for
    # Exact first, then one table at a time at each candidate, every other table exact.
    assert torch.tensor(seen).allclose(torch.tensor([[0.0, 0.0], [0.01, 0.0], [0.05, 0.0], [0.0, 0.01], [0.0, 0.05]]))
    cal.batch_measured()
    cal.finish(1, ["fragile", "sturdy"])
    assert cal.table_bounds == {"fragile": 0.01, "sturdy": 0.05}
    with pytest.raises(ValueError, match="probe bound of table 'x'"):
        ProbeBounds({"x": 1.5})


def test_calibrator_recalibrates_on_schedule_and_state_round_trips() -> None:
    settings = CalibrationSettings(mode="homogenization", batches=1, sensitivity_batches=0, recalibrate_every=10)
    cal = Calibrator(settings)
    cal.begin()
    cal.observe("diverse", _two_tables()["diverse"])
    cal.batch_measured()
    first = cal.finish(2, ["diverse"])
    assert not first.again and not cal.measuring(11) and cal.measuring(12)
    state = cal.state_dict()
    # A run restored from this state measures again when the schedule says, not at once.
    restored = Calibrator(settings)
    restored.load_state_dict(state)
    restored.begin()
    assert restored.calibrated and restored.table_bounds == cal.table_bounds
    assert not restored.measuring(11) and restored.measuring(12) and restored.state_dict() == state
    restored.observe("diverse", _two_tables()["diverse"])
    restored.batch_measured()
    assert restored.finish(13, ["diverse"]).again
    assert [c["at"] for c in restored.calibrations] == [2, 13]


def test_calibrator_skips_a_recalibration_whose_bounds_would_apply_to_no_batch() -> None:
    settings = CalibrationSettings(mode="homogenization", batches=2, sensitivity_batches=0, recalibrate_every=4)

    def calibrate(cal: Calibrator, first_batch: int) -> None:
        for _ in range(2):
            cal.observe("diverse", _two_tables()["diverse"])
            cal.batch_measured()
        cal.finish(first_batch, ["diverse"])

    ends = {}
    for end in (8, 9, None):
        cal = Calibrator(settings)
        cal.end_at(end)
        cal.begin()
        assert cal.measuring(0)  # the first calibration is always scheduled
        calibrate(cal, 2)
        ends[end] = cal.next_measurement
    # Measuring batches 6-7 would give bounds from batch 8: within a run of 9 batches, after one of 8.
    assert ends == {8: None, 9: 6, None: 6}
    # A run resumed with more batches to go schedules it again; one resumed with fewer drops it.
    cal = Calibrator(settings)
    cal.end_at(8)
    cal.begin()
    calibrate(cal, 2)
    cal.end_at(20)
    cal.begin()
    assert not cal.measuring(5) and cal.measuring(6)
    cal.end_at(7)
    cal.begin()
    assert cal.next_measurement is None and not cal.measuring(6)
    # Resumed at batch 7, past the due batch 6: it measures from 7, so within a run of 9 its bounds (from 9) are
    # too late; within one of 10 they are not.
    for end, due in ((9, None), (10, 7)):
        cal.end_at(end)
        cal.begin(7)
        assert cal.next_measurement == due and cal.end == end
    with pytest.raises(ValueError, match="batches=-1 must be a whole number >= 0"):
        cal.end_at(-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "magic"}, "mode='magic' is not supported"),
        ({"recalibrate_every": 5, "mode": "off"}, "recalibrate_every needs a calibration"),
        ({"batches": 2, "sensitivity_batches": 3}, "sensitivity_batches=3 exceeds calibration_batches=2"),
        ({"mode": "sensitivity", "sensitivity_batches": 0}, "set sensitivity_batches >= 1"),
        ({"candidates": (0.05, 0.01)}, "strictly increasing"),
        ({"index_eps": 0.0}, "index_eps=0.0 is out of range"),
    ],
)
def test_invalid_calibration_settings_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CalibrationSettings(**kwargs)


def test_mode_off_is_calibrated_from_the_start_and_never_measures() -> None:
    cal = Calibrator(CalibrationSettings(mode="off"))
    cal.begin()
    assert cal.calibrated and cal.table_bounds == {} and not cal.measuring(0)


def test_a_measurement_in_progress_survives_the_state_round_trip() -> None:
    settings = CalibrationSettings(mode="homogenization", batches=3, sensitivity_batches=1)
    tables = _two_tables()
    uninterrupted, first = Calibrator(settings), Calibrator(settings)
    for cal in (uninterrupted, first):
        cal.begin()
        cal.probe(sorted(tables), lambda bounds: 1.0)
    for batch in range(3):
        for cal in (uninterrupted, first) if batch < 2 else (uninterrupted,):
            for name, chunk in tables.items():
                cal.observe(name, chunk + batch)
            cal.batch_measured()
    state = first.state_dict()  # saved after 2 of the 3 batches
    assert state["measurement"]["seen"] == 2 and state["measurement"]["probed"] == 1
    resumed = Calibrator(settings)
    resumed.load_state_dict(state)
    resumed.begin()  # goes on with the saved measurement: no second probe, one batch to go
    assert not resumed.wants_probe and resumed.measuring(2) and not resumed.complete
    for name, chunk in tables.items():
        resumed.observe(name, chunk + 2)
    resumed.batch_measured()
    names = sorted(tables)
    expected = uninterrupted.finish(3, names)
    assert resumed.finish(3, names) == expected
    assert resumed.state_dict() == uninterrupted.state_dict()
    # Without its part of the measurement (e.g. another world size), the calibration starts over.
    fresh = Calibrator(settings)
    fresh.load_state_dict({**state, "measurement": None})
    fresh.begin()
    assert fresh.wants_probe and not fresh.calibrated


def test_calibrator_agrees_on_a_batch_count_and_checkpoints_every_ranks_measurement() -> None:
    # Two ranks simulated with scripted collectives: rank 1 has 2 calibration batches, so both measure 2.
    settings = CalibrationSettings(mode="homogenization", batches=3, sensitivity_batches=0)
    offered: list[float] = []

    def all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
        offered.append(float(t[0]))
        return torch.tensor([2.0]) if op == "min" else t

    gathered: list = []
    ranks = [Calibrator(settings, all_reduce, lambda obj: gathered) for _ in range(2)]
    assert ranks[0].agreed_batches(5) == 2 and offered == [3.0]  # a rank offers at most calibration_batches
    tables = _two_tables()
    for i, cal in enumerate(ranks):
        cal.begin()
        for name, chunk in tables.items():
            cal.observe(name, chunk + i)
        cal.batch_measured()
    gathered.extend(cal.state_dict()["measurement"] for cal in ranks)
    shared = ranks[0].shared_state_dict()
    assert shared["measurements"] == gathered and "measurement" not in shared
    for rank in range(2):  # resumed on as many ranks: each gets its own part back
        resumed = Calibrator(settings)
        assert resumed.load_shared_state_dict(shared, rank, 2)
        assert resumed.state_dict()["measurement"] == gathered[rank]
    other = Calibrator(settings)  # on another number of ranks the measurement starts over
    assert not other.load_shared_state_dict(shared, 0, 3)
    other.begin()
    assert other.state_dict()["measurement"]["seen"] == 0
    between = Calibrator(CalibrationSettings(mode="off"))  # nothing in progress: nothing is gathered
    assert between.shared_state_dict()["measurements"] is None and between.load_shared_state_dict(
        between.shared_state_dict(), 1, 4)


# ---------------------------------------------------------------------------------------------------- planted data


def _planted(roles: list[str]):  # noqa: ANN202
    from lightning_dlac.examples.planted import PlantedSensitivityGenerator

    return PlantedSensitivityGenerator(roles, rows=2000, seed=0)


def _calibrate_on_planted(mode: str, roles: list[str], tolerance: float = 1e-3,
                          index: str = "vector") -> tuple[Calibrator, list[str]]:
    """Drive a Calibrator as DLACCallback does, on the planted-sensitivity oracle: each batch's pooled embeddings
    are the observed chunks, and the probe's loss is the oracle's with the real (reference) codec's error on the
    probed table."""
    gen = _planted(roles)
    cal = Calibrator(CalibrationSettings(mode=mode, batches=2, sensitivity_batches=2, codec_impl="ref",
                                         sensitivity_tolerance=tolerance, index=index))
    cal.begin()
    for i in range(2):
        batch = gen.batch(i, batch_size=256)
        pooled = gen.pooled(batch)
        names = list(pooled)

        def loss_at(bounds: ProbeBounds, pooled=pooled, names=names, batch=batch) -> float:  # noqa: ANN001
            eps = bounds.effective_many(names).tolist()
            sent = {n: decode(encode(c, eps=e, impl="ref"), impl="ref") if e > 0 else c
                    for (n, c), e in zip(pooled.items(), eps)}
            return gen.loss(sent, batch.labels)

        assert cal.wants_probe
        cal.probe(names, loss_at)
        for name, chunk in pooled.items():
            cal.observe(name, chunk)
        cal.batch_measured()
    cal.finish(2, names)
    return cal, names


def test_sensitivity_calibration_finds_the_planted_tables() -> None:
    """Sensitive tables (signal in small differences next to large anchors) tight; noise and repeated tables
    loose. Two probe batches of 256 samples; the tolerance leaves a 2x margin over the repeated tables' loss change
    at the loosest bound (0.3-1.3e-3 at 1-2 batches, against 3e-3 and more for the sensitive tables at 0.03)."""
    roles = ["sensitive", "noise", "repeated", "sensitive", "noise", "repeated"]
    cal, names = _calibrate_on_planted("sensitivity", roles, tolerance=2e-3)
    by_role = {r: {cal.table_bounds[n] for n, rr in zip(names, roles) if rr == r} for r in set(roles)}
    assert by_role == {"sensitive": {0.01}, "noise": {0.05}, "repeated": {0.05}}
    for n, r in zip(names, roles):
        sens = cal.table_stats[n].sensitivity()
        if r == "sensitive":  # the error hurts more the looser the bound
            assert sens[0.05] > 2e-3 and sens[0.05] > sens[0.01]
        if r == "noise":  # the labels do not depend on it: the loss does not move
            assert sens[0.05] == 0.0


def test_homogenization_calibration_on_planted_tables_separates_diverse_from_repeated() -> None:
    """The per-column index puts the sensitive (diverse) tables tight and the repeated (a few well separated
    vectors) tables loose. It sees the payload only, not the labels: a diverse noise table is tight too, which
    costs bytes but no accuracy (only the sensitivity probe can tell it apart)."""
    roles = ["sensitive", "noise", "repeated", "sensitive", "noise", "repeated"]
    cal, names = _calibrate_on_planted("homogenization", roles, index="value")
    classes = {n: str(cal.classes[n]) for n in names}
    assert {classes[n] for n, r in zip(names, roles) if r == "sensitive"} == {"tight"}
    assert {classes[n] for n, r in zip(names, roles) if r == "repeated"} == {"loose"}
    assert {classes[n] for n, r in zip(names, roles) if r == "noise"} == {"tight"}


def test_calibrated_bounds_hold_the_oracle_auroc_where_all_loose_loses_it() -> None:
    """On held-out batches, the oracle model's AUROC with every table's pooled embeddings through the real codec: all
    tables at 0.05 loses about 0.02; the sensitivity calibration's bounds lose about what a constant 0.01 does
    (0.002), and send fewer bytes than it."""
    from torchmetrics.functional.classification import binary_auroc

    roles = ["sensitive", "noise", "repeated", "sensitive", "noise", "repeated"]
    cal, names = _calibrate_on_planted("sensitivity", roles, tolerance=2e-3)
    gen = _planted(roles)
    batches = [gen.batch(1000 + i, batch_size=1024) for i in range(2)]

    def sent(bounds: dict[str, float]) -> tuple[float, int]:
        logits, labels, size = [], [], 0
        for batch in batches:
            chunks = []
            for name, chunk in gen.pooled(batch).items():
                buf = encode(chunk, eps=bounds[name], impl="ref")
                size += buf.numel()
                chunks.append(decode(buf, impl="ref"))
            logits.append(gen.logits_of(chunks))  # pooled() keeps the tables in order
            labels.append(batch.labels.long())
        return float(binary_auroc(torch.cat(logits), torch.cat(labels))), size

    logits = torch.cat([gen.logits_of(list(gen.pooled(b).values())) for b in batches])
    exact = float(binary_auroc(logits, torch.cat([b.labels.long() for b in batches])))
    loose, _ = sent({n: 0.05 for n in names})
    constant, constant_bytes = sent({n: 0.01 for n in names})
    calibrated, calibrated_bytes = sent(cal.table_bounds)
    assert exact - loose > 0.01
    assert exact - calibrated < 0.005 and abs(calibrated - constant) < 0.002
    assert calibrated_bytes < 0.8 * constant_bytes
