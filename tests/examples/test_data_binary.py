"""CriteoBinaryDataModule: the same batches as CriteoTSVDataModule and as TorchRec's own binary reader, day and
fraction splits, rank sharding, bad files named, the shipped config running on a tiny set, and the TSV module's
pointer to `dlac preprocess` past its size threshold."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning_dlac.examples import tsv as tsv_module
from lightning_dlac.examples.binary import CriteoBinaryDataModule
from lightning_dlac.examples.tsv import CriteoTSVDataModule
from torchrec.datasets.utils import Batch

from lightning_dlac.criteo import binary_paths, preprocess_criteo

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_kaggle_head10k.tsv"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "dlrm_criteo_binary.yaml"


def _tsv(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        dense = ["" if rng.random() < 0.2 else str(rng.randint(-2, 5000)) for _ in range(13)]
        sparse = ["" if rng.random() < 0.1 else f"{rng.getrandbits(32):08x}" for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *dense, *sparse]))
    path.write_text("\n".join(lines) + "\n")
    return path


def _convert(tmp_path: Path, *files: Path) -> Path:
    preprocess_criteo(list(files), tmp_path / "npy", progress=False)
    return tmp_path / "npy"


def _batches(dm, split: str) -> list[Batch]:  # noqa: ANN001
    loader = {"train": dm.train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader}[split]()
    return list(loader)


def _assert_same_batches(a: list[Batch], b: list[Batch]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        torch.testing.assert_close(x.dense_features, y.dense_features, rtol=0, atol=0)
        torch.testing.assert_close(x.labels.float(), y.labels.float(), rtol=0, atol=0)
        assert x.labels.dtype == torch.float32
        assert x.sparse_features.keys() == y.sparse_features.keys()
        torch.testing.assert_close(x.sparse_features.values(), y.sparse_features.values(), rtol=0, atol=0)
        torch.testing.assert_close(x.sparse_features.lengths(), y.sparse_features.lengths(), rtol=0, atol=0)


def _tsv_vs_binary(tsv: Path, npy: Path, batch_size: int) -> None:
    for rank in range(2):
        text = CriteoTSVDataModule(str(tsv), val_fraction=0.2, batch_size=batch_size, max_rows=1000, shuffle=False,
                                   dense_transform="torchrec")  # fmt: skip
        binary = CriteoBinaryDataModule(str(npy), train_stems=[tsv.stem], val_stems=[], val_fraction=0.2,
                                        test_fraction=0.0, batch_size=batch_size, max_rows=1000)  # fmt: skip
        for dm in (text, binary):
            dm.set_rank(rank, 2)
            dm.setup("fit")
        assert binary.num_train_batches == text.num_train_batches
        _assert_same_batches(_batches(binary, "train"), _batches(text, "train"))
        _assert_same_batches(_batches(binary, "val"), _batches(text, "val"))


def test_same_batches_as_the_tsv_module_on_a_generated_file(tmp_path: Path) -> None:
    tsv = _tsv(tmp_path / "train.txt", 1000, seed=0)
    _tsv_vs_binary(tsv, _convert(tmp_path, tsv), batch_size=64)


@pytest.mark.skipif(not SAMPLE.is_file(), reason="the Criteo sample lives in ../shared/data, outside a fresh clone")
def test_same_batches_as_the_tsv_module_on_the_criteo_sample(tmp_path: Path) -> None:
    _tsv_vs_binary(SAMPLE, _convert(tmp_path, SAMPLE), batch_size=256)


@pytest.mark.parametrize("mmap_mode", [False, True])
def test_day_split_matches_torchrecs_reader(tmp_path: Path, mmap_mode: bool) -> None:
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    days = [_tsv(tmp_path / f"day_{d}", rows, seed=d) for d, rows in ((0, 300), (1, 250), (23, 201))]
    npy = _convert(tmp_path, *days)
    sizes = [97 + k for k in range(26)]
    for rank in range(2):
        dm = CriteoBinaryDataModule(str(npy), train_stems=["day_0", "day_1"], num_embeddings_per_feature=sizes,
                                    batch_size=32, mmap_mode=mmap_mode)  # fmt: skip
        assert dm.val_stems == ["day_23"]  # held out by default, as in TorchRec's DLRM example
        dm.set_rank(rank, 2)
        dm.setup("fit")
        assert (dm.split_rows("train"), dm.split_rows("val"), dm.split_rows("test")) == (550, 101, 100)
        for split, stems in (("train", ["day_0", "day_1"]), ("val", ["day_23"]), ("test", ["day_23"])):
            paths = [binary_paths(npy, s) for s in stems]
            reference = InMemoryBinaryCriteoIterDataPipe(
                split, [str(p[0]) for p in paths], [str(p[1]) for p in paths], [str(p[2]) for p in paths],
                batch_size=32, rank=rank, world_size=2, drop_last=True, mmap_mode=True, hashes=sizes,
            )  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.from_numpy on read-only memory maps
                expected = list(reference)
            _assert_same_batches(_batches(dm, split), expected)


def test_one_tb_layout_defaults_to_days_0_to_22_and_day_23(tmp_path: Path) -> None:
    npy = tmp_path / "npy"
    npy.mkdir()
    for d in range(24):
        arrays = (np.zeros((10, 13), np.float32), np.full((10, 26), d, np.int64), np.zeros((10, 1), np.int32))
        for path, arr in zip(binary_paths(npy, f"day_{d}"), arrays):
            np.save(path, arr)
    dm = CriteoBinaryDataModule(str(npy), batch_size=5)
    assert dm.train_stems == [f"day_{d}" for d in range(23)] and dm.val_stems == ["day_23"]
    dm.set_rank(0, 1)
    dm.setup("fit")
    assert (dm.num_train_batches, dm.num_val_batches, dm.num_test_batches) == (46, 1, 1)
    # Batches cross file boundaries in order: batch 2 is day 1's first five rows.
    assert _batches(dm, "train")[2].sparse_features.values().unique().tolist() == [1]


@pytest.mark.slow  # DataLoader worker processes
def test_ranks_read_disjoint_interleaved_batches_and_workers_keep_the_stream(tmp_path: Path) -> None:
    npy = _convert(tmp_path, _tsv(tmp_path / "train.txt", 700, seed=3))
    kwargs = dict(data_dir=str(npy), batch_size=50, max_rows=1000, shuffle=True, seed=4)
    single = CriteoBinaryDataModule(**kwargs)
    single.set_rank(0, 1)
    single.setup("fit")
    everything = _batches(single, "train")
    per_rank = []
    for rank in range(3):
        dm = CriteoBinaryDataModule(**kwargs, num_workers=2 if rank == 0 else 0)
        dm.set_rank(rank, 3)
        dm.setup("fit")
        per_rank.append(_batches(dm, "train"))
    assert len({len(b) for b in per_rank}) == 1  # the same count on every rank
    interleaved = [per_rank[i % 3][i // 3] for i in range(3 * len(per_rank[0]))]
    _assert_same_batches(interleaved, everything[: len(interleaved)])


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing", "day_5_labels.npy not found. Create it with `dlac preprocess criteo"),
        ("rows", "disagree on the row count"),
        ("dtype", "day_5_sparse.npy holds int32, expected int64"),
        ("shape", r"day_5_dense.npy has shape \(10, 12\), expected a C-order \[N, 13\] array"),
        ("truncated", "day_5_sparse.npy is truncated"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, damage: str, message: str) -> None:
    dense, sparse, labels = binary_paths(tmp_path, "day_5")
    np.save(dense, np.zeros((10, 13), np.float32))
    np.save(sparse, np.zeros((10, 26), np.int64))
    np.save(labels, np.zeros((10, 1), np.int32))
    if damage == "missing":
        labels.unlink()
    elif damage == "rows":
        np.save(labels, np.zeros((9, 1), np.int32))
    elif damage == "dtype":
        np.save(sparse, np.zeros((10, 26), np.int32))
    elif damage == "shape":
        np.save(dense, np.zeros((10, 12), np.float32))
    else:
        sparse.write_bytes(sparse.read_bytes()[:-100])
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        CriteoBinaryDataModule(str(tmp_path), train_stems=["day_5"])


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--data.data_dir"):
        CriteoBinaryDataModule(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="train_dense.npy not found"):
        CriteoBinaryDataModule(str(tmp_path))  # no day_23, so the Kaggle stem `train` is expected
    with pytest.raises(ValueError, match="val_fraction \\+ test_fraction"):
        CriteoBinaryDataModule(str(tmp_path), val_fraction=0.5, test_fraction=0.5)
    npy = _convert(tmp_path, _tsv(tmp_path / "train.txt", 30, seed=5))
    dm = CriteoBinaryDataModule(str(npy), batch_size=64)
    dm.set_rank(0, 2)
    with pytest.raises(ValueError, match="fewer than one batch per rank"):
        dm.setup("fit")


def test_shipped_config_runs_a_few_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_dlac.commands.cli import build_cli

    monkeypatch.chdir(tmp_path)  # whatever the run writes stays out of the checkout

    npy = _convert(tmp_path, _tsv(tmp_path / "train.txt", 600, seed=6))
    args = ["--config", str(CONFIG), "--trainer.logger=false", "--trainer.devices=1", f"--data.data_dir={npy}",
            "--data.batch_size=64", "--data.max_rows=100", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]  # fmt: skip
    cli = build_cli(args, run=False)
    assert type(cli.datamodule) is CriteoBinaryDataModule
    assert list(cli.model.hparams.num_embeddings_per_feature) == cli.datamodule.num_embeddings_per_feature
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["npy", "train.txt"]  # no logger: nothing else written


def test_tsv_module_points_to_preprocess_past_its_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tsv = _tsv(tmp_path / "train.txt", 50, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CriteoTSVDataModule(str(tsv))  # small: silent
    monkeypatch.setattr(tsv_module, "TSV_SIZE_WARNING_BYTES", 1000)
    with pytest.warns(UserWarning, match="dlac preprocess criteo"):
        CriteoTSVDataModule(str(tsv))
