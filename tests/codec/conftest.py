"""Shared fixtures of the codec tests: the native build (once per session) and realistic payloads."""

from __future__ import annotations

import pytest
import torch

from lightning_dlac.codec import _loader
from tests.conftest import ALLOW_NO_NATIVE, compiler_present, native_opted_out


@pytest.fixture(scope="session")
def native() -> None:
    """Build and load the native kernels once.

    Where a C++ compiler exists the build must work: a failure fails every test that needs it, with the build log.
    Skips only where no compiler exists, or where DLAC_TESTS_ALLOW_NO_NATIVE=1 says the native codec may be missing
    (docs/reliability.md).
    """
    try:
        _loader.load_native()
    except _loader.NativeUnavailable as e:
        if not compiler_present():
            pytest.skip(f"native codec unavailable, no C++ compiler: {str(e)[:500]}")
        if native_opted_out():
            pytest.skip(f"native codec unavailable and {ALLOW_NO_NATIVE}=1: {str(e)[:500]}")
        pytest.fail(
            f"the native codec failed to build although a C++ compiler is present. Fix the build, or set"
            f" {ALLOW_NO_NATIVE}=1 to run without it. Build log (tail):\n{str(e)[-3000:]}",
            pytrace=False,
        )


def zipf_payload(rows: int = 4096, dim: int = 64, vocab: int = 2000, alpha: float = 1.1, seed: int = 0) -> torch.Tensor:
    """Embedding rows looked up with Zipf-distributed ids, as in a pooling-factor-1 table's all-to-all chunk."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, dim, generator=g) * 0.05
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** alpha
    ids = torch.multinomial(p, rows, replacement=True, generator=g)
    return table[ids].contiguous()


@pytest.fixture(scope="session")
def zipf() -> torch.Tensor:
    return zipf_payload()


def assert_bound(x: torch.Tensor, y: torch.Tensor, eb: float) -> None:
    """Every finite element within eb (checked in float64, which never rejects a correct float32 result);
    non-finite elements bit-exact."""
    assert y.dtype == torch.float32 and y.shape == x.shape
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
        return
    d = (x.double() - y.double()).abs()
    assert bool((d <= eb).all()), f"max error {float(d.max())} > bound {eb}"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)
