"""Property tests: the error bound, exact sizes and reference/native parity over random chunks and bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import assert_bound, bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_dlac.codec import Mode, decode, encode, inspect
from lightning_dlac.codec.format import HEADER_SIZE

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def chunks(draw) -> torch.Tensor:
    rows = draw(st.integers(0, 40))
    dim = draw(st.integers(1, 17))
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["normal", "wide", "tiny", "const", "few", "specials", "offset"]))
    rng = np.random.default_rng(seed)
    shape = (rows, dim)
    if kind == "normal":
        a = rng.standard_normal(shape) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    elif kind == "wide":  # values spanning many orders of magnitude, up to the float32 limit
        a = rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 38, size=shape)
    elif kind == "tiny":  # denormals and near-denormals
        a = rng.standard_normal(shape) * 10.0 ** rng.integers(-45, -36, size=shape)
    elif kind == "const":
        a = np.full(shape, draw(st.sampled_from([0.0, -0.0, 1.5, -7e-39, 3e37])))
    elif kind == "few":  # a handful of distinct rows: the dedup path
        base = rng.standard_normal((3, dim))
        a = base[rng.integers(0, 3, size=rows)] if rows else np.zeros(shape)
    elif kind == "offset":  # a huge offset with a tiny spread: the bound repair / RAW path
        a = 1e6 + rng.standard_normal(shape) * 1e-2
    else:
        a = rng.standard_normal(shape)
        if rows:
            flat = a.reshape(-1)
            k = rng.integers(1, 4)
            flat[rng.integers(0, flat.size, size=k)] = rng.choice([np.nan, np.inf, -np.inf], size=k)
    return torch.from_numpy(np.asarray(a, dtype=np.float32).copy())


bounds = st.one_of(
    st.tuples(st.just("eps"), st.sampled_from([1e-6, 1e-4, 0.001, 0.01, 0.03, 0.05, 0.2, 0.49, 0.999])),
    st.tuples(st.just("abs_eb"), st.sampled_from([1e-30, 1e-6, 1e-3, 0.1, 10.0, 1e30])),
)


def _check_roundtrip(x: torch.Tensor, bound: tuple[str, float], impl: str) -> torch.Tensor:
    buf = encode(x, **{bound[0]: bound[1]}, impl=impl)
    info = inspect(buf)
    y = decode(buf, impl=impl)
    assert info.compressed_bytes == buf.numel()
    assert (info.rows, info.dim) == tuple(x.shape)
    if info.mode == Mode.RAW:
        assert torch.equal(bits(x), bits(y))
    elif info.mode == Mode.CONST:
        assert torch.equal(x, y)
    else:
        assert bool(torch.isfinite(x).all())
        lo = x.min() + 0.0
        hi = x.max() + 0.0
        if bound[0] == "eps":
            expect = (torch.tensor(bound[1], dtype=torch.float32) * (hi - lo)).item()
        else:
            expect = torch.tensor(bound[1], dtype=torch.float32).item()
        assert info.abs_eb == expect
        assert info.min == lo.item()
        assert_bound(x, y, info.abs_eb)
    if not bool(torch.isfinite(x).all()):
        assert info.mode == Mode.RAW
    return buf


@SETTINGS
@given(x=chunks(), bound=bounds)
def test_reference_bound_holds(x, bound):
    _check_roundtrip(x, bound, "ref")


@SETTINGS
@given(x=chunks(), bound=bounds)
def test_native_matches_reference_bit_for_bit(native, x, bound):
    a = _check_roundtrip(x, bound, "ref")
    b = _check_roundtrip(x, bound, "native")
    assert torch.equal(a, b), "payload bytes differ between reference and native"
    assert torch.equal(bits(decode(a, impl="ref")), bits(decode(b, impl="native")))
    assert torch.equal(bits(decode(a, impl="native")), bits(decode(a, impl="ref")))


@pytest.mark.parametrize("impl", ["ref", "native"])
def test_edge_shapes(request, impl):
    if impl == "native":
        request.getfixturevalue("native")
    for shape in [(0, 5), (5, 0), (0, 0), (1, 1), (1, 64), (3, 1)]:
        x = torch.randn(shape)
        buf = encode(x, eps=0.01, impl=impl)
        y = decode(buf, impl=impl)
        assert y.shape == x.shape
        assert_bound(x, y, inspect(buf).abs_eb if x.numel() else 0.0)
        if x.numel() == 0:
            assert inspect(buf).mode == Mode.CONST and buf.numel() == HEADER_SIZE


@pytest.mark.parametrize("impl", ["ref", "native"])
def test_strided_and_noncontiguous_inputs(request, impl):
    if impl == "native":
        request.getfixturevalue("native")
    base = torch.randn(50, 40)
    for x in [base[::2, 3:20], base.t(), base[:, :1], base.expand(50, 40)[5:9]]:
        buf = encode(x, eps=0.02, impl=impl)
        assert torch.equal(buf, encode(x.contiguous(), eps=0.02, impl="ref"))
        assert_bound(x, decode(buf, impl=impl), inspect(buf).abs_eb)


def test_bound_repair_and_raw_fallback_hold_exactly():
    # A huge offset with a bound far below the float32 spacing cannot be held: the chunk must go RAW, exactly.
    x = torch.tensor([[1e6, 1e6 + 0.0625, 1e6 + 0.125]], dtype=torch.float32)
    buf = encode(x, abs_eb=1e-9, impl="ref")
    assert inspect(buf).mode == Mode.RAW and torch.equal(decode(buf, impl="ref"), x)
    # Bounds near the spacing exercise the neighbour repair; the bound still holds element by element.
    g = torch.Generator().manual_seed(3)
    x = 1000.0 + torch.randn(64, 16, generator=g) * 0.5
    for eb in (3e-5, 6e-5, 1.2e-4, 2.5e-4):
        buf = encode(x, abs_eb=eb, impl="ref")
        assert_bound(x, decode(buf, impl="ref"), eb if inspect(buf).mode != Mode.RAW else 0.0)


def test_huge_range_goes_raw():
    x = torch.tensor([[-3e38, 3e38]], dtype=torch.float32)  # the range overflows float32
    buf = encode(x, eps=0.01, impl="ref")
    assert inspect(buf).mode == Mode.RAW
    assert torch.equal(decode(buf, impl="ref"), x)
    assert not math.isinf(float((x.double() - decode(buf).double()).abs().max()))
