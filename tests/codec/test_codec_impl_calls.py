"""``impl_calls()``: every encode and decode is counted under the implementation that actually ran."""

from __future__ import annotations

import pytest
import torch

from lightning_dlac.codec import decode, decode_grid, encode, encode_grid, impl_calls


def _delta(before: dict, after: dict) -> dict:
    return {impl: {op: after[impl][op] - before[impl][op] for op in ops} for impl, ops in after.items()}


def test_each_call_counts_under_the_implementation_that_ran(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    before = impl_calls()
    decode(encode(x, eps=0.01, impl="ref"), impl="ref")
    payload, sizes = encode_grid(x, [0, 8, 16], [0, 4, 8], eps=0.01, impl="native")
    decode_grid(payload, sizes, [0, 8, 16], [0, 4, 8], impl="native")
    decode_grid(payload, sizes, [0, 8, 16], [0, 4, 8], impl="native")
    monkeypatch.setenv("DLAC_CODEC_IMPL", "ref")
    encode(x, eps=0.01)  # "auto" resolves through DLAC_CODEC_IMPL: counted where it ran
    assert _delta(before, impl_calls()) == {"native": {"encode": 1, "decode": 2}, "ref": {"encode": 2, "decode": 1}}


def test_rejected_inputs_are_not_counted_and_snapshots_are_copies() -> None:
    before = impl_calls()
    with pytest.raises(TypeError):
        encode(torch.zeros(4, 4, dtype=torch.float64), eps=0.01, impl="ref")
    with pytest.raises(ValueError):
        decode_grid(torch.zeros(3, dtype=torch.uint8), [1, 1], [0, 1, 2], [0, 1], impl="ref")
    snapshot = impl_calls()
    snapshot["ref"]["encode"] += 100
    assert impl_calls() == before
