"""The native layer: building, caching and loading the package's C++ / CUDA libraries (:mod:`.build`).

The bottom of the package, with ``testing/`` and ``checks/``: it imports nothing of ``lightning_dlac`` and no torch
at import time, and both native libraries go through it, the codec's kernels (``cuda_ext/``, loaded by
:mod:`lightning_dlac.codec`) and the Criteo TSV parser (``lightning_dlac/criteo/criteo_tsv.cpp``, loaded by
:mod:`lightning_dlac.criteo`).
"""

from lightning_dlac.native.build import (
    ENV_DIR,
    IMPLS,
    NativeLibrary,
    NativeUnavailable,
    build_dir,
    build_extension,
    cache_root,
    sources_dir,
)

__all__ = [
    "ENV_DIR",
    "IMPLS",
    "NativeLibrary",
    "NativeUnavailable",
    "build_dir",
    "build_extension",
    "cache_root",
    "sources_dir",
]
