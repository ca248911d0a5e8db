"""The null codec: a benchmark facility that stands in for the DLAC codec inside the real compressed exchange.

benchmarks/e2e_bandwidth.py measures the ceiling of DLAC at its own compression ratios with it. Everything but the
codec is the real thing: the same module (:class:`~lightning_dlac.comm.CompressedPooledEmbeddingsAllToAll`), the same
size exchange and payload exchange, the same overlap setting and autograd path. Per table and per direction it sends
exactly the bytes it is given (a DLAC launch's mean per exchange, read from that launch's
:class:`~lightning_dlac.comm.CommStats` with :func:`bytes_per_call`), and it neither encodes nor decodes: the payload
is zeros and the other ranks' columns (forward) and gradients (backward) arrive as zeros. The one thing left out is
codec time, so a DLAC launch cannot be faster than its null-codec launch by more than noise.

Not for training: with it the model learns nothing from the other ranks' tables.

    group = install_compressed_all_to_all(model, CompressionConfig(backward="dlac", error_every=0), bounds)
    install_null_codec(group, forward=dlac_bytes["forward"], backward=dlac_bytes["backward"])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from lightning_dlac.comm.all_to_all import CompressedPooledEmbeddingsAllToAll
from lightning_dlac.comm.config import BackwardCompression
from lightning_dlac.comm.stats import CommStats


class NullChunkCodec:
    """A :class:`~lightning_dlac.comm.exchange.ChunkCodec` that sends ``chunk_bytes[table]`` zero bytes for every
    chunk of a table and decodes any chunks to zeros.

    Args:
        chunk_bytes: Bytes of one chunk, per table.
    """

    def __init__(self, chunk_bytes: Mapping[str, int]) -> None:
        for table, n in chunk_bytes.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"the null codec's byte count of table {table!r} must be an integer >= 0, got {n!r}.")
        self.chunk_bytes = dict(chunk_bytes)

    def encode(self, block: torch.Tensor, row_splits: list[int], col_splits: list[int], eps: torch.Tensor | float,
               tables: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeros: ``chunk_bytes`` of each column block's table per row block, row-block-major."""
        if len(tables) != len(col_splits) - 1:
            raise ValueError(f"the null codec needs one table name per column block: {len(col_splits) - 1} blocks,"
                             f" {len(tables)} names.")
        missing = sorted(set(tables) - set(self.chunk_bytes))
        if missing:
            raise ValueError(f"the null codec has no byte count for table(s) {missing}; give every table the exchange"
                             " sends (install_null_codec takes them per direction).")
        per_row_block = [self.chunk_bytes[t] for t in tables]
        sizes = torch.tensor(per_row_block * (len(row_splits) - 1), dtype=torch.int64, device=block.device)
        return torch.zeros(int(sum(per_row_block)) * (len(row_splits) - 1), dtype=torch.uint8,
                           device=block.device), sizes

    def decode(self, received: torch.Tensor, sizes: torch.Tensor, row_splits: list[int], col_splits: list[int],
               device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
        """Zeros of the chunks' shape: nothing was encoded. With ``out`` (the block of the result the DLAC codec
        decodes into) the zeros are written there: one pass over the block, as a decode makes, not a new tensor
        and a copy of it, which would make the ceiling do more than the launch it bounds."""
        if out is not None:
            return out.zero_()
        return torch.zeros(row_splits[-1], col_splits[-1], device=device)


def bytes_per_call(stats: CommStats) -> dict[str, dict[str, float]]:
    """Per direction (``"forward"``, ``"backward"``) and table, the mean payload bytes one exchange of ``stats``
    sent: what :func:`install_null_codec` takes to send the same. ``stats`` is a DLAC launch's (its timed
    interval: a difference of two snapshots); the backward figures need DLAC-compressed gradients."""
    if not stats.calls:
        raise ValueError("the statistics hold no forward exchange: measure a DLAC launch first.")
    # What the codec made: the bytes sent as they are to peers the plan does not compress go the same way in both.
    forward = {t: (n - stats.table_passed_bytes.get(t, 0)) / stats.calls for t, n in stats.table_sent_bytes.items()}
    backward = ({t: (n - stats.table_backward_passed_bytes.get(t, 0)) / stats.backward_calls
                 for t, n in stats.table_backward_sent_bytes.items()} if stats.backward_calls else {})
    return {"forward": forward, "backward": backward}


def _chunk_bytes(per_call: Mapping[str, float], chunk_tables: Sequence[str]) -> dict[str, int]:
    """A table's bytes per exchange split evenly over its chunks of one exchange (``chunk_tables``: the table of
    each chunk), rounded to whole bytes per chunk."""
    counts: dict[str, int] = {}
    for t in chunk_tables:
        counts[t] = counts.get(t, 0) + 1
    missing = sorted(set(counts) - set(per_call))
    if missing:
        raise ValueError(f"no byte count for table(s) {missing}: the null codec sends what a DLAC launch of the same"
                         " model sent for each of its tables.")
    out = {}
    for t, n in counts.items():
        value = per_call[t]
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"the byte count of table {t!r} must be a finite number >= 0, got {value!r}.")
        out[t] = round(value / n)
    return out


def install_null_codec(exchanges: Sequence[object], forward: Mapping[str, float],
                       backward: Mapping[str, float] | None = None) -> list[CompressedPooledEmbeddingsAllToAll]:
    """Put a :class:`NullChunkCodec` in place of the DLAC codec in every pooled exchange of ``exchanges`` (an
    :class:`~lightning_dlac.comm.ExchangeGroup`): per exchange (call), each table's ``forward`` bytes, and its
    ``backward`` bytes for DLAC-compressed gradients (``None``: the gradients go as configured). Returns the
    exchanges it changed.

    Args:
        exchanges: The installed exchanges.
        forward: Per table, payload bytes of one forward exchange (:func:`bytes_per_call`'s ``"forward"``).
        backward: Per table, payload bytes of one gradient exchange (its ``"backward"``); needs
            ``CompressionConfig(backward="dlac")``.
    """
    pooled = [a for a in exchanges if isinstance(a, CompressedPooledEmbeddingsAllToAll)]
    if len(pooled) != len(exchanges) or not pooled:
        raise ValueError("the null codec stands in for the pooled-embedding exchange only; the group holds"
                         f" {[type(a).__name__ for a in exchanges]}.")
    for a2a in pooled:
        config = a2a._config
        if config.error_every:
            raise ValueError("the null codec's payload is not DLAC's: error sampling would decode it. Install the"
                             " exchange with CompressionConfig(error_every=0).")
        if backward is not None and BackwardCompression(config.backward) is not BackwardCompression.DLAC:
            raise ValueError(f"backward byte counts stand in for DLAC-compressed gradients; this exchange sends them"
                             f" as {config.backward}: install it with CompressionConfig(backward='dlac').")
        layout = a2a.layout
        # One chunk per (compressed peer, table); the plan's other peers get their rows as they are.
        sent = [t for r in layout.other_ranks if layout.compress_to[r] for t in layout.local_tables]
        a2a.forward_impl = NullChunkCodec(_chunk_bytes(forward, sent))
        if backward is not None:
            owned = [t for r in layout.other_ranks if layout.compress_from[r] for t in layout.tables_per_rank[r]]
            a2a.backward_impl = NullChunkCodec(_chunk_bytes(backward, owned))
    return pooled
