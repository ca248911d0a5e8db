"""The suite's own rules (tests/conftest.py), checked on an inner pytest session that uses the same conftest: a test
that starts a process must be marked slow, and the native implementations are pinned whatever the shell says."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

pytest_plugins = ["pytester"]


@pytest.mark.slow  # its inner tests start processes
def test_a_test_that_starts_a_process_fails_unless_it_is_marked_slow(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(
        test_inner='''
        import multiprocessing
        import subprocess
        import sys

        import pytest


        def test_unmarked_subprocess():
            subprocess.run([sys.executable, "-c", "pass"], check=True)


        def test_unmarked_multiprocessing():
            p = multiprocessing.get_context("spawn").Process(target=print)
            p.start()
            p.join()


        @pytest.mark.slow
        def test_marked_subprocess():
            subprocess.run([sys.executable, "-c", "pass"], check=True)


        def test_unmarked_without_processes():
            assert sum(range(4)) == 6
        ''',
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*test_unmarked_subprocess started 1 process(es) in its call (subprocess *python* -c pass) but is not marked*",
        "*test_unmarked_multiprocessing started 1 process(es) in its call (a SpawnProcess (multiprocessing))*",
    ])  # fmt: skip


def test_the_suite_pins_the_native_implementations_over_the_shell(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import native_expected

    if not native_expected():
        pytest.skip("no C++ compiler, or DLAC_TESTS_ALLOW_NO_NATIVE=1: the shell's values stand")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_inner='''
        import os


        def test_env():
            assert os.environ["DLAC_CODEC_IMPL"] == os.environ["DLAC_PREPROCESS_IMPL"] == "native"
        ''',
    )
    monkeypatch.setenv("DLAC_CODEC_IMPL", "ref")
    monkeypatch.setenv("DLAC_PREPROCESS_IMPL", "auto")
    with pytest.warns(UserWarning, match="the test suite runs the native code: it ignores .*'DLAC_CODEC_IMPL': 'ref'"):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
