"""The configuration reference (docs/configuration.md) lists every option of the public classes with the defaults
the code has, the fields of DLACStrategy's config objects included, and names for every option the test that proves
it changes a run."""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_dlac import CheckpointOptions, CompressionOptions, DLACCallback, DLACStrategy, ShardingOptions

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
LIGHTNING_FILLED = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin"}
# DLACStrategy's config parameters, documented by their classes' own sections; their rows name no test of their own.
CONFIG_OBJECTS = {"sharding": ShardingOptions, "compression": CompressionOptions, "checkpointing": CheckpointOptions}
CLASSES = [DLACStrategy, *CONFIG_OBJECTS.values(), DLACCallback]
SEE_FIELDS = "its fields, below"


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


def _shown(d: object) -> str:
    """A default as the reference writes it: a timedelta in seconds, an enum by its value, a config object that is
    its class's default as ``Class()``."""
    if isinstance(d, timedelta):
        return f"'{int(d.total_seconds())} s'"
    if isinstance(d, enum.Enum):
        return repr(d.value)
    if dataclasses.is_dataclass(d) and not isinstance(d, type):
        assert d == type(d)(), f"the default {d!r} is not {type(d).__name__}()"
        return f"{type(d).__name__}()"
    return repr(d)


def _options(cls: type) -> dict[str, str]:
    """{option: its default as the reference writes it}: a config object's fields, a class's constructor arguments
    (those Lightning fills, and the deprecated flat options of **deprecated, left out)."""
    if dataclasses.is_dataclass(cls):
        return {f.name: _shown(f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(cls)}  # fmt: skip
    return {name: _shown(p.default) for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and name not in LIGHTNING_FILLED and p.kind is not p.VAR_KEYWORD}  # fmt: skip


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_configuration_reference_matches_the_code(cls: type) -> None:
    assert _documented(cls) == _options(cls)


def test_every_config_parameter_defaults_to_its_class_s_default() -> None:
    parameters = inspect.signature(DLACStrategy.__init__).parameters
    for name, cls in CONFIG_OBJECTS.items():
        assert parameters[name].annotation in (cls.__name__, cls), (name, parameters[name].annotation)
        assert type(parameters[name].default) is cls and parameters[name].default == cls(), name


def _args_entries(cls: type) -> str:
    """The ``Args:`` sections of the docstrings of ``cls`` and its bases (a config object inherits its base's fields
    and their entries)."""
    return "\n".join(doc.split("Args:", 1)[1] for klass in cls.__mro__
                     if (doc := inspect.getdoc(klass) if klass.__doc__ else None) and "Args:" in doc)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_option_has_a_docstring_entry(cls: type) -> None:
    doc = _args_entries(cls)
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:
        names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    missing = [n for n in names if not re.search(rf"^    (\*\*)?{n}: ", doc, flags=re.M)]
    assert not missing, f"{cls.__name__} docstring lacks Args entries for {missing}"


@pytest.mark.parametrize("cls", list(CONFIG_OBJECTS.values()), ids=lambda c: c.__name__)
def test_every_field_of_a_config_object_has_its_one_line_comment(cls: type) -> None:
    """TorchRec's config style: every field is followed, on its line, by a comment saying what it is."""
    source = "\n".join(inspect.getsource(klass) for klass in cls.__mro__ if dataclasses.is_dataclass(klass))
    bare = [f.name for f in dataclasses.fields(cls)
            if not re.search(rf"^    {f.name}: .*  # \S", source, flags=re.M)]  # fmt: skip
    assert not bare, f"{cls.__name__}: fields without a comment: {bare}"


def test_every_option_names_the_test_that_proves_it_and_that_test_exists() -> None:
    named: dict[str, str] = {}
    for cls in CLASSES:
        tested = _tested_by(cls)
        assert set(tested) == set(_documented(cls)), f"{cls.__name__}: rows without a 'tested by' cell"
        for option, cell in tested.items():
            if cls is DLACStrategy and option in CONFIG_OBJECTS:
                assert cell.strip() == SEE_FIELDS, f"DLACStrategy.{option}: {cell!r}, not {SEE_FIELDS!r}"
                continue
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
