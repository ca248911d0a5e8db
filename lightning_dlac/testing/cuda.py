"""Counting a CUDA call's blocking host-device synchronizations, for the codec's tests and its GPU benchmark.

torch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``) reports every blocking device-to-host copy.
On the lent H200 (torch 2.11) each report is a C++ warning printed to the process's stderr, not a Python warning;
the only Python warning is the mode's own "prototype feature" notice, which an earlier count mistook for a
synchronization. So the count reads what the call printed at file descriptor 2 (and, should a torch version turn
the reports into Python warnings, those too). torch only.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Callable

import torch

SYNC_REPORT = "called a synchronizing CUDA operation"  # in each report of the sync debug mode


def stderr_of(fn: Callable[[], object]) -> str:
    """What one call of ``fn`` wrote to file descriptor 2, as C++ code writes (the descriptor itself is redirected for
    the call, then restored; Python's ``sys.stderr`` is flushed first, but where a caller such as pytest replaced it,
    what it prints goes there)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            fn()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return err.read().decode(errors="replace")


def count_synchronizations(fn: Callable[[], object]) -> int:
    """Blocking host-device synchronizations one call of ``fn`` makes (work queued before it is waited for first)."""
    torch.cuda.synchronize()

    def watched() -> None:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        printed = stderr_of(watched)
    return printed.count(SYNC_REPORT) + sum(SYNC_REPORT in str(w.message) for w in caught)
