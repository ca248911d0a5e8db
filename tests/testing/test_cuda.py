"""lightning_dlac/testing/cuda.py reads what a call wrote at file descriptor 2, where torch's sync debug mode reports
synchronizations from C++: checked here without a GPU by writing to the descriptor itself (the count runs in
tests/codec/test_codec_cuda.py and benchmarks/cuda_codec_bench.py on a GPU)."""

from __future__ import annotations

import os

from lightning_dlac.testing.cuda import SYNC_REPORT, stderr_of


def test_stderr_of_reads_the_descriptor_and_restores_it() -> None:
    before = os.fstat(2)

    def report_twice() -> None:  # as C++ code writes: to the descriptor, past Python's sys.stderr
        for _ in range(2):
            os.write(2, b"[W sync] called a synchronizing CUDA operation\n")

    assert stderr_of(report_twice).count(SYNC_REPORT) == 2
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    assert stderr_of(lambda: None) == ""
