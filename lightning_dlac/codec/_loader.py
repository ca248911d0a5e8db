"""JIT build and load of the native codec kernels (cuda_ext/), cached per process and on disk.

``DLAC_CODEC_IMPL`` = ``auto`` (default: native if it builds, else a one-time warning and the reference) | ``native``
(fail with the build log if it does not build) | ``ref``. ``DLAC_EXTENSION_DIR`` is the cache root for builds
(default ``~/.cache/lightning_dlac``); each build lives in a sub-directory named by a hash of the sources, the
compiler flags and the torch version, so editing a kernel or upgrading torch rebuilds. The build, the cache and the
choice are :mod:`lightning_dlac.native`'s, shared with the Criteo parser; this module says what the codec builds.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from lightning_dlac.native import (
    ENV_DIR,
    IMPLS,
    NativeLibrary,
    NativeUnavailable,
    build_extension,
    sources_dir,
)
from lightning_dlac.native import build_dir as _build_dir

log = logging.getLogger(__name__)

__all__ = [
    "ENV_DIR",
    "ENV_IMPL",
    "IMPLS",
    "NativeUnavailable",
    "build_dir",
    "build_library",
    "load_native",
    "native_available",
    "resolve_impl",
    "sources_dir",
]

ENV_IMPL = "DLAC_CODEC_IMPL"

# The C++ standard is torch's own (C++17 for torch 2.13, C++20 from 2.14): the sources compile as either.
# -ffp-contract=off: the kernels must round every float32 multiply and add separately (no FMA) to match the
# reference bit for bit. -fopenmp: at::parallel_for is an inline OpenMP region.
# -ffp-contract=off / -fno-fast-math keep float32 results identical to the reference; -fno-trapping-math only
# lets the compiler vectorize branch-free float code (no value changes: floating-point exceptions are not observed).
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
# The device code spells every float32 operation with a round-to-nearest intrinsic, so these flags only restate what
# it relies on; --extended-lambda lets dlac_grid.h write each kernel once as a __host__ __device__ lambda.
CUDA_CFLAGS = ["-O3", "--fmad=false", "-ftz=false", "-prec-div=true", "--extended-lambda"]


def _want_cuda() -> bool:
    return torch.version.cuda is not None and torch.cuda.is_available()


def _sources(with_cuda: bool | None = None) -> tuple[list[Path], list[Path]]:
    root = sources_dir()
    cpp = sorted(root.glob("*.cpp"))
    cu = sorted(root.glob("*.cu")) if (_want_cuda() if with_cuda is None else with_cuda) else []
    headers = sorted(root.glob("*.h")) + sorted(root.glob("*.cuh"))
    if not cpp:
        raise NativeUnavailable(f"no C++ sources found in {root}")
    return cpp + cu, headers


def build_dir(sources: list[Path], headers: list[Path]) -> Path:
    """The cache directory of a codec build of ``sources`` and ``headers`` (named by their hash)."""
    return _build_dir(sources + headers, CFLAGS + LDFLAGS + CUDA_CFLAGS)


def build_library(sources: list[Path], headers: list[Path], prefix: str = "dlac_native") -> Path:
    """Build ``sources`` (C++ and, if any, CUDA) into a shared library in the cache and load it into this process.

    The build directory is named by a hash of the sources, headers, flags and torch version, so an unchanged
    library is only loaded again. Returns the build directory; raises NativeUnavailable with the build log's tail.
    Also used by ``make cuda-check`` (CUDA sources, no GPU needed) and by the tests' CPU emulation of the device
    pipeline.
    """
    directory, _ = build_extension(
        "native DLAC codec", prefix, sources, headers, cflags=CFLAGS, ldflags=LDFLAGS, cuda_cflags=CUDA_CFLAGS,
        include_dirs=[sources_dir()],
    )  # fmt: skip
    return directory


def _build_and_load() -> None:
    sources, headers = _sources()
    directory = build_library(sources, headers)
    try:
        from lightning_dlac.codec import _fake  # noqa: F401 - registers fake kernels for torch.compile / opcheck
    except RuntimeError as e:  # built and loaded, but the library registered no (or other) dlac ops
        raise NativeUnavailable(
            f"the native library built in {directory} does not provide the dlac ops ({e}); the sources in"
            f" {sources_dir()} are incomplete or from another version"
        ) from e


_LIBRARY = NativeLibrary("native codec", ENV_IMPL, _build_and_load, "the (slower) reference codec")
# The per-process outcome of the build ("loaded", "error", "warned"); tests reset it to replay a failure.
_state = _LIBRARY.state


def load_native() -> None:
    """Build (once per source hash) and load the native ops into ``torch.ops.dlac``; raise NativeUnavailable."""
    _LIBRARY.load()


def native_available() -> bool:
    """Whether the native ops load, building them if needed; never raises.

    Returns:
        True if ``torch.ops.dlac`` has the native kernels.
    """
    return _LIBRARY.available()


def resolve_impl(impl: str = "auto") -> str:
    """Map ``impl`` (and ``DLAC_CODEC_IMPL`` when impl is "auto") to "ref" or "native"."""
    return _LIBRARY.choose(impl)
