"""Building, loading and choosing this package's native code (``cuda_ext/``): one helper for both native libraries.

Two libraries are JIT-built from ``cuda_ext/`` with ``torch.utils.cpp_extension``: the codec's kernels
(:mod:`lightning_dlac.codec._loader`) and the Criteo TSV parser (:mod:`lightning_dlac.criteo.parser`). Both are
built the same way and chosen with the same words:

- :func:`build_extension` compiles sources into the cache (``DLAC_EXTENSION_DIR``, default
  ``~/.cache/lightning_dlac``), in a directory named by a hash of the sources, the flags and the torch version, so
  editing a source or upgrading torch rebuilds and an unchanged library is only loaded again. A failure raises
  :class:`NativeUnavailable` with the cause (no compiler, an unwritable cache, the build log's tail).
- :class:`NativeLibrary` builds one library at most once per process (the outcome, success or error, is kept) and
  resolves a choice: ``"auto"`` (native if it builds, else one warning and the pure-Python reference), ``"native"``
  (fail with the build log) or ``"ref"``. An environment variable (``DLAC_CODEC_IMPL``, ``DLAC_PREPROCESS_IMPL``)
  decides when the caller says ``"auto"``.

Nothing here imports torch at module level: ``dlac preprocess --help`` stays instant.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import os
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ENV_DIR = "DLAC_EXTENSION_DIR"
# The choice of implementation, in every place that offers one.
IMPLS = ("auto", "ref", "native")


class NativeUnavailable(RuntimeError):
    """A native library could not be built or loaded."""


def sources_dir() -> Path:
    """The directory holding the native sources.

    Returns:
        The installed package ``lightning_dlac._cuda_ext``, else the checkout's ``cuda_ext/``.
    """
    try:
        path = Path(str(importlib.resources.files("lightning_dlac._cuda_ext")))
        if (path / "dlac_cpu.cpp").is_file():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "cuda_ext"


def cache_root() -> Path:
    """Where builds are cached.

    Returns:
        ``$DLAC_EXTENSION_DIR``, else ``~/.cache/lightning_dlac``.
    """
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "lightning_dlac")


def build_dir(files: Sequence[Path], flags: Sequence[str], prefix: str = "") -> Path:
    """The cache directory of a build of ``files`` with ``flags``.

    The paths count because torch's build file names them (the sources, the include directories): two checkouts
    with identical sources sharing one directory would each find the other's build file different and rebuild,
    replacing the library under the other's running processes.

    Args:
        files: Every file of the build (sources and headers), read for the hash.
        flags: The compiler and linker flags.
        prefix: Prefix of the directory's name.

    Returns:
        ``<cache>/<prefix><16 hex digits>``, the digits a hash of the files' paths and bytes, the flags and the torch
        version.
    """
    import torch

    digest = hashlib.sha256()
    for p in files:
        digest.update(str(Path(p).resolve()).encode())
        digest.update(p.read_bytes())
    digest.update(" ".join(flags).encode())
    digest.update(torch.__version__.encode())
    return cache_root() / f"{prefix}{digest.hexdigest()[:16]}"


def build_extension(
    what: str,
    name: str,
    sources: Sequence[Path],
    headers: Sequence[Path] = (),
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    cuda_cflags: Sequence[str] = (),
    include_dirs: Sequence[Path] = (),
    dir_prefix: str = "",
    python_module: bool = False,
) -> tuple[Path, Any]:
    """Build ``sources`` (C++ and, if any, CUDA) into the cache and load the result into this process.

    Args:
        what: What is built, for messages ("native DLAC codec").
        name: Prefix of the extension's name; the build's hash is appended (``<name>_<hash>``).
        sources: Files to compile.
        headers: Files the sources include: part of the hash, not compiled.
        cflags: C++ compiler flags.
        ldflags: Linker flags.
        cuda_cflags: nvcc flags (used only when ``sources`` hold ``.cu`` files).
        include_dirs: Extra include directories.
        dir_prefix: Prefix of the cache directory's name.
        python_module: Load the result as a Python module (pybind11) and return it; else load it as a plain library
            (ops registered with ``TORCH_LIBRARY``) and return None.

    Returns:
        The build directory and the module (None unless ``python_module``).

    Raises:
        NativeUnavailable: No compiler, an unusable cache directory, or a failed build (with the build log's tail).
    """
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise NativeUnavailable("no C++ compiler found (install g++ or set CXX)")
    directory = build_dir([*sources, *headers], [*cflags, *ldflags, *cuda_cflags], dir_prefix)
    # Several processes (ranks) may get here at once: nothing below may depend on another's files.
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NativeUnavailable(
            f"the build cache {directory} is not a writable directory ({e}); set {ENV_DIR} to one"
        ) from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise NativeUnavailable(f"the build cache {directory} is not a writable directory; set {ENV_DIR} to one")
    from torch.utils import cpp_extension

    try:
        with _build_lock(directory):
            module = cpp_extension.load(
                name=f"{name}_{directory.name[len(dir_prefix):]}",
                sources=[str(p) for p in sources],
                # Copies: cpp_extension appends torch's link flags to the list it gets, which would change build_dir's
                # hash for every later build in this process (and rebuild unchanged sources in a new directory).
                extra_cflags=list(cflags),
                extra_ldflags=list(ldflags),
                extra_cuda_cflags=list(cuda_cflags),
                extra_include_paths=[str(p) for p in include_dirs],
                build_directory=str(directory),
                is_python_module=python_module,
                verbose=False,
            )
    except Exception as e:  # noqa: BLE001 - any build failure becomes one explained error
        tail = str(e)[-4000:]
        raise NativeUnavailable(f"building the {what} in {directory} failed:\n{tail}") from e
    return directory, module if python_module else None


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` while torch builds and loads in it.

    Before torch 2.14, torch's own lock (``directory/lock``, a ``FileBaton``: a file that exists while a process
    builds) outlives a builder killed with SIGKILL, and every later build then waits for it forever: a restarted job
    would hang before its first step. The kernel drops a ``flock`` when its holder dies, so whoever holds this one
    knows that a ``lock`` file left in the directory belongs to no live builder, and removes it. From torch 2.14 that
    file is itself an OS lock that the kernel releases (a ``FileLock``; the file stays after every build): it is left
    alone, since it blocks nobody.
    """
    import fcntl

    from torch.utils import cpp_extension

    baton = not hasattr(cpp_extension, "FileLock")  # torch < 2.14: the lock is a file whose existence blocks
    with open(directory / "dlac_build.flock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if baton and stale.exists():
                warnings.warn(f"removing {stale}, left by a build that was killed", stacklevel=3)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class NativeLibrary:
    """One native library and the choice between it and its pure-Python reference.

    The library is built at most once per process: :meth:`load` keeps the outcome (the loaded module, or the error,
    raised again on every later call) in :attr:`state`, guarded by a lock. :meth:`choose` maps ``"auto"`` |
    ``"native"`` | ``"ref"`` (and, for ``"auto"``, the environment variable ``env_impl``) to ``"native"`` or ``"ref"``:
    in auto mode a library that does not build gives one warning per process naming the cause, then the reference.

    Args:
        what: The library, for messages ("native codec").
        env_impl: Environment variable that decides when the caller says ``"auto"``.
        build: Builds and loads the library; returns what :meth:`load` hands out; raises NativeUnavailable.
        fallback: The reference, for the warning ("the (slower) reference codec").
    """

    def __init__(
        self,
        what: str,
        env_impl: str,
        build: Callable[[], Any],
        fallback: str,
    ) -> None:
        self.what = what
        self.env_impl = env_impl
        self.fallback = fallback
        self._build = build
        self._lock = threading.Lock()
        # "loaded": built and loaded; "module": what build returned; "error": the build's error message once it
        # failed; "warned": the auto-mode fallback warning was given.
        self.state: dict[str, Any] = {"loaded": False, "module": None, "error": None, "warned": False}

    def load(self) -> Any:
        """Build (once per process) and load the library.

        Returns:
            What ``build`` returned.

        Raises:
            NativeUnavailable: If the library does not build or load (again on every later call, with the first
                error's message).
        """
        with self._lock:
            if self.state["loaded"]:
                return self.state["module"]
            if self.state["error"] is not None:
                raise NativeUnavailable(self.state["error"])
            try:
                module = self._build()
            except NativeUnavailable as e:
                self.state["error"] = str(e)
                raise
            self.state["module"] = module
            self.state["loaded"] = True
            return module

    def available(self) -> bool:
        """Whether the library loads, building it if needed; never raises.

        Returns:
            True if it loads.
        """
        try:
            self.load()
            return True
        except NativeUnavailable:
            return False

    def normalize(self, value: str, source: str = "impl") -> str:
        """Check that ``value`` is one of :data:`IMPLS`.

        Args:
            value: The choice.
            source: Where it came from (``"impl"``, the environment variable), for the message.

        Returns:
            ``value``.

        Raises:
            ValueError: If ``value`` is not one of :data:`IMPLS`.
        """
        if value not in IMPLS:
            raise ValueError(f"{source}={value!r} is not one of {IMPLS}")
        return value

    def choose(self, impl: str = "auto") -> str:
        """Map ``impl`` (and the environment variable when it is ``"auto"``) to ``"ref"`` or ``"native"``.

        In auto mode a library that does not build gives one warning per process naming the cause, then the
        reference.

        Args:
            impl: ``"auto"``, ``"ref"`` or ``"native"``.

        Returns:
            ``"ref"`` or ``"native"``.

        Raises:
            ValueError: If ``impl``, or the environment variable, is not one of :data:`IMPLS`.
            NativeUnavailable: If the choice is ``"native"`` and the library does not build.
        """
        impl = self.normalize(impl)
        if impl == "auto":
            impl = self.normalize(os.environ.get(self.env_impl, "auto").strip().lower() or "auto", self.env_impl)
        if impl == "ref":
            return "ref"
        if impl == "native":
            self.load()
            return "native"
        try:
            self.load()
            return "native"
        except NativeUnavailable as e:
            if not self.state["warned"]:
                self.state["warned"] = True
                env = self.env_impl
                warnings.warn(
                    f"lightning_dlac: {self.what} unavailable, using {self.fallback}. "
                    f"Cause: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
                    f"(set {env}=native to see the full build log). "
                    f"Set {env}=ref to silence this, or {env}=native to make it an error.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return "ref"
