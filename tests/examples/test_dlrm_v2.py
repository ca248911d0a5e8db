"""DLRM v2 (MLPerf's DLRM-DCNv2): the example module's interactions, multi-hot synthetic data, and a 2-rank fit."""

from __future__ import annotations

import pytest
import torch
from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule
from torchmetrics.functional.classification import binary_auroc

from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES, multi_hot_from_one_hot
from lightning_dlac.testing import run_ranks
from tests.conftest import FEATURES, ROWS, small_dlrm, trainer

# MLPerf's pooling factors with the 100-id feature cut to 10: the same shape of data, quick on a loaded CPU.
SMALL_SIZES = [min(p, 10) for p in MLPERF_MULTI_HOT_SIZES]


def _multi_hot_data(distribution: str = "per_id", batch_size: int = 64, train_batches: int = 30,
                    seed: int = 0) -> SyntheticCriteoDataModule:
    return SyntheticCriteoDataModule(num_embeddings_per_feature=ROWS, batch_size=batch_size,
                                     num_train_batches=train_batches, num_val_batches=4, seed=seed,
                                     multi_hot_sizes=SMALL_SIZES, multi_hot_distribution=distribution)


@pytest.mark.parametrize(
    ("kwargs", "model_class"),
    [({}, "DLRM"), ({"interaction": "dcn"}, "DLRM_DCN"),
     ({"interaction": "dcn", "dcn_num_layers": 2, "dcn_low_rank_dim": 8}, "DLRM_DCN"),
     ({"interaction": "projection", "interaction_branch1_layer_sizes": [32, 64],
       "interaction_branch2_layer_sizes": [32, 48]}, "DLRM_Projection"),
     ({"interaction": "projection"}, "DLRM_Projection")],
)
def test_each_interaction_builds_torchrecs_model_and_takes_multi_hot_features(kwargs: dict, model_class: str) -> None:
    model = small_dlrm(**kwargs)
    assert type(model.model).__name__ == model_class
    data = _multi_hot_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert int(batch.sparse_features.lengths().max()) == 10  # multi-hot: lengths above 1
    logits = model(batch)
    assert logits.shape == (64,) and torch.isfinite(logits).all()
    loss = model.training_step(batch, 0)
    loss.backward()
    grads = [p.grad for p in model.model.inter_arch.parameters()] + [p.grad for p in model.model.over_arch.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    if kwargs.get("dcn_num_layers"):
        crossnet = model.model.inter_arch.crossnet
        assert crossnet._num_layers == 2 and crossnet._low_rank == 8


def test_dcn_defaults_are_mlperfs() -> None:
    model = small_dlrm(interaction="dcn")
    crossnet = model.model.inter_arch.crossnet
    assert (crossnet._num_layers, crossnet._low_rank) == (3, 512)
    assert model.hparams.interaction == "dcn"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interaction": "dcnv2"}, "interaction='dcnv2' is not supported"),
        ({"dcn_num_layers": 3}, "dcn_num_layers only applies to interaction='dcn'"),
        ({"interaction": "projection", "dcn_low_rank_dim": 64}, "dcn_low_rank_dim only applies"),
        ({"interaction": "dcn", "interaction_branch1_layer_sizes": [32]}, "interaction_branch1_layer_sizes only"),
        ({"interaction": "dcn", "dcn_low_rank_dim": 0}, "dcn_low_rank_dim must be a positive integer"),
        ({"interaction": "projection", "interaction_branch2_layer_sizes": [32, 20]},
         "interaction_branch2_layer_sizes=[32, 20] must be positive sizes ending in a multiple of embedding_dim=16"),
        ({"pooling": "max"}, "pooling='max' is not supported"),
    ],
)
def test_invalid_combinations_fail_at_construction_naming_the_option(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        small_dlrm(**kwargs)


def test_mean_pooling_reaches_the_tables() -> None:
    from torchrec.modules.embedding_configs import PoolingType

    model = small_dlrm(pooling="mean")
    assert {c.pooling for c in model.embedding_bag_collection.embedding_bag_configs()} == {PoolingType.MEAN}


@pytest.mark.parametrize("distribution", ["per_id", "independent"])
def test_multi_hot_batches_have_the_pooling_factors_and_are_deterministic(distribution: str) -> None:
    data = _multi_hot_data(distribution)
    data.setup("fit")
    batch, again = (next(iter(data.train_dataloader())) for _ in range(2))
    kjt = batch.sparse_features
    assert kjt.keys() == FEATURES
    assert kjt.lengths().view(26, 64).tolist() == [[p] * 64 for p in SMALL_SIZES]
    assert torch.equal(kjt.values(), again.sparse_features.values())
    for feature, rows in zip(FEATURES, ROWS):
        ids = kjt[feature].values()
        assert ids.min() >= 0 and ids.max() < rows
    # The planted signal is there: the hidden model's own logits rank the labels far above chance.
    data = _multi_hot_data(distribution, batch_size=4096)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert binary_auroc(torch.sigmoid(data.generator.logits(batch)), batch.labels.int()) > 0.75


def test_per_id_bags_are_a_fixed_function_of_the_one_hot_id() -> None:
    data = _multi_hot_data("per_id", batch_size=512)
    data.setup("fit")
    bags: dict[int, list[int]] = {}
    for batch in list(data.train_dataloader())[:4]:
        jt = batch.sparse_features["cat_20"]  # 10 ids per bag here
        for bag in jt.values().view(-1, SMALL_SIZES[20]).tolist():
            assert bags.setdefault(bag[0], bag) == bag  # the same id always brings the same bag
    assert len(bags) > 50
    # The expansion itself: the id leads, single-id tables pass through, the extras stay inside the table.
    ids = torch.tensor([[3, 3, 7], [0, 1, 2]])
    values = multi_hot_from_one_hot(ids, [4, 1], [10, 5], salt=123)
    assert values.numel() == 3 * 4 + 3
    first = values[:12].view(3, 4)
    assert first[:, 0].tolist() == [3, 3, 7] and torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])
    assert values[12:].tolist() == [0, 1, 2] and int(first.max()) < 10
    assert not torch.equal(multi_hot_from_one_hot(ids, [4, 1], [10, 5], salt=124)[:12], values[:12])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"multi_hot_sizes": [2] * 25}, "multi_hot_sizes needs one pooling factor per categorical feature"),
        ({"multi_hot_sizes": [0] + [1] * 25}, "multi_hot_sizes must all be at least 1"),
        ({"multi_hot_sizes": [2] * 26, "ids_per_feature": 3}, "give only multi_hot_sizes"),
        ({"multi_hot_distribution": "zipf"}, "multi_hot_distribution='zipf' is not supported"),
    ],
)
def test_invalid_multi_hot_options_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticCriteoDataModule(num_embeddings_per_feature=ROWS, **kwargs)


@pytest.mark.slow  # 80 training batches in process: ~30 s on a busy 2-core machine
def test_dcn_learns_the_planted_multi_hot_signal_in_process() -> None:
    torch.manual_seed(0)
    model = small_dlrm(interaction="dcn", dcn_num_layers=2, dcn_low_rank_dim=32, learning_rate=0.05)
    data = _multi_hot_data(batch_size=256, train_batches=40)
    data.setup("fit")
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    for _ in range(2):
        for batch in data.train_dataloader():
            optimizer.zero_grad()
            model.training_step(batch, 0).backward()
            optimizer.step()
    with torch.no_grad():
        val = list(data.val_dataloader())
        probs = torch.cat([torch.sigmoid(model(b)) for b in val])
        labels = torch.cat([b.labels for b in val]).int()
    assert binary_auroc(probs, labels) > 0.65


def _fit_dcn_multi_hot(rank: int, world_size: int) -> dict:
    from lightning_dlac import DLACCallback

    torch.manual_seed(0)
    model = small_dlrm(interaction="dcn", dcn_num_layers=2, dcn_low_rank_dim=32)
    callback = DLACCallback(calibration_batches=2, calibration_start=4, T=10, log_every_n_steps=5)
    t = trainer(world_size, max_epochs=2, callbacks=[callback])
    t.fit(model, datamodule=_multi_hot_data(batch_size=128, train_batches=20))
    stats = t.strategy.total_comm_stats()
    return {"auroc": float(t.callback_metrics["val/auroc"]), "raw": stats.raw_bytes, "sent": stats.sent_bytes,
            "calls": stats.calls, "max_error": max(stats.table_max_error_ratio.values(), default=0.0)}


@pytest.mark.slow
def test_two_rank_dcn_fit_on_multi_hot_data_compresses_and_learns() -> None:
    results = run_ranks(_fit_dcn_multi_hot, 2)
    for r in results:
        assert r["calls"] > 0 and r["sent"] * 2 < r["raw"], r  # compressed at least 2x
        assert r["max_error"] <= 1.0 + 1e-6, r  # the bound held wherever it was sampled
        assert r["auroc"] > 0.6, r
