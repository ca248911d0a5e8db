"""The example DataModules: batch layout, determinism, rank sharding, Zipf skew, planted signal, Criteo TSV."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning_dlac.examples.base import RankShardedDataModule, table_sizes
from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule
from lightning_dlac.examples.tsv import CriteoTSVDataModule
from torchmetrics.classification import BinaryAUROC
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_dlac.criteo import CRITEO_KAGGLE_CARDINALITIES, FEATURE_NAMES, capped_cardinalities
from tests.conftest import write_criteo_tsv

CRITEO_SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_kaggle_head10k.tsv"
needs_sample = pytest.mark.skipif(
    not CRITEO_SAMPLE.is_file(), reason=f"Criteo sample not found at {CRITEO_SAMPLE} (shared/ beside the repo)"
)


def _batches(dm, split: str = "train") -> list[Batch]:
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return list(loader)


def _assert_batch_equal(a: Batch, b: Batch) -> None:
    torch.testing.assert_close(a.dense_features, b.dense_features, rtol=0, atol=0)
    torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)
    torch.testing.assert_close(a.sparse_features.values(), b.sparse_features.values(), rtol=0, atol=0)
    torch.testing.assert_close(a.sparse_features.lengths(), b.sparse_features.lengths(), rtol=0, atol=0)


def _assert_batch_layout(batch: Batch, batch_size: int, table_sizes: list[int], ids_per_feature: int = 1) -> None:
    assert isinstance(batch, Batch)
    assert batch.dense_features.shape == (batch_size, 13) and batch.dense_features.dtype == torch.float32
    assert batch.labels.shape == (batch_size,) and batch.labels.dtype == torch.float32
    assert set(batch.labels.unique().tolist()) <= {0.0, 1.0}
    kjt = batch.sparse_features
    assert isinstance(kjt, KeyedJaggedTensor)
    assert kjt.keys() == list(FEATURE_NAMES) == [f"cat_{i}" for i in range(26)]
    assert kjt.values().dtype == torch.int64 and kjt.lengths().dtype == torch.int32
    assert torch.all(kjt.lengths() == ids_per_feature) and kjt.lengths().numel() == 26 * batch_size
    for name, size in zip(FEATURE_NAMES, table_sizes):
        ids = kjt[name].values()
        assert ids.numel() == batch_size * ids_per_feature
        assert int(ids.min()) >= 0 and int(ids.max()) < size, name


def test_cardinalities() -> None:
    assert len(CRITEO_KAGGLE_CARDINALITIES) == 26 and CRITEO_KAGGLE_CARDINALITIES[2] == 10131227
    assert capped_cardinalities(1000) == [min(n, 1000) for n in CRITEO_KAGGLE_CARDINALITIES]
    with pytest.raises(ValueError, match="max_rows"):
        capped_cardinalities(0)
    # The Criteo sources need Criteo's 26 tables (the synthetic one takes any number: test_table_shapes.py).
    with pytest.raises(ValueError, match="one table size per categorical feature"):
        table_sizes([10] * 3)


def test_synthetic_batch_layout_and_exposed_attributes() -> None:
    dm = SyntheticCriteoDataModule(batch_size=64, num_train_batches=3, num_val_batches=2, max_rows=500)
    assert dm.num_embeddings_per_feature == capped_cardinalities(500)
    assert dm.feature_names == list(FEATURE_NAMES) and dm.num_dense_features == 13
    dm.setup("fit")
    train, val = _batches(dm), _batches(dm, "val")
    assert len(train) == len(dm.train_dataloader()) == 3 and len(val) == 2
    for batch in train + val:
        _assert_batch_layout(batch, 64, dm.num_embeddings_per_feature)
    assert torch.all(train[0].dense_features >= 0)
    # Validation is its own stream, not a replay of training.
    assert not torch.equal(train[0].dense_features, val[0].dense_features)


def test_synthetic_multi_hot_and_full_size_tables() -> None:
    sizes = list(CRITEO_KAGGLE_CARDINALITIES)
    dm = SyntheticCriteoDataModule(
        num_embeddings_per_feature=sizes, batch_size=32, num_train_batches=2, ids_per_feature=3
    )
    dm.setup("fit")
    for batch in _batches(dm):
        _assert_batch_layout(batch, 32, sizes, ids_per_feature=3)


def test_synthetic_is_deterministic_by_seed_and_epoch() -> None:
    def stream(seed: int) -> list[Batch]:
        dm = SyntheticCriteoDataModule(batch_size=128, num_train_batches=3, seed=seed)
        dm.setup("fit")
        return _batches(dm)

    first, again, other = stream(0), stream(0), stream(1)
    for a, b in zip(first, again):
        _assert_batch_equal(a, b)
    assert not torch.equal(first[0].sparse_features.values(), other[0].sparse_features.values())
    # Batches within a stream differ from each other, and a second epoch replays the first.
    assert not torch.equal(first[0].sparse_features.values(), first[1].sparse_features.values())
    dm = SyntheticCriteoDataModule(batch_size=128, num_train_batches=3, seed=0)
    dm.setup("fit")
    loader = dm.train_dataloader()
    list(loader)
    for a, b in zip(first, loader):
        _assert_batch_equal(a, b)


def test_synthetic_ranks_get_disjoint_interleaved_streams() -> None:
    kwargs = dict(batch_size=64, num_train_batches=3, num_val_batches=2, seed=3)
    single = SyntheticCriteoDataModule(**{**kwargs, "num_train_batches": 6, "num_val_batches": 4})
    single.setup("fit")
    global_train, global_val = _batches(single), _batches(single, "val")

    per_rank = []
    for rank in range(2):
        dm = SyntheticCriteoDataModule(**kwargs)
        dm.set_rank(rank, 2)
        dm.setup("fit")
        per_rank.append((_batches(dm), _batches(dm, "val")))
        assert len(per_rank[-1][0]) == 3 and len(per_rank[-1][1]) == 2
        # Rank r of W reads global batches r, r + W, ...
        for j, batch in enumerate(per_rank[-1][0]):
            _assert_batch_equal(batch, global_train[rank + 2 * j])
        for j, batch in enumerate(per_rank[-1][1]):
            _assert_batch_equal(batch, global_val[rank + 2 * j])
    for a in per_rank[0][0]:
        for b in per_rank[1][0]:
            assert not torch.equal(a.sparse_features.values(), b.sparse_features.values())

    # Without the test hook, rank and world come from the attached trainer.
    dm = SyntheticCriteoDataModule(**kwargs)
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2)  # type: ignore[assignment]
    dm.setup("fit")
    for a, b in zip(_batches(dm), per_rank[1][0]):
        _assert_batch_equal(a, b)


@pytest.mark.slow  # DataLoader worker processes
def test_synthetic_workers_keep_the_stream() -> None:
    dm = SyntheticCriteoDataModule(batch_size=32, num_train_batches=5, seed=5)
    dm.setup("fit")
    expected = _batches(dm)
    dm.num_workers = 2
    got = _batches(dm)
    assert len(got) == 5
    for a, b in zip(expected, got):
        _assert_batch_equal(a, b)


def test_synthetic_ids_are_zipf_skewed_and_permuted() -> None:
    dm = SyntheticCriteoDataModule(batch_size=512, num_train_batches=8, max_rows=10_000)
    dm.setup("fit")
    ids = torch.cat([b.sparse_features["cat_2"].values() for b in _batches(dm)])
    counts = torch.bincount(ids, minlength=10_000).sort(descending=True)
    # The hottest 1% of ids take a large share of lookups (uniform would give 1%).
    assert counts.values[:100].sum() / ids.numel() > 0.3
    # ... and the hot ids are scattered over the table, not 0..k.
    assert counts.indices[:10].float().mean() > 500
    uniform = SyntheticCriteoDataModule(batch_size=512, num_train_batches=8, max_rows=10_000, zipf_alpha=0.0)
    uniform.setup("fit")
    ids = torch.cat([b.sparse_features["cat_2"].values() for b in _batches(uniform)])
    # Sampling noise alone puts ~7% of 4,096 uniform draws on the 100 most drawn of 10,000 ids.
    assert torch.bincount(ids, minlength=10_000).sort(descending=True).values[:100].sum() / ids.numel() < 0.1


def test_synthetic_positive_rate_and_planted_signal_is_learnable() -> None:
    torch.manual_seed(0)
    dm = SyntheticCriteoDataModule(batch_size=512, num_train_batches=8, num_val_batches=4, seed=0)
    dm.setup("fit")
    train, val = _batches(dm), _batches(dm, "val")
    labels = torch.cat([b.labels for b in train + val])
    assert 0.2 < labels.mean().item() < 0.3

    # Logistic regression: one learned scalar per id of every table plus a linear term on the dense features.
    sizes = dm.num_embeddings_per_feature
    offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0).unsqueeze(1)
    per_id = torch.nn.EmbeddingBag(sum(sizes), 1, mode="sum")
    torch.nn.init.zeros_(per_id.weight)
    dense = torch.nn.Linear(dm.num_dense_features, 1)
    opt = torch.optim.Adam([*per_id.parameters(), *dense.parameters()], lr=0.05)

    def logit(batch: Batch) -> torch.Tensor:
        ids = batch.sparse_features.values().view(len(sizes), -1) + offsets
        return (dense(batch.dense_features) + per_id(ids.t().contiguous())).squeeze(1)

    for _ in range(5):
        for batch in train:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit(batch), batch.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    auroc = BinaryAUROC()
    with torch.no_grad():
        for batch in val:
            auroc.update(logit(batch), batch.labels.long())
    assert auroc.compute().item() > 0.65


class _TinyCTR(LightningModule):
    """One scalar per id plus a linear dense term: enough to see Lightning feed Batches through fit."""

    def __init__(self, table_sizes: list[int], num_dense: int) -> None:
        super().__init__()
        self.per_id = torch.nn.EmbeddingBag(sum(table_sizes), 1, mode="sum")
        self.dense = torch.nn.Linear(num_dense, 1)
        self.register_buffer("offsets", torch.tensor([0, *table_sizes[:-1]]).cumsum(0).unsqueeze(1))
        self.seen: list[int] = []

    def _loss(self, batch: Batch) -> torch.Tensor:
        assert isinstance(batch, Batch)
        ids = batch.sparse_features.values().view(self.offsets.shape[0], -1) + self.offsets
        logit = (self.dense(batch.dense_features) + self.per_id(ids.t().contiguous())).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logit, batch.labels)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.labels.shape[0])
        return self._loss(batch)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), batch_size=batch.labels.shape[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_synthetic_datamodule_drives_a_trainer() -> None:
    dm = SyntheticCriteoDataModule(batch_size=64, num_train_batches=3, num_val_batches=2, max_rows=100)
    model = _TinyCTR(dm.num_embeddings_per_feature, dm.num_dense_features)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    assert model.seen == [64] * 6 and trainer.num_training_batches == 3
    assert math.isfinite(trainer.callback_metrics["val_loss"].item())


TSV_ROWS = 10_000


@pytest.fixture(scope="module", params=["generated", pytest.param("sample", marks=needs_sample)])
def criteo_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10,000-row Criteo Kaggle TSV: one generated here (missing, negative and hex fields; runs in a fresh
    clone), and the real sample when ../shared holds it."""
    if request.param == "sample":
        return CRITEO_SAMPLE
    return write_criteo_tsv(tmp_path_factory.mktemp("criteo") / "train.tsv", rows=TSV_ROWS, positives=2_180)


@pytest.fixture(scope="module")
def criteo_dm(criteo_file: Path) -> CriteoTSVDataModule:
    dm = CriteoTSVDataModule(str(criteo_file), val_fraction=0.2, batch_size=500, max_rows=1000, shuffle=False)
    dm.setup("fit")
    return dm


def _rows(path: Path) -> list[list[str]]:
    with path.open() as f:
        return [line.rstrip("\n").split("\t") for line in f]


def test_criteo_tsv_rows_labels_and_layout(criteo_dm: CriteoTSVDataModule, criteo_file: Path) -> None:
    assert criteo_dm.num_embeddings_per_feature == capped_cardinalities(1000)
    assert criteo_dm.feature_names == list(FEATURE_NAMES) and criteo_dm.num_dense_features == 13
    train, val = _batches(criteo_dm), _batches(criteo_dm, "val")
    # 8,000 training rows and 2,000 held-out rows in batches of 500, nothing dropped.
    assert len(train) == criteo_dm.num_train_batches == 16 and len(val) == 4
    labels = torch.cat([b.labels for b in train + val])
    assert labels.tolist() == [float(r[0]) for r in _rows(criteo_file)]  # unshuffled: file order
    assert labels.mean().item() == pytest.approx(0.218, abs=0.005)
    for batch in train + val:
        _assert_batch_layout(batch, 500, criteo_dm.num_embeddings_per_feature)


def test_criteo_tsv_transforms_match_the_file(criteo_dm: CriteoTSVDataModule, criteo_file: Path) -> None:
    rows = _rows(criteo_file)
    batches = _batches(criteo_dm) + _batches(criteo_dm, "val")  # unshuffled: file order
    dense = torch.cat([b.dense_features for b in batches])
    ids = torch.cat([b.sparse_features.values().view(26, -1) for b in batches], dim=1).t()
    sizes = criteo_dm.num_embeddings_per_feature
    seen_missing_dense = seen_missing_cat = seen_negative = False
    for i in range(0, TSV_ROWS, 97):
        fields = rows[i]
        for k, v in enumerate(fields[1:14]):
            raw = int(v) if v else 0
            seen_missing_dense |= not v
            seen_negative |= raw < 0
            assert dense[i, k].item() == pytest.approx(math.log1p(max(raw, 0)), rel=1e-6)
        for k, v in enumerate(fields[14:]):
            seen_missing_cat |= not v
            assert ids[i, k].item() == (int(v, 16) % sizes[k] if v else 0)
    assert seen_missing_dense and seen_missing_cat and seen_negative


def test_criteo_tsv_shards_evenly_across_ranks(criteo_file: Path) -> None:
    kwargs = dict(train_path=str(criteo_file), batch_size=512, max_samples=5000, max_rows=1000, seed=1)
    single = CriteoTSVDataModule(**kwargs)
    single.setup("fit")
    global_train = _batches(single)  # 4,000 training rows -> 7 batches, remainder dropped
    assert len(global_train) == 7
    streams = []
    for rank in range(2):
        dm = CriteoTSVDataModule(**kwargs)
        dm.set_rank(rank, 2)
        if rank == 0:
            with pytest.warns(UserWarning, match="validation is empty"):  # 1,000 val rows: no batch per rank
                dm.setup("fit")
        else:
            dm.setup("fit")
        streams.append(_batches(dm))
        assert len(streams[-1]) == 3 and len(_batches(dm, "val")) == 0
        for j, batch in enumerate(streams[-1]):
            _assert_batch_equal(batch, global_train[rank + 2 * j])
    for a in streams[0]:
        for b in streams[1]:
            assert not torch.equal(a.dense_features, b.dense_features)


def test_criteo_tsv_separate_val_file(tmp_path: Path, criteo_file: Path) -> None:
    val_file = tmp_path / "val.tsv"
    val_file.write_text("".join(criteo_file.open().readlines()[:1000]))
    dm = CriteoTSVDataModule(str(criteo_file), val_path=str(val_file), batch_size=256, max_samples=2000)
    dm.setup("fit")
    assert dm.num_train_batches == 7 and dm.num_val_batches == 3


def test_criteo_tsv_a_bad_line_deep_in_a_real_sized_file_is_named(tmp_path: Path) -> None:
    good = ["0", *["1"] * 13, *["ab"] * 26]
    bad = {7_321: "\t".join(good[:20]), 9_002: "\t".join([*good[:20], "xyz!", *good[21:]])}  # too few fields; not hex
    path = write_criteo_tsv(tmp_path / "train.tsv", bad_lines=bad)
    with pytest.raises(ValueError, match="expected 40 tab-separated fields") as err:
        CriteoTSVDataModule(str(path), batch_size=64).setup("fit")
    assert str(path) in str(err.value) and "line 7321" in str(err.value)  # the first bad line
    path = write_criteo_tsv(tmp_path / "train2.tsv", bad_lines={9_002: bad[9_002]})
    with pytest.raises(ValueError, match="cat_6") as err:
        CriteoTSVDataModule(str(path), batch_size=64).setup("fit")
    assert "line 9002" in str(err.value)


def _write_rows(path: Path, rows: list[list[str]]) -> Path:
    path.write_text("".join("\t".join(r) + "\n" for r in rows))
    return path


def _good_row() -> list[str]:
    return ["1", *[str(i) for i in range(13)], *[f"{i:08x}" for i in range(26)]]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (["0", *["1"] * 13, *["ab"] * 25], "expected 40 tab-separated fields"),
        (["0", *["1"] * 13, *["ab"] * 12, "xyz!", *["ab"] * 13], "cat_12"),
        (["0", *["1"] * 13, *["ab"] * 12, "-1f", *["ab"] * 13], "cat_12"),
        (["0", "1.5", *["1"] * 12, *["ab"] * 26], "int_0"),
        (["2", *["1"] * 13, *["ab"] * 26], "label"),
    ],
)
def test_criteo_tsv_malformed_line_names_file_and_line(tmp_path: Path, line: list[str], message: str) -> None:
    path = _write_rows(tmp_path / "bad.tsv", [_good_row(), _good_row(), line, _good_row()])
    dm = CriteoTSVDataModule(str(path), batch_size=1)
    with pytest.raises(ValueError, match=message) as err:
        dm.setup("fit")
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_criteo_tsv_missing_path_names_it_and_the_argument(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.txt"
    with pytest.raises(FileNotFoundError, match="train_path") as err:
        CriteoTSVDataModule(str(missing)).setup("fit")
    assert str(missing) in str(err.value)
    good = _write_rows(tmp_path / "train.tsv", [_good_row()] * 4)
    with pytest.raises(FileNotFoundError, match="val_path"):
        CriteoTSVDataModule(str(good), val_path=str(missing), batch_size=1).setup("fit")


def test_criteo_tsv_too_few_rows_for_the_world(tmp_path: Path) -> None:
    path = _write_rows(tmp_path / "train.tsv", [_good_row()] * 10)
    dm = CriteoTSVDataModule(str(path), batch_size=4, val_fraction=0.0)
    dm.set_rank(0, 4)
    with pytest.raises(ValueError, match="batch_size"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ the public base and its documentation

DATA_DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dlrm_synthetic.yaml"


def _documented_blocks() -> tuple[str, str]:
    """The Python and the shell block of docs/data.md, "Adding your own data source", as a user copies them."""
    section = DATA_DOC.read_text().split("## Adding your own data source\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    command = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return code, command.replace("\\\n", " ")


RATING_SIZES = [944, 1683, 19, 21]  # the documented command's table sizes (MovieLens-100k-like)


def _write_ratings(path: Path, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays in the documented file's layout: 4 tables, 1 dense feature, a label that depends on two of them."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, n, rows) for n in RATING_SIZES], axis=1)
    dense = rng.random((rows, 1), dtype=np.float32)
    logit = np.where(ids[:, 1] % 3 == 0, 1.5, -1.0) + np.where(ids[:, 2] < 5, 0.8, -0.4) + dense[:, 0]
    labels = rng.random(rows) < 1 / (1 + np.exp(-logit))
    np.savez(path, dense=dense, ids=ids, labels=labels)
    return {"dense": dense, "ids": ids, "labels": labels}


def test_the_documented_data_source_shards_and_checks_its_batches(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The class of docs/data.md as written: its batches hold the file's rows under its own feature names, 2 ranks
    read disjoint interleaved shards, and a batch that disagrees with the declared layout fails at that batch."""
    import importlib

    (tmp_path / "my_data.py").write_text(_documented_blocks()[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    my_data = importlib.import_module("my_data")
    names = ["user", "item", "genre", "occupation"]
    arrays = _write_ratings(tmp_path / "ratings.npz", rows=1000)

    def source(**overrides: object) -> RankShardedDataModule:
        kwargs = dict(path=str(tmp_path / "ratings.npz"), num_embeddings_per_feature=RATING_SIZES,
                      feature_names=names, num_dense_features=1, batch_size=100, val_rows=200)  # fmt: skip
        dm = my_data.NpzClicks(**{**kwargs, **overrides})
        dm.setup("fit")
        return dm

    train, val = _batches(source()), _batches(source(), "val")
    assert len(train) == 8 and len(val) == 2
    for batch in train + val:
        assert batch.sparse_features.keys() == names and batch.dense_features.shape == (100, 1)
    assert torch.equal(train[1].sparse_features.values().view(4, 100).t(), torch.from_numpy(arrays["ids"][100:200]))
    for rank in range(2):
        dm = source()
        dm.set_rank(rank, 2)
        shard = _batches(dm)
        assert len(shard) == 4
        for j, batch in enumerate(shard):
            _assert_batch_equal(batch, train[rank + 2 * j])
    # Declared layouts that the file does not have fail at the first batch, naming both numbers.
    with pytest.raises(ValueError, match=r"dense features of shape \[100, 1\] but the DataModule declares"
                                         r" num_dense_features=13: pass num_dense_features=1"):
        _batches(source(num_dense_features=13))
    outside = r"read_batch\('train', 0\): feature 'item' has ids from \d+ to \d+, outside its table of 1000 rows"
    with pytest.raises(ValueError, match=outside):
        _batches(source(num_embeddings_per_feature=[944, 1000, 19, 21]))
    # Rows for less than one training batch: stopped in setup, naming the file, the rows and the fix.
    with pytest.raises(ValueError, match=r"ratings\.npz gives 800 training rows, fewer than one batch per rank"
                                         r" \(batch_size=1000 x world_size=1\)\. Lower `batch_size` or `val_rows`"):
        source(batch_size=1000)


def test_a_batch_made_for_other_features_fails_in_the_datamodule_with_both_numbers() -> None:
    """The trap docs/data.md's old recipe set: a batch assembled with the 26 Criteo names for a 4-table source used to
    die at the first training step inside TorchRec ("Sum of lengths must equal the number of values")."""
    from lightning_dlac.examples.base import check_batch, make_batch

    from lightning_dlac.criteo import FEATURE_NAMES

    dense, ids, labels = torch.rand(8, 1), torch.zeros(4 * 8, dtype=torch.int64), torch.zeros(8)
    layout = (["user", "item", "genre", "occupation"], 1, RATING_SIZES)
    with pytest.raises(ValueError, match=r"has 26 categorical features \['cat_0', .*, \.\.\.\] but the DataModule"
                                         r" declares 4: \['user', 'item', 'genre', 'occupation'\]"):
        check_batch(make_batch(dense, ids, labels, feature_names=FEATURE_NAMES), *layout)
    lengths = torch.ones(4 * 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"has 33 ids but its lengths sum to 32: with 4 features x 8 samples"):
        check_batch(make_batch(dense, torch.zeros(33, dtype=torch.int64), labels, lengths, feature_names=layout[0]),
                    *layout)
    with pytest.raises(ValueError, match=r"has 16 lengths for 4 features x 8 samples \(32 expected"):
        check_batch(make_batch(dense, ids[:16], labels, lengths[:16], feature_names=layout[0]), *layout)
    with pytest.raises(ValueError, match="feature 'user' has ids from -1 to 0, outside its table of 944 rows"):
        check_batch(make_batch(dense, torch.cat([torch.tensor([-1]), ids[1:]]), labels, feature_names=layout[0]),
                    *layout)
    check_batch(make_batch(dense, ids, labels, feature_names=layout[0]), *layout)  # the right layout passes


@pytest.mark.slow
def test_dlac_fit_trains_the_documented_data_source_as_written(tmp_path: Path) -> None:
    """The shell block of docs/data.md, run as a user would (2 CPU ranks from the config's defaults), shortened."""
    import shlex

    from tests.commands.test_cli import _dlac

    code, command = _documented_blocks()
    (tmp_path / "my_data.py").write_text(code)
    _write_ratings(tmp_path / "ratings.npz", rows=6000)
    args = shlex.split(command.replace("examples/configs/", f"{CONFIG.parent}/"))
    assert args[0] == "dlac"
    short = ["--trainer.max_steps=6", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2",
             "--trainer.enable_progress_bar=false", "--trainer.logger=false", "--model.embedding_dim=16",
             "--model.dense_arch_layer_sizes=[16, 16]", "--model.over_arch_layer_sizes=[16, 1]"]  # fmt: skip
    env_path = {"PYTHONPATH": str(tmp_path)}
    proc = _dlac([*args[1:], *short], cwd=tmp_path, timeout=300, env=env_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"sharded 4 embedding tables over 2 rank", out), out[-4000:]
    assert re.search(r"dlac fit finished after 6 steps: .*val/auroc=0\.\d{4}", out), out[-4000:]


class _Unfinished(RankShardedDataModule):
    """A source that forgot its reading part."""


def test_the_base_names_what_a_subclass_must_write() -> None:
    dm = _Unfinished(num_embeddings_per_feature=[10] * 26, batch_size=8)
    with pytest.raises(NotImplementedError, match=r"must implement num_batches\(split\) -> int"):
        dm.train_dataloader()
    with pytest.raises(NotImplementedError, match=r"read_batch\(split, index\) -> Batch"):
        dm.read_batch("train", 0)
    with pytest.raises(ValueError, match="one per feature"):
        _Unfinished(num_embeddings_per_feature=[10] * 3, batch_size=8, feature_names=["a", "b"])
    with pytest.raises(ValueError, match="Need 0 <= rank < world_size"):
        dm.set_rank(2, 2)


def test_a_datamodule_attached_to_a_trainer_pickles_for_spawned_workers() -> None:
    """DataLoader workers started with "spawn" receive a pickled datamodule (read_batch is its method): the Trainer
    it is attached to stays behind, and the copy reads the same batches."""
    import pickle
    import threading

    dm = SyntheticCriteoDataModule(batch_size=16, num_train_batches=3, max_rows=100)
    dm.trainer = SimpleNamespace(global_rank=0, world_size=1, lock=threading.Lock())  # type: ignore[assignment]
    dm.setup("fit")
    copy = pickle.loads(pickle.dumps(dm))
    assert copy.trainer is None
    for a, b in zip(_batches(dm), _batches(copy)):
        _assert_batch_equal(a, b)
