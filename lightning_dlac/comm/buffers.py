"""Result tensors of the exchanges whose memory is reused from one call to the next (:class:`ResultBuffers`).

An allocation concern beside the exchange, not part of it: the pooled exchange's start functions
(:mod:`lightning_dlac.comm.pooled`) take one as ``buffers``, and the all-to-all module keeps one per kind of result.
"""

from __future__ import annotations

import torch

# How many references an untyped storage has (tensors and views on it, storage objects); None where torch lacks it.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


class ResultBuffers:
    """New result tensors whose memory is reused from one call to the next where nothing holds it any more.

    An exchange's result is as large as the step's pooled embeddings (or their gradient), and a large new tensor on
    the CPU costs the first code that writes it a page fault per page whenever the allocator hands it fresh
    memory (glibc maps large blocks anew, and unmaps them when freed, until its threshold adapts). :meth:`empty`
    returns a new tensor (its own, with no autograd history) on the memory of the previous result when no tensor or
    view of that result is alive any more, which the storage's reference count says exactly; otherwise, and on other
    devices (whose caching allocators keep memory already, and whose kernels may still read it on another stream),
    fresh memory. One instance per kind of result: a forward output and a gradient are alive together."""

    def __init__(self) -> None:
        self._held: torch.UntypedStorage | None = None
        self._idle = 0  # the held storage's reference count when only this object holds it

    def empty(self, rows: int, cols: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A [rows, cols] tensor of ``dtype`` and unspecified contents on ``device``."""
        nbytes = rows * cols * dtype.itemsize
        if device.type != "cpu" or _storage_use_count is None or nbytes == 0:
            return torch.empty(rows, cols, device=device, dtype=dtype)
        held = self._held
        if held is None or held.nbytes() != nbytes or _storage_use_count(held._cdata) != self._idle:
            held = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()  # the temporary tensor is gone at once
            self._held, self._idle = held, _storage_use_count(held._cdata)
        return torch.empty(0, dtype=dtype).set_(held, 0, (rows, cols))
