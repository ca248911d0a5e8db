"""Invalid inputs are rejected with messages that teach; corrupted, truncated and foreign buffers raise CodecError."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import bits, zipf_payload
from grid_cases import refresh_crc

from lightning_dlac.codec import CodecError, decode, encode, inspect
from lightning_dlac.codec._loader import resolve_impl
from lightning_dlac.codec.format import HEADER_SIZE


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps": 0.0}, "> 0"),
        ({"eps": -0.1}, "> 0"),
        ({"eps": float("nan")}, "valid error bound"),
        ({"eps": float("inf")}, "valid error bound"),
        ({"eps": 1.0}, "must be < 1"),
        ({"eps": 5.0}, "must be < 1"),
        ({"eps": 1e-50}, "float32"),  # underflows to 0 in float32
        ({"abs_eb": 0.0}, "> 0"),
        ({"abs_eb": 1e39}, "valid error bound"),  # overflows float32
        ({}, "exactly one"),
        ({"eps": 0.01, "abs_eb": 0.1}, "exactly one"),
    ],
)
def test_invalid_bounds_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        encode(torch.randn(4, 4), **kwargs)


def test_invalid_inputs_rejected():
    with pytest.raises(TypeError, match=r"float32.*\.float\(\)"):
        encode(torch.randn(4, 4, dtype=torch.float64), eps=0.01)
    with pytest.raises(TypeError, match="float32"):
        encode(torch.ones(4, 4, dtype=torch.int32), eps=0.01)
    with pytest.raises(ValueError, match="2-D.*reshape"):
        encode(torch.randn(4, 4, 4), eps=0.01)
    with pytest.raises(ValueError, match="2-D"):
        encode(torch.randn(4), eps=0.01)
    with pytest.raises(TypeError, match="torch.Tensor"):
        encode([[1.0, 2.0]], eps=0.01)
    with pytest.raises(TypeError, match="a number"):
        encode(torch.randn(4, 4), eps="0.01")
    with pytest.raises(TypeError, match="1-D uint8"):
        decode(torch.zeros(10))
    with pytest.raises(ValueError, match="impl"):
        encode(torch.randn(4, 4), eps=0.01, impl="gpu")


def test_env_var_selects_impl(monkeypatch):
    monkeypatch.setenv("DLAC_CODEC_IMPL", "ref")
    assert resolve_impl("auto") == "ref"
    assert resolve_impl("ref") == "ref"
    monkeypatch.setenv("DLAC_CODEC_IMPL", "bogus")
    with pytest.raises(ValueError, match="DLAC_CODEC_IMPL"):
        resolve_impl("auto")


def _samples() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    z = zipf_payload(rows=300, dim=16, vocab=40)
    wide = torch.randn(37, 9, generator=g)
    uniform = torch.rand(20, 9, generator=g)
    few = torch.randn(2, 33, generator=g)[torch.randint(0, 2, (70,), generator=g)]
    bufs = [encode(z, eps=0.01, impl="ref"), encode(wide, eps=0.05, impl="ref"), encode(uniform, eps=1e-4, impl="ref"),
            encode(few, eps=0.2, impl="ref"), encode(torch.full((3, 3), 2.0), eps=0.1, impl="ref"),
            encode(torch.tensor([[float("nan"), 1.0]]), eps=0.1, impl="ref"), encode(z, eps=0.3, impl="ref")]
    assert len({inspect(b).mode for b in bufs}) == 5, "the samples should cover every mode"
    return bufs


def _decode_both(data: bytes, impls: list[str]):
    """Decode with every impl; each must raise CodecError or return a tensor, and all must agree."""
    results = []
    for impl in impls:
        try:
            results.append(bits(decode(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else
                                       torch.zeros(0, dtype=torch.uint8), impl=impl)))
        except CodecError:
            results.append(None)
    for r in results[1:]:
        assert (r is None) == (results[0] is None), f"impls disagree on validity: {[r is None for r in results]}"
        if r is not None:
            assert torch.equal(r, results[0])
    return results[0]


def _fuzz(n: int, seed: int, impls: list[str]) -> None:
    rnd = random.Random(seed)
    samples = [bytes(b.numpy().tobytes()) for b in _samples()]
    for k in range(n):
        data = bytearray(rnd.choice(samples))
        kind = k % 4
        if kind == 0:  # random bit flips: the checksum must catch them
            for b in rnd.sample(range(8 * len(data)), rnd.randint(1, 3)):  # distinct bits: CRC-32 catches all
                data[b // 8] ^= 1 << (b % 8)
            assert _decode_both(bytes(data), impls) is None
        elif kind == 1:  # truncation or extension
            cut = rnd.randrange(len(data) + 8)
            data = data[:cut] if cut < len(data) else data + bytes(cut - len(data) + 1)
            assert _decode_both(bytes(data), impls) is None
        else:  # structural mutations behind a recomputed checksum: validation must hold without the CRC
            for _ in range(rnd.randint(1, 4)):
                i = rnd.randrange(len(data)) if kind == 2 else rnd.randrange(min(len(data), 64))
                data[i] = rnd.randrange(256) if rnd.random() < 0.5 else data[i] ^ (1 << rnd.randrange(8))
            refresh_crc(data)
            _decode_both(bytes(data), impls)


@pytest.mark.parametrize("impl", ["ref", "native"])
def test_foreign_and_truncated_buffers(request, impl):
    if impl == "native":
        request.getfixturevalue("native")
    for data in [b"", b"DLAC", b"PK\x03\x04" + bytes(60), bytes(HEADER_SIZE), b"DLAC" + bytes(HEADER_SIZE - 4)]:
        with pytest.raises(CodecError):
            decode(bytearray(data) if data else torch.zeros(0, dtype=torch.uint8), impl=impl)
    buf = encode(torch.randn(8, 8), eps=0.01, impl=impl)
    for cut in (0, 1, HEADER_SIZE - 1, HEADER_SIZE, buf.numel() - 1):
        with pytest.raises(CodecError, match="(shorter|truncated|announces)"):
            decode(buf[:cut], impl=impl)
    data = bytearray(buf.numpy().tobytes())
    data[4] = 9
    refresh_crc(data)
    with pytest.raises(CodecError, match="version"):
        decode(data, impl=impl)


def test_corruption_fuzz_reference():
    # Runs wherever the suite runs: it is the decoder users get when the native build is unavailable.
    _fuzz(400, seed=1, impls=["ref"])


def test_corruption_fuzz(native):
    _fuzz(400, seed=1, impls=["ref", "native"])


@pytest.mark.slow
def test_corruption_fuzz_large_reference():
    _fuzz(3000, seed=2, impls=["ref"])


@pytest.mark.slow
def test_corruption_fuzz_large(native):
    _fuzz(3000, seed=2, impls=["ref", "native"])


def test_valid_samples_decode_identically(native):
    for b in _samples():
        assert torch.equal(bits(decode(b, impl="ref")), bits(decode(b, impl="native")))
