"""Any model shape from a config: the synthetic DataModule with any number of tables, drawn production-like shapes
(:class:`TableShapes`), and the shipped many-table config (examples/configs/dlrm_many_tables.yaml) built and trained
from the commands its header and README give."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import pytest
import torch
from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule, TableShapes

from lightning_dlac.commands.cli import build_cli
from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dlrm_many_tables.yaml"


def test_a_drawn_shape_is_log_uniform_within_its_bounds_and_a_pure_function_of_its_fields() -> None:
    shape = TableShapes(num_tables=1000, min_rows=10, max_rows=1_000_000, seed=3)
    sizes = shape.table_sizes()
    assert sizes == TableShapes(num_tables=1000, min_rows=10, max_rows=1_000_000, seed=3).table_sizes()
    assert sizes != TableShapes(num_tables=1000, min_rows=10, max_rows=1_000_000, seed=4).table_sizes()
    assert len(sizes) == 1000 and min(sizes) >= 10 and max(sizes) <= 1_000_000
    # Log-uniform over five decades: each decade holds about a fifth of the tables, the median near 10**3.5.
    decades = [sum(10**d <= n < 10 ** (d + 1) for n in sizes) for d in range(1, 6)]
    assert all(150 <= k <= 250 for k in decades), decades
    assert abs(math.log10(statistics.median(sizes)) - 3.5) < 0.25
    # A positive exponent makes small tables more common; pooling "one_hot" draws none, "mlperf" MLPerf's factors.
    steep = TableShapes(num_tables=1000, min_rows=10, max_rows=1_000_000, size_exponent=0.5, seed=3).table_sizes()
    assert statistics.median(steep) < statistics.median(sizes) / 10
    assert shape.pooling_factors() is None
    pooling = TableShapes(num_tables=1000, pooling="mlperf").pooling_factors()
    assert set(pooling) <= set(MLPERF_MULTI_HOT_SIZES) and len(set(pooling)) > 8
    assert sum(p == 1 for p in pooling) > 300  # as in MLPerf's 26, where 11 features look up one id


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_tables": 0}, "num_tables must be at least 1, got 0"),
    ({"num_tables": 5, "min_rows": 100, "max_rows": 10}, "1 <= min_rows <= max_rows"),
    ({"num_tables": 5, "size_exponent": -1.0}, "size_exponent must be >= 0"),
    ({"num_tables": 5, "pooling": "poisson"}, "pooling='poisson' is not supported; choose one of 'one_hot', 'mlperf'"),
])  # fmt: skip
def test_a_bad_shape_names_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TableShapes(**fields)


def test_the_synthetic_datamodule_serves_any_number_of_tables() -> None:
    dm = SyntheticCriteoDataModule(num_embeddings_per_feature=[1000, 20, 5000], batch_size=16, seed=1)
    batch = dm.read_batch("train", 0)
    assert dm.feature_names == ["cat_0", "cat_1", "cat_2"] and batch.sparse_features.keys() == dm.feature_names
    assert batch.sparse_features.values().numel() == 3 * 16 and batch.dense_features.shape == (16, 13)
    for name, rows in zip(dm.feature_names, [1000, 20, 5000]):
        ids = batch.sparse_features[name].values()
        assert 0 <= int(ids.min()) and int(ids.max()) < rows

    shape = TableShapes(num_tables=300, max_rows=50_000, pooling="mlperf", seed=2)
    dm = SyntheticCriteoDataModule(shape=shape, batch_size=32, seed=1)
    assert dm.num_embeddings_per_feature == shape.table_sizes() and dm.multi_hot_sizes == shape.pooling_factors()
    batch = dm.read_batch("val", 3)
    lengths = batch.sparse_features.lengths().view(300, 32)
    assert lengths.tolist() == [[p] * 32 for p in shape.pooling_factors()]
    # Hundreds of tables stay as learnable as Criteo's 26: the effects are scaled to the same total variance.
    labels = torch.cat([dm.read_batch("train", i).labels for i in range(8)])
    assert 0.2 < float(labels.mean()) < 0.3
    logits = dm.generator.logits(batch)
    criteo = SyntheticCriteoDataModule(batch_size=32, seed=1)
    assert 0.5 < float(logits.std()) / float(criteo.generator.logits(criteo.read_batch("val", 3)).std()) < 2.0


def test_criteo_s_shape_is_unchanged_by_any_shape_support() -> None:
    """Criteo's 26 tables keep Criteo's keys and the same batches (the effect scale is 1 exactly at 9 of 26)."""
    dm = SyntheticCriteoDataModule(batch_size=8, seed=0)
    again = SyntheticCriteoDataModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, batch_size=8, seed=0)
    a, b = dm.read_batch("train", 5), again.read_batch("train", 5)
    assert dm.feature_names == [f"cat_{k}" for k in range(26)]
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values()) and torch.equal(a.labels, b.labels)
    assert dm.generator.informative_tables == again.generator.informative_tables


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"shape": TableShapes(4), "num_embeddings_per_feature": [10] * 4}, "give either shape or num_embeddings"),
    ({"shape": TableShapes(4), "multi_hot_sizes": [1] * 4}, "give either shape or num_embeddings"),
    ({"num_embeddings_per_feature": []}, "num_embeddings_per_feature is empty"),
    ({"num_embeddings_per_feature": [10, 0]}, "must lie in [1, 2147483647]; got (table, size) [(1, 0)]"),
    ({"num_embeddings_per_feature": [10] * 3, "multi_hot_sizes": [2] * 26},
     "multi_hot_sizes needs one pooling factor per categorical feature (3), got 26"),
    ({"shape": TableShapes(4, pooling="mlperf"), "ids_per_feature": 2}, "give only multi_hot_sizes"),
])  # fmt: skip
def test_conflicting_or_bad_shapes_name_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SyntheticCriteoDataModule(**kwargs)


@pytest.mark.parametrize(("overrides", "tables", "pooled"), [
    ([], 200, True),
    (["--data.shape.num_tables=500", "--data.shape.pooling=one_hot"], 500, False),
    (["--data.shape=null", "--data.num_embeddings_per_feature=[1000, 20, 5000]"], 3, False),
])  # fmt: skip
def test_the_many_table_config_takes_any_shape_from_the_command_line(overrides: list, tables: int,
                                                                     pooled: bool) -> None:
    cli = build_cli(["--config", str(CONFIG), "--trainer.logger=false", *overrides], run=False)
    sizes = cli.datamodule.num_embeddings_per_feature
    assert len(sizes) == tables and list(cli.model.hparams.num_embeddings_per_feature) == sizes
    assert list(cli.model.hparams.feature_names) == [f"cat_{k}" for k in range(tables)]
    assert (cli.datamodule.multi_hot_sizes is not None) == pooled
    assert len(cli.model.embedding_bag_collection.embedding_bag_configs()) == tables


@pytest.mark.slow  # a fresh `dlac fit` of 200 tables on 2 ranks
def test_the_many_table_config_trains_from_its_documented_command(tmp_path: Path) -> None:
    from tests.commands.test_cli import _dlac

    header = CONFIG.read_text().splitlines()
    (command,) = [line.strip(" #") for line in header if line.startswith("#   dlac fit") and "num_tables" not in line
                  and "shape=null" not in line]  # fmt: skip
    assert command == "dlac fit --config examples/configs/dlrm_many_tables.yaml"
    short = ["--trainer.max_steps=12", "--trainer.val_check_interval=6", "--trainer.limit_val_batches=2",
             "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--data.batch_size=64",
             "--trainer.callbacks.init_args.calibration_start=4", "--trainer.callbacks.init_args.recalibrate_every=4",
             "--trainer.callbacks.init_args.calibration_batches=2"]  # fmt: skip
    proc = _dlac(["fit", "--config", str(CONFIG), *short], cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"sharded 200 embedding tables over 2 rank", out), out[-4000:]
    classes = re.search(r"bounds \(noise\): calibrated, (\d+) tight, (\d+) base, (\d+) loose tables", out)
    assert classes and sum(map(int, classes.groups())) == 200, out[-4000:]
    assert re.search(r"dlac fit finished after 12 steps: dlac/ratio=\d+\.\d+.*val/auroc=0\.\d{4}", out), out[-4000:]
