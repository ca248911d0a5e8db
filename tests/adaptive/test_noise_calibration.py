"""The noise mode (issue 33 item 1): a table's bound from the variance the codec's error adds to a batch's loss, as
a share of the loss's minibatch variance; a quantity free of the loss's scale and offset and of the batch size, and
a greedy choice of bounds that fits the sum of the shares in a budget with the fewest bytes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lightning_dlac.adaptive import (
    CalibrationSettings,
    CalibrationStats,
    Calibrator,
    TableStats,
    noise_table_bounds,
    relative_noise_budget,
)
from lightning_dlac.adaptive.calibrator import NOISE_CANDIDATES, NOISE_FRACTION
from lightning_dlac.testing import run_ranks

CANDIDATES = (0.01, 0.03, 0.05)


def _observed(losses: list[float], energy: float, rows: int, scale: float = 1.0, shift: float = 0.0) -> TableStats:
    """One table's statistics after a batch per loss in ``losses`` (each of ``rows`` samples, gradient ``energy``),
    the loss multiplied by ``scale`` and moved by ``shift`` (its gradient only feels the scale)."""
    stats = CalibrationStats(CANDIDATES, index_eps=0.03)
    for loss in losses:
        stats.observe_gradient("t", energy * scale**2, rows)
        stats.record_batch_loss(loss * scale + shift, ["t"])
    return stats.table("t")


def test_the_noise_share_is_the_codecs_added_batch_loss_variance_over_the_minibatch_variance() -> None:
    losses = [0.50, 0.56, 0.47, 0.53]
    s = _observed(losses, energy=2e-4, rows=64)
    noise = sum((x - sum(losses) / 4) ** 2 for x in losses) / 3
    assert s.loss_noise() == pytest.approx(noise)
    # Per sample: rows**2 x energy / rows, over 3 (uniform error); a batch's mean of 64 such changes.
    per_sample = 2e-4 * 64 * 64 / 64 / 3
    assert s.noise_share() == pytest.approx({eps: eps**2 * per_sample / 64 / noise for eps in CANDIDATES})


def test_the_noise_share_is_free_of_the_losss_scale_and_offset_and_of_the_batch_size() -> None:
    losses = [0.50, 0.56, 0.47, 0.53, 0.61, 0.44]
    base = _observed(losses, energy=2e-4, rows=64).noise_share()
    assert _observed(losses, energy=2e-4, rows=64, scale=1000.0).noise_share() == pytest.approx(base)
    assert _observed(losses, energy=2e-4, rows=64, shift=7.0).noise_share() == pytest.approx(base)
    # Twice the samples per batch: the same per-sample gradients give half the batch gradient's energy (twice the
    # rows, each a quarter), and the minibatch variance halves (the losses' spread shrinks by sqrt(2)).
    mean = sum(losses) / len(losses)
    narrower = [mean + (x - mean) / math.sqrt(2) for x in losses]
    assert _observed(narrower, energy=2e-4 / 2, rows=128).noise_share() == pytest.approx(base)
    # The gradient mode's statistic, relative to the mean loss, moves with the offset: the reason for this one.
    shifted = _observed(losses, energy=2e-4, rows=64, shift=7.0).gradient_sensitivity()
    assert shifted[0.05] < _observed(losses, energy=2e-4, rows=64).gradient_sensitivity()[0.05] / 5


def test_without_two_losses_or_a_gradient_there_is_no_share() -> None:
    assert _observed([0.5], energy=1.0, rows=8).noise_share() is None
    assert _observed([0.5, 0.5], energy=1.0, rows=8).noise_share() is None  # no measurable noise
    assert TableStats(CANDIDATES).noise_share() is None
    assert TableStats.from_dict({k: v for k, v in TableStats(CANDIDATES).as_dict().items()
                                 if k != "loss_sq_sum"}).loss_sq_sum == 0.0  # checkpoints of earlier versions


def _table(shares: tuple[float, ...], nbytes: tuple[int, ...]) -> TableStats:
    """A table whose noise shares at CANDIDATES are ``shares`` (proportional to eps**2 as measured ones are not
    needed here) and whose compressed sizes are ``nbytes``."""
    s = TableStats(CANDIDATES, encoded_bytes=list(nbytes))
    s.noise_share = lambda: dict(zip(CANDIDATES, shares))  # type: ignore[method-assign]
    return s


def test_the_budget_is_spent_where_it_saves_the_most_bytes() -> None:
    tables = {
        "loud": _table((0.02, 0.18, 0.50), (1000, 600, 400)),  # sensitive: loosening it costs most of the budget
        "quiet": _table((0.001, 0.009, 0.025), (1000, 600, 400)),
        "flat": _table((0.001, 0.009, 0.025), (1000, 990, 985)),  # loosening saves almost nothing
    }
    chosen = noise_table_bounds(tables, 0.1)
    assert chosen == {"loud": 0.01, "quiet": 0.05, "flat": 0.05}
    used = sum(tables[n].noise_share()[eps] for n, eps in chosen.items())
    assert used <= 0.1
    # Brute force over all 27 choices within the budget: none sends fewer bytes.
    best = min(sum(tables[n].encoded_bytes[CANDIDATES.index(e)] for n, e in zip(tables, combo))
               for combo in itertools.product(CANDIDATES, repeat=3)
               if sum(tables[n].noise_share()[e] for n, e in zip(tables, combo)) <= 0.1)
    assert sum(tables[n].encoded_bytes[CANDIDATES.index(e)] for n, e in chosen.items()) == best
    assert noise_table_bounds(tables, 10.0) == dict.fromkeys(tables, 0.05)  # a budget nothing exhausts
    assert noise_table_bounds(tables, 1e-9) == dict.fromkeys(tables, 0.01)  # smallest candidate, whatever it adds
    with pytest.raises(ValueError, match="noise_budget=0 must be > 0"):
        noise_table_bounds(tables, 0)


def test_the_noise_mode_calibrates_on_the_finer_candidates() -> None:
    from lightning_dlac import DLACCallback

    dlac = DLACCallback(mode="noise")
    assert dlac.settings.candidates == NOISE_CANDIDATES
    assert dlac.settings.noise_budget is None and dlac.settings.noise_fraction == NOISE_FRACTION
    assert DLACCallback(noise_budget=0.01).settings.noise_fraction is None
    with pytest.raises(ValueError, match="give one"):
        DLACCallback(noise_budget=0.01, noise_fraction=0.1)
    for bad in (0, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match=r"must be a number in \(0, 1\]"):
            DLACCallback(noise_fraction=bad)
    assert DLACCallback(mode="gradient").settings.candidates == (0.01, 0.03, 0.05)
    with pytest.raises(ValueError, match="mode='noise' measures the loss gradient"):
        DLACCallback(mode="noise", calibration_dataloader=[1])

    cal = Calibrator(CalibrationSettings(mode="noise", candidates=NOISE_CANDIDATES, batches=4, noise_budget=0.1))
    cal.begin()
    g = torch.Generator().manual_seed(0)
    for batch in range(4):
        for name, energy in (("loud", 25.0), ("quiet", 1e-7)):
            cal.observe(name, torch.randn(64, 8, generator=g))
            cal.observe_gradient(name, energy, 64)
        cal.observe_loss(0.5 + 0.05 * (-1) ** batch)
        cal.batch_measured()
    cal.finish(4, ["loud", "quiet"])
    # loud: shares 0.01, 0.06, 0.25, 1, 6 at the five candidates; the budget takes it to 0.005
    assert cal.table_bounds == {"loud": 0.005, "quiet": 0.05}
    shares = {row["table"]: row["noise_share"] for row in cal.report()}
    assert sum(shares[n][str(e)] for n, e in cal.table_bounds.items()) <= 0.1


def _plain_loop_rank(rank: int, world_size: int) -> dict:
    """docs/strategy.md's "Without Lightning" loop, as written there, on a small example DLRM."""
    import warnings

    import torch.distributed as dist
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    from lightning_dlac.adaptive import CalibrationSettings, Calibrator, ErrorBounds
    from lightning_dlac.comm import CompressionConfig, install_compressed_all_to_all
    from lightning_dlac.comm.collectives import all_gather_object, all_reduce
    from lightning_dlac.engine import ShardingOptions, dense_parameters, shard_model

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = SyntheticCriteoDataModule(max_rows=500, batch_size=64, seed=0)
    model = DLRMModule(data.num_embeddings_per_feature, embedding_dim=16, dense_arch_layer_sizes=[32, 16],
                       over_arch_layer_sizes=[32, 1])
    batches = [data.generator.batch(i * world_size + rank, batch_size=64) for i in range(12)]
    loss_fn = torch.nn.BCEWithLogitsLoss()

    # The TorchRec DLRM inside the example module, called with dense and sparse features as in the docs.
    dmp = shard_model(model.model, ShardingOptions(sharding_types=["table_wise"]), torch.device("cpu"))
    bounds = ErrorBounds(0.01)
    group = install_compressed_all_to_all(dmp, CompressionConfig(backward="bf16"), bounds)
    calibrator = Calibrator(CalibrationSettings(batches=8), all_reduce, all_gather_object)
    calibrator.begin()
    group.set_observer(calibrator.observe)
    group.set_gradient_observer(calibrator.observe_gradient)
    optimizer = torch.optim.Adagrad(dense_parameters(dmp), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, batch in enumerate(batches):
            if step == 8:
                group.set_observer(None)
                group.set_gradient_observer(None)
                calibrator.finish(step, group.all_compressed_tables)
                bounds.set_table_bounds(calibrator.table_bounds)
            loss = loss_fn(dmp(batch.dense_features, batch.sparse_features).squeeze(-1), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if calibrator.measuring(step):
                calibrator.observe_loss(loss.item())
                calibrator.batch_measured()
    return {"mode": calibrator.settings.mode, "bounds": calibrator.table_bounds,
            "tables": sorted(group.all_compressed_tables),
            "warned": [str(w.message) for w in caught if "no loss gradient" in str(w.message)]}


@pytest.mark.slow
def test_the_documented_plain_loop_calibrates_every_table_in_the_default_mode() -> None:
    """docs/strategy.md's loop without Lightning: the default (noise) mode, fed the exchange's gradients and the
    losses, gives every compressed table a bound, the same on every rank, and nothing warns."""
    first, second = run_ranks(_plain_loop_rank, 2)
    assert first["mode"] == "noise" and not first["warned"] and not second["warned"]
    assert first["tables"] and set(first["bounds"]) == set(first["tables"])
    assert first["bounds"] == second["bounds"]
    assert set(first["bounds"].values()) <= set(NOISE_CANDIDATES)


def test_a_relative_budget_adds_its_fraction_of_all_loose_noise_whatever_the_statistic_s_level() -> None:
    """The default budget is a fraction of the noise every table at its loosest candidate would add: the chosen
    bounds add at most that, the loudest tables stay tight, and multiplying every table's statistic by one factor
    (the level moving from one data set, or one point of a run, to another) changes no bound, where an absolute
    budget's bounds move."""
    g = torch.Generator().manual_seed(3)

    def world(scale: float) -> dict[str, TableStats]:
        tables = {}
        for i, energy in enumerate((40.0, 9.0, 2.0, 0.5, 0.1, 0.01)):
            s = TableStats(NOISE_CANDIDATES, grad_rows=256, grad_energy=energy * scale * 256, loss_sum=1.0,
                           loss_batches=2, loss_sq_sum=0.5 + 0.5 * 0.25)
            s.encoded_bytes = [int(1000 * (1 + i) / (1 + 20 * e)) + int(torch.randint(0, 5, (1,), generator=g))
                               for e in NOISE_CANDIDATES]
            tables[f"t{i}"] = s
        return tables

    base = world(1.0)
    loosest = sum(s.noise_share()[0.05] for s in base.values())
    assert relative_noise_budget(base, 0.1) == pytest.approx(0.1 * loosest)
    chosen = noise_table_bounds(base, relative_noise_budget(base, 0.1))
    assert sum(base[n].noise_share()[e] for n, e in chosen.items()) <= 0.1 * loosest
    assert chosen["t0"] < 0.05 and chosen["t5"] == 0.05  # the loudest table stays tight, the quietest goes loose
    scaled = {scale: world(scale) for scale in (1e-3, 30.0)}
    for tables in scaled.values():
        for name, s in tables.items():
            s.encoded_bytes = list(base[name].encoded_bytes)
        assert noise_table_bounds(tables, relative_noise_budget(tables, 0.1)) == chosen
    budget = 0.1 * loosest  # the same budget held fixed: the louder world's bounds tighten
    assert noise_table_bounds(scaled[30.0], budget) != noise_table_bounds(base, budget)
    assert relative_noise_budget({}, 0.1) is None


def test_modes_that_only_report_the_homogenization_index_count_it_on_the_first_batch() -> None:
    """The index counts are nine tenths of a chunk's observer cost: only mode="homogenization" classifies by them,
    so it counts every batch; the other modes count the first batch of each calibration and report that."""
    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(64, 8, generator=g) for _ in range(3)]
    first = CalibrationStats(NOISE_CANDIDATES, 0.03)
    first.observe("t", batches[0])
    every = CalibrationStats(NOISE_CANDIDATES, 0.03)
    for chunk in batches:
        every.observe("t", chunk)
    for mode, expected in (("noise", first.table("t")), ("homogenization", every.table("t"))):
        cal = Calibrator(CalibrationSettings(mode=mode, candidates=NOISE_CANDIDATES, batches=3,
                                             sensitivity_batches=0))
        cal.begin()
        for chunk in batches:
            cal.observe("t", chunk)
            cal.observe_gradient("t", 1.0, 64)
            cal.observe_loss(0.5)
            cal.batch_measured()
        got = cal._stats.table("t")
        assert (got.distinct_raw, got.distinct_raw_values) == (expected.distinct_raw, expected.distinct_raw_values)
        assert got.chunks == 3 and got.encoded_bytes == every.table("t").encoded_bytes  # the rest on every batch
    skipped = CalibrationStats(NOISE_CANDIDATES, 0.03)
    skipped.observe("t", batches[0], index=False)
    assert skipped.table("t").distinct_raw == 0 and skipped.table("t").vector_homogenization_index == 1.0
