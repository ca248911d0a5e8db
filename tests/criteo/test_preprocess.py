"""`dlac preprocess criteo`: arrays identical to TorchRec's converter, streaming in ranges and blocks, strict
line checks with file and line number, skip-and-count, no finished-looking files after a failure, and the checks
the binary DataModule relies on."""

from __future__ import annotations

import logging
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from lightning_dlac import criteo
from lightning_dlac.commands.cli import main as cli_main
from lightning_dlac.criteo import convert, parser
from lightning_dlac.native import NativeUnavailable
from tests.conftest import native_expected

SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_kaggle_head10k.tsv"
# The native parser must build wherever the codec must (a compiler, no DLAC_TESTS_ALLOW_NO_NATIVE): tests/conftest.py.
needs_native = pytest.mark.skipif(not native_expected(), reason="no C++ compiler, or DLAC_TESTS_ALLOW_NO_NATIVE=1")
IMPLS = [pytest.param("native", marks=needs_native), "ref"]


def _line(rng: random.Random, label: str | None = None) -> str:
    """A valid Criteo line with the shapes real files have: missing fields, negatives, upper-case hex."""
    dense = []
    for _ in range(13):
        r = rng.random()
        dense.append("" if r < 0.2 else str(-rng.randint(1, 3)) if r < 0.25 else str(int(rng.expovariate(1e-3))))
    sparse = []
    for _ in range(26):
        r = rng.random()
        v = "" if r < 0.1 else f"{rng.getrandbits(32):08x}"
        sparse.append(v.upper() if rng.random() < 0.05 else v)
    return "\t".join([label or str(int(rng.random() < 0.25)), *dense, *sparse])


def _write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes("".join(line + end for line in lines).encode())
    return path


def _torchrec(path: Path, out: Path) -> dict[str, np.ndarray]:
    from torchrec.datasets.criteo import BinaryCriteoUtils

    out.mkdir(parents=True, exist_ok=True)
    names = {k: str(out / f"ref_{k}.npy") for k in ("dense", "sparse", "labels")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BinaryCriteoUtils.tsv_to_npys(str(path), names["dense"], names["sparse"], names["labels"])
    return {k: np.load(v) for k, v in names.items()}


def _ours(directory: Path, stem: str) -> dict[str, np.ndarray]:
    return {k: np.load(p) for k, p in zip(("dense", "sparse", "labels"), criteo.binary_paths(directory, stem))}


def _assert_same(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for k in ("dense", "sparse", "labels"):
        assert ours[k].dtype == ref[k].dtype, k
        assert ours[k].shape == ref[k].shape, k
        np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 4 KiB and ranges from 1 byte, so a small file crosses many blocks and every worker gets a range."""
    monkeypatch.setattr(parser, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(convert, "MIN_RANGE_BYTES", 1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("workers", [1, 3])
def test_generated_file_matches_torchrec(tmp_path: Path, impl: str, workers: int, small_blocks: None) -> None:
    rng = random.Random(0)
    lines = [_line(rng) for _ in range(700)]
    lines[5] = "\t".join(["1"] + ["-7"] + [""] * 12 + [""] * 26)  # all missing but one dense: the file minimum
    lines[6] = "\t".join(["0"] + ["2147483600"] * 13 + ["7fffffffffffffff"] * 26)  # near the largest values
    src = _write(tmp_path / "day_3", lines)
    [result] = criteo.preprocess_criteo([src], tmp_path / "out", workers=workers, impl=impl, progress=False)
    assert (result.stem, result.rows, result.bad_lines) == ("day_3", 700, 0)
    _assert_same(_ours(tmp_path / "out", "day_3"), _torchrec(src, tmp_path / "ref"))
    assert not list((tmp_path / "out").glob("*.partial"))


@pytest.mark.parametrize("impl", IMPLS)
def test_crlf_and_missing_final_newline(tmp_path: Path, impl: str) -> None:
    rng = random.Random(1)
    lines = [_line(rng) for _ in range(50)]
    src = tmp_path / "train.txt"
    src.write_bytes(("\r\n".join(lines)).encode())  # CRLF endings, no newline after the last line
    criteo.preprocess_criteo([src], tmp_path / "out", impl=impl, progress=False)
    _assert_same(_ours(tmp_path / "out", "train"), _torchrec(src, tmp_path / "ref"))


@pytest.mark.skipif(not SAMPLE.is_file(), reason="the Criteo sample lives in ../shared/data, outside a fresh clone")
@pytest.mark.parametrize("workers", [1, 2])
def test_criteo_sample_matches_torchrec(tmp_path: Path, workers: int, small_blocks: None) -> None:
    [result] = criteo.preprocess_criteo([SAMPLE], tmp_path / "out", workers=workers, progress=False)
    assert result.rows == 10_000
    _assert_same(_ours(tmp_path / "out", SAMPLE.stem), _torchrec(SAMPLE, tmp_path / "ref"))


_BAD_LINES = {
    "field count": ("1\t2\t3", "expected 40 tab-separated fields", "got 3"),
    "blank line": ("", "a blank line", "got 1"),
    "label": ("2" + "\t" * 39, "the label (field 1) must be 0 or 1, got '2'", ""),
    "empty label": ("\t" * 39, "the label (field 1) must be 0 or 1, got ''", ""),
    "dense": ("0\t1.5" + "\t" * 38, "integer feature int_0 (field 2) is not an integer: '1.5'", ""),
    "bare sign": ("0\t\t+" + "\t" * 37, "integer feature int_1 (field 3) is not an integer: '+'", ""),
    "dense range": ("0" + "\t" * 5 + "2147483648" + "\t" * 34, "int_4 (field 6) is outside the int32 range", ""),
    "hex": ("0" + "\t" * 14 + "xyz" + "\t" * 25, "categorical feature cat_0 (field 15) is not a hex string: 'xyz'", ""),
    "hex range": ("0" + "\t" * 39 + "8000000000000000", "cat_25 (field 40) is 2**63 or more", ""),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", list(_BAD_LINES))
def test_bad_line_stops_with_file_and_line(tmp_path: Path, impl: str, kind: str, small_blocks: None) -> None:
    rng = random.Random(2)
    bad, *expected = _BAD_LINES[kind]
    lines = [_line(rng) for _ in range(300)]
    lines[236] = bad
    src = _write(tmp_path / "day_0", lines)
    out = tmp_path / "out"
    with pytest.raises(criteo.CriteoFormatError) as info:
        criteo.preprocess_criteo([src], out, workers=2, impl=impl, progress=False)
    assert (info.value.path, info.value.line) == (str(src), 237)
    assert f"{src}, line 237: " in str(info.value)
    for text in expected:
        assert text in str(info.value)
    assert list(out.iterdir()) == []  # neither finished-looking files nor leftovers


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("workers", [1, 3])
def test_skip_bad_lines_counts_and_keeps_the_rest(tmp_path: Path, impl: str, workers: int, small_blocks: None) -> None:
    rng = random.Random(3)
    good = [_line(rng) for _ in range(400)]
    lines = list(good)
    for at, (bad, *_) in zip((399, 250, 120, 7), _BAD_LINES.values()):  # bad lines spread over the ranges
        lines.insert(at, bad)
    src = _write(tmp_path / "day_1", lines)
    [result] = criteo.preprocess_criteo([src], tmp_path / "out", workers=workers, impl=impl, skip_bad_lines=True,
                                        progress=False)  # fmt: skip
    assert (result.rows, result.bad_lines) == (400, 4)
    assert result.first_bad_line is not None and f"{src}, line 8: " in result.first_bad_line
    clean = _write(tmp_path / "clean", good)
    _assert_same(_ours(tmp_path / "out", "day_1"), _torchrec(clean, tmp_path / "ref"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", list(_BAD_LINES))
def test_in_memory_reader_applies_the_same_specification(tmp_path: Path, impl: str, kind: str) -> None:
    """One definition of a valid line: read_tsv (CriteoTSVDataModule's reader) stops at the line the converter stops
    at, with the converter's message, and stops before it when max_rows rows come first."""
    rng = random.Random(8)
    bad, *_ = _BAD_LINES[kind]
    lines = [_line(rng) for _ in range(300)]
    lines[200] = bad
    src = _write(tmp_path / "day_4", lines)
    with pytest.raises(criteo.CriteoFormatError) as converter:
        criteo.preprocess_criteo([src], tmp_path / "out", impl=impl, progress=False)
    with pytest.raises(criteo.CriteoFormatError) as reader:
        criteo.read_tsv(src, impl=impl)
    assert str(reader.value) == str(converter.value) and reader.value.line == 201
    assert len(criteo.read_tsv(src, max_rows=200, impl=impl).labels) == 200  # the bad line is never read


@pytest.mark.parametrize("impl", IMPLS)
def test_in_memory_reader_gives_the_converters_rows(tmp_path: Path, impl: str, small_blocks: None) -> None:
    rng = random.Random(9)
    src = _write(tmp_path / "day_5", [_line(rng) for _ in range(500)], end="\r\n")
    rows = criteo.read_tsv(src, impl=impl)
    criteo.preprocess_criteo([src], tmp_path / "out", impl=impl, progress=False)
    ours = _ours(tmp_path / "out", "day_5")
    np.testing.assert_array_equal(rows.labels, ours["labels"][:, 0])
    np.testing.assert_array_equal(rows.sparse, ours["sparse"])
    np.testing.assert_array_equal(criteo.dense_torchrec(rows.dense, rows.dense_min), ours["dense"])
    head = criteo.read_tsv(src, max_rows=123, impl=impl)
    assert head.dense_min == int(rows.dense[:123].min())
    np.testing.assert_array_equal(head.sparse, rows.sparse[:123])


def test_interrupted_run_leaves_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _write(tmp_path / "day_2", [_line(random.Random(4)) for _ in range(100)])

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "_finish_dense", interrupted)
    with pytest.raises(KeyboardInterrupt):
        criteo.preprocess_criteo([src], tmp_path / "out", progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_interrupt_while_converting_stops_every_worker_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_blocks: None
) -> None:
    import tqdm

    src = _write(tmp_path / "day_2", [_line(random.Random(4)) for _ in range(2000)])
    calls = []

    def interrupted(self: object, n: int = 1) -> None:
        calls.append(n)
        if len(calls) == 3:  # a few blocks in, as Ctrl-C would land
            raise KeyboardInterrupt

    monkeypatch.setattr(tqdm.tqdm, "update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        criteo.preprocess_criteo([src], tmp_path / "out", workers=2, progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def _mutate(rng: random.Random, line: str) -> str:
    chars = list(line)
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        i = rng.randrange(len(chars) + 1)
        if op < 0.4:
            chars.insert(i, rng.choice("\t-+0123456789abcdefABCDEFgx. \r"))
        elif chars and op < 0.8:
            chars.pop(min(i, len(chars) - 1))
        else:
            chars.insert(i, rng.choice(["99999999999", "0000000000012", "ffffffffffffffff", "0" * 20 + "1f"]))
    return "".join(chars)


@needs_native
def test_native_parser_agrees_with_the_python_specification() -> None:
    native = parser.resolve_parser("native")
    rng = random.Random(5)
    lines = []
    for _ in range(3000):
        line = _line(rng)
        lines.append(_mutate(rng, line) if rng.random() < 0.5 else line)
    data = ("\n".join(lines) + "\n").encode()
    for skip in (False, True):
        offset = 0
        while offset < len(data):
            outs = []
            for chosen in (native, parser.REFERENCE):
                bufs = (np.zeros((5000, 13), np.int32), np.zeros((5000, 26), np.int64), np.zeros((5000, 1), np.int32))
                view = memoryview(data)[offset:]
                outs.append((chosen.parse(view, len(view), *bufs, skip, True), bufs))
            (t_native, b_native), (t_python, b_python) = outs
            assert t_native[:7] == t_python[:7]  # rows, lines, bytes, bad, dense min, error code and line
            if t_native[5]:
                assert t_native[7:] == t_python[7:]
            rows = t_native[0]
            for a, b in zip(b_native, b_python):
                np.testing.assert_array_equal(a[:rows], b[:rows])
            offset += t_native[2]
            if t_native[5] and not skip:  # stopped before the bad line: step over it
                offset = data.index(b"\n", offset) + 1


def test_reference_fallback_warns_once_and_only_the_codec_words_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(parser.ENV_IMPL, raising=False)
    monkeypatch.setitem(parser._LIBRARY.state, "loaded", False)
    monkeypatch.setitem(parser._LIBRARY.state, "error", "building the native Criteo parser failed: no compiler")
    monkeypatch.setitem(parser._LIBRARY.state, "warned", False)
    with pytest.warns(RuntimeWarning, match="native Criteo parser unavailable, using the reference parser"):
        assert parser.resolve_parser("auto") is parser.REFERENCE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parser.resolve_parser("auto") is parser.REFERENCE  # warned once only
        assert parser.resolve_parser("ref") is parser.REFERENCE
    with pytest.raises(NativeUnavailable, match="no compiler"):
        parser.resolve_parser("native")
    # The codec's words: auto | native | ref, from the argument or DLAC_PREPROCESS_IMPL; nothing else.
    with pytest.raises(ValueError, match=r"impl='python' is not one of \('auto', 'ref', 'native'\)"):
        parser.resolve_parser("python")
    monkeypatch.setenv(parser.ENV_IMPL, "fast")
    with pytest.raises(ValueError, match=r"DLAC_PREPROCESS_IMPL='fast' is not one of \('auto', 'ref', 'native'\)"):
        parser.resolve_parser("auto")


def test_cli(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lightning_dlac.criteo")  # the command reports through logging
    rng = random.Random(6)
    a = _write(tmp_path / "day_0", [_line(rng) for _ in range(64)])
    b = _write(tmp_path / "day_1", [_line(rng) for _ in range(32)])
    cli_main(["preprocess", "criteo", "--output", str(tmp_path / "bin"), "--workers", "2", "--no-progress", str(a),
              str(b)])  # fmt: skip
    assert criteo.check_criteo_binary(tmp_path / "bin", "day_0") == 64
    assert criteo.check_criteo_binary(tmp_path / "bin", "day_1") == 32
    assert "day_1_{dense,sparse,labels}.npy: 32 rows" in caplog.text
    # A second run refuses to overwrite, with a one-line error and status 1.
    with pytest.raises(SystemExit) as info:
        cli_main(["preprocess", "criteo", "--output", str(tmp_path / "bin"), "--no-progress", str(a)])
    assert info.value.code == 1
    assert "already exists; pass --overwrite" in caplog.text
    bad = _write(tmp_path / "broken.tsv", ["1\t2"])
    with pytest.raises(SystemExit):
        cli_main(["preprocess", "criteo", "-o", str(tmp_path / "bin2"), "--skip-bad-lines", "--no-progress", str(bad)])
    assert "none of its 1 lines is a valid Criteo row" in caplog.text


@pytest.mark.parametrize(
    "name, problem",
    [("x.gz", "decompress it first"), ("missing", "not found")],
)
def test_rejected_inputs(tmp_path: Path, name: str, problem: str) -> None:
    src = tmp_path / name
    if name.endswith(".gz"):
        src.write_bytes(b"\x1f\x8b")
    with pytest.raises((ValueError, FileNotFoundError), match=problem):
        criteo.preprocess_criteo([src], tmp_path / "out", progress=False)


def _binary(tmp_path: Path, rows: int = 20) -> Path:
    src = _write(tmp_path / "day_0", [_line(random.Random(7)) for _ in range(rows)])
    criteo.preprocess_criteo([src], tmp_path / "bin", progress=False)
    return tmp_path / "bin"


def test_check_criteo_binary_names_the_file_and_problem(tmp_path: Path) -> None:
    directory = _binary(tmp_path)
    dense, sparse, labels = criteo.binary_paths(directory, "day_0")
    assert criteo.check_criteo_binary(directory, "day_0") == 20

    np.save(labels, np.zeros((19, 1), np.int32))
    with pytest.raises(ValueError, match=r"disagree on the row count .*day_0_labels.npy: 19"):
        criteo.check_criteo_binary(directory, "day_0")
    np.save(labels, np.zeros((20, 1), np.int64))
    with pytest.raises(ValueError, match=r"day_0_labels.npy holds int64, expected int32"):
        criteo.check_criteo_binary(directory, "day_0")
    np.save(labels, np.zeros((20, 2), np.int32))
    with pytest.raises(ValueError, match=r"day_0_labels.npy has shape \(20, 2\), expected a C-order \[N, 1\]"):
        criteo.check_criteo_binary(directory, "day_0")
    np.save(labels, np.zeros((20, 1), np.int32))
    sparse.write_bytes(sparse.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"day_0_sparse.npy is truncated"):
        criteo.check_criteo_binary(directory, "day_0")
    sparse.write_bytes(b"not an npy file")
    with pytest.raises(ValueError, match=r"day_0_sparse.npy is not a valid .npy file"):
        criteo.check_criteo_binary(directory, "day_0")
    dense.unlink()
    with pytest.raises(FileNotFoundError, match=r"day_0_dense.npy not found. Create it with `dlac preprocess"):
        criteo.check_criteo_binary(directory, "day_0")
