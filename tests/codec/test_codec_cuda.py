"""The CUDA kernels on a GPU, held to the CPU kernels byte for byte, and the codec's readiness for a GPU image.

The GPU tests skip only where there is no CUDA device, or no compiler to build the kernels (no C++ compiler, or no
CUDA toolkit). Where a GPU and a compiler exist, a failed build FAILS them (the fixture below is this file's own, so
a build error cannot turn a GPU session green by skipping). ``benchmarks/gpu_session.sh`` runs them on the lent
GPU machine, whose image has torch but neither TorchRec nor fbgemm: nothing here imports more than the codec.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import bits, zipf_payload
from grid_cases import CASES, thousands_of_chunks

from lightning_dlac.codec import CodecError, _loader, decode_grid, encode_grid
from lightning_dlac.codec.api import device_kernels
from lightning_dlac.testing.cuda import count_synchronizations

REPO = Path(__file__).resolve().parents[2]


def _toolchain_missing() -> str | None:
    """Why the CUDA kernels cannot be built here, or None if they can."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "no CUDA toolkit (set CUDA_HOME or put nvcc on PATH)"
    return None


def require_cuda_kernels() -> None:
    """Build and load the native library with its CUDA kernels: skip without a GPU or a compiler, else fail."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    why = _toolchain_missing()
    if why is not None:
        pytest.skip(f"cannot build the CUDA kernels: {why}")
    try:
        _loader.load_native()
    except _loader.NativeUnavailable as e:
        pytest.fail(f"a CUDA device and a compiler are present, but the native build failed:\n{e}")
    if not device_kernels("cuda"):
        pytest.fail("the native library loaded without CUDA kernels although a GPU was visible (stale build cache?)")


@pytest.fixture(scope="module")
def cuda_kernels() -> None:
    """The CUDA kernels, built and loaded (require_cuda_kernels)."""
    require_cuda_kernels()


def test_a_failed_build_fails_the_cuda_tests_where_a_gpu_and_a_compiler_exist(monkeypatch):
    # What a GPU session relies on, checked without a GPU: the skip/fail decision of this file's fixture.
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sys.modules[__name__], "_toolchain_missing", lambda: None)

    def broken_build() -> None:
        raise _loader.NativeUnavailable("building the native DLAC codec failed: nvcc error")

    monkeypatch.setattr(_loader, "load_native", broken_build)
    with pytest.raises(pytest.fail.Exception, match="native build failed:\nbuilding the native DLAC codec failed"):
        require_cuda_kernels()
    monkeypatch.setattr(_loader, "load_native", lambda: None)
    monkeypatch.setattr(sys.modules[__name__], "device_kernels", lambda device: False)
    with pytest.raises(pytest.fail.Exception, match="without CUDA kernels"):
        require_cuda_kernels()
    # No compiler, or no GPU: skipped, not failed.
    monkeypatch.setattr(sys.modules[__name__], "_toolchain_missing", lambda: "no CUDA toolkit")
    with pytest.raises(pytest.skip.Exception, match="no CUDA toolkit"):
        require_cuda_kernels()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="needs a CUDA device"):
        require_cuda_kernels()


def _grid(seed: int = 0):
    """A small all-to-all grid: Zipf tables (DEDUP / HUFF), noise (PACK), a raw and a constant block."""
    x = zipf_payload(rows=1200, dim=48, vocab=150, seed=seed)
    x[:, 40:44] = torch.randn(1200, 4, generator=torch.Generator().manual_seed(seed + 1))
    x[:, 44:] = 0.5
    return x, [0, 300, 300, 1200], [0, 16, 40, 44, 48], torch.tensor([0.01, 0.05, 0.0, 0.01])


@pytest.mark.cuda
def test_cuda_payload_is_the_cpu_kernels_payload(cuda_kernels):
    for seed in range(3):
        x, rs, cs, bounds = _grid(seed)
        want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, bounds, True)
        payload, sizes = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, bounds, True)
        assert payload.is_cuda and sizes.is_cuda
        assert torch.equal(sizes.cpu(), want_sizes) and torch.equal(payload.cpu(), want)
        out = torch.ops.dlac.decode_grid(payload, want_sizes, rs, cs)
        assert out.is_cuda
        assert torch.equal(bits(out.cpu()), bits(torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)))


@pytest.mark.cuda
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_matches_the_cpu_kernels(cuda_kernels, case):
    # tests/codec/grid_cases.py (the emulation runs the same grids in CI): NaN and Inf, dims 8 to 128 with relative
    # and absolute bounds, empty and zero-width blocks, multi-hot and gradient payloads, 2600 chunks. Decoded with
    # the sizes on the host, and on the device as the exchange receives them, through the op and the public API.
    x, rs, cs, bounds, relative = CASES[case]()
    want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)
    payload, sizes = torch.ops.dlac.encode_grid(x.cuda(), rs, cs, bounds, relative)
    assert payload.is_cuda and sizes.is_cuda
    assert torch.equal(sizes.cpu(), want_sizes) and torch.equal(payload.cpu(), want)
    decoded = bits(torch.ops.dlac.decode_grid(want, want_sizes, rs, cs))
    assert torch.equal(bits(torch.ops.dlac.decode_grid(payload, want_sizes, rs, cs).cpu()), decoded)
    assert torch.equal(bits(torch.ops.dlac.decode_grid(payload, sizes, rs, cs).cpu()), decoded)
    out = decode_grid(payload, sizes, rs, cs, impl="native")
    assert out.is_cuda and torch.equal(bits(out.cpu()), decoded)
    if relative:
        p2, s2 = encode_grid(x.cuda(), rs, cs, eps=bounds, impl="native")
    else:
        p2, s2 = encode_grid(x.cuda(), rs, cs, abs_eb=bounds, impl="native")
    assert torch.equal(p2.cpu(), want) and torch.equal(s2.cpu(), want_sizes)


@pytest.mark.cuda
def test_cuda_encoder_scratch_follows_the_data_not_the_chunk_count(cuda_kernels):
    # 2600 chunks of 3 to 40 rows: the encoder's temporaries are its codes, symbol lengths and offsets (at most 24
    # bytes per element with the payload) and row tables (a few words per row), and the histograms the planner reads;
    # not 3 x 4096 words zeroed and as many reserved per chunk (the old layout: 2 x 2600 x 48 KB = 250 MB here, over
    # three times this bound).
    x, rs, cs, bounds, relative = thousands_of_chunks()
    xc = x.cuda()
    torch.ops.dlac.encode_grid(xc, rs, cs, bounds, relative)  # the histograms' region sized for this grid
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    payload, sizes = torch.ops.dlac.encode_grid(xc, rs, cs, bounds, relative)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    elements, rows, chunks = x.numel(), x.size(0) * (len(cs) - 1), sizes.numel()
    assert chunks == 2600
    assert extra < 32 * elements + 64 * rows + 16 * 2**20, (extra, elements, rows)
    assert torch.equal(payload.cpu(), torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)[0])


@pytest.mark.cuda
def test_cuda_encode_synchronizes_once_and_decode_twice(cuda_kernels):
    # docs/codec.md: encode reads the chunk state and histograms back in one copy (once the histograms fit what the
    # previous call read), decode reads headers with checksums, then error flags. Counted by torch's sync debug mode
    # (lightning_dlac/testing/cuda.py says how its reports are read).
    x, rs, cs, bounds = _grid()
    xc = x.cuda()
    payload, sizes = torch.ops.dlac.encode_grid(xc, rs, cs, bounds, True)  # warm-up: CRC tables, readback size
    host_sizes = sizes.cpu()
    torch.ops.dlac.decode_grid(payload, host_sizes, rs, cs)
    torch.cuda.synchronize()
    assert count_synchronizations(lambda: torch.ops.dlac.encode_grid(xc, rs, cs, bounds, True)) == 1
    assert count_synchronizations(lambda: torch.ops.dlac.decode_grid(payload, host_sizes, rs, cs)) == 2


@pytest.mark.cuda
def test_cuda_kernels_run_on_the_current_stream(cuda_kernels):
    # Two grids encoded and decoded on two side streams with no synchronization between the calls: every temporary
    # and staging buffer belongs to its call's stream, so neither call can see the other's memory.
    grids = [_grid(seed) for seed in (3, 4)]
    streams = [torch.cuda.Stream() for _ in grids]
    inputs = [g[0].cuda() for g in grids]
    torch.cuda.synchronize()
    results = []
    for (_x, rs, cs, bounds), xc, stream in zip(grids, inputs, streams):
        with torch.cuda.stream(stream):
            payload, sizes = torch.ops.dlac.encode_grid(xc, rs, cs, bounds, True)
            out = torch.ops.dlac.decode_grid(payload, sizes.cpu(), rs, cs)
            results.append((payload, out))
    for stream in streams:
        stream.synchronize()
    for (x, rs, cs, bounds), (payload, out) in zip(grids, results):
        want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, bounds, True)
        assert torch.equal(payload.cpu(), want)
        assert torch.equal(bits(out.cpu()), bits(torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)))


@pytest.mark.cuda
@pytest.mark.slow  # a fresh Python
def test_cuda_crc_tables_made_on_one_stream_serve_another(cuda_kernels):
    # In a fresh process (the tables are cached per process): the first call runs on a side stream, the second at
    # once on another stream. The tables' upload blocks, so the second call cannot read them half-copied.
    script = (
        "import torch\n"
        "from lightning_dlac.codec import _loader\n"
        "_loader.load_native()\n"
        "x = torch.randn(4000, 64, generator=torch.Generator().manual_seed(0))\n"
        "rs, cs, b = [0, 2000, 4000], [0, 32, 64], torch.tensor([0.01, 0.05])\n"
        "want = torch.ops.dlac.encode_grid(x, rs, cs, b, True)[0]\n"
        "xc = x.cuda(); torch.cuda.synchronize()\n"
        "s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()\n"
        "with torch.cuda.stream(s1):\n"
        "    p1 = torch.ops.dlac.encode_grid(xc, rs, cs, b, True)[0]\n"
        "with torch.cuda.stream(s2):\n"
        "    p2 = torch.ops.dlac.encode_grid(xc, rs, cs, b, True)[0]\n"
        "torch.cuda.synchronize()\n"
        "assert torch.equal(p1.cpu(), want) and torch.equal(p2.cpu(), want)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.cuda
def test_cuda_decoder_rejects_a_corrupted_chunk_as_the_cpu_decoder_does(cuda_kernels):
    x, rs, cs, bounds = _grid(5)
    payload, sizes = encode_grid(x, rs, cs, abs_eb=None, eps=bounds, impl="native")
    data = bytearray(payload.numpy().tobytes())
    start = int(sizes[:9].sum())  # chunk 9: row block 2, column block 1 (a Zipf table, 900 rows)
    data[start + 60] ^= 0x10
    bad = torch.frombuffer(data, dtype=torch.uint8)
    with pytest.raises(CodecError, match=r"chunk 9 \(row block 2, column block 1\)") as on_cpu:
        decode_grid(bad, sizes, rs, cs, impl="native")
    with pytest.raises(CodecError) as on_gpu:
        decode_grid(bad.cuda(), sizes, rs, cs, impl="native")
    assert str(on_gpu.value) == str(on_cpu.value)


@pytest.mark.slow  # a fresh Python
def test_the_codec_imports_without_lightning_or_torchrec():
    # The GPU image has torch but no TorchRec: the codec (and so these tests and the GPU benchmark) must not need
    # either, and importing it must not load Lightning either.
    script = (
        "import sys, lightning_dlac.codec, lightning_dlac\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'torchrec', 'fbgemm_gpu'))\n"
        "print(bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # two fresh Pythons
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
def test_importing_the_package_registers_the_strategy_alias_when_lightning_loads():
    # The alias is registered when Lightning's strategy registry is imported, after lightning_dlac or before it,
    # as a factory: TorchRec is imported only when a Trainer builds the strategy.
    script = (
        "import sys, lightning_dlac\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "assert 'dlac' in StrategyRegistry, sorted(StrategyRegistry)\n"
        "assert 'torchrec' not in sys.modules\n"
        "print('ok')\n"
    )
    reverse = script.replace("import sys, lightning_dlac\n", "import sys, lightning.pytorch\nimport lightning_dlac\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for code in (script, reverse):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-4000:]
