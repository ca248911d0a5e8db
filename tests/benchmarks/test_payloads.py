"""The GPU codec benchmark's realistic payloads (benchmarks/lib/gpu_payloads.py, read with torch and numpy alone from
the shipped benchmarks/payloads/criteo_dlrm.npz): what the trained model sends, within the codec's bound."""

from __future__ import annotations

import torch

from benchmarks.lib import gpu_payloads as gp
from lightning_dlac.codec import decode_grid, encode_grid, inspect_grid
from tests.codec.conftest import assert_bound


def test_the_shipped_gpu_payloads_are_what_the_trained_model_sends(native: None) -> None:
    # The file the GPU benchmark reads (benchmarks/payloads/criteo_dlrm.npz): its plain-torch DLRM gives TorchRec's
    # gradients back, each destination holds distinct samples, multi-hot bags follow their one-hot rows, and the
    # payloads compress within the bound.
    data = gp.load()
    want = torch.from_numpy(data["grad_check"])
    got = gp.gradients(data, want.shape[0])
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    pooled = gp.pooled(data)
    rows, dests = 512, 2
    payloads = {name: gp.build(name, data, rows, dests) for name in gp.PAYLOADS}
    for name, x in payloads.items():
        assert x.shape == (dests * rows, 26 * 64) and x.dtype == torch.float32 and bool(torch.isfinite(x).all()), name
    # Each destination: distinct samples (its own permutation), rows of the captured pooled embeddings.
    samples = gp._permutations(rows, dests, 0).view(dests, rows)
    assert all(len(set(s.tolist())) == rows for s in samples)
    assert torch.equal(payloads["criteo"], pooled[samples.reshape(-1)])
    # Multi-hot: a sample's bag is a function of its one-hot row, so equal one-hot rows pool to equal bags.
    index = torch.from_numpy(data["index"].astype("int64"))[samples.reshape(-1)]
    for t in (0, 20):  # pooling factors 3 and 100
        same = torch.triu(index[:, t].unsqueeze(0) == index[:, t].unsqueeze(1), diagonal=1).nonzero()[:50]
        assert len(same) == 50  # one-hot rows repeat in a batch of Criteo samples
        cols = slice(64 * t, 64 * t + 64)
        for a, b in same.tolist():
            assert torch.equal(payloads["multihot"][a, cols], payloads["multihot"][b, cols])
    rs, cs = [0, rows, 2 * rows], list(range(0, 26 * 64 + 1, 64))
    for name, x in payloads.items():
        payload, sizes = encode_grid(x, rs, cs, eps=0.01, impl="native")
        y = decode_grid(payload, sizes, rs, cs, impl="native")
        infos = inspect_grid(payload, sizes)
        for k, info in enumerate(infos):
            r, c = divmod(k, 26)
            blk = (slice(rs[r], rs[r + 1]), slice(cs[c], cs[c + 1]))
            assert_bound(x[blk], y[blk], info.abs_eb)
        assert x.numel() * 4 / payload.numel() > 3, name
