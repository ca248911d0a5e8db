"""Capture the GPU codec benchmark's realistic payloads: train the example DLRM on the Criteo sample and write what
its payloads are made of to ``benchmarks/payloads/criteo_dlrm.npz`` (``--write``; needs TorchRec and
``../shared/data/criteo_kaggle_head10k.tsv``, about 5 minutes on 2 cores), then print each payload's shape and
spread. The file's layout and the payloads built from it: benchmarks/lib/gpu_payloads.py, read with torch and numpy
alone (the lent GPU machine has neither TorchRec nor the sample).

    python -m benchmarks.capture_payloads --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.gpu_payloads import DIM, PAYLOAD_FILE, PAYLOADS, SAMPLES, TABLES, build, gradients, load, pooled
from benchmarks.lib.paths import CRITEO_SAMPLE
from benchmarks.lib.payloads import train_criteo_dlrm
from benchmarks.lib.plan import outputs_help


def write(path: Path, criteo_tsv: Path, epochs: int) -> None:
    """Train the example DLRM on ``criteo_tsv`` and save what the payloads are made of (module docstring)."""
    from lightning_dlac.criteo import MLPERF_MULTI_HOT_SIZES

    torch.manual_seed(0)
    model, dm, trained = train_criteo_dlrm(criteo_tsv, SAMPLES, epochs, 10_000)
    m = model.model
    ebc = m.sparse_arch.embedding_bag_collection
    parts, dense, labels, grads = [], [], [], []
    for batch in dm.val_dataloader():
        with torch.no_grad():
            d = ebc(batch.sparse_features).to_dict()
        x = torch.cat([d[k] for k in d], dim=1)
        emb = x.view(x.shape[0], TABLES, DIM).detach().requires_grad_(True)
        logits = m.over_arch(m.inter_arch(dense_features=m.dense_arch(batch.dense_features), sparse_features=emb))
        model.loss_fn(logits.squeeze(-1), batch.labels.float()).backward()
        parts.append(x)
        dense.append(batch.dense_features)
        labels.append(batch.labels.float())
        grads.append(emb.grad.reshape(x.shape[0], -1))
    x, want = torch.cat(parts), torch.cat(grads)
    if x.shape != (SAMPLES, TABLES * DIM):
        raise RuntimeError(f"captured {tuple(x.shape)}, expected ({SAMPLES}, {TABLES * DIM})")
    out: dict[str, np.ndarray] = {"dense": torch.cat(dense).numpy().astype(np.float32),
                                  "labels": torch.cat(labels).numpy().astype(np.float32),
                                  "multi_hot_sizes": np.asarray(MLPERF_MULTI_HOT_SIZES, dtype=np.int64)}
    index = np.empty((SAMPLES, TABLES), dtype=np.uint16)
    for t in range(TABLES):
        rows, inverse = np.unique(x[:, t * DIM : (t + 1) * DIM].numpy(), axis=0, return_inverse=True)
        out[f"rows_{t}"] = rows.astype(np.float32)
        index[:, t] = inverse.reshape(-1)
    out["index"] = index
    for prefix, arch in (("dense", m.dense_arch), ("over", m.over_arch)):
        linears = [mod for mod in arch.modules() if isinstance(mod, torch.nn.Linear)]
        for k, lin in enumerate(linears):
            out[f"{prefix}_{k}_weight"] = lin.weight.detach().numpy().astype(np.float32)
            out[f"{prefix}_{k}_bias"] = lin.bias.detach().numpy().astype(np.float32)
    out["grad_check"] = want[:16].numpy().astype(np.float32)
    # The file must give back TorchRec's pooled embeddings exactly and its gradients (the same float operations).
    if not torch.equal(pooled(out), x):
        raise RuntimeError("the factored pooled embeddings do not give back the captured ones")
    got = gradients(out)
    err = float((got - want).abs().max() / want.abs().max())
    if err > 1e-5:
        raise RuntimeError(f"the plain-torch DLRM's gradients differ from TorchRec's by {err:.2e} of the largest")
    distinct = sum(out[f"rows_{t}"].shape[0] for t in range(TABLES))
    out["description"] = np.asarray(
        f"{trained}; the next {SAMPLES} rows of {criteo_tsv.name}: {distinct} distinct pooled rows over {TABLES}"
        f" tables; plain-torch gradients within {err:.1e} of TorchRec's (relative to the largest)")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {out['description']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="train the DLRM and (re)write the payload file")
    parser.add_argument("--criteo", type=Path, default=CRITEO_SAMPLE, help="the Criteo Kaggle TSV sample")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (as the codec benchmark)")
    parser.add_argument("--out", type=Path, default=PAYLOAD_FILE)
    args = parser.parse_args()
    if args.write:
        write(args.out, args.criteo, args.epochs)
    data = load(args.out)
    print(str(data["description"]))
    for name in PAYLOADS:
        x = build(name, data, 512, 2)
        print(f"{name}: {tuple(x.shape)} float32, mean {float(x.mean()):.2e}, std {float(x.std()):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
