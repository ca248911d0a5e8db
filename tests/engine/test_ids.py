"""Ids outside their tables fail at their batch, naming the feature, its largest id and the table's size
(lightning_dlac/engine/ids.py), whatever DataModule or training loop feeds the sharded model."""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_dlac.engine.ids import IdRangeError, check_ids, checked_batches
from lightning_dlac.testing import RanksFailed, run_ranks
from tests.conftest import FEATURES, ROWS, small_data, trainer


def _kjt(ids: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor from {feature: [ids of sample 0, ids of sample 1, ...]}."""
    values = [i for bags in ids.values() for bag in bags for i in bag]
    lengths = [len(bag) for bags in ids.values() for bag in bags]
    return KeyedJaggedTensor(keys=list(ids), values=torch.tensor(values, dtype=torch.int64),
                             lengths=torch.tensor(lengths, dtype=torch.int32))


def test_ids_inside_their_tables_pass_and_one_outside_is_named() -> None:
    rows = {"user": 10, "item": 5}
    check_ids(_kjt({"user": [[0], [9]], "item": [[4, 0], []]}), rows)  # multi-hot and empty bags
    check_ids(_kjt({"user": [[0]], "other": [[123]]}), rows)  # a feature without a table here is not ours to judge
    with pytest.raises(IdRangeError, match=r"a batch: feature 'item' has ids from 0 to 5, outside its table of 5 rows"
                                           r" \(ids must lie in \[0, 5\)\)\. .* at least 6 rows"):
        check_ids(_kjt({"user": [[1], [2]], "item": [[0, 5], [1]]}), rows)
    with pytest.raises(IdRangeError, match="feature 'user' has ids from -1 to 3"):
        check_ids(_kjt({"user": [[-1], [3]], "item": [[0], [1]]}), rows)


def test_every_batch_is_checked_on_cpu_and_a_sample_on_an_accelerator() -> None:
    cpu, gpu = checked_batches(torch.device("cpu")), checked_batches(torch.device("cuda"), first=3, every=10)
    assert all(cpu(n) for n in range(200))
    assert [n for n in range(45) if gpu(n)] == [0, 1, 2, 10, 20, 30, 40]


def _fit_with_a_short_table(rank: int, world_size: int) -> None:
    from lightning_dlac.examples.dlrm import DLRMModule

    # The data draws cat_3's ids from 100 rows; the model gives cat_3 a table of 30. No DataModule check applies
    # (the data is right by its own layout): the sharded model's input check is what stops it.
    rows = [30 if f == "cat_3" else n for f, n in zip(FEATURES, ROWS)]
    model = DLRMModule(num_embeddings_per_feature=rows, feature_names=FEATURES, embedding_dim=8,
                       dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    trainer(world_size, max_steps=2, num_sanity_val_steps=0).fit(model, datamodule=small_data(train_batches=4))


@pytest.mark.slow
def test_training_with_ids_past_a_table_stops_at_the_first_batch_naming_them() -> None:
    with pytest.raises(RanksFailed, match=r"IdRangeError: the batch given to [\w.]*: feature 'cat_3' has ids from \d+"
                                          r" to \d+, outside its table of 30 rows"):
        run_ranks(_fit_with_a_short_table, 2, timeout=120)
