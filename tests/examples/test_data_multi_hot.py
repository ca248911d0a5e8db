"""Multi-hot Criteo in MLPerf DLRM v2's layout (`<stem>_sparse_multi_hot.npz`): `dlac preprocess criteo
--multi-hot-sizes` writes what np.savez writes, streamed in blocks; CriteoBinaryDataModule(multi_hot_sizes=...)
reads it back per rank as the per-id bags of the one-hot ids; bad files and options are named."""

from __future__ import annotations

import logging
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning_dlac.examples.binary import CriteoBinaryDataModule
from torchrec.datasets.utils import Batch

from lightning_dlac import criteo
from lightning_dlac.commands.preprocess import main as preprocess_main
from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS_PER_FEATURE, multi_hot_from_one_hot
from lightning_dlac.criteo.writers import ZIP_DATE_TIME, StoredZipWriter
from tests.conftest import write_criteo_tsv

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dlrm_v2_criteo_binary.yaml"
SIZES = list(MLPERF_MULTI_HOT_SIZES)
TABLES = [min(n, 1000) for n in MLPERF_NUM_EMBEDDINGS_PER_FEATURE]


def _expected_arrays(sparse: np.ndarray, sizes: list[int], tables: list[int]) -> dict[str, np.ndarray]:
    """Each feature's [rows, P] bags, computed in one call of multi_hot_from_one_hot over the whole day."""
    rows = sparse.shape[0]
    ids = torch.from_numpy(np.ascontiguousarray((sparse % np.asarray(tables)).T))
    values = multi_hot_from_one_hot(ids, sizes, tables).numpy().astype(np.int32)
    parts = np.split(values, np.cumsum([p * rows for p in sizes])[:-1])
    return {str(t): part.reshape(rows, p) for t, (part, p) in enumerate(zip(parts, sizes))}


def _day(directory: Path, stem: str, rows: int, seed: int) -> None:
    """A one-hot day in TorchRec's layout with raw (unhashed) 40-bit ids."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    dense, sparse, labels = criteo.binary_paths(directory, stem)
    np.save(dense, rng.random((rows, 13), dtype=np.float32))
    np.save(sparse, rng.integers(0, 2**40, (rows, 26), dtype=np.int64))
    np.save(labels, rng.integers(0, 2, (rows, 1), dtype=np.int32))


@pytest.mark.parametrize("workers, block_rows", [(1, 1000), (3, 37)])
def test_materialised_file_is_what_np_savez_writes(tmp_path: Path, workers: int, block_rows: int) -> None:
    _day(tmp_path, "day_0", 300, seed=0)
    [result] = criteo.materialize_multi_hot([criteo.binary_paths(tmp_path, "day_0")[1]], tmp_path, SIZES, TABLES,
                                            workers=workers, block_rows=block_rows, progress=False)  # fmt: skip
    assert result.rows == 300 and result.path == criteo.multi_hot_path(tmp_path, "day_0")
    expected = _expected_arrays(np.load(criteo.binary_paths(tmp_path, "day_0")[1]), SIZES, TABLES)
    reference = tmp_path / "reference.npz"
    np.savez(reference, **expected, num_embeddings_per_feature=np.asarray(TABLES, dtype=np.int64))
    # Byte for byte: the zip layout (stored members, ZIP64 local extras, CRCs) and every id.
    assert result.path.read_bytes() == reference.read_bytes()
    with np.load(result.path) as loaded:
        assert sorted(loaded.files) == sorted([*expected, "num_embeddings_per_feature"])
        assert all(loaded[k].dtype == np.int32 and np.array_equal(loaded[k], v) for k, v in expected.items())
    members, tables = criteo.read_multi_hot_layout(result.path)
    assert tables == TABLES and [m.cols for m in members] == SIZES
    # In place: each member's bytes at its offset are the C-order array.
    data = result.path.read_bytes()
    m = members[20]
    assert np.array_equal(np.frombuffer(data, "<i4", m.rows * m.cols, m.offset).reshape(m.rows, m.cols),
                          expected["20"])  # fmt: skip
    assert not list(tmp_path.glob("*.partial"))


def test_members_past_two_gib_get_the_zip64_fields_zipfile_reads(tmp_path: Path) -> None:
    """Sizes and offsets past zipfile's ZIP64 limit go to ZIP64 extras and end records (a sparse file: no data)."""
    path = tmp_path / "big.zip"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writer = StoredZipWriter(fd, ["0.npy", "1.npy"], [(1 << 31) + 10, 5], ZIP_DATE_TIME)
        os.ftruncate(fd, writer.end_of_data)
        os.ftruncate(fd, writer.finish())
    finally:
        os.close(fd)
    with zipfile.ZipFile(path) as zf:
        big, small = zf.infolist()
        assert (big.filename, big.file_size, big.header_offset, big.compress_type) == ("0.npy", (1 << 31) + 10, 0, 0)
        assert (small.file_size, small.header_offset) == (5, writer.member_offset(0) + (1 << 31) + 10)
        assert zf.fp.seek(small.header_offset) >= 0 and zf.fp.read(4) == b"PK\x03\x04"


def _batches(dm: CriteoBinaryDataModule, split: str) -> list[Batch]:
    loader = {"train": dm.train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader}[split]()
    return list(loader)


@pytest.mark.parametrize("mmap_mode", [False, True])
def test_round_trip_from_tsv_gives_the_per_id_bags_of_the_one_hot_ids(
    tmp_path: Path, mmap_mode: bool, caplog: pytest.LogCaptureFixture
) -> None:
    tsv = write_criteo_tsv(tmp_path / "train.txt", rows=700, positives=150, seed=1)
    out = tmp_path / "npy"
    args = ["criteo", "--output", str(out), "--no-progress", "--multi-hot-sizes", "mlperf",
            "--num-embeddings-per-feature", "mlperf", "--max-rows", "1000", str(tsv)]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="lightning_dlac.criteo"):
        assert preprocess_main(args) == 0
    assert "train_sparse.npy -> " in caplog.text and "train_sparse_multi_hot.npz: 700 rows in" in caplog.text
    assert sorted(p.name for p in out.iterdir()) == [
        "train_dense.npy", "train_labels.npy", "train_sparse.npy", "train_sparse_multi_hot.npz"
    ]  # fmt: skip
    common = dict(data_dir=str(out), num_embeddings_per_feature=TABLES, batch_size=16, mmap_mode=mmap_mode)
    for rank in range(2):
        multi = CriteoBinaryDataModule(**common, multi_hot_sizes=SIZES)
        one = CriteoBinaryDataModule(**common)
        for dm in (multi, one):
            dm.set_rank(rank, 2)
            dm.setup("fit")
        for split in ("train", "val", "test"):
            got, want = _batches(multi, split), _batches(one, split)
            assert len(got) == len(want) > 0
            for a, b in zip(got, want):
                ids = b.sparse_features.values().view(26, 16)
                assert torch.equal(a.sparse_features.values(), multi_hot_from_one_hot(ids, SIZES, TABLES))
                assert a.sparse_features.lengths().tolist() == [p for p in SIZES for _ in range(16)]
                assert a.sparse_features.keys() == b.sparse_features.keys()
                assert a.sparse_features.values().dtype == torch.int64
                torch.testing.assert_close(a.dense_features, b.dense_features, rtol=0, atol=0)
                torch.testing.assert_close(a.labels, b.labels, rtol=0, atol=0)


@pytest.mark.slow  # DataLoader worker processes
def test_two_ranks_read_every_row_once_across_days(tmp_path: Path) -> None:
    for d, rows in ((0, 250), (1, 190), (23, 64)):
        _day(tmp_path, f"day_{d}", rows, seed=d)
    sparse = [criteo.binary_paths(tmp_path, f"day_{d}")[1] for d in (0, 1, 23)]
    criteo.materialize_multi_hot(sparse, tmp_path, SIZES, TABLES, block_rows=100, progress=False)
    kwargs = dict(data_dir=str(tmp_path), train_stems=["day_0", "day_1"], num_embeddings_per_feature=TABLES,
                  batch_size=20, multi_hot_sizes=SIZES)  # fmt: skip
    per_rank = []
    for rank in range(2):
        dm = CriteoBinaryDataModule(**kwargs, num_workers=2 if rank else 0)
        dm.set_rank(rank, 2)
        dm.setup("fit")
        per_rank.append(_batches(dm, "train"))
    assert len(per_rank[0]) == len(per_rank[1]) == 440 // 20 // 2
    # Interleaved, the ranks' batches are rows 0..439 of days 0 and 1 in order, each once (batch 12 spans both).
    rows = torch.cat([per_rank[i % 2][i // 2].dense_features for i in range(22)])
    days = np.concatenate([np.load(criteo.binary_paths(tmp_path, f"day_{d}")[0]) for d in (0, 1)])
    assert torch.equal(rows, torch.from_numpy(days))
    bags = np.concatenate([np.load(criteo.multi_hot_path(tmp_path, f"day_{d}"))["20"] for d in (0, 1)])
    got = torch.cat([per_rank[i % 2][i // 2].sparse_features["cat_20"].values().view(20, 100) for i in range(22)])
    assert torch.equal(got, torch.from_numpy(bags).long())


def _savez(path: Path, rows: int, sizes: list[int], tables: list[int] | None, high: list[int],
           compressed: bool = False, dtype: type = np.int32) -> None:  # fmt: skip
    rng = np.random.default_rng(0)
    arrays = {str(t): rng.integers(0, h, (rows, p)).astype(dtype) for t, (p, h) in enumerate(zip(sizes, high))}
    if tables is not None:
        arrays["num_embeddings_per_feature"] = np.asarray(tables, dtype=np.int64)
    (np.savez_compressed if compressed else np.savez)(path, **arrays)


def test_mlperf_style_file_without_table_sizes_is_read_and_checked_per_batch(tmp_path: Path) -> None:
    """MLPerf's own files (np.savez, members "0".."25" only) are read; an id outside its table is named."""
    _day(tmp_path, "day_7", 96, seed=7)
    _savez(criteo.multi_hot_path(tmp_path, "day_7"), 96, SIZES, None, TABLES)
    with np.load(criteo.multi_hot_path(tmp_path, "day_7")) as f:
        expected = np.concatenate([f[str(t)].reshape(-1) for t in range(26)])  # all 96 rows: one batch of 96
    dm = CriteoBinaryDataModule(str(tmp_path), train_stems=["day_7"], val_stems=[], val_fraction=0.0,
                                test_fraction=0.0, num_embeddings_per_feature=TABLES, batch_size=96,
                                multi_hot_sizes=SIZES)  # fmt: skip
    dm.set_rank(0, 1)
    dm.setup("fit")
    [batch] = _batches(dm, "train")
    assert np.array_equal(batch.sparse_features.values().numpy(), expected)
    smaller = [*TABLES[:20], 10, *TABLES[21:]]
    dm = CriteoBinaryDataModule(str(tmp_path), train_stems=["day_7"], val_stems=[], val_fraction=0.0,
                                test_fraction=0.0, num_embeddings_per_feature=smaller, batch_size=32,
                                multi_hot_sizes=SIZES)  # fmt: skip
    dm.set_rank(0, 1)
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"day_7_sparse_multi_hot.npz: feature cat_20 holds id \d+ \(rows 0..31\),"
                                         r" outside its table of 10 rows .*re-materialise"):  # fmt: skip
        next(iter(dm.train_dataloader()))


@pytest.mark.parametrize(
    "damage, error, message",
    [
        ("missing", FileNotFoundError,
         r"day_5_sparse_multi_hot.npz not found.*dlac preprocess criteo --output .* --multi-hot-sizes 3,2,1,2,6"),
        ("sizes", ValueError, r"holds \[3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 50, .*"
                              r"--data.multi_hot_sizes=\[3,2,1"),
        ("tables", ValueError, r"materialised for tables of \[1000, .*\(--data.num_embeddings_per_feature=\[1000,"),
        ("rows", ValueError, "disagree on the row count"),
        ("compressed", ValueError, "member '0.npy' is compressed \\(np.savez_compressed\\?\\)"),
        ("member", ValueError, "has no member '25.npy' \\(the ids of feature cat_25\\)"),
        ("dtype", ValueError, r"member '0.npy' holds float32 \[40, 3\]; expected C-order"),
        ("truncated", ValueError, "not a valid .npz|truncated"),
    ],
)
def test_bad_multi_hot_files_are_named(tmp_path: Path, damage: str, error: type, message: str) -> None:
    _day(tmp_path, "day_5", 40, seed=5)
    npz = criteo.multi_hot_path(tmp_path, "day_5")
    sizes = [*SIZES[:20], 50, *SIZES[21:]] if damage == "sizes" else SIZES
    rows = 39 if damage == "rows" else 40
    tables = [n + 1 for n in TABLES] if damage == "tables" else TABLES
    _savez(npz, rows, sizes, TABLES, TABLES, compressed=damage == "compressed",
           dtype=np.float32 if damage == "dtype" else np.int32)  # fmt: skip
    if damage == "missing":
        npz.unlink()
    elif damage == "member":
        with np.load(npz) as f:
            arrays = {k: f[k] for k in f.files if k != "25"}
        np.savez(npz, **arrays)
    elif damage == "truncated":
        npz.write_bytes(npz.read_bytes()[:-5000])
    with pytest.raises(error, match=message):
        CriteoBinaryDataModule(str(tmp_path), train_stems=["day_5"], num_embeddings_per_feature=tables,
                               multi_hot_sizes=SIZES)  # fmt: skip


def test_bad_options_are_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _day(tmp_path, "day_0", 10, seed=0)
    sparse = str(criteo.binary_paths(tmp_path, "day_0")[1])
    with pytest.raises(ValueError, match="multi_hot_sizes needs one pooling factor per categorical feature"):
        CriteoBinaryDataModule(str(tmp_path), train_stems=["day_0"], multi_hot_sizes=[1, 2])
    with pytest.raises(SystemExit):
        preprocess_main(["criteo", "--output", str(tmp_path), "--multi-hot-sizes", "mlperf", sparse])
    assert "--multi-hot-sizes needs --num-embeddings-per-feature" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        preprocess_main(["criteo", "--output", str(tmp_path), sparse])
    assert "pass --multi-hot-sizes to materialise" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        preprocess_main(["criteo", "--output", str(tmp_path), "--multi-hot-sizes", "3,x",
                         "--num-embeddings-per-feature", "kaggle", sparse])  # fmt: skip
    assert "--multi-hot-sizes takes 26 comma-separated integers or 'mlperf'" in capsys.readouterr().err
    assert preprocess_main(["criteo", "--output", str(tmp_path), "--no-progress", "--multi-hot-sizes", "1,2,3",
                            "--num-embeddings-per-feature", "kaggle", sparse]) == 1  # fmt: skip
    with pytest.raises(ValueError, match="not a one-hot <stem>_sparse.npy"):
        criteo.materialize_multi_hot([tmp_path / "day_0_dense.npy"], tmp_path, SIZES, TABLES)
    criteo.materialize_multi_hot([sparse], tmp_path, SIZES, TABLES, progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        criteo.materialize_multi_hot([sparse], tmp_path, SIZES, TABLES, progress=False)


def test_another_output_directory_gets_the_dense_and_labels_files(tmp_path: Path) -> None:
    _day(tmp_path / "one_hot", "day_2", 50, seed=2)
    out = tmp_path / "multi_hot"
    one_hot = criteo.binary_paths(tmp_path / "one_hot", "day_2")[1]
    criteo.materialize_multi_hot([one_hot], out, SIZES, TABLES, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["day_2_dense.npy", "day_2_labels.npy",
                                                    "day_2_sparse_multi_hot.npz"]  # fmt: skip
    dm = CriteoBinaryDataModule(str(out), train_stems=["day_2"], num_embeddings_per_feature=TABLES, batch_size=8,
                                multi_hot_sizes=SIZES)  # fmt: skip
    assert dm.split_rows("train") + dm.split_rows("val") + dm.split_rows("test") == 50


def test_shipped_v2_config_runs_a_few_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_dlac.commands.cli import build_cli

    monkeypatch.chdir(tmp_path)  # whatever the run writes stays out of the checkout
    tsv = write_criteo_tsv(tmp_path / "train.txt", rows=600, positives=130, seed=2)
    out = tmp_path / "npy"
    assert preprocess_main(["criteo", "--output", str(out), "--no-progress", "--multi-hot-sizes", "mlperf",
                   "--num-embeddings-per-feature", "mlperf", "--max-rows", "10000", str(tsv)]) == 0  # fmt: skip
    args = ["--config", str(CONFIG), "--trainer.logger=false", "--trainer.devices=1", f"--data.data_dir={out}",
            "--data.batch_size=32", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]  # fmt: skip
    cli = build_cli(args, run=False)
    assert type(cli.datamodule) is CriteoBinaryDataModule and cli.datamodule.multi_hot_sizes == SIZES
    assert type(cli.model.model).__name__ == "DLRM_DCN" and cli.model.hparams.embedding_dim == 128
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_local_header_is_where_mlperfs_reader_looks(tmp_path: Path) -> None:
    """torchrec_dlrm's reader finds a member's .npy at ``header_offset + len(FileHeader()) + 20`` (the 20-byte ZIP64
    extra np.savez puts in every local header); the materialised file keeps that true."""
    _day(tmp_path, "day_0", 20, seed=0)
    [result] = criteo.materialize_multi_hot([criteo.binary_paths(tmp_path, "day_0")[1]], tmp_path, SIZES, TABLES,
                                            progress=False)  # fmt: skip
    data = result.path.read_bytes()
    with zipfile.ZipFile(result.path) as zf:
        for info in zf.infolist():
            at = info.header_offset + len(info.FileHeader()) + 20
            assert data[at : at + 6] == b"\x93NUMPY", info.filename
            assert struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])[1] == 20


def test_a_failed_materialisation_leaves_no_file_that_looks_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_dlac.criteo import multi_hot

    _day(tmp_path, "day_3", 200, seed=3)
    calls = []

    def failing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk gone")
        return multi_hot_from_one_hot(*args, **kwargs)

    monkeypatch.setattr(multi_hot, "multi_hot_from_one_hot", failing)
    with pytest.raises(RuntimeError, match="disk gone"):
        criteo.materialize_multi_hot([criteo.binary_paths(tmp_path, "day_3")[1]], tmp_path, SIZES, TABLES, workers=2,
                                     block_rows=16, progress=False)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["day_3_dense.npy", "day_3_labels.npy", "day_3_sparse.npy"]
    assert len(calls) < 13  # the blocks after the failure were not all computed
