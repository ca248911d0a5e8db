import torch

from lightning_dlac.codec import decode, encode, inspect, max_error


def test_reference_roundtrip_smoke():
    x = torch.randn(64, 8)
    buf = encode(x, eps=0.01, impl="ref")
    y = decode(buf, impl="ref")
    assert max_error(x, y) <= inspect(buf).abs_eb
