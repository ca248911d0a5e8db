"""The gradient sensitivity (mode="gradient", the default table-wise level): the statistic against the codec's real
loss change, the policy, the exchange's gradient observer on 2 ranks, and the defaults that follow the run."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lightning_dlac.adaptive import CalibrationStats, gradient_table_bounds
from lightning_dlac.codec import decode, encode
from lightning_dlac.testing import run_ranks
from tests.conftest import native_expected, run_length

NATIVE = "native" if native_expected() else "auto"


def _chunk(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Pooled-embedding-like values: a bulk of small values and a few large ones that stretch the range."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * 0.1
    x[torch.randint(0, rows, (rows // 50,), generator=g)] *= 4.0
    return x


def _per_sample_loss(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A logistic loss of a nonlinear readout of each row: the kind of function a DLRM's top computes."""
    logit = (torch.tanh(x) * w).sum(dim=1) * 2.0
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, y, reduction="none")


@pytest.mark.parametrize("eps", [0.01, 0.05])
def test_gradient_sensitivity_predicts_the_rms_loss_change_the_codec_causes(eps: float) -> None:
    """The statistic is computed from gradients alone; the oracle encodes the chunk with the real codec, decodes it
    and measures every sample's loss change: their root mean square, over the mean loss, must agree."""
    rows, dim = 4096, 16
    x = _chunk(rows, dim, seed=0)
    g = torch.Generator().manual_seed(1)
    w, y = torch.randn(dim, generator=g), (torch.rand(rows, generator=g) < 0.3).float()
    xg = x.clone().requires_grad_(True)
    loss = _per_sample_loss(xg, w, y).mean()  # the batch loss, a mean over the rows as a training step's is
    (grad,) = torch.autograd.grad(loss, xg)
    stats = CalibrationStats([0.01, 0.05], index_eps=0.03, codec_impl=NATIVE)
    value_range = float(x.max() - x.min())
    stats.observe_gradient("t", value_range**2 * float(grad.square().sum()), rows)
    stats.record_batch_loss(float(loss.detach()), ["t"])
    predicted = stats.table("t").gradient_sensitivity()[eps]

    x_hat = decode(encode(x, eps=eps, impl=NATIVE), impl=NATIVE)
    assert float((x_hat - x).abs().max()) <= eps * value_range * (1 + 1e-6)  # the codec's own guarantee
    change = _per_sample_loss(x_hat, w, y) - _per_sample_loss(x, w, y)
    measured = float(change.square().mean().sqrt()) / float(loss.detach())
    assert predicted == pytest.approx(measured, rel=0.1)  # first order: 2% apart at these bounds
    assert predicted > 0


def test_gradient_sensitivity_is_proportional_to_the_bound_and_summed_over_ranks_and_batches() -> None:
    stats = CalibrationStats([0.01, 0.03, 0.05], index_eps=0.03)
    for energy, rows, loss in ((2.0, 4, 0.5), (6.0, 8, 0.7)):  # two (batch, rank) observations
        stats.observe_gradient("t", energy, rows)
        stats.record_batch_loss(loss, ["t"])
    s = stats.table("t")
    # Per-sample squared gradient norms are rows**2 x the batch gradient's: (2 * 16 + 6 * 64) / 12 samples.
    rms = math.sqrt((2.0 * 16 + 6.0 * 64) / 12 / 3)
    expected = {eps: eps * rms / 0.6 for eps in (0.01, 0.03, 0.05)}
    assert s.gradient_sensitivity() == pytest.approx(expected)
    # Reduction over ranks sums the parts: a second rank's copy doubles every sum and leaves the statistic as is.
    names = ["t"]
    doubled = {k: v * 2 if k == "sum" else v for k, v in stats.to_tensors(names).items()}
    other = CalibrationStats([0.01, 0.03, 0.05], index_eps=0.03)
    other.load_tensors(names, doubled)
    assert other.table("t").grad_rows == 24
    assert other.table("t").gradient_sensitivity() == pytest.approx(expected)
    assert CalibrationStats([0.01], index_eps=0.01).table("u").gradient_sensitivity() is None


def test_gradient_policy_takes_the_largest_candidate_within_the_tolerance() -> None:
    stats = CalibrationStats([0.01, 0.03, 0.05], index_eps=0.03)
    for name, energy in (("quiet", 1e-4), ("middle", 3.0), ("loud", 1e4)):
        stats.observe_gradient(name, energy, 1)
        stats.record_batch_loss(1.0, [name])
    stats.table("unseen")  # no gradient observed: left to the strategy's bound
    tol = 0.04 * math.sqrt(3.0 / 3)  # middle: S(eps) = eps * 1.0, within at 0.03 and 0.01, not at 0.05
    bounds = gradient_table_bounds(stats.tables, tol)
    assert bounds == {"quiet": 0.05, "middle": 0.03, "loud": 0.01}
    with pytest.raises(ValueError, match="gradient_tolerance=0 must be > 0"):
        gradient_table_bounds(stats.tables, 0)


def _observed_rank(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressionConfig
    from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll

    dist.init_process_group("gloo")
    dims = [[4, 8], [8]]
    tables = [["a", "b"], ["a"]]  # table "a" is column-wise: a block on each rank, one energy for both
    a2a = CompressedPooledEmbeddingsAllToAll(dist.group.WORLD, dims, tables, CompressionConfig(impl=NATIVE),
                                             ErrorBounds(default_eps=0.01))
    seen: list[tuple[str, float, int]] = []
    a2a.recorder.gradient_observer = lambda t, e, r: seen.append((t, e, r))
    g = torch.Generator().manual_seed(rank)
    local = (torch.randn(6, sum(dims[rank]), generator=g) * (rank + 1)).requires_grad_(True)
    out = a2a(local, [3, 3]).wait()
    out.retain_grad()
    (out.sin() * torch.arange(1.0, out.size(1) + 1)).sum().backward()
    cols = [0, 4, 12, 20]  # output blocks: rank 0's a, b, then rank 1's a
    expected: dict[str, float] = {}
    for name, lo, hi in zip(["a", "b", "a"], cols[:-1], cols[1:]):
        block = out.detach()[:, lo:hi]
        energy = float(block.max() - block.min()) ** 2 * float(out.grad[:, lo:hi].square().sum())
        expected[name] = expected.get(name, 0.0) + energy
    with a2a.off_the_record(ErrorBounds(default_eps=0.01)):  # a probe's exchange reports nothing
        a2a(local.detach().requires_grad_(True), [3, 3]).wait().sum().backward()
    return {"seen": seen, "expected": expected}


@pytest.mark.slow
def test_exchange_reports_each_tables_gradient_energy_weighted_by_its_chunks_range() -> None:
    for result in run_ranks(_observed_rank, 2):
        assert sorted(t for t, _, _ in result["seen"]) == ["a", "b"]  # once per table and call on the record
        for table, energy, rows in result["seen"]:
            assert rows == 3
            assert energy == pytest.approx(result["expected"][table], rel=1e-5)


@pytest.mark.parametrize(
    ("steps", "accumulate", "start", "T", "every"),
    [(200, 1, 20, 20, 40), (50_000, 1, 5000, 1000, 10_000), (100, 4, 40, 40, 80),
     (float("inf"), 1, 1000, 1000, 2000)],
)
def test_default_start_early_stage_and_recalibration_follow_the_run(steps: float, accumulate: int, start: int,
                                                                     T: int, every: int) -> None:
    from lightning_dlac import DLACCallback

    dlac = DLACCallback()
    dlac._fit_defaults_to_the_run(run_length(steps, accumulate))  # on_train_start, before:
    dlac.calibrator.begin()
    assert dlac.schedule.T == T
    assert dlac.settings.start == start
    assert dlac.calibrator.measuring(start) and not dlac.calibrator.measuring(start - 1)
    # The noise mode measures again every fifth of the run (the statistic drifts as the model learns).
    assert dlac.settings.recalibrate_every == every


def test_only_the_noise_mode_recalibrates_by_default_and_a_given_period_is_kept() -> None:
    from lightning_dlac import DLACCallback

    for dlac, every in ((DLACCallback(mode="gradient"), 0), (DLACCallback(mode="homogenization"), 0),
                        (DLACCallback(recalibrate_every=0), 0), (DLACCallback(recalibrate_every=300), 300)):
        dlac._fit_defaults_to_the_run(run_length(10_000))
        assert dlac.settings.recalibrate_every == every, dlac.mode


def test_default_recalibration_follows_the_run_when_start_and_T_are_given_without_max_steps() -> None:
    """Every example config gives calibration_start and T and a run length in epochs: the period still follows the
    run's length (read as training starts, from the epochs)."""
    from lightning_dlac import DLACCallback

    trainer = SimpleNamespace(max_steps=-1, **vars(run_length(3000)))
    dlac = DLACCallback(calibration_start=100, T=200)
    dlac._fit_defaults_to_the_run(trainer)
    dlac.calibrator.begin()
    assert (dlac.settings.start, dlac.schedule.T, dlac.settings.recalibrate_every) == (100, 200, 600)


def test_given_start_and_T_are_kept_and_probes_run_only_where_they_choose() -> None:
    from lightning_dlac import DLACCallback

    dlac = DLACCallback(calibration_start=7, T=30)
    dlac._fit_defaults_to_the_run(run_length(10_000))
    assert (dlac.settings.start, dlac.schedule.T) == (7, 30)
    assert DLACCallback().settings.mode == "noise" and DLACCallback().sensitivity_batches == 0
    assert DLACCallback(mode="sensitivity").sensitivity_batches == 1


def test_an_unknown_run_length_is_said_with_what_to_set(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from lightning_dlac import DLACCallback

    with caplog.at_level(logging.INFO):
        DLACCallback(T=50)._fit_defaults_to_the_run(run_length(float("inf")))
    assert "cannot tell the run's length" in caplog.text
    assert "so calibration_start defaults to the paper's 1000 batches" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        DLACCallback()._fit_defaults_to_the_run(run_length(2000))
    assert "cannot tell" not in caplog.text


# ------------------------------------------------------------------------- no silent failure (issue 33, item 4)


def test_the_gradient_mode_refuses_a_calibration_dataloader_it_could_not_use() -> None:
    """Batches calibrated on before training are only run forward: no gradient comes back, and the gradient mode
    used to skip every table and still call itself calibrated. It, and the noise mode (the default), which reads
    the same gradients, are refused at construction, naming the fix."""
    from lightning_dlac import DLACCallback
    from lightning_dlac.adaptive import CalibrationSettings

    with pytest.raises(ValueError, match="mode='noise' measures the loss gradient.*Calibrate on training"):
        DLACCallback(calibration_dataloader=[1])
    with pytest.raises(ValueError, match="mode='gradient' measures the loss gradient.*Calibrate on training"):
        DLACCallback(mode="gradient", calibration_dataloader=[1])
    with pytest.raises(ValueError, match="mode='sensitivity' or mode='homogenization'"):
        CalibrationSettings(mode="gradient", before_training=True)
    for mode in ("sensitivity", "homogenization", "off"):  # the modes that can use the batches keep them
        DLACCallback(mode=mode, calibration_dataloader=[1])


def test_a_loss_scale_is_divided_out_of_the_gradient_statistic() -> None:
    """Under a GradScaler the gradient the exchange carries back is the loss's times the scale: the calibrator
    divides the scale out, so the statistic (and the bounds) are those of the unscaled run."""
    from lightning_dlac.adaptive import CalibrationSettings, Calibrator

    results = []
    for scale in (1.0, 2.0**16):
        cal = Calibrator(CalibrationSettings(mode="gradient", batches=1))
        cal.begin()
        cal.set_gradient_scale(scale)
        cal.observe("t", _chunk(64, 8, seed=0))
        cal.observe_gradient("t", 0.25 * scale**2, 64)  # the energy of gradients `scale` times the loss's
        cal.observe_loss(0.5)
        cal.batch_measured()
        cal.finish(1, ["t"])
        results.append((cal.table_stats["t"].gradient_sensitivity(), cal.table_bounds))
    assert results[1][0] == pytest.approx(results[0][0]) and results[1][1] == results[0][1]
    with pytest.raises(ValueError, match="must be a positive finite number"):
        Calibrator(CalibrationSettings()).set_gradient_scale(0.0)


def test_the_loss_scale_is_read_from_the_trainers_grad_scaler() -> None:
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    from lightning_dlac.plugin._run import loss_scale

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    assert loss_scale(SimpleNamespace(precision_plugin=MixedPrecision("16-mixed", "cpu", scaler=scaler))) == 2.0**16
    assert loss_scale(SimpleNamespace(precision_plugin=MixedPrecision("bf16-mixed", "cpu"))) == 1.0  # no scaler
    assert loss_scale(SimpleNamespace(precision_plugin=Precision())) == 1.0
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    assert loss_scale(SimpleNamespace(precision_plugin=MixedPrecision("16-mixed", "cpu", scaler=disabled))) == 1.0


@pytest.mark.parametrize(("start", "batches", "run", "warns"), [(10, 2, 6, True), (5, 2, 6, True), (4, 2, 6, False),
                                                                 (None, 8, 8, True), (None, 8, 200, False)])
def test_a_calibration_past_the_runs_known_end_is_said_as_training_starts(start: int | None, batches: int,
                                                                          run: int, warns: bool) -> None:
    import warnings

    from lightning_dlac import DLACCallback

    dlac = DLACCallback(calibration_start=start, calibration_batches=batches)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dlac._fit_defaults_to_the_run(run_length(run))
    said = [str(w.message) for w in caught if "never calibrate" in str(w.message)]
    assert bool(said) == warns, said
    if warns:
        assert f"but the run takes {run}" in said[0] and "calibration_start" in said[0]
    # With T and calibration_start both set the run's length is read all the same (as training starts, when the
    # fit loop has set the loader up), and a given start past it is said.
    fixed = DLACCallback(calibration_start=start or 0, calibration_batches=batches, T=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fixed._fit_defaults_to_the_run(run_length(run))
    assert bool([w for w in caught if "never calibrate" in str(w.message)]) == (warns and start is not None)
    with warnings.catch_warnings(record=True) as caught:  # mode="off" calibrates nothing: nothing to say
        warnings.simplefilter("always")
        DLACCallback(mode="off", calibration_start=start)._fit_defaults_to_the_run(run_length(run))
    assert not [w for w in caught if "never calibrate" in str(w.message)]


def test_the_calibrators_status_says_which_bounds_hold_and_why() -> None:
    from lightning_dlac.adaptive import CalibrationSettings, Calibrator

    assert Calibrator(CalibrationSettings(mode="off")).status(10) == {"state": "constant"}
    cal = Calibrator(CalibrationSettings(mode="homogenization", batches=2, start=5))
    cal.begin()
    assert cal.status(3) == {"state": "never_calibrated", "due": 5, "measured": 0, "needed": 2, "batches_run": 3}
    cal.observe("t", _chunk(64, 8, seed=0))
    cal.batch_measured()
    assert cal.status(6)["measured"] == 1  # stopped inside the window
    cal.batch_measured()
    cal.finish(7, ["t"])
    assert cal.status(9) == {"state": "calibrated", "at": 7, "calibrations": 1}


@pytest.mark.parametrize("mode", ["gradient", "noise"])
def test_a_calibrator_fed_no_gradient_says_so_instead_of_keeping_every_eps_in_silence(mode: str) -> None:
    """A loop that drives the Calibrator itself and feeds only the forward chunks (benchmarks/e2e_bandwidth.py did)
    would leave every table at the strategy's eps in the two modes that read gradients: finish() warns, naming what
    to feed or the mode that needs no gradient; fed gradients and losses, it does not."""
    import warnings

    from lightning_dlac.adaptive import CalibrationSettings, Calibrator

    chunk = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    quiet = Calibrator(CalibrationSettings(mode=mode, batches=1))
    quiet.begin()
    quiet.observe("t", chunk)
    quiet.batch_measured()
    with pytest.warns(UserWarning, match=rf"mode='{mode}'.*no loss gradient reached it.*set_gradient_observer"):
        quiet.finish(1, ["t"])
    assert quiet.table_bounds == {}  # the strategy's eps stays

    fed = Calibrator(CalibrationSettings(mode=mode, batches=1))
    fed.begin()
    fed.observe("t", chunk)
    fed.observe_gradient("t", energy=0.25, rows=16)  # what the exchange hands over: range-weighted energy, rows
    fed.observe_loss(torch.tensor(0.5))
    fed.batch_measured()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fed.finish(1, ["t"])
