"""Realistic payloads for the GPU codec benchmark, read from a small shipped file with plain torch and numpy (the lent
GPU machine has neither TorchRec nor the Criteo sample).

``benchmarks/payloads/criteo_dlrm.npz`` (about 6 MB) holds what the example DLRM (26 tables, dim 64), trained on the
shipped Criteo sample as the codec benchmark trains it (benchmarks/lib/payloads.py), computes for the 4096 rows it did
not train on:

- ``rows_<t>`` float32 [n_t, 64] and ``index`` uint16 [4096, 26]: the distinct pooled embeddings of table ``t`` and
  each sample's row of each table (the pooled embeddings, factored: a one-hot table's pooled rows repeat);
- ``dense`` float32 [4096, 13] and ``labels`` float32 [4096]: the samples' dense features (as the model reads them)
  and labels; ``dense_<k>_weight`` / ``dense_<k>_bias`` and ``over_<k>_weight`` / ``over_<k>_bias``: the model's
  dense and over MLPs, so that the gradient payload can be computed for every sample without TorchRec;
- ``grad_check`` float32 [16, 26 * 64]: the first 16 rows of TorchRec's own gradient, which :func:`gradients` must
  reproduce; ``multi_hot_sizes`` int64 [26]: MLPerf DLRM v2's pooling factors; ``description``: how it was made.

It is written by ``python -m benchmarks.capture_payloads --write`` (needs TorchRec and
``../shared/data/criteo_kaggle_head10k.tsv``; about 5 minutes on 2 cores).

Payloads: float32 ``[destinations * rows, 26 * 64]``, row block ``d`` for destination ``d`` and one column block per
table, as the forward all-to-all cuts them. Each destination's rows are its own permutation of the 4096 samples (so
``rows <= 4096``), which repeats no sample inside a chunk:

- ``criteo``: the pooled embeddings (one-hot features: a chunk repeats a row wherever its samples share a category);
- ``multihot``: sum-pooled bags of MLPerf DLRM v2's sizes (1 to 100 ids) over each table's trained rows, the bag of a
  sample a fixed function of its one-hot row (MLPerf's materialisation; its other ids uniform over the table's rows);
- ``gradient``: d(batch-mean BCE loss) / d(pooled embeddings) per batch of 256 samples, the payload of the backward
  all-to-all, computed with the shipped dense model by :func:`dlrm_logits` (TorchRec's DLRM forward in plain torch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.paths import PAYLOADS as PAYLOADS_DIR

PAYLOAD_FILE = PAYLOADS_DIR / "criteo_dlrm.npz"
TABLES, DIM, SAMPLES, GRAD_BATCH = 26, 64, 4096, 256
PAYLOADS = ("criteo", "multihot", "gradient")


def load(path: Path = PAYLOAD_FILE) -> dict[str, np.ndarray]:
    """The shipped arrays, checked for the shapes this module relies on."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: write it with `python -m benchmarks.capture_payloads --write` "
                                "(needs TorchRec and the Criteo sample)")
    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    index = data["index"]
    if index.shape != (SAMPLES, TABLES) or data["dense"].shape[0] != SAMPLES:
        raise ValueError(f"{path}: index {index.shape} / dense {data['dense'].shape}, expected {SAMPLES} samples x "
                         f"{TABLES} tables (rewrite it with --write)")
    for t in range(TABLES):
        if data[f"rows_{t}"].shape[1] != DIM or int(index[:, t].max()) >= data[f"rows_{t}"].shape[0]:
            raise ValueError(f"{path}: table {t}'s rows and index do not fit together (rewrite it with --write)")
    return data


def _permutations(rows: int, destinations: int, seed: int) -> torch.Tensor:
    """[destinations * rows] sample numbers: destination d's rows are the first ``rows`` of its own permutation."""
    if not 1 <= rows <= SAMPLES:
        raise ValueError(f"rows per destination must be 1..{SAMPLES} (the samples in the file), got {rows}")
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randperm(SAMPLES, generator=g)[:rows] for _ in range(destinations)])


def pooled(data: dict[str, np.ndarray]) -> torch.Tensor:
    """The pooled embeddings of the 4096 samples, [4096, 26 * 64] in sample order."""
    index = torch.from_numpy(data["index"].astype(np.int64))
    return torch.cat([torch.from_numpy(data[f"rows_{t}"])[index[:, t]] for t in range(TABLES)], dim=1).contiguous()


def criteo(data: dict[str, np.ndarray], rows: int, destinations: int, seed: int = 0) -> torch.Tensor:
    """The one-hot pooled embeddings, ``rows`` samples for each destination."""
    return pooled(data)[_permutations(rows, destinations, seed)].contiguous()


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic), kept non-negative."""
    x = x ^ (x >> 30)
    x = x * -4658895280553007687  # 0xbf58476d1ce4e5b9 as a signed int64
    x = x ^ (x >> 27)
    x = x * -7723592293110705685  # 0x94d049bb133111eb
    return (x ^ (x >> 31)) & ((1 << 62) - 1)


def multihot_pooled(data: dict[str, np.ndarray]) -> torch.Tensor:
    """Sum-pooled multi-hot bags of the 4096 samples, [4096, 26 * 64]: table t's bag of a sample whose one-hot row is
    i holds i and ``multi_hot_sizes[t] - 1`` rows drawn by a hash of (t, i, slot), so equal one-hot rows give equal
    bags (MLPerf DLRM v2 materialises Criteo 1TB's bags so)."""
    index = torch.from_numpy(data["index"].astype(np.int64))
    out = []
    for t, pool in enumerate(data["multi_hot_sizes"].tolist()):
        table = torch.from_numpy(data[f"rows_{t}"])
        one = index[:, t : t + 1]
        slots = torch.arange(1, int(pool), dtype=torch.int64)
        bag = torch.cat([one, _mix64((one * 1_000_003 + t) * 1_009 + slots) % table.shape[0]], dim=1)
        out.append(table[bag].sum(dim=1))
    return torch.cat(out, dim=1).contiguous()


def multihot(data: dict[str, np.ndarray], rows: int, destinations: int, seed: int = 0) -> torch.Tensor:
    """The multi-hot pooled embeddings (:func:`multihot_pooled`), ``rows`` samples for each destination."""
    return multihot_pooled(data)[_permutations(rows, destinations, seed)].contiguous()


def _layers(data: dict[str, np.ndarray], prefix: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out, k = [], 0
    while f"{prefix}_{k}_weight" in data:
        out.append((torch.from_numpy(data[f"{prefix}_{k}_weight"]), torch.from_numpy(data[f"{prefix}_{k}_bias"])))
        k += 1
    return out


def dlrm_logits(data: dict[str, np.ndarray], dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """TorchRec's DLRM forward (``torchrec.models.dlrm.DLRM`` after its sparse arch) in plain torch: the dense MLP
    (Linear + ReLU per layer), the pairwise dot interaction of [dense output, 26 embeddings] (upper triangle without
    the diagonal, after the dense output), the over MLP (Linear + ReLU, a final Linear). ``emb``: [B, 26, 64]."""
    h = dense
    for w, b in _layers(data, "dense"):
        h = torch.relu(torch.nn.functional.linear(h, w, b))
    combined = torch.cat([h.unsqueeze(1), emb], dim=1)
    i, j = torch.triu_indices(TABLES + 1, TABLES + 1, offset=1)
    z = torch.cat([h, torch.bmm(combined, combined.transpose(1, 2))[:, i, j]], dim=1)
    over = _layers(data, "over")
    for w, b in over[:-1]:
        z = torch.relu(torch.nn.functional.linear(z, w, b))
    return torch.nn.functional.linear(z, *over[-1]).squeeze(-1)


def gradients(data: dict[str, np.ndarray], samples: int = SAMPLES) -> torch.Tensor:
    """d(batch-mean BCE loss)/d(pooled embeddings) of the first ``samples`` samples, [samples, 26 * 64], from batches
    of 256 samples as in training (the batches holding them are computed whole)."""
    x = pooled(data)
    dense, labels = torch.from_numpy(data["dense"]), torch.from_numpy(data["labels"])
    out = []
    for b0 in range(0, samples, GRAD_BATCH):
        b1 = min(SAMPLES, b0 + GRAD_BATCH)
        emb = x[b0:b1].view(b1 - b0, TABLES, DIM).clone().requires_grad_(True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(dlrm_logits(data, dense[b0:b1], emb),
                                                                    labels[b0:b1])
        (g,) = torch.autograd.grad(loss, emb)
        out.append(g.reshape(b1 - b0, TABLES * DIM))
    return torch.cat(out)[:samples].contiguous()


def gradient(data: dict[str, np.ndarray], rows: int, destinations: int, seed: int = 0) -> torch.Tensor:
    """The backward all-to-all's payload (:func:`gradients`), ``rows`` samples for each destination."""
    return gradients(data)[_permutations(rows, destinations, seed)].contiguous()


def build(name: str, data: dict[str, np.ndarray], rows: int, destinations: int, seed: int = 0) -> torch.Tensor:
    """Payload ``name`` (one of PAYLOADS) on the host."""
    makers = {"criteo": criteo, "multihot": multihot, "gradient": gradient}
    if name not in makers:
        raise ValueError(f"unknown payload {name!r}: choose from {', '.join(PAYLOADS)}")
    return makers[name](data, rows, destinations, seed)
