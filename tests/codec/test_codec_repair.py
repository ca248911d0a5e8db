"""The quantizer's bound check and neighbour repair, and the native encoder's shortcuts, against the reference.

The native encoder tests float32 ``|x - x_hat| < eb`` in its hot loop and re-tests exactly (TwoSum) only the rows
where that fails, repairs codes there, and tracks the largest code without a scan; it also stops hashing raw rows
after the first 256 when they barely repeat. None of this may change a byte: every case here is checked against the
reference bit for bit, and the decoded values against the bound element by element.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_bound, bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_dlac.codec import Mode, decode, encode, inspect

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _parity(x: torch.Tensor, **bound) -> torch.Tensor:
    """Encode with both implementations; assert identical bytes, identical decodes and the bound; return the buffer."""
    a = encode(x, **bound, impl="ref")
    b = encode(x, **bound, impl="native")
    assert torch.equal(a, b), "payload bytes differ between reference and native"
    ya, yb = decode(a, impl="ref"), decode(b, impl="native")
    assert torch.equal(bits(ya), bits(yb))
    info = inspect(a)
    if info.mode == Mode.RAW:
        assert torch.equal(bits(ya), bits(x))
    else:
        assert_bound(x, ya, info.abs_eb)
    return a


def _f32(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32).copy())


def test_exact_half_steps_sit_on_the_bound(native):
    # abs_eb = 0.25, step = 0.5: every (2k + 1) * 0.25 is exactly half a step from two codes, |x - x_hat| == eb in
    # float32 with no rounding error: the fast test (< eb) fails, the exact test must accept the rounded code.
    k = np.arange(0, 200, dtype=np.float64)
    x = _f32(np.concatenate([[0.0], (2 * k + 1) * 0.25])[: 200].reshape(50, 4))
    buf = _parity(x, abs_eb=0.25)
    info = inspect(buf)
    assert info.mode != Mode.RAW and info.step == 0.5
    y = decode(buf, impl="ref")
    assert float((x.double() - y.double()).abs().max()) == 0.25  # on the bound, not past it


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    lo=st.sampled_from([0.0, 1.0, 1000.0, -3e5, 1e6, 3e37, -3e37, 1e-38]),
    eb=st.sampled_from([1e-45, 1e-40, 3e-5, 6e-5, 1.2e-4, 2.5e-4, 0.0625, 0.1, 1.0, 1e30]),
    rows=st.integers(1, 40),
    dim=st.integers(1, 9),
)
def test_values_one_ulp_around_half_steps(native, seed, lo, eb, rows, dim):
    # Values a few ulps either side of code midpoints lo + (k + 1/2) * 2 eb: the rounded code misses the bound by a
    # rounding error and a neighbour must be taken, or the step factors cascade, or the chunk goes RAW. The largest
    # element is one of them, so the largest code itself is repaired in some cases.
    rng = np.random.default_rng(seed)
    lo32 = np.float32(lo)
    step = np.float32(np.float32(eb) * np.float32(2.0))
    k = rng.integers(0, 50, size=(rows, dim)).astype(np.float32)
    mid = lo32 + (k + np.float32(0.5)) * step
    ulps = rng.integers(-3, 4, size=(rows, dim))
    x = mid.copy()
    for _ in range(3):
        x = np.where(ulps > 0, np.nextafter(x, np.float32(np.inf)), x)
        x = np.where(ulps < 0, np.nextafter(x, np.float32(-np.inf)), x)
        ulps = ulps - np.sign(ulps)
    x = np.concatenate([np.full((1, dim), lo32, dtype=np.float32), x])
    x = x[:, :dim]
    _parity(_f32(x), abs_eb=eb)


@pytest.mark.parametrize("eps", [1e-6, 0.01, 0.3])
def test_extreme_magnitudes(native, eps):
    g = torch.Generator().manual_seed(1)
    cases = [
        torch.randn(30, 7, generator=g) * 1e37,                       # near the float32 limit
        torch.randn(30, 7, generator=g) * 1e-40,                      # denormals
        3e38 - torch.rand(30, 7, generator=g) * 1e33,                 # a huge offset, spacing 2e31
        torch.tensor([[3.4e38, -3.4e38], [0.0, 1.0]]),                # range overflows float32: RAW
        torch.tensor([[1.0, 1.0 + 2 ** -23], [1.0 + 2 ** -22, 1.0]]),  # a range of a few ulps
    ]
    for x in cases:
        _parity(x.float(), eps=eps)


def _gradient_like(rows: int, dim: int, seed: int) -> torch.Tensor:
    """Heavy-tailed, near-zero-mean rows with no repeated raw row: most values quantize to the code nearest 0."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(rows, 1, generator=g) * 2.0)
    return (torch.randn(rows, dim, generator=g) ** 3 * scale * 1e-4).float()


@pytest.mark.parametrize("eps", [0.01, 0.05, 0.2])
@pytest.mark.parametrize("rows", [255, 256, 257, 700])
def test_raw_dedup_probe_gives_up_on_unique_rows(native, rows, eps):
    # No repeated raw row in the first 256: the native encoder stops hashing raw rows; code rows still repeat.
    x = _gradient_like(rows, 16, seed=rows)
    buf = _parity(x, eps=eps)
    if eps >= 0.05:
        assert inspect(buf).mode == Mode.DEDUP  # repeats among code rows are found without raw-row hashing


@pytest.mark.parametrize("repeats_in_probe", [0, 15, 16, 17, 200])
def test_raw_dedup_probe_threshold(native, repeats_in_probe):
    # Repeats of earlier rows placed in the first 256 rows (around the 1-in-16 threshold), and many more after them:
    # whichever way the probe decides, the rows that repeat later must still be deduplicated identically.
    g = torch.Generator().manual_seed(repeats_in_probe)
    x = torch.randn(800, 12, generator=g)
    src = torch.randint(0, 20, (repeats_in_probe,), generator=g)
    dst = 20 + torch.randperm(236, generator=g)[:repeats_in_probe]
    x[dst] = x[src]
    later = 256 + torch.randperm(544, generator=g)[:300]
    x[later] = x[torch.randint(0, 256, (300,), generator=g)]
    for eps in (0.001, 0.05):
        _parity(x, eps=eps)


def test_grid_of_gradient_like_chunks_matches_reference(native):
    from lightning_dlac.codec import decode_grid, encode_grid

    x = _gradient_like(600, 64, seed=7)
    rs, cs = [0, 300, 600], [0, 16, 40, 64]
    a, sa = encode_grid(x, rs, cs, eps=0.02, impl="ref")
    b, sb = encode_grid(x, rs, cs, eps=0.02, impl="native")
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert torch.equal(bits(decode_grid(a, sa, rs, cs, impl="native")), bits(decode_grid(a, sa, rs, cs, impl="ref")))


def _repairs(x: torch.Tensor, eb: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rounded codes, final codes) of the reference quantizer, or None if the chunk is not quantized."""
    from lightning_dlac.codec import reference as ref

    mode, q = ref.quantize(x, eb, False)
    if mode is not None:
        return None
    lo, _, step, codes = q
    lo32, step32 = torch.tensor(lo, dtype=torch.float32), torch.tensor(step, dtype=torch.float32)
    return torch.round((x - lo32) / step32).to(torch.int64), codes


def test_repairs_happen_and_match_including_the_largest_code(native):
    # Values of order 1 with a bound of a few float32 spacings (1.2e-7 at 1): the rounding errors of (x - lo) / step
    # and lo + q * step decide, and codes are repaired both ways. Search chunks until one repairs some code down,
    # one up, and one the largest element's code down (the native encoder then rescans for the largest code);
    # each is checked against the reference.
    found = {"down": False, "up": False, "top_down": False}
    for seed in range(1000):
        g = torch.Generator().manual_seed(seed)
        eb = (2.5e-7, 3e-7, 3.5e-7)[seed % 3]
        x = torch.randn(6, 5, generator=g).float()
        r = _repairs(x, eb)
        if r is None:
            continue
        rounded, codes = r
        new = {"down": bool((codes < rounded).any()), "up": bool((codes > rounded).any())}
        top = int(torch.argmax(x))
        new["top_down"] = bool(codes.reshape(-1)[top] < rounded.reshape(-1)[top])
        if any(v and not found[k] for k, v in new.items()):
            _parity(x, abs_eb=eb)
            for k, v in new.items():
                found[k] |= v
        if all(found.values()):
            break
    assert all(found.values()), f"no chunk exercised every repair: {found}"


@pytest.mark.parametrize("dim", [63, 64, 65, 128])
@pytest.mark.parametrize("eps", [1e-6, 0.01, 0.05])
def test_specialized_widths_match_reference(native, dim, eps):
    # The native encoder has copies compiled for dim 64 and 128; neighbouring widths take the generic one.
    x = _gradient_like(300, dim, seed=dim)
    x[150:160] = x[:10]  # a few repeated raw rows as well
    _parity(x, eps=eps)
    _parity(x[:, : dim // 2 * 2 : 1], eps=eps)
