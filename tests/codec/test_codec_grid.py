"""encode_grid / decode_grid: layout, exact sizes, per-column bounds, raw columns, and chunk-level errors."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_bound, bits, zipf_payload

from lightning_dlac.codec import CodecError, Mode, decode, decode_grid, encode_grid, inspect_grid

IMPLS = ["ref", "native"]


@pytest.fixture(params=IMPLS)
def impl(request) -> str:
    if request.param == "native":
        request.getfixturevalue("native")
    return request.param


def _grid_input():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 30, generator=g) * torch.tensor([0.01] * 10 + [1.0] * 12 + [100.0] * 8)
    x[:, 22:30] = x[torch.randint(0, 4, (40,), generator=g), 22:30]  # a repetitive table: dedup
    return x, [0, 10, 10, 33, 40], [0, 10, 22, 30]  # includes an empty row block


def test_grid_roundtrip_layout_and_sizes(impl):
    x, rs, cs = _grid_input()
    eps = torch.tensor([0.01, 0.05, 0.03])
    payload, sizes = encode_grid(x, rs, cs, eps=eps, impl=impl)
    assert payload.dtype == torch.uint8 and sizes.dtype == torch.int64 and sizes.numel() == 12
    assert int(sizes.sum()) == payload.numel()
    y = decode_grid(payload, sizes, rs, cs, impl=impl)
    assert y.shape == x.shape
    infos = inspect_grid(payload, sizes)
    off = 0
    for i, info in enumerate(infos):  # row-block-major; each chunk decodes on its own from exactly its bytes
        r, c = divmod(i, 3)
        block = x[rs[r]: rs[r + 1], cs[c]: cs[c + 1]]
        chunk = payload[off: off + int(sizes[i])]
        off += int(sizes[i])
        assert (info.rows, info.dim) == tuple(block.shape)
        assert_bound(block, decode(chunk, impl=impl), info.abs_eb)
        assert torch.equal(bits(decode(chunk, impl=impl)), bits(y[rs[r]: rs[r + 1], cs[c]: cs[c + 1]]))
        if block.numel():
            rng = float(block.max() - block.min())
            assert info.abs_eb <= float(eps[c]) * rng * (1 + 1e-6)
    assert any(i.mode == Mode.DEDUP for i in infos)


def test_grid_native_equals_reference(native):
    x, rs, cs = _grid_input()
    for kw in ({"eps": [0.01, 0.0, 0.2]}, {"abs_eb": [1e-4, 0.5, 0.0]}, {"eps": 0.03}):
        pa, sa = encode_grid(x, rs, cs, impl="ref", **kw)
        pb, sb = encode_grid(x, rs, cs, impl="native", **kw)
        assert torch.equal(pa, pb) and torch.equal(sa, sb)
        ya = decode_grid(pa, sa, rs, cs, impl="ref")
        yb = decode_grid(pa, sa, rs, cs, impl="native")
        assert torch.equal(bits(ya), bits(yb))


def test_zero_bound_sends_column_block_raw(impl):
    x, rs, cs = _grid_input()
    payload, sizes = encode_grid(x, rs, cs, eps=[0.01, 0.0, 0.01], impl=impl)
    modes = [i.mode for i in inspect_grid(payload, sizes)]
    assert all(m in (Mode.RAW, Mode.CONST) for m in modes[1::3])
    y = decode_grid(payload, sizes, rs, cs, impl=impl)
    assert torch.equal(bits(y[:, 10:22]), bits(x[:, 10:22]))


def test_grid_accepts_tensor_splits_and_strided_input(impl):
    base = zipf_payload(rows=64, dim=48, vocab=50)
    x = base[:, ::2]  # non-unit column stride
    rs = torch.tensor([0, 32, 64])
    cs = torch.tensor([0, 8, 24])
    payload, sizes = encode_grid(x, rs, cs, eps=torch.tensor([0.01, 0.02]), impl=impl)
    ref_payload, _ = encode_grid(x.contiguous(), rs, cs, eps=torch.tensor([0.01, 0.02]), impl="ref")
    assert torch.equal(payload, ref_payload)
    assert_bound(x, decode_grid(payload, sizes, rs, cs, impl=impl), 0.02 * float(x.max() - x.min()))


def test_decode_grid_into_a_view_writes_the_same_bits_and_nothing_around_them(impl):
    # The exchange decodes straight into its output: a block of columns (row stride wider than the grid) or of rows
    # of a larger tensor. Every chunk's bits are decode_grid's, and the rest of the larger tensor is not touched.
    x, rs, cs = _grid_input()
    payload, sizes = encode_grid(x, rs, cs, eps=[0.01, 0.05, 0.03], impl=impl)
    expected = decode_grid(payload, sizes, rs, cs, impl=impl)
    columns = torch.full((40, 50), 7.0)
    rows = torch.full((60, 30), 7.0)
    for larger, view in ((columns, columns[:, 12:42]), (rows, rows[15:55])):
        untouched = torch.ones_like(larger, dtype=torch.bool)  # the same layout: the view's strides select its part
        untouched.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
        assert decode_grid(payload, sizes, rs, cs, impl=impl, out=view) is view
        assert torch.equal(bits(view), bits(expected))
        assert bool((larger[untouched] == 7.0).all())


def test_decode_grid_into_native_equals_reference(native):
    x, rs, cs = _grid_input()
    payload, sizes = encode_grid(x, rs, cs, eps=0.02, impl="ref")
    a, b = torch.zeros(40, 64), torch.zeros(40, 64)
    decode_grid(payload, sizes, rs, cs, impl="ref", out=a[:, 30:60])
    decode_grid(payload, sizes, rs, cs, impl="native", out=b[:, 30:60])
    assert torch.equal(bits(a), bits(b))


def test_decode_grid_into_checks_out(impl):
    x, rs, cs = _grid_input()
    payload, sizes = encode_grid(x, rs, cs, eps=0.01, impl=impl)
    with pytest.raises(ValueError, match=r"float32 \[40, 30\]"):
        decode_grid(payload, sizes, rs, cs, impl=impl, out=torch.zeros(40, 31))
    with pytest.raises(ValueError, match=r"float32 \[40, 30\]"):
        decode_grid(payload, sizes, rs, cs, impl=impl, out=torch.zeros(40, 30, dtype=torch.float64))
    with pytest.raises(ValueError, match="column stride 1"):
        decode_grid(payload, sizes, rs, cs, impl=impl, out=torch.zeros(30, 40).t())


def test_decode_grid_errors_name_the_chunk(impl):
    x, rs, cs = _grid_input()
    payload, sizes = encode_grid(x, rs, cs, eps=0.01, impl=impl)
    with pytest.raises(CodecError, match="sum to"):
        decode_grid(payload[:-1], sizes, rs, cs, impl=impl)
    bad = sizes.clone()
    bad[3] += 1
    bad[4] -= 1
    with pytest.raises(CodecError, match="chunk 3"):
        decode_grid(payload, bad, rs, cs, impl=impl)
    with pytest.raises(CodecError, match="(chunk 0|shape)"):  # a row split that does not match the headers
        decode_grid(payload, sizes, [0, 11, 11, 33, 40], cs, impl=impl)
    corrupt = payload.clone()
    off = int(sizes[:7].sum())
    corrupt[off + 50] ^= 0x10
    with pytest.raises(CodecError, match="chunk 7"):
        decode_grid(corrupt, sizes, rs, cs, impl=impl)
    with pytest.raises(ValueError, match="one entry per chunk"):
        decode_grid(payload, sizes[:-1], rs, cs, impl=impl)


def test_grid_input_validation():
    x, rs, cs = _grid_input()
    with pytest.raises(ValueError, match="row_splits"):
        encode_grid(x, [0, 10, 5, 40], cs, eps=0.01)
    with pytest.raises(ValueError, match="col_splits"):
        encode_grid(x, rs, [0, 31], eps=0.01)
    with pytest.raises(ValueError, match="one bound per column block"):
        encode_grid(x, rs, cs, eps=torch.tensor([0.01, 0.01]))
    with pytest.raises(ValueError, match="< 1"):
        encode_grid(x, rs, cs, eps=[0.01, 1.0, 0.01])
    with pytest.raises(ValueError, match=">= 0"):
        encode_grid(x, rs, cs, abs_eb=[0.01, -1.0, 0.01])
    with pytest.raises(ValueError, match="exactly one"):
        encode_grid(x, rs, cs)
    with pytest.raises(TypeError, match="float32"):
        encode_grid(x.double(), rs, cs, eps=0.01)
