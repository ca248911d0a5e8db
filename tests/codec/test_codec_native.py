"""The native ops: opcheck, fake kernels, the loader's dispatch, and CUDA parity where a GPU exists."""

from __future__ import annotations

import pytest
import torch
from conftest import bits, zipf_payload

from lightning_dlac.codec import decode_grid, encode, encode_grid
from lightning_dlac.codec._loader import build_dir, resolve_impl, sources_dir


def _args():
    x = zipf_payload(rows=64, dim=24, vocab=20)
    return x, [0, 20, 64], [0, 8, 24], torch.tensor([0.01, 0.05])


def test_opcheck_decode_grid(native):
    x, rs, cs, b = _args()
    payload, sizes = torch.ops.dlac.encode_grid(x, rs, cs, b, True)
    torch.library.opcheck(torch.ops.dlac.decode_grid.default, (payload, sizes, rs, cs))


def test_opcheck_encode_grid(native):
    # The payload size depends on the data, so the fake kernel returns an unbacked size: the AOT-dispatch check
    # (which needs a concrete output shape) does not apply.
    x, rs, cs, b = _args()
    torch.library.opcheck(
        torch.ops.dlac.encode_grid.default, (x, rs, cs, b, True),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


def test_native_checks_preconditions(native):
    x, rs, cs, b = _args()
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.dlac.encode_grid(x.double(), rs, cs, b, True)
    with pytest.raises(RuntimeError, match="col_splits"):
        torch.ops.dlac.encode_grid(x, rs, [0, 8, 25], b, True)
    with pytest.raises(RuntimeError, match="one bound per column block"):
        torch.ops.dlac.encode_grid(x, rs, cs, b[:1], True)
    with pytest.raises(RuntimeError, match="< 1"):
        torch.ops.dlac.encode_grid(x, rs, cs, torch.tensor([0.5, 2.0]), True)


def test_loader_resolves_and_caches(native, monkeypatch):
    monkeypatch.delenv("DLAC_CODEC_IMPL", raising=False)
    assert resolve_impl("auto") == "native"
    assert resolve_impl("native") == "native"
    assert (sources_dir() / "dlac_cpu.cpp").is_file()
    src = sorted(sources_dir().glob("*.cpp"))
    assert build_dir(src, []).name == build_dir(src, []).name  # stable hash


def test_single_thread_and_multi_thread_agree(native):
    x = zipf_payload(rows=512, dim=32, vocab=64)
    rs, cs = [0, 128, 256, 384, 512], [0, 16, 32]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        p1, s1 = encode_grid(x, rs, cs, eps=0.01, impl="native")
        torch.set_num_threads(max(2, threads))
        p2, s2 = encode_grid(x, rs, cs, eps=0.01, impl="native")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(p1, p2) and torch.equal(s1, s2)
    assert torch.equal(bits(decode_grid(p1, s1, rs, cs, impl="native")), bits(decode_grid(p1, s1, rs, cs, impl="ref")))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_reference(native):
    x = zipf_payload()
    rs, cs = [0, 2048, 4096], [0, 32, 64]
    ref_payload, ref_sizes = encode_grid(x, rs, cs, eps=0.01, impl="ref")
    payload, sizes = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, torch.tensor([0.01, 0.01]), True)
    assert torch.equal(payload.cpu(), ref_payload) and torch.equal(sizes.cpu(), ref_sizes)
    y = torch.ops.dlac.decode_grid(ref_payload.cuda(), ref_sizes.cuda(), rs, cs)
    assert torch.equal(bits(y.cpu()), bits(decode_grid(ref_payload, ref_sizes, rs, cs, impl="ref")))
    assert torch.equal(encode(x, eps=0.01, impl="ref"), encode(x, eps=0.01, impl="native"))


def test_auto_falls_back_with_one_warning(monkeypatch):
    from lightning_dlac.codec import _loader

    monkeypatch.delenv("DLAC_CODEC_IMPL", raising=False)
    monkeypatch.setitem(_loader._state, "loaded", False)
    monkeypatch.setitem(_loader._state, "error", "no C++ compiler found (install g++ or set CXX)")
    monkeypatch.setitem(_loader._state, "warned", False)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        assert resolve_impl("auto") == "ref"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_impl("auto") == "ref"  # warned once only
    with pytest.raises(_loader.NativeUnavailable, match="compiler"):
        resolve_impl("native")
