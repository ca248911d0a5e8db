"""The parts around the pure exchange, without processes: the statistics record, phase timing and the uncompressed
fallback (driven by injected times, so no decision depends on how busy the machine is)."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_dlac.comm.fallback import UncompressedFallback, check_interval
from lightning_dlac.comm.stats import CommStats
from lightning_dlac.comm.timing import PhaseTimer


def _record(calls: int, table_sent: int, error: float, non_finite: int = 0) -> CommStats:
    return CommStats(calls=calls, raw_bytes=100 * calls, sent_bytes=10 * calls, encode_s=0.5 * calls,
                     table_raw_bytes={"a": 100 * calls}, table_sent_bytes={"a": table_sent},
                     table_non_finite_chunks={"a": non_finite}, table_max_error_ratio={"a": error})


def test_stats_sum_and_difference_cover_every_counter() -> None:
    early, late = _record(2, 20, 0.4), _record(5, 50, 0.7, non_finite=1)
    interval = late - early
    assert (interval.calls, interval.raw_bytes, interval.sent_bytes) == (3, 300, 30)
    assert interval.encode_s == pytest.approx(1.5) and interval.table_sent_bytes == {"a": 30}
    assert interval.non_finite_tables == {"a"} and early.non_finite_tables == set()
    assert interval.table_max_error_ratio == {"a": 0.7}  # a running maximum: the later snapshot's value
    both = early + _record(1, 5, 0.9)
    assert both.calls == 3 and both.table_sent_bytes == {"a": 25} and both.table_max_error_ratio == {"a": 0.9}
    assert both.ratio == pytest.approx(10.0) and CommStats().ratio == 1.0
    assert early.copy() == early and early.copy() is not early


def test_stats_round_trip_through_tensors_and_plain_data() -> None:
    stats = _record(4, 44, 0.3, non_finite=2)
    tensors = stats.to_tensors(["a", "b"])
    assert set(tensors) == {"sum", "max"} and tensors["max"].tolist() == [0.3, 0.0]
    back = CommStats.from_tensors(["a", "b"], {k: v * 1 for k, v in tensors.items()})
    assert back.calls == 4 and isinstance(back.calls, int) and back.table_sent_bytes == {"a": 44, "b": 0}
    assert back.table_non_finite_chunks == {"a": 2, "b": 0} and back.table_max_error_ratio["a"] == pytest.approx(0.3)
    # Two ranks: sums add, maxima take the larger.
    other = _record(1, 1, 0.8).to_tensors(["a", "b"])
    merged = CommStats.from_tensors(["a", "b"], {"sum": tensors["sum"] + other["sum"],
                                                 "max": torch.maximum(tensors["max"], other["max"])})
    assert merged.calls == 5 and merged.table_max_error_ratio["a"] == pytest.approx(0.8)
    assert CommStats.from_dict(stats.as_dict()) == stats
    assert CommStats.from_dict({"calls": 3, "a_field_of_an_older_version": 1}).calls == 3


def test_phase_timer_accumulates_by_name_and_labels_profiler_ranges() -> None:
    ticks = iter([1.0, 1.25, 2.0, 2.5, 3.0, 3.125])
    timer = PhaseTimer(torch.device("cpu"), clock=lambda: next(ticks))
    with timer.phase("encode_s", "dlac encode"):
        pass
    with timer.phase("decode_s"):
        pass
    with timer.phase("encode_s"):
        pass
    assert timer.collect() == {"encode_s": 0.375, "decode_s": 0.5}
    assert timer.collect() == {}  # collected once
    with torch.autograd.profiler.profile() as prof:
        with PhaseTimer(torch.device("cpu")).phase("encode_s", "dlac encode"):
            torch.ones(1)
    assert any(e.name == "## dlac encode ##" for e in prof.function_events)


def _drive(policy: UncompressedFallback, cost: dict[bool, float], calls: int) -> tuple[list[bool], list[bool]]:
    """Make ``calls`` decisions, feeding each timed call its way's ``cost``; return the ways and the timed calls."""
    ways, timed = [], []
    for _ in range(calls):
        call = policy.next_call()
        ways.append(call.uncompressed)
        timed.append(call.timed)
        if call.timed:
            policy.record(call.uncompressed, cost[call.uncompressed])
    return ways, timed


def test_fallback_uses_the_faster_way_and_checks_the_other_every_n_calls_while_the_gap_is_small() -> None:
    policy = UncompressedFallback(check_every=4, slowest=lambda s: list(s))
    ways, timed = _drive(policy, {False: 0.011, True: 0.01}, 15)
    # Warm-up (0, 1 compressed; 2 uncompressed), then uncompressed, with the compressed way checked at 6, 10, 14.
    assert [k for k, u in enumerate(ways) if not u] == [0, 1, 6, 10, 14]
    # Only what a decision reads is timed: call 1, each check, and the call of the way in use just before it.
    assert [k for k, t in enumerate(timed) if t] == [1, 2, 5, 6, 9, 10, 13, 14]
    ways, _ = _drive(UncompressedFallback(4, lambda s: list(s)), {False: 0.01, True: 0.011}, 12)
    assert [k for k, u in enumerate(ways) if u] == [2, 6, 10]  # the codec is faster: only the checks go uncompressed


@pytest.mark.parametrize(("ratio", "interval"), [(1.0, 4), (1.6, 6), (3.0, 12), (5.0, 20), (16.0, 64), (300.0, 64)])
def test_fallback_checks_less_often_the_larger_the_gap(ratio: float, interval: int) -> None:
    assert check_interval(4, [0.01, 0.01 * ratio], max_stretch=16) == interval
    assert check_interval(4, [0.01 * ratio, 0.01], max_stretch=16) == interval  # whichever way is the faster
    # A slow link: compression `ratio` times faster. The first check (2) decides; the next comes 4 calls later, and
    # each check that confirms the decision doubles the interval, up to the gap's.
    calls = 400
    policy = UncompressedFallback(4, lambda s: list(s), max_stretch=16)
    ways, timed = _drive(policy, {False: 0.01, True: 0.01 * ratio}, calls)
    expected, gap = [2], 4
    while expected[-1] + gap < calls:
        expected.append(expected[-1] + gap)
        gap = min(2 * gap, interval)
    checks = [k for k, u in enumerate(ways) if u]
    assert checks == expected and policy.interval == interval, checks
    # Timed: call 1, the checks, and the call before each check (the next one's too).
    before = {k - 1 for k in [*checks[1:], expected[-1] + gap] if k - 1 < calls}
    assert [k for k, t in enumerate(timed) if t] == [1, *sorted({*checks, *before})]
    # Once doubled up to the gap's interval, what the checks cost per call is below 1 / check_every of the fast
    # way's time up to the cap (a 300x gap is the cap's case: (300 - 1) / 64 of it).
    steady = [k for a, k in itertools.pairwise(checks) if k - a == interval]
    extra = (len(steady) - 1) * 0.01 * (ratio - 1) / (steady[-1] - steady[0])
    assert extra <= 0.01 / 4 * max(1.0, (ratio - 1) / 16) + 1e-12


def test_fallback_interval_follows_the_measured_gap_as_it_changes() -> None:
    policy = UncompressedFallback(4, lambda s: list(s), max_stretch=16)
    cost = {False: 0.01, True: 0.08}  # a slow link: 8x, checks doubling up to 32 calls apart
    ways, _ = _drive(policy, cost, 40)
    assert [k for k, u in enumerate(ways) if u] == [2, 6, 14, 30] and policy.interval == 32
    # The link gets faster: each check's average (of the way's last two times) closes in on the new gap, and the
    # checks come closer together until they are check_every apart again.
    cost[True] = 0.011
    ways, _ = _drive(policy, cost, 120)
    checks = [40 + k for k, u in enumerate(ways) if u]
    gaps = [b - a for a, b in itertools.pairwise([30, *checks])]
    assert gaps[0] == 32 and gaps == sorted(gaps, reverse=True) and gaps[-3:] == [4, 4, 4], gaps
    # Faster still (5x): the uncompressed way wins its next check (161) and stays; the changed decision is checked
    # 4 calls later, then at growing intervals as the averages close in on the 5x gap (at most 20 calls apart).
    cost[True] = 0.002
    ways, _ = _drive(policy, cost, 60)
    compressed = [k for k, u in enumerate(ways) if not u]
    gaps = [b - a for a, b in itertools.pairwise(compressed[1:])]
    assert compressed[:2] == [0, 5] and all(ways[1:5]) and gaps == sorted(gaps) and gaps[0] > 4, compressed
    assert 4 < policy.interval <= 20
    with pytest.raises(ValueError, match="max_stretch=0.5 must be a finite number >= 1"):
        UncompressedFallback(4, lambda s: list(s), max_stretch=0.5)


def test_fallback_undoes_a_wrong_decision_within_check_every_calls() -> None:
    # One noisy time at the first check makes the uncompressed way look 10x faster on a link where compression is
    # 10x faster: the next check, 4 calls later, sees the real gap and switches back (then the checks spread out).
    # Checks spread out at once instead, for a gap this large, would have kept the wrong way for 64 calls.
    uncompressed_times = iter([0.001] + [0.1] * 100)  # the check at 2 (noisy), then every uncompressed timed call
    policy = UncompressedFallback(4, lambda s: list(s), max_stretch=16)
    ways = []
    for _ in range(40):
        call = policy.next_call()
        ways.append(call.uncompressed)
        if call.timed:
            policy.record(call.uncompressed, next(uncompressed_times) if call.uncompressed else 0.01)
    assert ways[:7] == [False, False, True, True, True, True, False]
    # Back to compressed at 6; checked at 10 (4 calls after the change), then 8 calls later (18), doubling on.
    assert not any(ways[7:10]) and ways[10] and not any(ways[11:18]) and ways[18], ways


def test_fallback_decides_from_the_slowest_rank() -> None:
    # This rank finds the uncompressed way faster, but another rank's codec time is what holds everyone back less.
    seen = []

    def slowest(seconds):  # noqa: ANN001, ANN202
        seen.append(list(seconds))
        return [max(seconds[0], 0.02), max(seconds[1], 0.06)]

    ways, _ = _drive(UncompressedFallback(4, slowest), {False: 0.05, True: 0.01}, 8)
    assert ways == [False, False, True, False, False, False, True, False]  # a 1.2x gap: checks 4 calls apart
    assert seen == [[0.05, 0.01], [0.05, 0.01]]  # one all-reduce per check, none in between
    with pytest.raises(ValueError, match="check_every=0 must be a whole number >= 1"):
        UncompressedFallback(0, slowest)


def test_recorder_times_phases_within_a_step_apart_and_off_the_record_not_at_all() -> None:
    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm.config import CompressionConfig
    from lightning_dlac.comm.recorder import Recorder

    ticks = itertools.count(0.0, 0.25)  # every phase boundary 0.25 s after the previous one
    rec = Recorder(CompressionConfig(), ErrorBounds(), clock=lambda: next(ticks))
    cpu = torch.device("cpu")
    with rec.call_timer(cpu, on_record=True).phase("encode_s"):
        pass
    rec.set_in_step(True)
    with rec.call_timer(cpu, on_record=True).phase("exchange_s"):
        pass
    with rec.call_timer(cpu, on_record=False).phase("decode_s"):  # a probe's exchange: not counted
        pass
    rec.set_in_step(False)
    stats = rec.stats()
    assert (stats.encode_s, stats.exchange_s, stats.decode_s, stats.in_step_s) == (0.25, 0.25, 0.0, 0.25)
    assert stats.a2a_s == 0.5 and rec.stats() == stats  # folded once: a second read adds nothing


def test_recorder_counts_what_a_call_sends_and_switches_bounds_off_the_record() -> None:
    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm.config import CompressionConfig
    from lightning_dlac.comm.exchange import encode_chunks
    from lightning_dlac.comm.recorder import Recorder

    bounds, probe = ErrorBounds(0.01), ErrorBounds(0.05)
    rec = Recorder(CompressionConfig(error_every=2, impl="ref"), bounds)
    seen: list[tuple[str, int]] = []
    rec.observer = lambda table, chunk: seen.append((table, chunk.size(0)))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    x[4, 2] = float("nan")  # the second row block of table "b" is sent raw
    grid = encode_chunks(x, [0, 3, 6], [0, 2, 4], torch.tensor([0.01, 0.02]), "ref", ("a", "b"))
    rec.observe((t, c) for t, c, _ in grid.chunks())
    for _ in range(3):
        rec.count_forward(["a", "b"], [48, 48], [30, 40], 86)
        rec.check([grid], {"a": 0.01, "b": 0.02})
    rec.count_backward(96, 48)
    s = rec.stats()
    assert seen == [("a", 3), ("b", 3), ("a", 3), ("b", 3)]
    assert (s.calls, s.raw_bytes, s.sent_bytes, s.table_sent_bytes) == (3, 288, 258, {"a": 90, "b": 120})
    assert (s.backward_calls, s.backward_raw_bytes, s.backward_sent_bytes) == (1, 96, 48)
    assert s.table_non_finite_chunks == {"b": 3}  # once per call
    assert 0 < s.table_max_error_ratio["a"] <= 1 and s.table_max_error_ratio["b"] <= 1  # sampled at calls 1 and 3
    assert rec.bounds is bounds and rec.on_record
    with rec.off_the_record(probe):
        assert rec.bounds is probe and not rec.on_record
    assert rec.bounds is bounds and rec.on_record


def test_wire_functions_encode_and_decode_a_grid_without_chunks_to_empty_tensors() -> None:
    from lightning_dlac.comm.exchange import decode_chunks, encode_chunks, rank_sums, with_own

    x = torch.randn(5, 8)
    for rows, cols in (([0], [0, 8]), ([0, 5], [0]), ([0], [0])):  # no destination, no table, neither
        grid = encode_chunks(x[: rows[-1], : cols[-1]], rows, cols, 0.01, "ref")
        assert grid.payload.numel() == grid.sizes.numel() == 0 and list(grid.chunks()) == []
        out = decode_chunks(grid.payload, grid.sizes, rows, cols, "ref", torch.device("cpu"))
        assert out.shape == (rows[-1], cols[-1])
    grid = encode_chunks(x, [0, 2, 5], [0, 8], 0.01, "ref")  # and with chunks: the codec's bound
    assert (decode_chunks(grid.payload, grid.sizes, [0, 2, 5], [0, 8], "ref", torch.device("cpu")) - x).abs().max() \
        <= 0.01 * float(x.max() - x.min()) * 1.0001
    sizes = torch.tensor([3, 4, 5, 6])
    assert rank_sums(sizes, [1, 0, 3]) == [3, 0, 15] and rank_sums(sizes[:0], [0, 0]) == [0, 0]
    assert with_own(sizes, 1, 2).tolist() == [3, 0, 0, 4, 5, 6]
    assert with_own(torch.ones(2, 2, dtype=torch.int64), 2, 1).tolist() == [[1, 1], [1, 1], [0, 0]]


def test_exchange_group_keeps_one_name_per_concept() -> None:
    from types import SimpleNamespace

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import ExchangeGroup

    a2a = SimpleNamespace(local_tables=["b", "a"], tables_per_rank=[["b", "a"], ["c"]])
    group = ExchangeGroup([a2a], ErrorBounds())
    assert group.compressed_tables == ["a", "b"] and group.all_compressed_tables == ["a", "b", "c"]
    assert not hasattr(group, "local_tables") and not hasattr(group, "tables")  # the names removed at 0.1
