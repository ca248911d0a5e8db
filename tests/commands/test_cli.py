"""The dlac CLI: every shipped config parses, --print_config round-trips, a short 2-rank fit runs from a config
and writes the compression report, and bad input is named."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from lightning_dlac import DLACCallback, DLACStrategy
from lightning_dlac.commands.cli import CLIUserError, build_cli, main
from lightning_dlac.commands.errors import name_option
from lightning_dlac.testing import hosted_store, run_session
from tests._faults import kill_stopped
from tests.conftest import write_criteo_tsv

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
CONFIG = CONFIGS / "dlrm_synthetic.yaml"
CRITEO_SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_kaggle_head10k.tsv"
# What each config needs on this (CPU) machine to be built: the Criteo path, and CPU in place of the GPUs.
OVERRIDES = {
    "dlrm_synthetic.yaml": [],
    "dlrm_many_tables.yaml": [],
    "dlrm_v2_synthetic.yaml": [],
    "dlrm_uncompressed.yaml": [],
    "dlrm_pipelined.yaml": [],
    "dlrm_elastic.yaml": [],
    "dlrm_criteo.yaml": ["--data.train_path={criteo}"],
    "dlrm_criteo_binary.yaml": ["--data.data_dir={criteo_binary}"],
    "dlrm_v2_criteo_binary.yaml": ["--data.data_dir={criteo_binary}"],
    "dlrm_gpu.yaml": ["--trainer.accelerator=cpu", "--trainer.devices=2",
                      "--trainer.strategy.init_args.process_group_backend=gloo"],
}


def _settings(cli) -> dict:  # noqa: ANN001
    """The DLAC-relevant settings a built CLI ended up with."""
    strategy = cli.trainer.strategy
    dlac = [cb for cb in cli.trainer.callbacks if isinstance(cb, DLACCallback)]
    out = {
        "strategy": type(strategy).__name__,
        "compress": strategy.compress,
        "backward": str(strategy.compression.backward),
        "eps": strategy.error_bounds.default_eps,
        "sharding_types": list(strategy.sharding.sharding_types),
        "data": type(cli.datamodule).__name__,
        "tables": len(cli.model.hparams.num_embeddings_per_feature),
    }
    if dlac:
        cb = dlac[0]
        out["callback"] = {"mode": cb.mode, "schedule": (str(cb.schedule.kind), cb.schedule.c, cb.schedule.T),
                           "calibration": (cb.calibration_start, cb.calibration_batches, cb.sensitivity_batches),
                           "bounds": (cb.class_bounds.tight, cb.class_bounds.base, cb.class_bounds.loose)}
    return out


def test_every_config_is_shipped_and_tested() -> None:
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(OVERRIDES)


def _criteo_file(tmp_path: Path) -> Path:
    """The real sample when shared/ sits beside the checkout, else a generated file in its format."""
    if CRITEO_SAMPLE.is_file():
        return CRITEO_SAMPLE
    return write_criteo_tsv(tmp_path / "criteo_sample.tsv", rows=200, positives=50)


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_each_shipped_config_builds(name: str, tmp_path: Path) -> None:
    overrides = [o.format(criteo=_criteo_file(tmp_path), criteo_binary=tmp_path / "npy") for o in OVERRIDES[name]]
    if name in ("dlrm_criteo_binary.yaml", "dlrm_v2_criteo_binary.yaml"):  # converted by `dlac preprocess criteo`
        from lightning_dlac.commands.preprocess import main as preprocess

        multi_hot = ["--multi-hot-sizes", "mlperf", "--num-embeddings-per-feature", "mlperf", "--max-rows", "10000"]
        criteo = _criteo_file(tmp_path)
        assert preprocess(["criteo", "--output", str(tmp_path / "npy"), "--no-progress", str(criteo),
                           *(multi_hot if "v2" in name else [])]) == 0  # fmt: skip
        overrides.append(f"--data.train_stems=[{criteo.stem}]")
    cli = build_cli(["--config", str(CONFIGS / name), "--trainer.logger=false", *overrides], run=False)
    settings = _settings(cli)
    assert settings["strategy"] == "DLACStrategy" and settings["tables"] == (200 if "many" in name else 26)
    assert settings["compress"] == (name != "dlrm_uncompressed.yaml")
    assert ("callback" in settings) == (name != "dlrm_uncompressed.yaml")
    assert list(cli.model.hparams.num_embeddings_per_feature) == cli.datamodule.num_embeddings_per_feature
    if "v2" in name:  # MLPerf DLRM v2: DCN, dim 128, multi-hot with MLPerf's pooling factors
        assert type(cli.model.model).__name__ == "DLRM_DCN" and cli.model.hparams.embedding_dim == 128
        from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

        assert cli.datamodule.multi_hot_sizes == list(MLPERF_MULTI_HOT_SIZES)
    if name == "dlrm_criteo.yaml":
        assert settings["data"] == "CriteoTSVDataModule" and settings["callback"]["calibration"] == (16, 8, 0)
    if name == "dlrm_elastic.yaml":  # the demo plus last.ckpt every 40 steps (docs/multinode.md)
        from lightning.pytorch.callbacks import ModelCheckpoint

        (saves,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint)]
        assert saves.save_last is True and saves.save_top_k == 0 and saves.dirpath.endswith("checkpoints/dlrm_elastic")
        every, steps = saves._every_n_train_steps, cli.datamodule.num_train_batches
        assert every == 40 and not any(s % cli.trainer.val_check_interval == 0 for s in range(every, steps + 1, every))


def test_print_config_round_trips_into_the_same_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--config", str(CONFIG), "--trainer.strategy.init_args.compression.backward=fp16",
            "--trainer.strategy.init_args.compression.eps=0.03", "--data.batch_size=128"]
    with pytest.raises(SystemExit):
        build_cli([*args, "--print_config"], run=False)
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    direct = build_cli([*args, "--trainer.logger=false"], run=False)
    again = build_cli(["--config", str(printed), "--trainer.logger=false"], run=False)
    assert _settings(again) == _settings(direct)
    assert _settings(again)["backward"] == "fp16" and again.datamodule.batch_size == 128
    assert _settings(again)["eps"] == 0.03 and again.trainer.strategy.compression == direct.trainer.strategy.compression


def test_print_config_shows_the_strategy_s_config_objects_and_no_flat_options(capsys: pytest.CaptureFixture) -> None:
    """``--print_config`` lists every field of the three config objects under the strategy's init_args, and none of
    the deprecated flat names, which a config shows only where it gives them."""
    import yaml

    from lightning_dlac import CheckpointOptions, CompressionOptions, ShardingOptions
    from lightning_dlac.plugin._deprecated import FLAT_OPTIONS

    with pytest.raises(SystemExit):
        build_cli(["--config", str(CONFIG), "--print_config"], run=False)
    init_args = yaml.safe_load(capsys.readouterr().out)["trainer"]["strategy"]["init_args"]
    for group, cls in (("sharding", ShardingOptions), ("compression", CompressionOptions),
                       ("checkpointing", CheckpointOptions)):
        assert set(init_args[group]) == {f.name for f in dataclasses.fields(cls)}, (group, init_args[group])
    assert init_args["sharding"]["embedding_lr"] == 0.02 and init_args["compression"]["eps"] == 0.01
    assert not set(init_args) & set(FLAT_OPTIONS), sorted(set(init_args) & set(FLAT_OPTIONS))


# dlrm_criteo.yaml as lightning-dlac 0.1 shipped it (every option flat under init_args), plus compress: auto.
OLD_STRATEGY = """\
    init_args:
      sharding_types: [table_wise]
      embedding_optimizer: adagrad
      embedding_lr: 0.02
      eps: 0.03
      backward_compression: fp16
      compress: auto
      verify_checkpoints: false
"""
NEW_STRATEGY = """\
    init_args:
      sharding:
        sharding_types: [table_wise]
        embedding_optimizer: adagrad
        embedding_lr: 0.02
      compression:
        eps: 0.03
        backward: fp16
        auto_fallback: true
      checkpointing:
        verify: false
"""


def _strategy_yaml(tmp_path: Path, name: str, init_args: str) -> Path:
    """The demo config with the strategy's ``init_args`` block replaced."""
    text = CONFIG.read_text()
    start = text.index("    init_args:\n", text.index("class_path: lightning_dlac.DLACStrategy"))
    end = text.index("  logger:", start)
    path = tmp_path / name
    path.write_text(text[:start] + init_args + text[end:])
    return path


def test_a_config_in_the_old_flat_spelling_builds_the_same_strategy_and_says_how_to_write_it(tmp_path: Path) -> None:
    args = ["--trainer.logger=false"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new spelling warns nothing
        new = build_cli(["--config", str(_strategy_yaml(tmp_path, "new.yaml", NEW_STRATEGY)), *args], run=False)
    with pytest.warns(DeprecationWarning) as caught:
        old = build_cli(["--config", str(_strategy_yaml(tmp_path, "old.yaml", OLD_STRATEGY)), *args], run=False)
    (message,) = [str(w.message) for w in caught if "is deprecated" in str(w.message)]
    for spelled in ("init_args.compression.eps", "init_args.compression.backward", "init_args.sharding.embedding_lr",
                    "init_args.compression.auto_fallback", "init_args.checkpointing.verify"):
        assert spelled in message, (spelled, message)
    old_strategy, new_strategy = old.trainer.strategy, new.trainer.strategy
    for group in ("sharding", "compression", "checkpointing"):
        assert getattr(old_strategy, group) == getattr(new_strategy, group), group
    assert new_strategy.compression.eps == 0.03 and new_strategy.compression.auto_fallback
    assert new_strategy.error_bounds.default_eps == old_strategy.error_bounds.default_eps == 0.03
    # and on the command line: a flat option over a new-spelling config
    with pytest.warns(DeprecationWarning, match=r"init_args\.compression\.pieces"):
        flat = build_cli(["--config", str(CONFIG), "--trainer.strategy.init_args.pieces=2", *args], run=False)
    assert flat.trainer.strategy.compression.pieces == 2


def test_a_setting_given_both_flat_and_in_its_config_object_is_refused(tmp_path: Path) -> None:
    both = NEW_STRATEGY + "      eps: 0.05\n"
    with pytest.raises(CLIUserError) as info:
        build_cli(["--config", str(_strategy_yaml(tmp_path, "both.yaml", both)), "--trainer.logger=false"], run=False)
    assert info.value.component == "DLACStrategy" and info.value.option == "--trainer.strategy.init_args.eps"
    assert "DLACStrategy(eps=...) and compression=CompressionOptions(eps=...) set the same option" in str(info.value)


def test_shipped_config_builds_strategy_model_and_data() -> None:
    cli = build_cli(["--config", str(CONFIG), "--trainer.logger=false"], run=False)
    assert isinstance(cli.trainer.strategy, DLACStrategy)
    assert list(cli.trainer.strategy.sharding.sharding_types) == ["table_wise"]
    # The model is sized from the datamodule (linked arguments).
    assert list(cli.model.hparams.num_embeddings_per_feature) == cli.datamodule.num_embeddings_per_feature


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("embedding_lr: 0.02", "embeding_lr: 0.02", "embeding_lr"),  # unknown key
        ("T: 96", "T: ninety-six", "T"),  # wrong type
        ("schedule: step", "schedule: cosine", "schedule='cosine' is not supported"),  # invalid value
    ],
)
def test_bad_yaml_is_named(tmp_path: Path, capsys: pytest.CaptureFixture, old: str, new: str, named: str) -> None:
    bad = tmp_path / "bad.yaml"
    assert old in CONFIG.read_text()
    bad.write_text(CONFIG.read_text().replace(old, new))
    # Parse errors exit with jsonargparse's message; a value the callback rejects raises its ValueError, which
    # jsonargparse wraps when instantiating the trainer's callbacks. Either way the message names the problem.
    with pytest.raises((SystemExit, ValueError)) as info:
        build_cli(["--config", str(bad)], run=False)
    assert named in capsys.readouterr().err + str(info.value)


def test_missing_data_path_is_named(capsys: pytest.CaptureFixture) -> None:
    missing = "/nonexistent/criteo/train.txt"
    with pytest.raises((SystemExit, ValueError)) as info:  # raised while instantiating the datamodule
        build_cli(["--config", str(CONFIGS / "dlrm_criteo.yaml"), f"--data.train_path={missing}",
                   "--trainer.logger=false"], run=False)
    message = capsys.readouterr().err + str(info.value)
    assert f"Criteo TSV file not found: {missing!r}" in message and "--data.train_path" in message


# Variables a launcher sets; `dlac fit` from a shell has none of them, and Lightning's own launcher sets them itself.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "PL_GLOBAL_SEED")


def _short_config(tmp_path: Path) -> Path:
    """The demo config, its schedule scaled down to an 8-step run with 3.3 MiB of all-to-all traffic."""
    text = CONFIG.read_text()
    for old, new in (("calibration_start: 48", "calibration_start: 1"), ("calibration_batches: 8",
                     "calibration_batches: 2"), ("T: 96", "T: 4"), ("log_every_n_steps: 16", "log_every_n_steps: 2"),
                     ("save_dir: logs", f"save_dir: {tmp_path / 'logs'}")):
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "short.yaml"
    config.write_text(text)
    return config


SHORT_RUN = ["--trainer.max_steps=8", "--trainer.val_check_interval=4", "--trainer.log_every_n_steps=2",
             "--trainer.enable_progress_bar=false", "--data.max_rows=200", "--data.num_train_batches=8",
             "--data.num_val_batches=2", "--model.embedding_dim=16", "--model.dense_arch_layer_sizes=[16, 16]",
             "--model.over_arch_layer_sizes=[16, 1]"]


def _dlac(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None,
          **stdio: Any) -> subprocess.CompletedProcess:
    """Run the installed `dlac` console script as a user would, Lightning's launcher starting the other ranks, with
    one difference: the rendezvous port is one this test holds (a store hosted here, which the ranks join as
    clients), where Lightning would pick a free port, close it and hand it on (another process could take it in
    between). No other launcher variable is set (``env`` adds to them). The command runs in a session of its own,
    killed with the ranks it started if it outlives ``timeout``. Its output is captured as text, unless ``stdio``
    gives ``stdout`` and ``stderr`` of its own."""
    script = Path(sys.executable).with_name("dlac")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "lightning_dlac.commands.cli"]
    with hosted_store() as store:
        env = {**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}, "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True", **(env or {})}
        stdio = stdio or {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        return run_session([*command, *args], cwd=cwd, env=env, text=True, timeout=timeout, **stdio)


def _number(pattern: str, text: str) -> list[float]:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in:\n{text[-4000:]}"
    return [float(g.replace(",", "")) for g in match.groups()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dlac_fit_and_validate_as_a_user_runs_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`dlac fit` in a subprocess: Lightning launches the second rank itself (devices=2; only the port, one the test
    holds, is handed to it), the run prints its final metrics and the compression headline, and the report's numbers
    are those of dlac_run.json.
    Then `dlac validate` without a logger."""
    work = tmp_path / "cwd"
    work.mkdir()
    proc = _dlac(["fit", "--config", str(_short_config(tmp_path)), "--data.batch_size=512", *SHORT_RUN],
                 cwd=work, timeout=540)
    out = proc.stdout + proc.stderr  # end-of-run output is rank-zero logging: Lightning's handler writes to stderr
    assert proc.returncode == 0, out[-6000:]
    (run_dir,) = list((tmp_path / "logs").glob("dlrm_synthetic/version_*"))
    assert sorted(p.name for p in work.iterdir()) == [], "dlac fit wrote into the working directory"
    run = json.loads((run_dir / "dlac_run.json").read_text())
    s = run["summary"]
    assert s["world_size"] == 2 and s["batches"] == 8, s  # two ranks: Lightning's launcher started the second
    raw, sent = s["raw_bytes"], s["sent_bytes"]
    assert 0 < sent < raw and raw > 2**20, s

    # The final metrics line: every metric at 4 decimals, as dlac_run.json holds them.
    final = run["final_metrics"]
    assert {"train/loss", "val/auroc"} <= set(final), final
    line = re.search(r"dlac fit finished after 8 steps: (.*)", out)
    assert line, out[-4000:]
    for key, value in final.items():
        assert f"{key}={value:.4f}" in line.group(1), (key, value, line.group(1))

    # The printed headline, and the same line in the report, carry dlac_run.json's bytes and ratio.
    headline = (r"forward all-to-all: ([\d,.]+) MiB sent instead of ([\d,.]+) MiB \(([\d.]+)x smaller,"
                r" ([\d,.]+) MiB saved\)")
    report = (run_dir / "dlac_report.md").read_text()
    for text in (out, report):
        got_sent, got_raw, ratio, saved = _number(headline, text)
        assert got_sent == round(sent / 2**20, 1) and got_raw == round(raw / 2**20, 1), (got_sent, got_raw, s)
        assert ratio == round(raw / sent, 1) and saved == round((raw - sent) / 2**20, 1), (ratio, saved, s)
    assert re.search(r"dlac: forward all-to-all: .* over 8 training batches on 2 ranks", out), out[-4000:]
    assert f"dlac: report in {run_dir / 'dlac_report.md'}" in out
    # The per-table rows add up to the totals (sent bytes also count the exchanged chunk sizes, per call).
    assert sum(s["table_raw_bytes"].values()) == raw and sum(s["table_sent_bytes"].values()) <= sent
    for section in ("# DLAC compression report", "final metrics:", "## Tables", "## Time split", "## Plots",
                    "| t_cat_25 |"):
        assert section in report, section
    pngs = ["dlac_ratio_per_table.png", "dlac_bounds.png", "dlac_bytes_per_step.png", "dlac_loss_auc.png"]
    for png in pngs:
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png})" in report
    header = (run_dir / "metrics.csv").read_text().splitlines()[0]
    assert "train/loss" in header and "val/auroc" in header and "dlac/ratio" in header and "dlac/eps/t_cat_0" in header

    # `dlac report` rebuilds the same report from the run directory alone.
    for png in pngs:
        (run_dir / png).unlink()
    (run_dir / "dlac_report.md").unlink()
    main(["report", str(run_dir)])
    assert (run_dir / "dlac_report.md").read_text() == report
    assert all((run_dir / png).is_file() for png in pngs)
    assert _number(headline, caplog.text) == _number(headline, report)  # logged (under pytest: captured records)

    # `dlac validate` without a logger: the metrics and this rank's bytes, and still nothing in the working
    # directory (no config.yaml: without a logger the run has no directory of its own).
    proc = _dlac(["validate", "--config", str(_short_config(tmp_path)), "--trainer.logger=false",
                  "--data.batch_size=512", *SHORT_RUN], cwd=work, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"dlac validate finished after 0 steps: .*val/auroc=0\.\d{4}", out), out[-4000:]
    assert re.search(r"dlac: rank 0 forward all-to-all sent [\d.]+ MiB instead of [\d.]+ MiB", out), out[-4000:]
    assert sorted(p.name for p in work.iterdir()) == [], "dlac validate wrote into the working directory"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dlac_test_on_preprocessed_criteo_as_a_user_runs_it(tmp_path: Path) -> None:
    """`dlac test` (2 ranks, Lightning's launcher) with the binary Criteo config on a generated TSV converted by
    `dlac preprocess criteo`: the test metrics and this rank's bytes are printed, nothing lands in the working
    directory. (The synthetic and TSV datamodules have no test split; no shipped datamodule has a predict split.)"""
    from lightning_dlac.criteo import preprocess_criteo

    work = tmp_path / "cwd"
    work.mkdir()
    preprocess_criteo([write_criteo_tsv(tmp_path / "train.txt", rows=4000)], tmp_path / "npy", progress=False)
    proc = _dlac(["test", "--config", str(CONFIGS / "dlrm_criteo_binary.yaml"), "--trainer.logger=false",
                  f"--data.data_dir={tmp_path / 'npy'}", "--data.batch_size=64", "--data.max_rows=200",
                  "--model.embedding_dim=8", "--model.dense_arch_layer_sizes=[16, 8]",
                  "--model.over_arch_layer_sizes=[16, 1]", "--trainer.enable_progress_bar=false"],
                 cwd=work, timeout=360)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"dlac test finished after 0 steps: .*val/auroc=0\.\d{4}", out), out[-4000:]
    assert re.search(r"dlac: rank 0 forward all-to-all sent [\d.]+ MiB instead of [\d.]+ MiB", out), out[-4000:]
    assert sorted(p.name for p in work.iterdir()) == [], "dlac test wrote into the working directory"


def test_report_of_a_directory_without_a_run_names_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path)])
    assert f"{tmp_path / 'dlac_run.json'} does not exist" in capsys.readouterr().err


def test_dlac_report_takes_a_baseline(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`dlac report LOG_DIR --baseline OTHER` reaches the report: the logged headline and the report state the final
    differences from the baseline's metrics.csv (an uncompressed run writes no dlac_run.json)."""
    import logging

    from tests.plugin.test_report import _run

    run_dir, base_dir = tmp_path / "dlac", tmp_path / "fp32"
    run_dir.mkdir()
    base_dir.mkdir()
    (run_dir / "dlac_run.json").write_text(json.dumps(_run({"val/auroc": 0.7712}, [0.70, 0.7712])))
    (base_dir / "metrics.csv").write_text("epoch,step,val/auroc\n0,19,0.7700\n")
    with caplog.at_level(logging.INFO):
        main(["report", str(run_dir), "--baseline", str(base_dir), "--no-plots"])
    line = f"vs baseline {base_dir}: val/auroc 0.7712 vs 0.7700 (+0.0012)"
    assert f"dlac: {line}" in caplog.text
    assert f"- {line}" in (run_dir / "dlac_report.md").read_text()


# ---------------------------------------------------------------- errors a user can read, and a CLI that starts at once

# (arguments, the option named, the class that rejected the value, the library's message): a missing file, an
# out-of-range bound, an unknown mode.
USER_ERRORS = {
    "missing file": (["--config", str(CONFIGS / "dlrm_criteo.yaml"), "--data.train_path=/nonexistent/train.txt"],
                     "--data.train_path=/nonexistent/train.txt", "CriteoTSVDataModule",
                     "Criteo TSV file not found: '/nonexistent/train.txt'"),
    "bound out of range": (["--config", str(CONFIG), "--trainer.strategy.init_args.compression.eps=2"],
                           "--trainer.strategy.init_args.compression.eps=2", "CompressionOptions",
                           "eps=2.0 is out of range: a relative error bound must be in (0, 1)"),
    "unknown mode": (["--config", str(CONFIG), "--trainer.callbacks.init_args.mode=bogus"],
                     "--trainer.callbacks.init_args.mode=bogus", "DLACCallback", "mode='bogus' is not supported"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_a_rejected_value_names_the_option_as_given(case: str) -> None:
    args, option, component, message = USER_ERRORS[case]
    with pytest.raises(CLIUserError) as info:
        build_cli([*args, "--trainer.logger=false"], run=False)
    assert (info.value.option, info.value.component) == (option, component)
    assert message in info.value.message and str(info.value).startswith(f"{option} ({component}): {message}")


def test_a_rejected_trainer_setting_names_the_option() -> None:
    with pytest.raises(CLIUserError) as info:
        build_cli(["--config", str(CONFIG), "--trainer.logger=false", "--trainer.devices=0"], run=False)
    assert (info.value.option, info.value.component) == ("--trainer.devices=0", "Trainer")


def test_name_option_prefers_what_the_message_names_in_the_users_spelling() -> None:
    argv = ["fit", "--config", "x.yaml", "--data.init_args.batch_size=0", "--data.max_rows", "5"]
    assert name_option(argv, "data", ["batch_size", "max_rows"], "batch_size must be at least 1, got 0.") == (
        "--data.init_args.batch_size=0"
    )
    # The message names no parameter (as DLACStrategy's, which reports its bounds object's `default_eps`): every
    # option of the component given on the command line.
    assert name_option(argv, "data", ["batch_size", "max_rows"], "something else") == (
        "--data.init_args.batch_size=0, --data.max_rows 5"
    )
    # Set in a config file: the parameter the message names, spelled as an option.
    assert name_option(["fit"], "trainer.callbacks", ["mode", "T"], "mode='x' is not supported") == (
        "--trainer.callbacks.init_args.mode"
    )
    assert name_option(["fit"], "data", ["train_path"], "Set `train_path` of X") == "--data.train_path"
    # Several named: the one the message is about, named first (Lightning's run-time refusals suggest others after it).
    assert name_option(["fit"], "trainer", ["limit_val_batches", "val_check_interval"],
                       "`val_check_interval` (64) must be <= 48 ... set `limit_val_batches` to 0.0") == (
        "--trainer.val_check_interval"
    )
    assert name_option(["fit"], "trainer.strategy", ["eps"], "default_eps=2.0 is out of range") is None
    # A field of a config object (DLACStrategy's compression=): spelled after the object, with no init_args of its own.
    group = "trainer.strategy.init_args.compression"
    assert name_option(["fit"], group, ["eps", "pieces"], "eps=2.0 is out", group=True) == f"--{group}.eps"
    assert name_option(["fit", f"--{group}.eps=2"], group, ["eps"], "eps=2.0 is out", group=True) == f"--{group}.eps=2"


def _dlac_user_error(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    work = tmp_path / "cwd"
    work.mkdir(parents=True, exist_ok=True)
    return _dlac(["fit", *args, "--trainer.logger=false"], cwd=work, timeout=300)


@pytest.mark.slow  # a fresh `dlac fit`
@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_dlac_fit_stops_on_a_user_error_with_its_message_and_status_2(case: str, tmp_path: Path) -> None:
    args, option, component, message = USER_ERRORS[case]
    proc = _dlac_user_error(args, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert lines[0].startswith(f"dlac fit: error: {option} ({component}): {message}"), proc.stderr
    assert "--debug or DLAC_DEBUG=1" in proc.stderr


@pytest.mark.slow  # a fresh `dlac fit` on 2 ranks
def test_an_error_the_run_raises_on_every_rank_is_one_line_naming_the_option(tmp_path: Path) -> None:
    """Lightning refuses the demo config with fewer training batches than its validation interval, on both ranks,
    once training starts: one line from rank 0, naming the option, status 2; the ranks' tracebacks only with
    --debug."""
    config = str(CONFIGS / "dlrm_synthetic.yaml")
    proc = _dlac_user_error(["--config", config, "--data.num_train_batches=48"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert "Traceback" not in out and "[rank1]" not in proc.stderr.replace("[rank1]:W", "")
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, errors
    assert errors[0].startswith("dlac fit: error: --trainer.val_check_interval (Trainer): `val_check_interval` (64)"
                                " must be less than or equal to the number of the training batches (48)"), errors
    assert errors[0].endswith("(run with --debug or DLAC_DEBUG=1 to see the traceback)")
    debug = _dlac_user_error(["--config", config, "--data.num_train_batches=48", "--debug"], tmp_path / "debug")
    assert debug.returncode != 2 and "Traceback" in debug.stderr and "val_check_interval" in debug.stderr


@pytest.mark.slow  # a fresh `dlac fit`
def test_debug_shows_the_traceback_from_where_the_library_raised(tmp_path: Path) -> None:
    args, option, component, message = USER_ERRORS["bound out of range"]
    proc = _dlac_user_error([*args, "--debug"], tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    assert "lightning_dlac/adaptive/bounds.py" in proc.stderr or "lightning_dlac/comm" in proc.stderr
    assert f"CLIUserError: {option} ({component}): {message}" in proc.stderr


IMPORTS_AFTER_HELP = """
import sys
from lightning_dlac.commands.cli import main
try:
    main({argv!r})
except SystemExit as exit:
    assert exit.code == 0, exit.code
heavy = ("torch", "lightning", "pytorch_lightning", "torchrec", "fbgemm_gpu", "torchmetrics", "matplotlib")
print("LOADED", sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy)))
"""


@pytest.mark.slow  # a fresh Python process
@pytest.mark.parametrize("argv", [["preprocess", "criteo", "--help"], ["report", "--help"], ["estimate", "--help"]])
def test_light_subcommands_import_neither_torch_nor_lightning(argv: list[str]) -> None:
    """`dlac preprocess|report|estimate --help` answers without importing torch, Lightning or TorchRec, so it starts
    as fast as a bare `python -c "import numpy"` (measured in the report of this change, not here)."""
    proc = subprocess.run([sys.executable, "-c", IMPORTS_AFTER_HELP.format(argv=argv)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage: dlac" in proc.stdout
    assert "LOADED []" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow  # a fresh `dlac fit` on 2 ranks
@pytest.mark.timeout(300)
def test_a_peer_that_stops_answering_ends_dlac_fit_with_one_line_and_the_resume_command(tmp_path: Path) -> None:
    """`dlac fit` whose rank 1 stops (SIGSTOP) at batch 3: rank 0 ends at the strategy's timeout with one line
    naming rank 1, the step and where rank 0 waited, and the command that resumes the run from its last checkpoint
    (the elastic config checkpoints every 2 steps here); no traceback, exit status 1. The timeout also bounds the
    ranks' start-up (Lightning's launcher starts rank 1 once rank 0 runs), so it leaves room for a busy machine."""
    work = tmp_path / "cwd"
    work.mkdir()
    text = (CONFIGS / "dlrm_elastic.yaml").read_text()
    for old, new in (("every_n_train_steps: 40", "every_n_train_steps: 2"), ("save_dir: logs", f"save_dir: {tmp_path}"),
                     ("  callbacks:\n", f"  callbacks:\n    - class_path: tests._faults.Fault\n      init_args: {{how:"
                                       f" stop, rank: 1, batch: 3, workdir: {tmp_path}}}\n")):
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "stops.yaml"
    config.write_text(text)
    args = ["fit", "--config", str(config), "--trainer.strategy.init_args.timeout=20", *SHORT_RUN]
    output = tmp_path / "output.txt"
    # To a file, not a pipe: the stopped rank holds its end of the command's output open until the test kills it.
    try:
        with output.open("w") as sink:
            proc = _dlac(args, cwd=work, timeout=240, env={"PYTHONPATH": str(CONFIGS.parents[1])}, stdout=sink,
                         stderr=subprocess.STDOUT)
    finally:
        kill_stopped(tmp_path, rank=1)
    out = output.read_text()
    assert proc.returncode == 1, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    (line,) = [line for line in out.splitlines() if line.startswith("dlac fit: error:")]
    resume = shlex.join(["dlac", *args, "--ckpt_path=last"])
    assert re.fullmatch(r"dlac fit: error: rank 1 stopped answering: rank 0 waited 20 s in the forward pass"
                        r" \(TorchRec's input all-to-all\), at step 3 \(last mark: rank 1: [^;()]+\);"
                        r" resume: "
                        + re.escape(resume) + r" \(run with --debug or DLAC_DEBUG=1 to see the traceback\)",
                        line), line
    assert (work / "checkpoints" / "dlrm_elastic" / "last.ckpt").is_dir()


def _fit_stopped_by_a_silent_peer(args: Any, run: bool = True) -> Any:
    """In place of build_cli: a fit whose rank 1 went silent, after the strategy completed the error."""
    from lightning_dlac.comm import PeerTimeoutError

    error = PeerTimeoutError(0, "TorchRec's input all-to-all", "Timed out waiting 30000ms for send operation")
    error.phase, error.step, error.silent, error.last_seen = "forward", 41, (1,), {1: "train step 40, backward pass"}
    error.resume = "ckpt_path='last' (its last checkpoint is in checkpoints)"
    raise RuntimeError("fit failed") from error


def test_a_silent_peer_ends_dlac_with_one_line_the_resume_command_and_status_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The line `dlac fit` ends with when a peer went silent, in-process: the error's message, the user's own
    command line with --ckpt_path=last (its own --ckpt_path replaced), exit status 1; with --debug the error itself,
    with its traceback. The 2-rank run behind it: test_a_peer_that_stops_answering_ends_dlac_fit_with_one_line_..."""
    import lightning_dlac.commands.cli as cli

    monkeypatch.setattr(cli, "build_cli", _fit_stopped_by_a_silent_peer)
    monkeypatch.setenv("DLAC_DEBUG", "0")  # and restored at the end: main() sets it for the ranks it would launch
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", "my run.yaml", "--ckpt_path", "old"])
    assert stopped.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == ("dlac fit: error: rank 1 stopped answering: rank 0 waited 30 s in the forward pass (TorchRec's"
                    " input all-to-all), at step 41 (last mark: rank 1: train step 40, backward pass); resume: dlac fit"
                    " --config 'my run.yaml' --ckpt_path=last (run with --debug or DLAC_DEBUG=1 to see the"
                    " traceback)")
    with pytest.raises(RuntimeError, match="fit failed") as raised:
        main(["fit", "--config", "my run.yaml", "--debug"])
    assert "rank 1 stopped answering" in str(raised.value.__cause__)
