"""The GPU codec benchmark's MX4 baseline (``python -m benchmarks.cuda_codec_bench``), without a GPU: where it finds
fbgemm's Triton kernels (an installed fbgemm_gpu located without importing it, or $DLAC_FBGEMM_TRITON), how it loads
them as a standalone package, and the reason it gives where it cannot (the GPU image has no fbgemm; its row must say so,
not vanish)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

import benchmarks.cuda_codec_bench as bench
from benchmarks.lib.cuda_codec import DESTS, DIM, TABLES, Table, max_error_over_range


def test_an_installed_fbgemm_gpu_is_found_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("fbgemm_gpu") is None:
        pytest.skip("fbgemm_gpu is not installed here")
    monkeypatch.delenv(bench.FBGEMM_TRITON_ENV, raising=False)
    # As on the GPU image: importing fbgemm_gpu would load its native libraries, which that image lacks.
    if "fbgemm_gpu" in sys.modules:
        monkeypatch.delitem(sys.modules, "fbgemm_gpu")
    where, said = bench.fbgemm_triton_dir()
    assert where is not None and where.parts[-2:] == ("fbgemm_gpu", "triton") and (where / "quantize.py").is_file()
    assert said == f"fbgemm_gpu's {where}" and "fbgemm_gpu" not in sys.modules


def test_a_wrong_dlac_fbgemm_triton_says_what_it_lacks_and_what_to_point_it_at(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "common.py").write_text("")
    monkeypatch.setenv(bench.FBGEMM_TRITON_ENV, str(tmp_path))
    assert bench.fbgemm_triton_dir() == (None, f"{bench.FBGEMM_TRITON_ENV}={tmp_path} has no quantize.py: point it at"
                                               " fbgemm_gpu/triton (the directory holding quantize.py and common.py)")
    kernels, why = bench.load_mx4_kernels()
    assert kernels is None and "has no quantize.py" in why


def test_without_fbgemm_or_the_variable_the_reason_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(bench.FBGEMM_TRITON_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    where, why = bench.fbgemm_triton_dir()
    assert where is None and why.startswith("fbgemm_gpu is not installed and DLAC_FBGEMM_TRITON is not set")


def test_the_kernels_load_as_a_standalone_package_whose_relative_import_resolves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in of fbgemm's layout (quantize.py importing from .common, an __init__.py that must not run) and of
    Triton (absent here): the loader imports quantize.py under its own package name."""
    (tmp_path / "__init__.py").write_text("raise RuntimeError('the package __init__ ran')\n")
    (tmp_path / "common.py").write_text("class RoundingMode:\n    even = 2\n")
    (tmp_path / "quantize.py").write_text("import triton\nfrom .common import RoundingMode\n\n"
                                          "def triton_quantize_mx4(a, *args, **kwargs):\n    return a\n")
    monkeypatch.setenv(bench.FBGEMM_TRITON_ENV, str(tmp_path))
    kernels, why = bench.load_mx4_kernels("_fbgemm_triton_test")
    if importlib.util.find_spec("triton") is None:
        assert kernels is None and why == f"Triton is not installed (kernels at {bench.FBGEMM_TRITON_ENV}={tmp_path})"
        triton = types.ModuleType("triton")
        triton.__spec__ = importlib.machinery.ModuleSpec("triton", None)
        monkeypatch.setitem(sys.modules, "triton", triton)
    try:
        kernels, why = bench.load_mx4_kernels("_fbgemm_triton_test")
        assert kernels is not None and why == f"{bench.FBGEMM_TRITON_ENV}={tmp_path}"
        assert kernels.__name__ == "_fbgemm_triton_test.quantize" and kernels.RoundingMode.even == 2
    finally:
        for name in ("_fbgemm_triton_test", "_fbgemm_triton_test.quantize", "_fbgemm_triton_test.common"):
            sys.modules.pop(name, None)


def test_the_error_column_is_the_worst_chunk_over_its_own_range() -> None:
    x = torch.zeros(DESTS * 2, TABLES * DIM)
    x[:2, : DIM] = torch.tensor([0.0, 4.0]).repeat(DIM // 2)  # destination 0, table 0: range 4
    y = x.clone()
    y[0, 1] += 1.0  # an error of 1 in that chunk: 1 / 4
    assert max_error_over_range(x, y) == pytest.approx(0.25)
    assert max_error_over_range(x, x) == 0.0


def test_codecs_not_measured_are_printed_and_kept_in_the_json(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    metadata = {"command": "python -m benchmarks.cuda_codec_bench", "date": "2026-12-04T18:00:00+00:00"}
    table = Table(tmp_path / "bench.json", metadata, {"device": "cpu"})
    table.skip("zipf", bench.MX4, "no GPU")
    table.skip("criteo", bench.MX4, "no GPU")
    assert "zipf: mx4 (fbgemm triton) not measured (no GPU)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["not_measured"][1] == {"payload": "criteo", "codec": bench.MX4, "reason": "no GPU"}
    assert Table.not_measured_lines(saved["not_measured"]) == [
        "- mx4 (fbgemm triton) not measured on zipf, criteo: no GPU"]


def test_an_mx4_row_is_measured_through_the_loaded_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's path after the kernels load (on a GPU, Triton's): here fbgemm's Python reference of the same
    format stands in for them, on a host backend timed by the wall clock."""
    quantize_ref = pytest.importorskip("fbgemm_gpu.triton.quantize_ref")
    from fbgemm_gpu.triton.common import RoundingMode

    kernels = types.SimpleNamespace(triton_quantize_mx4=quantize_ref.py_quantize_mx4,
                                    triton_dequantize_mx4=quantize_ref.py_dequantize_mx4, RoundingMode=RoundingMode)
    monkeypatch.setattr(bench, "load_mx4_kernels", lambda: (kernels, "a stand-in"))
    be = bench.Backend(emulate=True, repeat=1)
    be.emulate = False  # past the --emulate refusal; seconds() would use CUDA events, so time with the wall clock
    monkeypatch.setattr(be, "seconds", lambda fn, repeat=None: (fn(), 1e-3)[1])
    metadata = {"command": "python -m benchmarks.cuda_codec_bench", "date": "2026-12-04T18:00:00+00:00"}
    table = Table(tmp_path / "bench.json", metadata, {"device": "cpu"})
    x = torch.randn(DESTS * 2, TABLES * DIM)
    bench.bench_mx4(table, be, "zipf", x)
    (row,) = table.rows
    assert row["codec"] == bench.MX4 and row["ratio"] == pytest.approx(128 / 17)  # 4.25 bits a value
    assert row["encode_gbps"] == pytest.approx(x.numel() * 4 / 1e9 / 1e-3) and 0 < row["max_err_range"] < 0.5
    assert row["kernels"] == "a stand-in" and not table.not_measured
