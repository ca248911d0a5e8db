"""The native ops: opcheck, fake kernels, the loader's dispatch, and CUDA parity where a GPU exists."""

from __future__ import annotations

import pytest
import torch
from conftest import bits, zipf_payload

from lightning_dlac.codec import decode_grid, encode, encode_grid
from lightning_dlac.codec._loader import build_library, resolve_impl, sources_dir
from tests.conftest import compiler_present


def _args():
    x = zipf_payload(rows=64, dim=24, vocab=20)
    return x, [0, 20, 64], [0, 8, 24], torch.tensor([0.01, 0.05])


def test_opcheck_decode_grid(native):
    x, rs, cs, b = _args()
    payload, sizes = torch.ops.dlac.encode_grid(x, rs, cs, b, True)
    torch.library.opcheck(torch.ops.dlac.decode_grid.default, (payload, sizes, rs, cs))


def test_opcheck_decode_grid_into(native):
    x, rs, cs, b = _args()
    payload, sizes = torch.ops.dlac.encode_grid(x, rs, cs, b, True)
    out = torch.zeros(64, 40)[:, 8:32]  # a block of columns: the row stride is not the grid's width
    torch.library.opcheck(torch.ops.dlac.decode_grid_into.default, (payload, sizes, rs, cs, out))
    torch.ops.dlac.decode_grid_into(payload, sizes, rs, cs, out)  # opcheck ran on copies of the arguments
    assert torch.equal(bits(out), bits(torch.ops.dlac.decode_grid(payload, sizes, rs, cs)))


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


def test_loader_resolves_to_the_native_kernels(native, monkeypatch):
    monkeypatch.delenv("DLAC_CODEC_IMPL", raising=False)
    assert resolve_impl("auto") == "native"
    assert resolve_impl("native") == "native"
    assert (sources_dir() / "dlac_cpu.cpp").is_file()


def test_build_cache_reuses_unchanged_sources_and_rebuilds_changed_ones(tmp_path, monkeypatch):
    if not compiler_present():
        pytest.skip("needs a C++ compiler")
    monkeypatch.setenv("DLAC_EXTENSION_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src" / "probe.cpp"
    src.parent.mkdir()
    src.write_text("int dlac_cache_probe = 1;\n")
    first = build_library([src], [], prefix="dlac_cache_probe")
    built = {p.name: p.stat().st_mtime_ns for p in first.iterdir() if p.suffix in (".so", ".o")}
    assert any(name.endswith(".so") for name in built), sorted(p.name for p in first.iterdir())
    # The same sources: the same directory, and nothing is compiled or linked again.
    assert build_library([src], [], prefix="dlac_cache_probe") == first
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir() if p.suffix in (".so", ".o")} == built
    # A changed source gets a directory (and a build) of its own; the first build stays for whoever uses it.
    src.write_text("int dlac_cache_probe = 2;\n")
    changed = build_library([src], [], prefix="dlac_cache_probe")
    assert changed != first and changed.parent == first.parent
    assert any(p.suffix == ".so" for p in changed.iterdir()) and first.is_dir()


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


_ENCODE_SCRIPT = """
import sys, torch
from lightning_dlac.codec import encode_grid
x, rs, cs, eps = torch.load(sys.argv[1])
p, s = encode_grid(x, rs, cs, eps=eps, impl="native")
torch.save((p, s), sys.argv[2])
"""


def _quantize_grid():
    g = torch.Generator().manual_seed(7)
    heavy = torch.randn(2048, 64, generator=g) * torch.rand(2048, 64, generator=g) ** 4  # gradient-like tails
    x = torch.cat([heavy, torch.randn(2048, 128, generator=g), torch.rand(2048, 37, generator=g)], dim=1)
    return x, [0, 1000, 2048], [0, 64, 192, 229], torch.tensor([0.01, 0.03, 0.002])


def _native_in_subprocess(tmp_path, variable: str, x, rs, cs, eps):
    """The native encoder's payload and sizes for the grid, from a fresh Python process with ``variable``=1 (the
    switches are read once per process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    torch.save((x, rs, cs, eps), tmp_path / "in.pt")
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    env[variable] = "1"
    subprocess.run([sys.executable, "-c", _ENCODE_SCRIPT, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                   env=env, check=True, cwd=repo)
    return torch.load(tmp_path / "out.pt")


@pytest.mark.slow  # a fresh Python process
def test_baseline_and_avx2_quantize_loops_give_the_reference_bytes(native, tmp_path):
    """The encoder's quantize loop has an SSE2 and an AVX2 copy chosen at run time; DLAC_CPU_BASELINE=1 (read once per
    process, hence the subprocess) forces the SSE2 one. Both must give the reference's bytes."""
    x, rs, cs, eps = _quantize_grid()
    want_p, want_s = encode_grid(x, rs, cs, eps=eps, impl="ref")
    p, s = encode_grid(x, rs, cs, eps=eps, impl="native")
    assert torch.equal(p, want_p) and torch.equal(s, want_s)
    p2, s2 = _native_in_subprocess(tmp_path, "DLAC_CPU_BASELINE", x, rs, cs, eps)
    assert torch.equal(p2, want_p) and torch.equal(s2, want_s)


@pytest.mark.slow  # a fresh Python process
def test_column_blocks_read_in_place_or_copied_give_the_reference_bytes(native, tmp_path):
    """The encoder copies a column block of a wider tensor into a contiguous block before its passes, unless the chunk
    is over 64 MB; DLAC_ENCODE_IN_PLACE=1 makes it read every block where it lies, so both paths are checked here on
    a grid of every mode (DEDUP with hashed and distinct raw rows, HUFF, PACK, RAW, an empty CONST row block) and on
    chunks holding NaN and Inf."""
    from grid_cases import nan_inf

    x, rs, cs, eps = _all_modes_grid()
    x[100:300:7, 70] = float("nan")  # a HUFF chunk of the all-modes grid turned RAW by a NaN
    for grid in ((x, rs, cs, eps), nan_inf()[:4]):
        x_, rs_, cs_, eps_ = grid
        want_p, want_s = encode_grid(x_, rs_, cs_, eps=eps_, impl="ref")
        p, s = encode_grid(x_, rs_, cs_, eps=eps_, impl="native")
        assert torch.equal(p, want_p) and torch.equal(s, want_s)
        p2, s2 = _native_in_subprocess(tmp_path, "DLAC_ENCODE_IN_PLACE", x_, rs_, cs_, eps_)
        assert torch.equal(p2, want_p) and torch.equal(s2, want_s)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _all_modes_grid():
    x = zipf_payload(rows=4096, dim=64, vocab=300)
    noise = torch.randn(4096, 40, generator=torch.Generator().manual_seed(3))
    x = torch.cat([x, noise, torch.rand(4096, 16, generator=torch.Generator().manual_seed(4))], dim=1)
    rs, cs = [0, 1024, 1024, 4096], [0, 16, 48, 64, 104, 120]
    return x, rs, cs, torch.tensor([0.01, 0.05, 0.0, 0.01, 1e-4])  # DEDUP, DEDUP, RAW, HUFF, PACK (+ empty CONST)


@pytest.mark.cuda
@CUDA
def test_cuda_matches_reference(native):
    from lightning_dlac.codec.api import device_kernels

    assert device_kernels("cuda"), "torch has CUDA and a GPU, so the loader must have built the CUDA kernels"
    x, rs, cs, eps = _all_modes_grid()
    ref_payload, ref_sizes = encode_grid(x, rs, cs, eps=eps, impl="ref")
    payload, sizes = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, eps, True)
    assert payload.is_cuda and sizes.is_cuda
    assert torch.equal(sizes.cpu(), ref_sizes) and torch.equal(payload.cpu(), ref_payload)
    y = torch.ops.dlac.decode_grid(ref_payload.cuda(), ref_sizes.cuda(), rs, cs)
    assert y.is_cuda
    assert torch.equal(bits(y.cpu()), bits(decode_grid(ref_payload, ref_sizes, rs, cs, impl="ref")))
    # The public API keeps device tensors on the device with the native kernels.
    p2, s2 = encode_grid(x.cuda(), rs, cs, eps=eps, impl="native")
    assert p2.is_cuda and torch.equal(p2.cpu(), ref_payload)
    assert decode_grid(p2, s2, rs, cs, impl="native").is_cuda
    assert torch.equal(encode(x, eps=0.01, impl="ref"), encode(x.cuda(), eps=0.01, impl="native").cpu())


@pytest.mark.cuda
@CUDA
def test_opcheck_cuda(native):
    # The fake kernels put the payload and the sizes on x's device, as the CUDA kernels do.
    x, rs, cs, b = _args()
    payload, sizes = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, b, True)
    assert payload.is_cuda and sizes.is_cuda
    torch.library.opcheck(torch.ops.dlac.decode_grid.default, (payload, sizes, rs, cs))
    torch.library.opcheck(
        torch.ops.dlac.encode_grid.default, (x.cuda(), rs, cs, b, True),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )


@pytest.mark.cuda
@CUDA
def test_cuda_large_batch_and_repeated_calls(native):
    # 26 tables x 8 destinations, as the all-to-all sends them: the same bytes as the CPU kernels, every time.
    x = zipf_payload(rows=8 * 2048, dim=26 * 16, vocab=5000)
    rs, cs = list(range(0, 8 * 2048 + 1, 2048)), list(range(0, 26 * 16 + 1, 16))
    eps = torch.full((26,), 0.01)
    want = torch.ops.dlac.encode_grid(x, rs, cs, eps, True)
    xc = x.cuda()
    for _ in range(3):
        got = torch.ops.dlac.encode_grid(xc, rs, cs, eps, True)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


@pytest.mark.cuda
@CUDA
def test_cuda_decoder_rejects_what_the_cpu_decoder_rejects(native):
    from grid_cases import damaged_payloads, verdict

    x, rs, cs, eps = _all_modes_grid()
    payload, sizes = torch.ops.dlac.encode_grid(x[:600], [0, 200, 600], cs, eps, True)
    for mutated, new_sizes, _ in damaged_payloads(payload, sizes, 300, seed=9):
        got, err = verdict(torch.ops.dlac.decode_grid, mutated.cuda(), new_sizes, [0, 200, 600], cs)
        want, want_err = verdict(torch.ops.dlac.decode_grid, mutated, new_sizes, [0, 200, 600], cs)
        assert err == want_err
        if err is None:
            assert torch.equal(bits(got.cpu()), bits(want))


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


def _column_blocks() -> tuple[torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(7)
    wide = torch.randn(37, 120, generator=g) * torch.logspace(-40, 38, 120)  # subnormal to near overflow per column
    x = wide[:, 3:110]  # a block of columns: the row stride is not the width
    x[0, :6] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 3.3e38, 65519.0])
    return x, [0, 16, 16, 51, 100, 107]  # widths 16, 0, 35, 49, 7: vector bodies, tails and an empty block


def test_opcheck_cast_column_blocks(native):
    x, cs = _column_blocks()
    for dtype in (torch.bfloat16, torch.float16):
        torch.library.opcheck(torch.ops.dlac.cast_column_blocks.default,
                              (x, cs, torch.empty(x.numel(), dtype=dtype)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cast_column_blocks_is_torchs_cast_of_the_gathered_blocks_bit_for_bit(native, dtype):
    from lightning_dlac.codec import cast_column_blocks

    x, cs = _column_blocks()
    expected = torch.cat([x[:, a:b].reshape(-1) for a, b in zip(cs[:-1], cs[1:])]).to(dtype)
    for impl in ("native", "ref"):
        out = cast_column_blocks(x, cs, torch.full((x.numel(),), 9.0, dtype=dtype), impl=impl)
        assert torch.equal(out.view(torch.int16), expected.view(torch.int16)), impl
    assert bool(torch.isinf(expected).any()) and bool((expected == 0).any())  # the edge values were in the test
    # NaN comes back NaN (its payload bits follow whichever of torch's casts ran: not compared).
    x[1, 2] = float("nan")
    assert bool(torch.isnan(cast_column_blocks(x, cs, torch.empty(x.numel(), dtype=dtype), impl="native")).any())
    empty = cast_column_blocks(torch.zeros(0, 5), [0, 2, 5], torch.empty(0, dtype=dtype), impl="native")
    assert empty.numel() == 0
    with pytest.raises(ValueError, match="out must be"):
        cast_column_blocks(x, cs, torch.empty(x.numel() - 1, dtype=dtype))
