"""The dlac CLI: the shipped config parses, and a short 2-rank fit runs from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dlac import DLACStrategy
from lightning_dlac.cli import build_cli, main
from tests._launch import run_ranks

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "dlrm_synthetic.yaml"


def test_shipped_config_builds_strategy_model_and_data() -> None:
    cli = build_cli(["--config", str(CONFIG), "--trainer.logger=false"], run=False)
    assert isinstance(cli.trainer.strategy, DLACStrategy)
    assert cli.trainer.strategy.sharding_types == ["table_wise"]
    # The model is sized from the datamodule (linked arguments).
    assert list(cli.model.hparams.num_embeddings_per_feature) == cli.datamodule.num_embeddings_per_feature


def test_unknown_yaml_key_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIG.read_text().replace("embedding_lr: 0.02", "embeding_lr: 0.02"))
    with pytest.raises(SystemExit):
        build_cli(["--config", str(bad)], run=False)
    assert "embeding_lr" in capsys.readouterr().err


def _fit_from_config(rank: int, world_size: int, log_dir: str) -> None:
    main(
        [
            "fit",
            "--config",
            str(CONFIG),
            "--trainer.max_steps=6",
            "--trainer.val_check_interval=3",
            "--trainer.log_every_n_steps=2",
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={log_dir}",
            "--data.batch_size=64",
            "--data.max_rows=200",
            "--data.num_train_batches=6",
            "--data.num_val_batches=2",
            "--model.embedding_dim=8",
            "--model.dense_arch_layer_sizes=[16, 8]",
            "--model.over_arch_layer_sizes=[16, 1]",
        ]
    )


def test_two_rank_fit_from_config(tmp_path: Path) -> None:
    run_ranks(_fit_from_config, 2, str(tmp_path))
    metrics = list(tmp_path.glob("dlrm_synthetic/version_*/metrics.csv"))
    assert len(metrics) == 1
    header = metrics[0].read_text().splitlines()[0]
    assert "train/loss" in header and "val/auroc" in header
