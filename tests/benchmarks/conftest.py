"""What the benchmark tests share: the committed results directory, loaded once, and the native codec's build.

The benchmarks are a package (``benchmarks/``: scripts at its top, the library in ``benchmarks/lib``, the renderer in
``benchmarks/render``) importable from the repository root, which pytest puts on the path (pyproject.toml's
``pythonpath``): the tests import ``benchmarks.<module>`` as any package is imported, nothing here edits ``sys.path``.
Imports stay light (the GPU session's rehearsal runs tests/benchmarks/test_gpu_session.py in an environment with
torch alone).
"""

from __future__ import annotations

import pytest

from benchmarks.lib.paths import RESULTS
from benchmarks.render.core import Results
from tests.codec.conftest import native  # noqa: F401 - the codec tests' native build, for the payload test


@pytest.fixture(scope="session")
def committed() -> Results:
    """The committed results files (benchmarks/results/), each loaded once for the session."""
    return Results(RESULTS)
