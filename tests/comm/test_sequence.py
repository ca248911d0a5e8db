"""Sequence features: sharded EmbeddingCollections and their compressed sequence-embedding all-to-all
(lightning_dlac/comm/sequence.py), against TorchRec's uncompressed exchange on real gloo ranks."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from lightning_dlac.testing import run_ranks
from tests.conftest import load_global_weights

FEATURES = [f"s_{i}" for i in range(5)]
EPS = 0.02
DIM = 8


class _SequenceModel(nn.Module):
    """An EmbeddingCollection (5 sequence features, one table each) beside an EmbeddingBagCollection."""

    def __init__(self, with_bags: bool = False) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig

        torch.manual_seed(0)
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=f"seq_{i}", embedding_dim=DIM, num_embeddings=50 + 30 * i,
                                    feature_names=[f]) for i, f in enumerate(FEATURES)],
            device=torch.device("cpu"),
        )
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="bag_0", embedding_dim=DIM, num_embeddings=40, feature_names=["b_0"])],
            device=torch.device("cpu"),
        ) if with_bags else None

    def forward(self, kjt, bags=None):  # noqa: ANN001, ANN201
        out = self.ec(kjt)
        return out, (self.ebc(bags) if self.ebc is not None else None)


def _batch(rank: int, step: int, batch_size: int = 6):  # noqa: ANN202
    """This rank's sequence features: 0-4 ids per sample and feature, Zipf-like so rows repeat."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 5, (len(FEATURES) * batch_size,), generator=gen)
    ids = []
    for i, n in enumerate(lengths.view(len(FEATURES), batch_size).sum(1).tolist()):
        ids.append((torch.rand(n, generator=gen) ** 3 * (50 + 30 * i)).long())
    return KeyedJaggedTensor(keys=FEATURES, values=torch.cat(ids), lengths=lengths)


def _shard(model: nn.Module, sharding_types: list[str], compress: bool, backward: str = "fp32",  # noqa: ANN202
           **config: object):
    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressionConfig, install_compressed_all_to_all
    from lightning_dlac.engine.sharding import ShardingOptions, shard_model

    dmp = shard_model(model, ShardingOptions(sharding_types=sharding_types, embedding_optimizer="sgd",
                                             embedding_lr=1.0), device=torch.device("cpu"))
    group = install_compressed_all_to_all(dmp, CompressionConfig(backward=backward, error_every=1, **config),
                                          ErrorBounds(EPS)) if compress else None
    return dmp, group


def _weights(dmp) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """This rank's shards of each sequence table."""
    out = {}
    for key, value in dmp.state_dict().items():
        if "ec.embeddings" in key:
            shards = value.local_shards()
            if shards:
                out[key] = shards[0].tensor.detach().clone()
    return out


def _parity(rank: int, world_size: int, sharding_type: str = "table_wise") -> dict:
    from torchrec.distributed.embedding import ShardedEmbeddingCollection

    torch.distributed.init_process_group("gloo")
    reference = _SequenceModel()
    global_state = copy.deepcopy(reference.state_dict())
    ranges = {f"seq_{i}": float(w.max() - w.min()) for i, w in
              enumerate(global_state[f"ec.embeddings.seq_{i}.weight"] for i in range(len(FEATURES)))}
    out: dict = {"modes": {}}
    uncompressed, _ = _shard(_SequenceModel(), ["table_wise"], compress=False)
    load_global_weights(uncompressed, global_state)
    assert any(isinstance(m, ShardedEmbeddingCollection) for m in uncompressed.modules())
    for mode in ("fp32", "bf16", "fp16", "dlac"):
        model, group = _shard(_SequenceModel(), [sharding_type], compress=True, backward=mode)
        load_global_weights(model, global_state)
        ref_model, _ = _shard(_SequenceModel(), ["table_wise"], compress=False)
        load_global_weights(ref_model, global_state)
        assert len(group) == 1 and type(group[0]).__name__ == "CompressedSequenceEmbeddingsAllToAll"
        kjt = _batch(rank, 0)
        got, _ = model(kjt)
        want, _ = ref_model(kjt)
        worst, exact = 0.0, True
        for i, f in enumerate(FEATURES):
            assert torch.equal(got[f].lengths(), want[f].lengths())
            diff = (got[f].values() - want[f].values()).detach()
            err = float(diff.abs().max()) if diff.numel() else 0.0
            worst = max(worst, err / (EPS * ranges[f"seq_{i}"]))
            exact &= torch.equal(got[f].values(), want[f].values())
        # The same linear loss on both: its gradient does not depend on the (lossy) forward values, so the two
        # gradient exchanges carry the same values and SGD(lr=1) leaves weight - gradient in each table.
        torch.manual_seed(7)
        weights = {f: torch.randn(want[f].values().shape) for f in FEATURES}
        sum((got[f].values() * weights[f]).sum() for f in FEATURES).backward()
        sum((want[f].values() * weights[f]).sum() for f in FEATURES).backward()
        got_w, want_w = _weights(model), _weights(ref_model)
        start = {k: v for k, v in _weights(uncompressed).items()}
        grad_err = max((float(((got_w[k] - start[k]) - (want_w[k] - start[k])).abs().max()) for k in want_w),
                       default=0.0)
        grad_scale = max((float((want_w[k] - start[k]).abs().max()) for k in want_w), default=0.0)
        # What DLAC's gradient bound allows per weight row: each occurrence of the id in the global batch brings
        # one gradient row, each element within backward_eps x (range of the gradients sent), at most the global
        # range of the loss weights / world; rows add up their occurrences' errors.
        counts, lo, hi = [], [], []
        for i, f in enumerate(FEATURES):
            counts.append(torch.bincount(kjt[f].values(), minlength=50 + 30 * i).float())
            values = weights[f] / world_size
            lo.append(float(values.min()) if values.numel() else 0.0)
            hi.append(float(values.max()) if values.numel() else 0.0)
        for t in counts:
            torch.distributed.all_reduce(t)
        extremes = torch.tensor([*(-v for v in lo), *hi])
        torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MAX)
        grad_ranges = (extremes[len(FEATURES):] + extremes[: len(FEATURES)]).tolist()
        dlac_allowed = max(float(c.max()) * 0.01 * r for c, r in zip(counts, grad_ranges))
        stats = group.stats()
        out["modes"][mode] = {"worst": worst, "exact": exact, "grad_err": grad_err, "grad_scale": grad_scale,
                              "dlac_allowed": dlac_allowed,
                              "calls": stats.calls, "raw": stats.raw_bytes, "sent": stats.sent_bytes,
                              "backward_calls": stats.backward_calls, "backward_raw": stats.backward_raw_bytes,
                              "backward_sent": stats.backward_sent_bytes,
                              "max_error_ratio": max(stats.table_max_error_ratio.values(), default=0.0),
                              "tables": group.compressed_tables}
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "sharding_type"), [(2, "table_wise"), (3, "table_wise"), (2, "column_wise")])
def test_sequence_exchange_is_within_the_bound_and_gradients_per_backward_mode(world_size: int,
                                                                               sharding_type: str) -> None:
    # Column-wise sequence shardings use the same output dist (TwSequenceEmbeddingDist); compared against
    # TorchRec's table-wise uncompressed result, the same embeddings.
    results = run_ranks(_parity, world_size, sharding_type, timeout=400)
    tables = sorted(t for r in results for t in r["modes"]["fp32"]["tables"])
    assert tables == [f"seq_{i}" for i in range(len(FEATURES))]  # every table sharded once, every one compressed
    for r in results:
        for mode, m in r["modes"].items():
            assert m["worst"] <= 1.0 + 1e-5, (mode, m)  # every element within eps x the table's range
            assert m["max_error_ratio"] <= 1.0 + 1e-5, (mode, m)
            if m["calls"]:
                assert m["raw"] > 0 and m["sent"] < m["raw"], (mode, m)  # compression happened
                assert m["backward_calls"] == 1 and m["backward_raw"] > 0
            if mode == "dlac":  # within the bound of CompressionConfig().backward_eps = 0.01, summed per row
                assert m["grad_err"] <= m["dlac_allowed"] * (1 + 1e-5) + 1e-7, m
            else:  # the cast's relative rounding: bf16 keeps 8 bits, fp16 11
                tolerance = {"fp32": 1e-6, "bf16": 2**-8, "fp16": 2**-11}[mode]
                assert m["grad_err"] <= tolerance * max(m["grad_scale"], 1e-6) + 1e-7, (mode, m)
        fp32 = r["modes"]["fp32"]
        assert fp32["grad_err"] == 0.0  # float32 gradients travel exactly
        if r["modes"]["bf16"]["backward_calls"]:
            assert r["modes"]["bf16"]["backward_sent"] * 2 == fp32["backward_sent"]
    assert any(not m["exact"] for r in results for m in r["modes"].values())  # the forward was lossy somewhere


def _mixed(rank: int, world_size: int) -> dict:
    """A LightningModule-like model with an EmbeddingCollection beside an EmbeddingBagCollection, as a new user
    writes it; row-wise sequence tables say in the log why they stay uncompressed."""
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.distributed.init_process_group("gloo")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("lightning_dlac.comm.inject").addHandler(handler)
    model, group = _shard(_SequenceModel(with_bags=True), ["table_wise"], compress=True, backward="bf16")
    kinds = sorted(type(m).__name__ for m in model.modules()
                   if isinstance(m, (ShardedEmbeddingCollection, ShardedEmbeddingBagCollection)))
    bags = KeyedJaggedTensor(keys=["b_0"], values=torch.arange(6) % 40, lengths=torch.ones(6, dtype=torch.long))
    seq, pooled = model(_batch(rank, 1), bags)
    shapes = {f: list(seq[f].values().shape) for f in FEATURES}
    exchanges = sorted(type(a).__name__ for a in group)
    rw_model, rw_group = _shard(_SequenceModel(), ["row_wise"], compress=True)
    return {"kinds": kinds, "exchanges": exchanges, "pooled": list(pooled.values().shape), "shapes": shapes,
            "rw_exchanges": len(rw_group), "log": records}


@pytest.mark.slow
def test_embedding_collection_beside_bags_is_sharded_and_row_wise_tables_are_named() -> None:
    results = run_ranks(_mixed, 2, timeout=400)
    for r in results:
        assert r["kinds"] == ["ShardedEmbeddingBagCollection", "ShardedEmbeddingCollection"]
        assert all(s[1] == DIM for s in r["shapes"].values()) and r["pooled"] == [6, DIM]
        assert r["rw_exchanges"] == 0
        assert any("seq_0" in line and "row_wise" in line and "uncompressed" in line for line in r["log"]), r["log"]
    exchanges = [e for r in results for e in r["exchanges"]]
    assert "CompressedSequenceEmbeddingsAllToAll" in exchanges and "CompressedPooledEmbeddingsAllToAll" in exchanges


def test_sequence_exchange_rejects_a_layout_with_the_wrong_number_of_ranks() -> None:
    from lightning_dlac.adaptive import ErrorBounds
    from lightning_dlac.comm import CompressionConfig
    from lightning_dlac.comm.sequence import CompressedSequenceEmbeddingsAllToAll

    class _OneRank:
        def size(self) -> int:
            return 1

    with pytest.raises(ValueError, match=r"tables_per_rank needs one entry per rank \(1\), got 2"):
        CompressedSequenceEmbeddingsAllToAll(_OneRank(), [["a"], ["b"]], CompressionConfig(), ErrorBounds(EPS),
                                             uncompressed=None)


def _lightning_fit(rank: int, world_size: int, ckpt_dir: str | None = None, phase: str = "uninterrupted") -> dict:
    """The new user's case: a LightningModule with an EmbeddingCollection beside an EmbeddingBagCollection, trained
    with ``strategy="dlac"`` and the DLACCallback, nothing else said. ``phase``: ``"uninterrupted"`` (two epochs when
    ``ckpt_dir`` is given, else one), ``"first"`` (one epoch, then a checkpoint into ``ckpt_dir``) or ``"resume"``
    (from that checkpoint to the end of the second epoch)."""
    from pathlib import Path

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import IterableDataset
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from lightning_dlac import DLACCallback, dense_parameters
    from tests.conftest import trainer

    class Batches(IterableDataset):
        def __iter__(self):  # noqa: ANN204
            for step in range(12):
                seq = _batch(rank, step, batch_size=16)
                gen = torch.Generator().manual_seed(step * 10 + rank)
                bags = KeyedJaggedTensor(keys=["b_0"], values=torch.randint(0, 40, (32,), generator=gen),
                                         lengths=torch.full((16,), 2))
                labels = (seq.lengths().view(len(FEATURES), 16).sum(0) > 10).float()  # learnable from the ids
                yield seq, bags, labels

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _SequenceModel(with_bags=True)
            self.head = nn.Linear(DIM * (len(FEATURES) + 1), 1)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            seq, bags, labels = batch
            out, pooled = self.model(seq, bags)
            # Sum each sample's sequence embeddings per feature (a minimal sequence model).
            per_feature = [torch.zeros(16, DIM).index_add(0, torch.repeat_interleave(torch.arange(16),
                           out[f].lengths()), out[f].values()) for f in FEATURES]
            logits = self.head(torch.cat([pooled.values(), *per_feature], dim=1)).squeeze(-1)
            return nn.functional.binary_cross_entropy_with_logits(logits, labels)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.Adagrad(dense_parameters(self), lr=0.05)

        def train_dataloader(self):  # noqa: ANN201
            return torch.utils.data.DataLoader(Batches(), batch_size=None)

    class Losses(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):  # noqa: ANN001, ANN201
            self.losses.append(float(outputs["loss"]))

    module = Module()
    losses, dlac = Losses(), DLACCallback(mode="homogenization", calibration_batches=2, calibration_start=0, T=4)
    callbacks: list = [losses, dlac]
    if phase == "first":
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, every_n_epochs=1, save_top_k=-1))
    epochs = 1 if ckpt_dir is None or phase == "first" else 2
    t = trainer(world_size, "dlac", max_epochs=epochs, callbacks=callbacks, enable_checkpointing=phase == "first")
    t.fit(module, ckpt_path=str(next(Path(ckpt_dir).iterdir())) if phase == "resume" else None)
    stats = t.strategy.total_comm_stats()
    held = sorted(n.split(".")[-2] for n, p in module.named_parameters() if "ec.embeddings" in n and p.numel())
    # numpy, not tensors: a tensor crosses the result queue as a shared-memory handle of a process that has exited
    weights = {n: p.detach().numpy().copy() for n, p in module.named_parameters() if "ec.embeddings" in n and p.numel()}
    return {"exchanges": sorted(type(a).__name__ for a in t.strategy.exchanges), "calls": stats.calls,
            "raw": stats.raw_bytes, "sent": stats.sent_bytes, "tables": sorted(stats.table_raw_bytes),
            "held": held, "losses": losses.losses, "weights": weights, "table_bounds": dlac.table_bounds}


@pytest.mark.slow
def test_a_lightning_module_with_sequence_features_trains_with_strategy_dlac() -> None:
    results = run_ranks(_lightning_fit, 2, timeout=400)
    for r in results:
        assert "CompressedSequenceEmbeddingsAllToAll" in r["exchanges"], r
        assert r["calls"] > 0 and r["sent"] < r["raw"], r
    # Table-wise: each sequence table lives on one rank (it used to be replicated on every rank).
    held0, held1 = results[0]["held"], results[1]["held"]
    assert held0 and held1 and not set(held0) & set(held1) and sorted(held0 + held1) == [f"seq_{i}" for i in range(5)]
    assert sorted({t for r in results for t in r["tables"]}) == ["bag_0", *[f"seq_{i}" for i in range(5)]]


@pytest.mark.slow
def test_a_run_with_sequence_features_resumes_exactly(tmp_path) -> None:  # noqa: ANN001
    """The sharded sequence tables, their fused optimizer state and the bounds of their exchange travel in the
    checkpoint: the epoch after a resume is the uninterrupted run's second epoch, loss for loss and weight for
    weight."""
    uninterrupted = run_ranks(_lightning_fit, 2, str(tmp_path), "uninterrupted", timeout=400)
    run_ranks(_lightning_fit, 2, str(tmp_path), "first", timeout=400)
    resumed = run_ranks(_lightning_fit, 2, str(tmp_path), "resume", timeout=400)
    for u, r in zip(uninterrupted, resumed):
        assert len(u["losses"]) == 24 and r["losses"] == u["losses"][12:]
        assert r["table_bounds"] == u["table_bounds"] and any(t.startswith("seq_") for t in u["table_bounds"])
        assert r["weights"].keys() == u["weights"].keys() and r["weights"]
        for name, w in u["weights"].items():
            assert (r["weights"][name] == w).all(), name


# ------------------------------------------------------------------ fewer tables than ranks


MODES = ("fp32", "bf16", "fp16", "dlac")


class _FewTables(nn.Module):
    """One sequence table (100 rows, dim 8) beside ``bags`` pooled tables: fewer tables than ranks, so some rank owns
    no sequence table and (with ``bags`` < ranks) some rank owns no pooled table either."""

    def __init__(self, bags: int) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig

        torch.manual_seed(0)
        self.ec = EmbeddingCollection(tables=[EmbeddingConfig(name="seq", embedding_dim=DIM, num_embeddings=100,
                                                              feature_names=["s"])], device=torch.device("cpu"))
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"bag_{i}", embedding_dim=DIM, num_embeddings=40 + 20 * i,
                                       feature_names=[f"b_{i}"]) for i in range(bags)],
            device=torch.device("cpu"),
        )

    def forward(self, seq, bags):  # noqa: ANN001, ANN201
        return self.ec(seq)["s"].values(), self.ebc(bags).values()


def _few_batch(rank: int, bags: int, batch_size: int = 6, step: int = 0):  # noqa: ANN202
    """0-4 ids per sample for the sequence feature (none at all on rank 1: it receives no rows), one id per sample
    and bag feature (its pooled embedding is one table row), Zipf-like so that rows repeat."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(100 + rank + 1000 * step)
    lengths = torch.randint(0, 5, (batch_size,), generator=gen) * int(rank != 1)
    seq = KeyedJaggedTensor(keys=["s"], values=(torch.rand(int(lengths.sum()), generator=gen) ** 3 * 100).long(),
                            lengths=lengths)
    ids = [(torch.rand(batch_size, generator=gen) ** 3 * (40 + 20 * i)).long() for i in range(bags)]
    pooled = KeyedJaggedTensor(keys=[f"b_{i}" for i in range(bags)], values=torch.cat(ids),
                               lengths=torch.ones(bags * batch_size, dtype=torch.long))
    return seq, pooled


def _few_tables(rank: int, world_size: int, bags: int) -> dict:
    """Per backward mode: the compressed exchanges against TorchRec's uncompressed ones on the same weights and
    batch, forward (error / bound) and backward (the SGD(lr=1) weight change of every table)."""
    torch.distributed.init_process_group("gloo")
    global_state = copy.deepcopy(_FewTables(bags).state_dict())
    tables = {"ec.embeddings.seq.weight": 100, **{f"ebc.embedding_bags.bag_{i}.weight": 40 + 20 * i
                                                  for i in range(bags)}}
    bound = EPS * max(float(global_state[k].max() - global_state[k].min()) for k in tables)
    seq, pooled = _few_batch(rank, bags)
    out: dict = {"modes": {}}
    for mode in MODES:
        model, group = _shard(_FewTables(bags), ["table_wise"], compress=True, backward=mode)
        reference, _ = _shard(_FewTables(bags), ["table_wise"], compress=False)
        for m in (model, reference):
            load_global_weights(m, global_state)
        (got_seq, got_pooled), (want_seq, want_pooled) = model(seq, pooled), reference(seq, pooled)
        assert got_seq.shape == want_seq.shape and got_pooled.shape == want_pooled.shape
        forward_err = max(float((g - w).abs().max()) if w.numel() else 0.0
                          for g, w in ((got_seq, want_seq), (got_pooled, want_pooled)))
        # The same linear loss on both: the gradients sent do not depend on the lossy forward values.
        torch.manual_seed(7)
        w_seq, w_pooled = torch.randn(want_seq.shape), torch.randn(want_pooled.shape)
        for s, p in ((got_seq, got_pooled), (want_seq, want_pooled)):
            ((s * w_seq).sum() + (p * w_pooled).sum()).backward()
        deltas = {}
        for name, m in (("got", model), ("want", reference)):
            state = m.state_dict()
            deltas[name] = {k: _local(state[k]) - _local_of(global_state[k], state[k]) for k in tables}
        grad_err = max((float((deltas["got"][k] - deltas["want"][k]).abs().max()) for k in tables
                        if deltas["want"][k].numel()), default=0.0)
        grad_scale = max((float(deltas["want"][k].abs().max()) for k in tables if deltas["want"][k].numel()),
                         default=0.0)
        # Each gradient element within backward_eps x its chunk's range, at most the range of every rank's loss
        # weights / world; a weight row adds up the errors of its id's occurrences in the global batch.
        extremes = torch.tensor([-float(torch.cat([w_seq.flatten(), w_pooled.flatten()]).min()),
                                 float(torch.cat([w_seq.flatten(), w_pooled.flatten()]).max())])
        torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MAX)
        counts = [torch.bincount(seq.values(), minlength=100).float()]
        counts += [torch.bincount(pooled[f"b_{i}"].values(), minlength=40 + 20 * i).float() for i in range(bags)]
        for c in counts:
            torch.distributed.all_reduce(c)
        stats = group.stats()
        out["modes"][mode] = {
            "forward_ok": forward_err <= bound * (1 + 1e-5), "forward_exact": forward_err == 0.0,
            "grad_err": grad_err, "grad_scale": grad_scale,
            "dlac_allowed": max(float(c.max()) for c in counts) * 0.01 * float(extremes.sum()) / world_size,
            "raw": stats.raw_bytes, "sent": stats.sent_bytes, "calls": stats.calls,
            "backward_raw": stats.backward_raw_bytes, "backward_sent": stats.backward_sent_bytes,
            "max_error_ratio": max(stats.table_max_error_ratio.values(), default=0.0),
            "tables": sorted(group.compressed_tables),
        }
    out["seq_rows"] = list(got_seq.shape)
    return out


def _local(value) -> torch.Tensor:  # noqa: ANN001
    """This rank's shard of a sharded table (an empty tensor where it holds none)."""
    shards = value.local_shards()
    return shards[0].tensor.detach().clone() if shards else torch.zeros(0)


def _local_of(full: torch.Tensor, value) -> torch.Tensor:  # noqa: ANN001
    """The rows of ``full`` (an unsharded table) that this rank's shard of ``value`` holds."""
    shards = value.local_shards()
    if not shards:
        return torch.zeros(0)
    from lightning_dlac.engine.sharding import shard_slices

    return full[shard_slices(shards[0].metadata)]


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "bags"), [(2, 1), (3, 1), (3, 2)])
def test_fewer_tables_than_ranks_are_compressed_both_ways_in_every_backward_mode(world_size: int, bags: int) -> None:
    results = run_ranks(_few_tables, world_size, bags, timeout=400)
    owned = [r["modes"]["fp32"]["tables"] for r in results]
    assert sorted(t for tables in owned for t in tables) == sorted(["seq", *(f"bag_{i}" for i in range(bags))])
    assert sum("seq" in tables for tables in owned) == 1  # the other ranks own no sequence table
    assert sum(any(t.startswith("bag_") for t in tables) for tables in owned) <= bags < world_size  # nor a pooled one
    assert results[1]["seq_rows"] == [0, DIM]  # rank 1 looked up no id: it receives no rows, an empty tensor
    for r in results:
        for mode, m in r["modes"].items():
            assert m["forward_ok"] and m["max_error_ratio"] <= 1.0 + 1e-5, (mode, m)
            if not m["tables"]:
                assert m["sent"] == m["raw"] == 0, (mode, m)  # no table of its own: not even a size record
            elif m["raw"]:
                assert m["sent"] < m["raw"], (mode, m)  # this rank's tables went out compressed
            if mode == "dlac":
                assert m["grad_err"] <= m["dlac_allowed"] * (1 + 1e-5) + 1e-7, m
                if m["backward_raw"]:
                    assert m["backward_sent"] < m["backward_raw"], m
            else:
                tolerance = {"fp32": 0.0, "bf16": 2**-8, "fp16": 2**-11}[mode]
                assert m["grad_err"] <= tolerance * m["grad_scale"] + (1e-7 if tolerance else 0.0), (mode, m)
    assert any(not m["forward_exact"] for r in results for m in r["modes"].values())  # the forward was lossy


def _fit_one_sequence_table(rank: int, world_size: int) -> dict:
    """The issue's case: a LightningModule with one EmbeddingCollection table (dim 8, 100 rows) and one
    EmbeddingBagCollection table, trained with ``strategy="dlac"`` and the DLACCallback."""
    import lightning.pytorch as pl
    from torch.utils.data import IterableDataset

    from lightning_dlac import DLACCallback, dense_parameters
    from tests.conftest import loss_recorder, trainer

    class Batches(IterableDataset):
        def __iter__(self):  # noqa: ANN204
            for step in range(8):
                seq, bags = _few_batch(rank, 1, batch_size=8, step=step)
                yield seq, bags, (bags.values() % 2).float()  # learnable from the bag ids

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _FewTables(1)
            self.head = nn.Linear(2 * DIM, 1)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            seq, bags, labels = batch
            values, pooled = self.model(seq, bags)
            rows = torch.repeat_interleave(torch.arange(8), seq.lengths())  # each id's sample
            per_sample = torch.zeros(8, DIM).index_add(0, rows, values)
            logits = self.head(torch.cat([pooled, per_sample], dim=1)).squeeze(-1)
            return nn.functional.binary_cross_entropy_with_logits(logits, labels)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.Adagrad(dense_parameters(self), lr=0.05)

        def train_dataloader(self):  # noqa: ANN201
            return torch.utils.data.DataLoader(Batches(), batch_size=None)

    losses, dlac = loss_recorder(), DLACCallback(mode="homogenization", calibration_batches=2, calibration_start=0, T=4)
    t = trainer(world_size, "dlac", max_epochs=1, callbacks=[losses, dlac])
    t.fit(Module())
    stats = t.strategy.total_comm_stats()
    return {"losses": losses.losses, "calls": stats.calls, "raw": stats.raw_bytes, "sent": stats.sent_bytes,
            "tables": t.strategy.all_compressed_tables, "bounds": dlac.table_bounds}


@pytest.mark.slow
def test_a_lightning_module_with_one_sequence_table_trains_on_two_ranks() -> None:
    results = run_ranks(_fit_one_sequence_table, 2, timeout=400)
    for r in results:
        assert len(r["losses"]) == 8 and all(loss == loss for loss in r["losses"]), r  # every step ran, finite
        assert r["calls"] == 2 * 8 and r["tables"] == ["bag_0", "seq"], r  # two exchanges, 8 steps
        assert set(r["bounds"]) == {"bag_0", "seq"}  # both calibrated, on every rank alike
    assert results[0]["bounds"] == results[1]["bounds"]
    assert sum(r["sent"] for r in results) < sum(r["raw"] for r in results)
