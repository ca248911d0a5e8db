"""JIT build and load of the native codec kernels (cuda_ext/), cached per process and on disk.

``DLAC_CODEC_IMPL`` = ``auto`` (default: native if it builds, else a one-time warning and the reference) | ``native``
(fail with the build log if it does not build) | ``ref``. ``DLAC_EXTENSION_DIR`` is the cache root for builds
(default ``~/.cache/lightning_dlac``); each build lives in a sub-directory named by a hash of the sources, the
compiler flags and the torch version, so editing a kernel or upgrading torch rebuilds.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import shutil
import threading
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV_IMPL = "DLAC_CODEC_IMPL"
ENV_DIR = "DLAC_EXTENSION_DIR"
IMPLS = ("auto", "ref", "native")

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

_lock = threading.Lock()
_state: dict[str, object] = {"loaded": False, "error": None, "warned": False}


class NativeUnavailable(RuntimeError):
    """The native kernels could not be built or loaded."""


def sources_dir() -> Path:
    """Directory holding the kernel sources: the installed package ``lightning_dlac._cuda_ext``, else the checkout."""
    try:
        path = Path(str(importlib.resources.files("lightning_dlac._cuda_ext")))
        if (path / "dlac_cpu.cpp").is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "cuda_ext"


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
    digest = hashlib.sha256()
    for p in sources + headers:
        digest.update(p.name.encode())
        digest.update(p.read_bytes())
    digest.update(" ".join(CFLAGS + LDFLAGS + CUDA_CFLAGS).encode())
    digest.update(torch.__version__.encode())
    root = Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "lightning_dlac")
    return root / digest.hexdigest()[:16]


def load_native() -> None:
    """Build (once per source hash) and load the native ops into ``torch.ops.dlac``; raise NativeUnavailable."""
    with _lock:
        if _state["loaded"]:
            return
        if _state["error"] is not None:
            raise NativeUnavailable(_state["error"])
        try:
            _build_and_load()
        except NativeUnavailable as e:
            _state["error"] = str(e)
            raise
        _state["loaded"] = True


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


def build_library(sources: list[Path], headers: list[Path], prefix: str = "dlac_native") -> Path:
    """Build ``sources`` (C++ and, if any, CUDA) into a shared library in the cache and load it into this process.

    The build directory is named by a hash of the sources, headers, flags and torch version, so an unchanged
    library is only loaded again. Returns the build directory; raises NativeUnavailable with the build log's tail.
    Also used by ``make cuda-check`` (CUDA sources, no GPU needed) and by the tests' CPU emulation of the device
    pipeline.
    """
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise NativeUnavailable("no C++ compiler found (install g++ or set CXX)")
    directory = build_dir(sources, headers)
    # Several processes (ranks) may get here at once: nothing below may depend on another's files.
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NativeUnavailable(
            f"the build cache {directory} is not a writable directory ({e}); set {ENV_DIR} to one"
        ) from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise NativeUnavailable(f"the build cache {directory} is not a writable directory; set {ENV_DIR} to one")
    name = f"{prefix}_{directory.name}"
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(
            name=name,
            sources=[str(p) for p in sources],
            # Copies: cpp_extension appends torch's link flags to the list it gets, which would change build_dir's
            # hash for every later build in this process (and rebuild unchanged sources in a new directory).
            extra_cflags=list(CFLAGS),
            extra_ldflags=list(LDFLAGS),
            extra_cuda_cflags=list(CUDA_CFLAGS),
            extra_include_paths=[str(sources_dir())],
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - any build failure becomes one explained error
        tail = str(e)[-4000:]
        raise NativeUnavailable(f"building the native DLAC codec in {directory} failed:\n{tail}") from e
    return directory


def native_available() -> bool:
    """True if the native ops load (building them if needed); never raises."""
    try:
        load_native()
        return True
    except NativeUnavailable:
        return False


def resolve_impl(impl: str = "auto") -> str:
    """Map ``impl`` (and ``DLAC_CODEC_IMPL`` when impl is "auto") to "ref" or "native"."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
    if impl == "auto":
        impl = os.environ.get(ENV_IMPL, "auto").strip().lower() or "auto"
        if impl not in IMPLS:
            raise ValueError(f"{ENV_IMPL}={impl!r} is not one of {IMPLS}")
    if impl == "ref":
        return "ref"
    if impl == "native":
        load_native()
        return "native"
    try:
        load_native()
        return "native"
    except NativeUnavailable as e:
        if not _state["warned"]:
            _state["warned"] = True
            warnings.warn(
                f"lightning_dlac: native codec unavailable, using the (slower) reference codec. "
                f"Cause: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
                f"(set {ENV_IMPL}=native to see the full build log). "
                f"Set {ENV_IMPL}=ref to silence this, or {ENV_IMPL}=native to make it an error.",
                RuntimeWarning,
                stacklevel=3,
            )
        return "ref"
