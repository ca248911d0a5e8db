"""The CUDA kernels' algorithm, checked without a GPU.

cuda_ext/dlac_grid.h is the device pipeline that cuda_ext/dlac_cuda.cu launches as kernels. Compiled for the host
(tests/codec/emulated_grid.cpp, ops ``dlac_emu::*``), each kernel runs as a loop over its work items, so every
decision, bit offset, checksum and error of the GPU encoder and decoder is exercised here: its payloads must equal
the reference's byte for byte, its decoded values bit for bit, and it must reject exactly the buffers the CPU
decoder rejects, with the same message. What this cannot show (races between work items, launch configuration)
is what the CUDA tests check where a GPU exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import bits, zipf_payload
from grid_cases import CASES, damaged_payloads, verdict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_dlac.codec import Mode, _loader, encode_grid, inspect_grid
from lightning_dlac.codec import reference as ref

EMULATION = Path(__file__).with_name("emulated_grid.cpp")
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="session")
def emulated(native) -> None:
    """Build the host emulation of the device pipeline (once per source hash, like the native kernels)."""
    headers = sorted(_loader.sources_dir().glob("*.h"))
    try:
        _loader.build_library([EMULATION], headers, prefix="dlac_emu")
    except _loader.NativeUnavailable as e:
        pytest.fail(f"the device pipeline does not compile for the host:\n{e}")


def emu_encode(x, rs, cs, bounds, relative=True):
    return torch.ops.dlac_emu.encode_grid(x, rs, cs, torch.tensor(bounds, dtype=torch.float32), relative)


@st.composite
def grids(draw):
    rows = draw(st.integers(0, 60))
    ncols = draw(st.integers(1, 4))
    dims = [draw(st.integers(0, 9)) for _ in range(ncols)]
    cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=3)))
    rs = [0, *cuts, rows]
    cs = np.cumsum([0, *dims]).tolist()
    kind = draw(st.sampled_from(["normal", "wide", "tiny", "few", "offset", "specials", "const"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    shape = (rows, cs[-1])
    if kind == "normal":
        a = rng.standard_normal(shape) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    elif kind == "wide":
        a = rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 38, size=shape)
    elif kind == "tiny":
        a = rng.standard_normal(shape) * 10.0 ** rng.integers(-45, -36, size=shape)
    elif kind == "few":
        base = rng.standard_normal((3, cs[-1]))
        a = base[rng.integers(0, 3, size=rows)] if rows else np.zeros(shape)
    elif kind == "offset":
        a = 1e6 + rng.standard_normal(shape) * 1e-2
    elif kind == "const":
        a = np.full(shape, draw(st.sampled_from([0.0, -0.0, 2.5])))
    else:
        a = rng.standard_normal(shape)
        if a.size:
            flat = a.reshape(-1)
            flat[rng.integers(0, flat.size, size=2)] = rng.choice([np.nan, np.inf, -np.inf], size=2)
    relative = draw(st.booleans())
    choices = [0.0, 1e-6, 1e-3, 0.01, 0.05, 0.3] if relative else [0.0, 1e-30, 1e-4, 0.1, 1e30]
    bounds = [draw(st.sampled_from(choices)) for _ in range(ncols)]
    return torch.from_numpy(np.asarray(a, dtype=np.float32).copy()), rs, cs, bounds, relative


@SETTINGS
@given(g=grids())
def test_device_pipeline_matches_reference(emulated, g):
    x, rs, cs, bounds, relative = g
    payload, sizes = emu_encode(x, rs, cs, bounds, relative)
    want, want_sizes = ref.encode_grid(x, rs, cs, torch.tensor(bounds, dtype=torch.float32), relative)
    assert torch.equal(sizes, want_sizes)
    assert torch.equal(payload, want)
    out = torch.ops.dlac_emu.decode_grid(payload, sizes, rs, cs)
    assert torch.equal(bits(out), bits(ref.decode_grid(payload, sizes.tolist(), rs, cs)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(g=grids(), seed=st.integers(0, 2**31 - 1))
def test_device_pipeline_does_not_depend_on_the_order_of_work_items(emulated, monkeypatch, g, seed):
    # On the GPU, work items run in any order and interleave; here they run reversed and shuffled. Every atomic
    # (min, max, or, add, the hash insert keeping the smallest row) must give the in-order result.
    x, rs, cs, bounds, relative = g
    want = emu_encode(x, rs, cs, bounds, relative)
    decoded = torch.ops.dlac_emu.decode_grid(want[0], want[1], rs, cs)
    for order in ("reverse", "shuffle"):
        monkeypatch.setenv("DLAC_EMULATE_ORDER", order)
        monkeypatch.setenv("DLAC_EMULATE_SEED", str(seed))
        got = emu_encode(x, rs, cs, bounds, relative)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), order
        assert torch.equal(bits(torch.ops.dlac_emu.decode_grid(got[0], got[1], rs, cs)), bits(decoded)), order
    monkeypatch.delenv("DLAC_EMULATE_ORDER")


def test_device_pipeline_on_embedding_payloads(emulated):
    # Every mode, Huffman sections of several blocks, DEDUP with both index codings, a strided input.
    x = zipf_payload(rows=3000, dim=64, vocab=300)
    noise = torch.randn(3000, 40, generator=torch.Generator().manual_seed(3))
    wide = torch.cat([x, noise, x[:, :8] * 1e3], dim=1)
    rs, cs = [0, 1000, 1000, 3000], [0, 16, 48, 64, 104, 112]
    bounds = [0.01, 0.05, 0.0, 0.01, 1e-7]
    payload, sizes = emu_encode(wide, rs, cs, bounds)
    native = torch.ops.dlac.encode_grid(wide, rs, cs, torch.tensor(bounds), True)
    assert torch.equal(payload, native[0]) and torch.equal(sizes, native[1])
    assert {info.mode for info in inspect_grid(payload, sizes)} == {Mode.DEDUP, Mode.HUFF, Mode.RAW, Mode.CONST}
    out = torch.ops.dlac_emu.decode_grid(payload, sizes, rs, cs)
    assert torch.equal(bits(out), bits(torch.ops.dlac.decode_grid(payload, sizes, rs, cs)))
    strided = wide.t().contiguous().t()  # column stride != 1: copied, as the CPU kernel does
    assert torch.equal(emu_encode(strided, rs, cs, bounds)[0], payload)
    row_view = torch.cat([wide, wide], dim=1)[:, :112]  # row stride 224: read in place
    assert torch.equal(emu_encode(row_view, rs, cs, bounds)[0], payload)


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_pipeline_matches_the_cpu_kernels(emulated, case):
    # The grids test_codec_cuda.py runs on a GPU (tests/codec/grid_cases.py): NaN and Inf, dims 8 to 128 with
    # relative and absolute bounds, empty and zero-width blocks, multi-hot and gradient payloads, 2600 chunks.
    x, rs, cs, bounds, relative = CASES[case]()
    want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)
    payload, sizes = torch.ops.dlac_emu.encode_grid(x, rs, cs, bounds, relative)
    assert torch.equal(sizes, want_sizes) and torch.equal(payload, want)
    out = torch.ops.dlac_emu.decode_grid(payload, sizes, rs, cs)
    assert torch.equal(bits(out), bits(torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)))


@pytest.mark.parametrize("order", ["forward", "shuffle"])
def test_device_pipeline_tiles_chunks_of_every_width(emulated, monkeypatch, order):
    # Elements are walked in tiles of 8192 by 256 threads, row and column stepped by additions: column blocks
    # narrower and wider than 256, and tiles that start mid-row (8192 is no multiple of 300 or 1000), must give
    # the reference's bytes.
    monkeypatch.setenv("DLAC_EMULATE_ORDER", order)
    dims = [1, 3, 255, 256, 257, 300, 1000]
    x = zipf_payload(rows=70, dim=sum(dims), vocab=20, seed=7)
    x[:, 1:4] = torch.randn(70, 3, generator=torch.Generator().manual_seed(8))
    rs, cs = [0, 9, 70], np.cumsum([0, *dims]).tolist()
    bounds = [0.01, 0.05, 0.01, 0.0, 0.01, 0.05, 0.01]
    payload, sizes = emu_encode(x, rs, cs, bounds)
    want, want_sizes = ref.encode_grid(x, rs, cs, torch.tensor(bounds), True)
    assert torch.equal(sizes, want_sizes) and torch.equal(payload, want)
    out = torch.ops.dlac_emu.decode_grid(payload, sizes, rs, cs)
    assert torch.equal(bits(out), bits(ref.decode_grid(payload, sizes.tolist(), rs, cs)))


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_device_pipeline_redoes_the_codes_of_chunks_that_keep_a_later_step(emulated, monkeypatch, order):
    # Codes are written with the first step (2 eb) in the pass that checks it; near the smallest floats some
    # element misses it, the chunk keeps a later step, and its codes, maximum and histogram are redone.
    monkeypatch.setenv("DLAC_EMULATE_ORDER", order)
    def tiny(seed: int, rows: int, dim: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((rows, dim)) * 10.0 ** rng.integers(-44, -36, size=(rows, dim))

    # Found by search: these two keep 1.9921875 eb and code with Huffman (so the redone histogram is what counts);
    # the 64 columns at eps 1e-6 keep 1.99 and 1.5 eb with PACK; the Zipf block keeps the first step.
    a = np.concatenate([tiny(111, 200, 16), tiny(1086, 200, 16), np.concatenate([tiny(0, 30, 64)] * 7)[:200],
                        zipf_payload(rows=200, dim=16, vocab=40).numpy()], axis=1)
    x = torch.from_numpy(a.astype(np.float32))
    rs, cs = [0, 200], [0, 16, 32, *range(36, 97, 4), 112]
    bounds = [0.003, 0.01, *[1e-6] * 16, 0.01]
    payload, sizes = emu_encode(x, rs, cs, bounds)
    want, want_sizes = ref.encode_grid(x, rs, cs, torch.tensor(bounds), True)
    assert torch.equal(sizes, want_sizes) and torch.equal(payload, want)
    infos = inspect_grid(payload, sizes)
    assert [i.mode for i in infos[:2]] == [Mode.HUFF, Mode.HUFF]
    assert all(abs(i.step / i.abs_eb - 2.0) > 1e-3 for i in infos[:2])  # a later step, with Huffman
    assert sum(abs(i.step / i.abs_eb - 2.0) > 1e-3 for i in infos[2:-1] if i.abs_eb) >= 2
    assert infos[-1].step == 2.0 * infos[-1].abs_eb  # the first step kept beside them


def test_device_pipeline_uses_pack_when_it_is_smaller(emulated):
    # Uniform codes over a wide alphabet: Huffman cannot beat fixed-width packing.
    x = torch.rand(500, 16, generator=torch.Generator().manual_seed(1))
    payload, sizes = emu_encode(x, [0, 500], [0, 16], [1e-4])
    assert inspect_grid(payload, sizes)[0].mode == Mode.PACK
    assert torch.equal(payload, encode_grid(x, [0, 500], [0, 16], eps=1e-4, impl="ref")[0])


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_device_pipeline_packs_and_counts_streams_of_several_tiles(emulated, monkeypatch, order):
    # A block counts its tile's codes in a histogram of its own and adds the non-zero bins to its chunk's; it packs
    # its tile of 8192 symbols into words of its own and stores them whole, OR-ing only the first and the last into
    # the payload. Chunks and streams of several tiles, starting at byte offsets that are no multiple of 4 (so tile
    # boundaries fall inside words): PACK of 13-bit codes, Huffman codes of varying length, DEDUP's two sections.
    monkeypatch.setenv("DLAC_EMULATE_ORDER", order)
    g = torch.Generator().manual_seed(11)
    n = 2500
    wide = torch.rand(n, 7, generator=g)  # ~5000 values of eps 1e-4 are too many for Huffman: PACK, 3 tiles
    gauss = torch.randn(n, 12, generator=g)
    x = torch.cat([gauss[:, :2], wide, gauss[:, 2:], zipf_payload(rows=n, dim=40, vocab=50)], dim=1)
    rs, cs = [0, n], np.cumsum([0, 2, 7, 10, 40]).tolist()
    bounds = [0.01, 1e-4, 0.01, 0.01]
    payload, sizes = emu_encode(x, rs, cs, bounds)
    native = torch.ops.dlac.encode_grid(x, rs, cs, torch.tensor(bounds), True)
    assert torch.equal(sizes, native[1]) and torch.equal(payload, native[0])
    assert [i.mode for i in inspect_grid(payload, sizes)] == [Mode.HUFF, Mode.PACK, Mode.HUFF, Mode.DEDUP]
    starts = np.cumsum([0, *sizes.tolist()])[:-1]
    assert starts[1] % 4 and starts[3] % 4  # the PACK and DEDUP sections start inside a payload word
    out = torch.ops.dlac_emu.decode_grid(payload, sizes, rs, cs)
    assert torch.equal(bits(out), bits(torch.ops.dlac.decode_grid(payload, sizes, rs, cs)))


def test_device_decoder_rejects_what_the_cpu_decoder_rejects(emulated):
    x = zipf_payload(rows=600, dim=24, vocab=30)
    x[:, 16:] = torch.randn(600, 8, generator=torch.Generator().manual_seed(2))
    rs, cs, bounds = [0, 200, 600], [0, 8, 16, 24], [0.01, 0.0, 0.05]
    payload, sizes = emu_encode(x, rs, cs, bounds)
    rejected = 0
    for mutated, new_sizes, _ in damaged_payloads(payload, sizes, 600, seed=5):
        got, err = verdict(torch.ops.dlac_emu.decode_grid, mutated, new_sizes, rs, cs)
        want, want_err = verdict(torch.ops.dlac.decode_grid, mutated, new_sizes, rs, cs)
        assert err == want_err
        if err is None:
            assert torch.equal(bits(got), bits(want))
        rejected += err is not None
    assert rejected > 300


def _copies(op, *args):
    """Device-to-host copies (each a synchronization on a GPU) that one call of op makes."""
    before = torch.ops.dlac_emu.device_to_host_copies()
    result = op(*args)
    return result, torch.ops.dlac_emu.device_to_host_copies() - before


def test_device_pipeline_synchronizes_once_to_encode_and_twice_to_decode(emulated):
    # docs/codec.md's counts: encode reads the chunk state and the histograms back in one copy (a second only when the
    # histograms outgrow their region: 16384 words for a grid not seen before, else what the same row and column
    # splits needed last time and a quarter more), decode reads headers with checksums, then error flags.
    x = zipf_payload(rows=2000, dim=32, vocab=900)
    rs, cs, bounds = [0, 700, 2000], [0, 8, 16, 32], [0.01, 0.0, 0.05]
    _, n = _copies(emu_encode, x, rs, cs, bounds)
    assert n == 1  # a few thousand histogram words: the first region holds them
    (payload, sizes), n = _copies(emu_encode, x, rs, cs, bounds)
    assert n == 1
    assert torch.equal(payload, ref.encode_grid(x, rs, cs, torch.tensor(bounds), True)[0])
    out, n = _copies(torch.ops.dlac_emu.decode_grid, payload, sizes, rs, cs)
    assert n == 2
    assert torch.equal(bits(out), bits(ref.decode_grid(payload, sizes.tolist(), rs, cs)))
    # Bounds and sizes passed as host tensors cost nothing more; an all-constant grid needs no histograms.
    _, n = _copies(emu_encode, torch.zeros(10, 4), [0, 10], [0, 4], [0.01])
    assert n == 1
    # Wide alphabets (12 chunks of ~2000 codes, DEDUP candidates: ~68,000 words) outgrow the first region: a second
    # copy once, then one; a bound that needs more words than the last call's and a quarter takes two again, once.
    wide = torch.rand(4000, 12, generator=torch.Generator().manual_seed(4))
    ws = list(range(13))
    for eps, want in ((2.5e-4, 2), (2.5e-4, 1), (1.5e-4, 2), (1.5e-4, 1)):
        (payload, sizes), n = _copies(emu_encode, wide, [0, 4000], ws, [eps] * 12)
        assert n == want, (eps, n)
        assert torch.equal(payload, encode_grid(wide, [0, 4000], ws, eps=eps, impl="ref")[0])
    # Each grid shape keeps its own need: the first grid still takes one copy.
    _, n = _copies(emu_encode, x, rs, cs, bounds)
    assert n == 1


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_device_encoder_raises_naming_the_chunk_when_its_row_hash_set_breaks(emulated, monkeypatch, order):
    # The probe loops are bounded: a hash set that cannot hold its rows (forced here to 4 slots for 40 distinct
    # rows; the real one has at least twice as many slots as rows) flags the chunk, and the read-back raises.
    monkeypatch.setenv("DLAC_EMULATE_ORDER", order)
    monkeypatch.setenv("DLAC_EMULATE_HASH_SLOTS", "4")
    x = torch.randn(84, 6, generator=torch.Generator().manual_seed(6))
    x[44:] = x[4:44]  # row block 1: 40 distinct rows, each twice (a DEDUP candidate); row block 0: 4 rows fit
    rs, cs = [0, 4, 84], [0, 3, 6]
    with pytest.raises(RuntimeError, match=r"chunk 3 \(row block 1, column block 1\): the device encoder's row hash"):
        emu_encode(x, rs, cs, [0.0, 0.01])  # column block 0 is sent raw: no hash set
    monkeypatch.setenv("DLAC_EMULATE_HASH_SLOTS", "128")  # enough slots: the same grid encodes as the reference
    assert torch.equal(emu_encode(x, rs, cs, [0.0, 0.01])[0],
                       ref.encode_grid(x, rs, cs, torch.tensor([0.0, 0.01]), True)[0])


@pytest.mark.parametrize(("kernel", "reported_by"), [
    ("decode: huffman blocks", "decode"), ("decode: output", "decode"), ("crc: segment registers", "decode"),
    ("encode: row hash insert", "encode"), ("encode: bit packing", "the next call"),
])
def test_a_device_fault_is_reported_as_one_naming_its_kernel(emulated, monkeypatch, kernel, reported_by):
    # CUDA reports a fault inside a kernel at the next synchronization; the emulation raises there what CUDA would
    # (DLAC_EMULATE_FAULT). The error stays a device error (torch.AcceleratorError, a RuntimeError) naming the
    # kernels launched since the last read-back, the faulting one among them, and the public API passes it on as it
    # is instead of calling the payload corrupted. An encode's last kernels (packing, checksums) have no read-back
    # after them: their fault surfaces in the next call, which names them too.
    from lightning_dlac.codec import CodecError, decode_grid

    x = zipf_payload(rows=600, dim=24, vocab=30)
    rs, cs, bounds = [0, 200, 600], [0, 8, 16, 24], [0.01, 0.0, 0.05]
    payload, sizes = emu_encode(x, rs, cs, bounds)
    monkeypatch.setattr(torch.ops.dlac, "decode_grid", torch.ops.dlac_emu.decode_grid)  # the API runs the emulation
    monkeypatch.setenv("DLAC_EMULATE_FAULT", kernel)
    if reported_by == "encode":
        with pytest.raises(torch.AcceleratorError, match="illegal memory access") as fault:
            emu_encode(x, rs, cs, bounds)
    else:
        if reported_by == "the next call":
            emu_encode(x, rs, cs, bounds)  # returns: nothing synchronizes after its last kernels
            monkeypatch.delenv("DLAC_EMULATE_FAULT")
        with pytest.raises(torch.AcceleratorError, match="illegal memory access") as fault:
            decode_grid(payload, sizes, rs, cs, impl="native")
    message = str(fault.value)
    assert f"'{kernel}'" in message and "DLAC_CUDA_SYNC_KERNELS=1" in message, message
    assert not isinstance(fault.value, (ValueError, CodecError))
    # The fault is gone with its report: the next calls encode and decode as before.
    monkeypatch.delenv("DLAC_EMULATE_FAULT", raising=False)
    again, again_sizes = emu_encode(x, rs, cs, bounds)
    assert torch.equal(again, payload) and torch.equal(again_sizes, sizes)
    out = decode_grid(payload, sizes, rs, cs, impl="native")
    assert torch.equal(bits(out), bits(ref.decode_grid(payload, sizes.tolist(), rs, cs)))


def test_device_ops_check_their_arguments(emulated):
    x = torch.randn(10, 4)
    with pytest.raises(RuntimeError, match="float32"):
        emu_encode(x.double(), [0, 10], [0, 4], [0.01])
    with pytest.raises(RuntimeError, match="one bound per column block"):
        emu_encode(x, [0, 10], [0, 2, 4], [0.01])
    with pytest.raises(RuntimeError, match="< 1"):
        emu_encode(x, [0, 10], [0, 4], [1.5])
    with pytest.raises(RuntimeError, match="col_splits"):
        emu_encode(x, [0, 10], [0, 5], [0.01])
    payload, sizes = emu_encode(x, [0, 10], [0, 4], [0.01])
    with pytest.raises(ValueError, match="sum to"):  # the sizes do not fit the bytes: a verdict on the payload
        torch.ops.dlac_emu.decode_grid(payload[:-1], sizes, [0, 10], [0, 4])
    with pytest.raises(RuntimeError, match="one entry per chunk"):
        torch.ops.dlac_emu.decode_grid(payload, sizes, [0, 5, 10], [0, 4])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
