"""The configuration reference (docs/configuration.md) lists every option of the public classes with the defaults
the code has, and names for every option the test that proves it changes a run."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_dlac import DLACCallback, DLACStrategy

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
LIGHTNING_FILLED = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin"}


def _section(cls: type) -> str:
    return DOC.read_text().split(f"### {cls.__name__}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]


def _documented(cls: type) -> dict[str, str]:
    return dict(re.findall(r"^\| `(\w+)` \| `(.*?)` \|", _section(cls), flags=re.M))


def _tested_by(cls: type) -> dict[str, str]:
    """{option: the last cell of its row} for every option row of the class's table."""
    return {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \| .* \| ([^|]*) \|$", _section(cls), flags=re.M)}


@functools.cache
def _test_functions(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def _default(p: inspect.Parameter) -> str:
    d = p.default
    return f"'{int(d.total_seconds())} s'" if isinstance(d, timedelta) else repr(d)


@pytest.mark.parametrize("cls", [DLACStrategy, DLACCallback])
def test_configuration_reference_matches_the_code(cls: type) -> None:
    code = {
        name: _default(p)
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and name not in LIGHTNING_FILLED
    }
    assert _documented(cls) == code


@pytest.mark.parametrize("cls", [DLACStrategy, DLACCallback])
def test_every_option_has_a_docstring_entry(cls: type) -> None:
    doc = inspect.getdoc(cls)
    names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    missing = [n for n in names if not re.search(rf"^    {n}: ", doc.split("Args:", 1)[1], flags=re.M)]
    assert not missing, f"{cls.__name__} docstring lacks Args entries for {missing}"


def test_every_option_names_the_test_that_proves_it_and_that_test_exists() -> None:
    named: dict[str, str] = {}
    for cls in (DLACStrategy, DLACCallback):
        tested = _tested_by(cls)
        assert set(tested) == set(_documented(cls)), f"{cls.__name__}: rows without a 'tested by' cell"
        for option, cell in tested.items():
            match = re.fullmatch(r"\s*`(tests/[\w/]+\.py)::(test_\w+)`\s*", cell)
            assert match, f"{cls.__name__}.{option}: 'tested by' must be `tests/<file>.py::<test>`, got {cell!r}"
            path, test = ROOT / match[1], match[2]
            assert path.is_file(), f"{cls.__name__}.{option}: {match[1]} does not exist"
            assert test in _test_functions(path), f"{cls.__name__}.{option}: {match[1]} has no {test}"
            named[f"{cls.__name__}.{option}"] = f"{match[1]}::{test}"
    shared = {t for t in named.values() if list(named.values()).count(t) > 1}
    assert not shared, f"one test per option: {sorted(o for o, t in named.items() if t in shared)} share a test"


@pytest.mark.parametrize("requirements", ["cpu.txt", "cuda.txt"])
def test_each_install_recipe_pins_the_test_extras(requirements: str) -> None:
    """The suite runs with --strict-markers: without pytest-timeout (a test extra) the modules that mark a timeout do
    not collect. Both installs the README gives (CPU, GPU) must bring every test extra of pyproject.toml."""
    extras = re.search(r"^test = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), flags=re.M | re.S)
    assert extras, "pyproject.toml has no [project.optional-dependencies] test list"
    names = [name.strip().strip('"') for name in extras[1].split(",") if name.strip()]
    wanted = {re.split(r"[<>=!~\[ ]", name)[0].lower() for name in names}
    pinned = {re.split(r"[<>=!~\[ ]", line)[0].lower()
              for line in (ROOT / "requirements" / requirements).read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert wanted and wanted <= pinned, f"requirements/{requirements} lacks {sorted(wanted - pinned)}"
