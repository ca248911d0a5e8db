"""The docstring style holds on the public surface (docs/api.md), and no docstring or comment carries a measurement.

**Style** (Google style, as Lightning and TorchRec write it): every public function, method, class and property has
a docstring whose first line is a one-line summary. A function or method with parameters documents each of them
under ``Args:`` (the names of its signature, ``*args`` / ``**kwargs`` with their stars, no others; types live in the
signature), one that returns something says what under ``Returns:`` (or ``Yields:``), and every exception it raises
itself (``raise SomeError(...)`` in its own body; what its helpers raise is left to the author) is named under
``Raises:``. A class documents its constructor's arguments (a dataclass or named tuple: its fields) under ``Args:``
in its docstring, a base's entries counting for the fields it inherits, and names under ``Raises:`` what its
``__init__`` / ``__post_init__`` raise. jsonargparse builds the ``dlac`` command's help from these ``Args:``
sections, so an entry outside its section is an option without help.

**The public surface** is what docs/api.md promises: every name in ``lightning_dlac.__all__`` and in each layer
package's ``__all__`` (the packages tests/test_public_api.py pins), with the public methods and properties of those
classes, plus the public functions and classes of the example modules (``lightning_dlac.examples``). Lightning's and
torch's hooks that a class overrides (``setup``, ``training_step``, ``forward``, ...) are documented by Lightning
and torch, and not checked here.

**Measurements** go stale in a docstring: a figure from a run belongs in a rendered block of docs/benchmarks.md or
docs/adaptive.md (``python -m benchmarks.render`` rewrites those), and the docstring points at the section.
:data:`MEASURED` lists what a measured figure looks like; defaults, formats and tolerances match none of them.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_public_api import EXPORTS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["base", "binary", "dlrm", "planted", "synthetic", "tsv"]
PACKAGE_PREFIXES = ("lightning_dlac",)  # lightning_dlac.examples included
NO_RESULT = ("None", "NoReturn", None, inspect.Signature.empty)

# What a measured figure looks like in prose, each with the kind of sentence it catches. Kept small on purpose: a
# pattern here must never match a default, a format constant or a tolerance (the test below proves the package
# clean, so a false positive would show at once).
MEASURED: dict[str, str] = {
    # "the synchronous path was faster in 11 of 13 paired CPU launches"
    "a count of runs": r"\b\d+ of \d+ (?:paired )?(?:CPU |GPU )?(?:launches|runs|repeats)\b",
    # "the native parser, over 1M rows/s", "encode at 3.2 GB/s"
    "a measured rate": r"\b\d+(?:\.\d+)?\s?[kKM]?\s?(?:rows/s|GB/s|MB/s)",
    # "about 1.3x the rank's share after an epoch, measured in ...", "measured at 12 ms"
    "a figure beside 'measured'": r"\d+(?:\.\d+)?\s?(?:x|ms|%)(?!\w)[^.;]{0,60}\bmeasured\b"
                                 r"|\bmeasured\b[^.;]{0,60}?\b\d+(?:\.\d+)?\s?(?:x|ms|%)(?!\w)",
    # "the reference parser (pure Python, about 30x slower)"
    "a measured speed-up": r"\babout \d+(?:\.\d+)?x (?:faster|slower)\b",
    # "5-6 s of CPU per rank here", "20 ms per step on this machine"
    "a timing on this machine": r"\b\d+(?:\.\d+)?(?:-\d+)? ?(?:s|ms)\b[^.;]{0,40}\b(?:here|on this machine)\b",
}


# ------------------------------------------------------------------------------------------------------ the surface


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith(PACKAGE_PREFIXES)


def _overrides_a_foreign_base(cls: type, name: str) -> bool:
    """Whether ``name`` is a hook of a base class from outside the package (Lightning's, torch's)."""
    return any(name in vars(base) for base in cls.__mro__[1:] if not _ours(base))


def _surface() -> dict[str, tuple[str, Any]]:
    """{qualified name: (kind, object)} of everything public: kind is "function", "class", "method" or "property"."""
    top: dict[str, Any] = {}
    for module_name in EXPORTS:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and _ours(obj):
                top.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    for example in EXAMPLES:
        module = importlib.import_module(f"lightning_dlac.examples.{example}")
        for name, obj in vars(module).items():
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)) \
                    and obj.__module__ == module.__name__:  # fmt: skip
                top.setdefault(f"{module.__name__}.{name}", obj)
    out: dict[str, tuple[str, Any]] = {}
    for qualname, obj in sorted(top.items()):
        if not inspect.isclass(obj):
            out[qualname] = ("function", obj)
            continue
        out[qualname] = ("class", obj)
        for name, member in vars(obj).items():
            if name.startswith("_") or _overrides_a_foreign_base(obj, name):
                continue
            if isinstance(member, property):
                out[f"{qualname}.{name}"] = ("property", member)
            elif isinstance(member, (staticmethod, classmethod)):
                out[f"{qualname}.{name}"] = ("method", member.__func__)
            elif inspect.isfunction(member):
                out[f"{qualname}.{name}"] = ("method", member)
    return out


SURFACE = _surface()
CALLABLES = [q for q, (kind, _) in SURFACE.items() if kind in ("function", "method")]
CLASSES = [q for q, (kind, _) in SURFACE.items() if kind == "class"]
PROPERTIES = [q for q, (kind, _) in SURFACE.items() if kind == "property"]


# ------------------------------------------------------------------------------------------------ reading docstrings


def _doc(obj: Any) -> str:
    """The docstring as help() shows it (inherited from a base's method where the override has none)."""
    if isinstance(obj, property):
        return inspect.cleandoc(obj.fget.__doc__ or "") if obj.fget else ""
    return inspect.getdoc(obj) or ""


def _section(doc: str, title: str) -> str | None:
    """The body of a Google-style section (``Args:``), up to the next line that is not indented; None if absent."""
    match = re.search(rf"^{title}:[ \t]*\n((?:[ \t]+\S.*\n?|[ \t]*\n)*)", doc, flags=re.M)
    return match[1] if match else None


def _entries(doc: str, title: str) -> list[str]:
    """The names a section documents: its lines indented by four spaces that start with ``name:``."""
    body = _section(doc, title)
    return re.findall(r"^    (\*{0,2}[\w.]+)(?: \([^)]*\))?:", body, flags=re.M) if body else []


def _summary_problem(doc: str) -> str | None:
    if not doc.strip():
        return "no docstring"
    if "\n" in doc.strip().split("\n\n", 1)[0]:
        return "its summary is not one line (a one-line summary, a blank line, then the rest)"
    return None


def _parameters(function: Callable[..., Any]) -> list[str]:
    """The parameters a docstring documents: ``*args`` and ``**kwargs`` with their stars, no ``self`` / ``cls``."""
    params = list(inspect.signature(function).parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in params]


def _own_raises(function: Callable[..., Any]) -> set[str]:
    """The exception classes a function raises in its own body (not in functions nested in it), by name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError):  # no source (a C function, a generated __init__)
        return set()
    (node,) = tree.body
    names: set[str] = set()
    todo: list[ast.AST] = list(node.body)  # type: ignore[attr-defined]
    while todo:
        item = todo.pop()
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(item, ast.Raise) and item.exc is not None:
            exc = item.exc.func if isinstance(item.exc, ast.Call) else item.exc
            name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", "")
            if name[:1].isupper():  # a class; `raise error` re-raises a caught object
                names.add(name)
        todo.extend(ast.iter_child_nodes(item))
    return names


def _raises_problem(doc: str, raised: set[str]) -> str | None:
    documented = {name.rsplit(".", 1)[-1] for name in _entries(doc, "Raises")}
    missing = sorted(raised - documented)
    return f"raises {missing} but its Raises: section does not name them" if missing else None


def _args_problem(names: list[str], documented: list[str]) -> str | None:
    missing = [n for n in names if n not in documented]
    unknown = [n for n in documented if n not in names]
    problems = []
    if missing:
        problems.append(f"Args: lacks {missing}")
    if unknown:
        problems.append(f"Args: documents {unknown}, which the signature does not have")
    return "; ".join(problems) or None


# ------------------------------------------------------------------------------------------------------- the checks


def test_the_surface_is_the_public_api() -> None:
    """The walk reaches the classes and read-outs docs/api.md lists (a broken walk would check nothing)."""
    assert "lightning_dlac.plugin.strategy.DLACStrategy.total_comm_stats" in CALLABLES
    assert "lightning_dlac.plugin.callback.DLACCallback.table_bounds" in PROPERTIES
    assert "lightning_dlac.comm.config.CompressionOptions" in CLASSES
    assert "lightning_dlac.examples.base.RankShardedDataModule" in CLASSES
    assert "lightning_dlac.plugin.strategy.DLACStrategy.setup" not in SURFACE  # Lightning's hook
    assert len(CALLABLES) > 100 and len(CLASSES) > 40 and len(PROPERTIES) > 40


@pytest.mark.parametrize("qualname", CALLABLES)
def test_a_public_function_documents_its_arguments_result_and_errors(qualname: str) -> None:
    function = SURFACE[qualname][1]
    doc = _doc(function)
    problems = [_summary_problem(doc)]
    params = _parameters(function)
    documented = _entries(doc, "Args")
    if params or documented:
        problems.append(_args_problem(params, documented))
    if inspect.signature(function).return_annotation not in NO_RESULT:
        if _section(doc, "Returns") is None and _section(doc, "Yields") is None:
            problems.append("returns a value but has no Returns: (or Yields:) section")
    problems.append(_raises_problem(doc, _own_raises(function)))
    problems = [p for p in problems if p]
    assert not problems, f"{qualname}: " + "; ".join(problems)


def _fields(cls: type) -> list[str] | None:
    """A dataclass's or named tuple's constructor fields; None for a class without generated fields."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return list(cls._fields)
    return None


@pytest.mark.parametrize("qualname", CLASSES)
def test_a_public_class_documents_its_constructor(qualname: str) -> None:
    cls = SURFACE[qualname][1]
    doc = _doc(cls)
    problems = [_summary_problem(doc)]
    fields = _fields(cls)
    if issubclass(cls, enum.Enum) or getattr(cls, "_is_protocol", False):
        pass  # an enum's members are its values, each with its one-line comment; a protocol is not constructed
    elif fields is not None:
        # Inherited fields are documented by the base that defines them (TorchRec's style, tests/test_docs.py).
        documented = [n for klass in cls.__mro__ if _ours(klass) and klass.__doc__
                      for n in _entries(inspect.cleandoc(klass.__doc__), "Args")]  # fmt: skip
        problems.append(_args_problem(fields, documented))
    elif "__init__" in vars(cls):
        init = vars(cls)["__init__"]
        documented = _entries(doc, "Args") + _entries(inspect.getdoc(init) or "", "Args")
        problems.append(_args_problem(_parameters(init), documented))
    raised = set()
    for hook in ("__init__", "__post_init__"):
        if inspect.isfunction(vars(cls).get(hook)) and _ours(vars(cls)[hook]):
            raised |= _own_raises(vars(cls)[hook])
    init_doc = inspect.getdoc(vars(cls)["__init__"]) if inspect.isfunction(vars(cls).get("__init__")) else ""
    problems.append(_raises_problem(doc + "\n" + (init_doc or ""), raised))
    problems = [p for p in problems if p]
    assert not problems, f"{qualname}: " + "; ".join(problems)


@pytest.mark.parametrize("qualname", PROPERTIES)
def test_a_public_property_says_in_one_line_what_it_returns(qualname: str) -> None:
    problem = _summary_problem(_doc(SURFACE[qualname][1]))
    assert problem is None, f"{qualname}: {problem}"


# ---------------------------------------------------------------------------------------------------- measurements


def _sources() -> list[Path]:
    return sorted([*(ROOT / "lightning_dlac").rglob("*.py"), *(ROOT / "examples").rglob("*.py")])


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a module."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno, " ".join(doc.split()))  # a figure may wrap across lines
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield (token.start[0], token.string)


def _measured(text: str) -> list[str]:
    return [kind for kind, pattern in MEASURED.items() if re.search(pattern, text)]


@pytest.mark.parametrize(("text", "kinds"), [
    ("the synchronous path was faster in 11 of 13 paired CPU launches", ["a count of runs"]),
    ("the native one, over 1M rows/s, or the reference (about 40k rows/s)", ["a measured rate"]),
    ("about 1.3x the rank's share after an epoch, measured in docs/benchmarks.md", ["a figure beside 'measured'"]),
    ("the reference parser (pure Python, about 30x slower)", ["a measured speed-up"]),
    ("(5-6 s of CPU per rank here)", ["a timing on this machine"]),
    ("the step takes 20 ms on this machine", ["a timing on this machine"]),
    # defaults, formats, tolerances, hypotheticals and pointers are not measurements
    ("Default 1 (the exchange whole); error_every=10 measures every 10th call", []),
    ("bins 2% wide from 10 us, so the median is read within 1% (half a bin)", []),
    ("On a slow link (compression 3x faster, say) the uncompressed way is tried a third as often", []),
    ("INT8 in rows of 32 values 4 * 32 / 40 = 3.2; DLAC measured", []),
    ("measured slower on CPU: docs/benchmarks.md, 'Sending the exchange in pieces'", []),
    ("read in 8 MiB pieces; 26 x 10k x dim 64 float32 is ~67 MB", []),
])  # fmt: skip
def test_the_patterns_catch_measurements_and_nothing_else(text: str, kinds: list[str]) -> None:
    assert _measured(text) == kinds


def test_no_docstring_or_comment_states_a_measured_figure() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {kinds}: {text[:160]}"
             for path in _sources() for line, text in _prose(path) if (kinds := _measured(text))]  # fmt: skip
    assert not found, (
        "measured figures go stale in docstrings and comments: point at the docs/benchmarks.md or docs/adaptive.md"
        " section that renders them instead (e.g. \"measured slower on CPU: docs/benchmarks.md, 'Sending the"
        " exchange in pieces'\"):\n" + "\n".join(found))
