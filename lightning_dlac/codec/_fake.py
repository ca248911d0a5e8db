"""Fake (meta) kernels of the native ops, so torch.compile and opcheck can trace them."""

from __future__ import annotations

import torch


@torch.library.register_fake("dlac::encode_grid")
def _encode_grid_fake(x, row_splits, col_splits, bounds, relative):
    ctx = torch.library.get_ctx()
    nbytes = ctx.new_dynamic_size()
    nchunks = (len(row_splits) - 1) * (len(col_splits) - 1)
    return x.new_empty((nbytes,), dtype=torch.uint8), x.new_empty((nchunks,), dtype=torch.int64)


@torch.library.register_fake("dlac::decode_grid")
def _decode_grid_fake(payload, sizes, row_splits, col_splits):
    return payload.new_empty((row_splits[-1], col_splits[-1]), dtype=torch.float32)


@torch.library.register_fake("dlac::decode_grid_into")
def _decode_grid_into_fake(payload, sizes, row_splits, col_splits, out):
    return None


@torch.library.register_fake("dlac::cast_column_blocks")
def _cast_column_blocks_fake(x, col_splits, out):
    return None
