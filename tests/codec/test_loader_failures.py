"""Real build failures of the native codec, each in a fresh process (the loader caches its outcome per process):
auto mode warns once naming the cause and falls back to the reference; native mode fails with the cause (and the
build log's tail when the compiler ran)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ALLOW_NO_NATIVE, compiler_present

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import warnings, torch
    from lightning_dlac.codec import _loader, decode, encode
    {patch}
    x = torch.randn(32, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = decode(encode(x, eps=0.01))          # auto: falls back, still correct
        decode(encode(x, eps=0.01))              # ... and warns only once
    assert (x - y).abs().max() <= 0.01 * (x.max() - x.min()) + 1e-6
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    print("WARNINGS", len(messages))
    print("AUTO", messages[0] if messages else "")
    try:
        encode(x, eps=0.01, impl="native")
        print("NATIVE ok")
    except _loader.NativeUnavailable as e:
        print("NATIVE", str(e)[-3000:])
    """
)


def _run(tmp_path: Path, patch: str = "", **env: str) -> str:
    full_env = {**os.environ, "DLAC_EXTENSION_DIR": str(tmp_path / "cache"), **env}
    full_env.pop("DLAC_CODEC_IMPL", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(patch=patch)], cwd=REPO, env=full_env, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # a fresh Python process that imports torch
def test_no_compiler(tmp_path: Path) -> None:
    out = _run(tmp_path, CXX=str(tmp_path / "no-such-c++"))
    assert "WARNINGS 1" in out
    assert "native codec unavailable, using the (slower) reference codec. Cause: no C++ compiler found" in out
    assert "NATIVE no C++ compiler found (install g++ or set CXX)" in out


@pytest.mark.slow  # a fresh Python process that imports torch
def test_unusable_cache_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    out = _run(tmp_path, DLAC_EXTENSION_DIR=str(blocker))
    assert "WARNINGS 1" in out
    assert f"Cause: the build cache {blocker}/" in out and "is not a writable directory" in out
    assert "set DLAC_EXTENSION_DIR to one" in out


@pytest.mark.slow  # a fresh Python process that imports torch
def test_compile_error_shows_the_build_log(tmp_path: Path) -> None:
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "dlac_cpu.cpp").write_text("this is not C++;\n")  # no torch headers: fails in a second
    patch = f"_loader.sources_dir = lambda: __import__('pathlib').Path({str(broken)!r})"
    out = _run(tmp_path, patch=patch)
    assert "WARNINGS 1" in out and "Cause: building the native DLAC codec in" in out
    native = out.split("NATIVE", 1)[1]
    assert "failed:" in native and "error" in native.lower()  # the compiler's own message, from the log's tail


@pytest.mark.slow  # a fresh Python process that imports torch
def test_sources_that_build_but_register_no_ops(tmp_path: Path) -> None:
    empty = tmp_path / "src"
    empty.mkdir()
    (empty / "dlac_cpu.cpp").write_text("int dlac_nothing_here = 0;\n")
    patch = f"_loader.sources_dir = lambda: __import__('pathlib').Path({str(empty)!r})"
    out = _run(tmp_path, patch=patch)
    assert "WARNINGS 1" in out and "does not provide the dlac ops" in out


# The `native` fixture of the codec tests (tests/codec/conftest.py): a real build failure in a fresh pytest, and its
# skip conditions in this process.
NATIVE_TEST = "tests/codec/test_codec_grid.py::test_grid_native_equals_reference"


@pytest.mark.slow  # a fresh Python process that imports torch
def test_a_broken_native_build_fails_the_suite_where_a_compiler_exists(tmp_path: Path) -> None:
    if not compiler_present():
        pytest.skip("needs a C++ compiler: the case is a build failure with one present")
    blocker = tmp_path / "not-a-directory"  # the build cannot write its cache: a build failure, compiler present
    blocker.write_text("a file where the cache directory should be")
    env = {k: v for k, v in os.environ.items() if k not in ("DLAC_CODEC_IMPL", ALLOW_NO_NATIVE)}
    env["DLAC_EXTENSION_DIR"] = str(blocker)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", NATIVE_TEST],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "failed to build although a C++ compiler is present" in out, out
    assert "is not a writable directory" in out, out  # the loader's own message, from the build log


@pytest.mark.parametrize(
    ("cxx", "allow", "outcome"),
    [
        ("c++", "", "fail"),
        ("c++", "1", "skip"),  # DLAC_TESTS_ALLOW_NO_NATIVE=1
        ("no-such-c++", "", "skip"),  # no compiler
    ],
)
def test_the_native_fixture_skips_only_without_a_compiler_or_with_the_opt_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cxx: str, allow: str, outcome: str
) -> None:
    from conftest import require_native

    from lightning_dlac.codec import _loader

    if cxx == "c++" and not compiler_present():
        pytest.skip("needs a C++ compiler")
    monkeypatch.setenv("CXX", cxx if cxx == "c++" else str(tmp_path / cxx))
    monkeypatch.setenv(ALLOW_NO_NATIVE, allow)
    monkeypatch.setitem(_loader._state, "loaded", False)
    monkeypatch.setitem(_loader._state, "error", "building the native DLAC codec in /x failed: error: boom")
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected) as info:
        require_native()
    assert "boom" in str(info.value)


@pytest.mark.slow  # a fresh Python process that imports torch
def test_a_build_lock_left_by_a_killed_builder_does_not_block_later_builds() -> None:
    """A process killed while it JIT-builds (SIGKILL, an OOM kill, a scheduler's timeout) leaves torch's ``lock``
    file in the build directory; every later build of the same sources must get past it, not wait forever. Before
    torch 2.14 the file's existence blocks (a FileBaton), and the loader removes it with a warning; from 2.14 it is an
    OS lock the kernel released (a FileLock, which stays after every build), and the loader leaves it without a word
    (it used to warn on every load of every process)."""
    from torch.utils import cpp_extension

    from tests.conftest import native_expected

    if not native_expected():
        pytest.skip("no C++ compiler here (or DLAC_TESTS_ALLOW_NO_NATIVE): nothing is built")
    from lightning_dlac.codec import _loader

    _loader.load_native()  # the cached build the next process loads
    lock = _loader.build_dir(*_loader._sources()) / "lock"
    lock.write_text("")  # what torch's FileBaton leaves when its holder is killed (a FileLock, after any build)
    try:
        load = "from lightning_dlac.codec import _loader; _loader.load_native(); print('loaded')"
        done = subprocess.run([sys.executable, "-c", load], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=240)  # fmt: skip
    finally:
        lock.unlink(missing_ok=True)
    assert done.returncode == 0 and "loaded" in done.stdout, done.stdout[-4000:]
    baton = not hasattr(cpp_extension, "FileLock")
    assert ("left by a build that was killed" in done.stdout) == baton, done.stdout[-4000:]
