"""The codec benchmarks' payloads: rows looked up with Zipf id frequencies, and the pooled embeddings (and their
gradients) of the example DLRM trained on the Criteo sample, and of MLPerf's DLRM v2 trained on synthetic multi-hot
data (:mod:`benchmarks.lib.gpu_payloads` ships the Criteo ones for machines without TorchRec).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


def zipf_payload(rows: int, dim: int, vocab: int = 2000, alpha: float = 1.1, seed: int = 0) -> torch.Tensor:
    """Rows looked up from a ``vocab``-row table with Zipf(``alpha``) id frequencies (as tests/codec/conftest.py)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, dim, generator=g) * 0.05
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** alpha
    return table[torch.multinomial(p, rows, replacement=True, generator=g)].contiguous()


def train_criteo_dlrm(path: Path, capture_rows: int, epochs: int, max_rows: int,
                      max_samples: int | None = None) -> tuple[Any, Any, str]:
    """Train the example DLRM (dim 64) unsharded on the rows before the last ``capture_rows`` of ``path`` (the
    module's own Adagrad over every parameter, tables included). Returns the model, the data module (its validation
    split is the last ``capture_rows`` rows, in batches of 256) and a description of the training."""
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.tsv import CriteoTSVDataModule

    n = sum(1 for _ in path.open())
    n = n if max_samples is None else min(n, max_samples)
    if n <= capture_rows:
        raise ValueError(f"{path} has {n} rows, not more than the {capture_rows} to capture")
    dm = CriteoTSVDataModule(str(path), max_rows=max_rows, batch_size=256,
                             max_samples=n, val_fraction=capture_rows / n, seed=0)
    dm.setup("fit")
    model = DLRMModule(num_embeddings_per_feature=dm.num_embeddings_per_feature, embedding_dim=64, seed=0)
    opt = model.configure_optimizers()
    start, losses = time.perf_counter(), []
    model.train()
    for _ in range(epochs):
        for batch in dm.train_dataloader():
            opt.zero_grad()
            loss = model.loss_fn(model(batch), batch.labels.float())
            loss.backward()
            opt.step()
            losses.append(loss.item())
    train_rows = n - int(round(capture_rows / n * n))
    desc = (
        f"DLRM (26 tables <= {max_rows} rows, dim 64) trained {epochs} epoch(s) on rows 0..{train_rows - 1} "
        f"({len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, {time.perf_counter() - start:.0f} s)"
    )
    return model, dm, desc


def criteo_payload(
    path: Path, capture_rows: int, epochs: int, max_rows: int, max_samples: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[int], str, str]:
    """The example DLRM trained by :func:`train_criteo_dlrm`: the pooled embeddings of the last ``capture_rows``
    rows of ``path`` as ``[capture_rows, 26 * dim]`` with one column block per table, the loss gradients w.r.t. them
    (same shape: the payload of the backward exchange), the column splits, and a one-line description of each."""
    model, dm, trained = train_criteo_dlrm(path, capture_rows, epochs, max_rows, max_samples)
    ebc = model.model.sparse_arch.embedding_bag_collection
    m = model.model
    parts, grads = [], []
    for batch in dm.val_dataloader():
        with torch.no_grad():
            d = ebc(batch.sparse_features).to_dict()
        pooled = torch.cat([d[k] for k in d], dim=1)
        parts.append(pooled)
        # The gradient the backward all-to-all sends: d(batch-mean BCE loss)/d(pooled embeddings) of this batch, as
        # TorchRec's DLRM computes it (the sparse arch's [B, tables, dim] output feeds the interaction).
        emb = pooled.view(pooled.shape[0], -1, 64).detach().requires_grad_(True)
        logits = m.over_arch(m.inter_arch(dense_features=m.dense_arch(batch.dense_features), sparse_features=emb))
        model.loss_fn(logits.squeeze(-1), batch.labels.float()).backward()
        grads.append(emb.grad.reshape(pooled.shape[0], -1))
    x = torch.cat(parts).contiguous()
    grad = torch.cat(grads).contiguous()
    dim = 64
    desc = f"{trained}; pooled embeddings of the next {x.shape[0]} rows"
    gdesc = (f"gradients of the same model's batch-mean BCE loss w.r.t. those pooled embeddings (batches of 256, "
             f"as the backward all-to-all sends them; mean {float(grad.mean()):.1e}, std {float(grad.std()):.1e}, "
             f"max |g| {float(grad.abs().max()):.1e})")
    return x, grad, list(range(0, x.shape[1] + 1, dim)), desc, gdesc


def dlrm_v2_payloads(capture_rows: int, steps: int, batch_size: int, max_rows: int) -> list[tuple]:
    """MLPerf DLRM v2: train the example ``DLRM_DCN`` (dim 128, 3 cross layers of rank 512, MLPerf's MLPs) unsharded
    on synthetic multi-hot data with MLPerf's pooling factors (bags per id, as MLPerf materialises them), then
    capture the sum-pooled embeddings of ``capture_rows`` fresh samples: ``dlrm_v2`` (bags per id, the training
    distribution) and ``dlrm_v2_iid`` (every id of a bag its own Zipf draw: bags repeat far less, the pessimistic
    case). Returns ``(name, x [rows, 26 * 128], col_splits, description)`` tuples."""
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

    def data(distribution: str, batch: int) -> SyntheticCriteoDataModule:
        dm = SyntheticCriteoDataModule(max_rows=max_rows, batch_size=batch, num_train_batches=steps,
                                       num_val_batches=1, multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES),
                                       multi_hot_distribution=distribution, seed=0)
        dm.setup("fit")
        return dm

    train = data("per_id", batch_size)
    # Adagrad at 0.002 over every parameter, tables included: at 0.01 the DCN diverges (loss 0.7 -> 190 in 4 steps).
    model = DLRMModule(num_embeddings_per_feature=train.num_embeddings_per_feature, embedding_dim=128,
                       dense_arch_layer_sizes=[512, 256, 128], over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
                       interaction="dcn", dcn_num_layers=3, dcn_low_rank_dim=512, learning_rate=0.002, seed=0)
    opt = model.configure_optimizers()
    start, losses = time.perf_counter(), []
    model.train()
    for batch in train.train_dataloader():
        opt.zero_grad()
        loss = model.loss_fn(model(batch), batch.labels.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    elapsed = time.perf_counter() - start
    ebc = model.embedding_bag_collection
    out = []
    for name, distribution in (("dlrm_v2", "per_id"), ("dlrm_v2_iid", "independent")):
        batch = next(iter(data(distribution, capture_rows).val_dataloader()))
        with torch.no_grad():
            d = ebc(batch.sparse_features).to_dict()
        x = torch.cat([d[k] for k in d], dim=1).contiguous()
        desc = (f"DLRM_DCN (MLPerf DLRM v2: 26 tables <= {max_rows} rows, dim 128, DCN 3 x rank 512) trained"
                f" {steps} steps of {batch_size} synthetic multi-hot samples (MLPerf pooling factors, bags per id;"
                f" loss {losses[0]:.3f} -> {losses[-1]:.3f}, {elapsed:.0f} s); sum-pooled embeddings of"
                f" {x.shape[0]} fresh samples, bags {'per id' if distribution == 'per_id' else 'of independent ids'}")
        out.append((name, x, list(range(0, x.shape[1] + 1, 128)), desc))
    return out
