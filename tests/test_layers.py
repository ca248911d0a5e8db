"""The package's layers, as docs/strategy.md ("Architecture") draws them, are enforced here from the code's imports.

Every import in the package counts, at module level or inside a function (a lazy import is still a dependency),
``TYPE_CHECKING`` blocks included (an annotation that names an upper layer is knowledge of it). The map is the
code's: each layer's level is one above the highest layer it imports, and the page's table of levels and imports,
and the package docstring's table, are checked against the imports, so none of them can drift from the code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lightning_dlac"
# Bottom (0) to top. A module may import its own folder and any folder on a lower level; never a sibling on its
# own level (codec, criteo and engine know nothing of each other) and never upwards. A layer's level is one above
# the highest layer it imports (test_each_level_is_one_above_the_highest_layer_imported).
LEVELS = {
    "native": 0,
    "testing": 0,
    "checks": 0,
    "codec": 1,
    "criteo": 1,
    "engine": 1,
    "adaptive": 2,
    "comm": 3,
    "plugin": 4,
    "commands": 5,
}
LIGHTNING_LAYERS = {"plugin", "commands"}  # the only ones that may import Lightning
TORCHREC_LAYERS = {"comm", "engine", "plugin", "commands"}  # the only ones that may import TorchRec or FBGEMM


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str | None:
    """The layer folder of a file of the package, ``None`` for the package's own ``__init__``."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; ``from X import Y`` yields ``X.Y`` too, since Y may
    be a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _package_layer(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "lightning_dlac":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LEVELS else ""


def test_every_folder_of_the_package_is_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(LEVELS), f"folders without a level: {folders - set(LEVELS)}; levels without a folder:" \
                                   f" {set(LEVELS) - folders}"
    stray = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert not stray, f"modules at the package root belong in a layer folder: {stray}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_only(path: Path) -> None:
    layer = _layer(path)
    wrong = []
    for line, name in _imports(path):
        target = _package_layer(name)
        if target is None or layer is None:
            continue  # outside the package, or the package's own __init__ (the public facade)
        if target == "":
            if name != "lightning_dlac":  # `from lightning_dlac import X`: the facade, which imports upward
                continue  # `lightning_dlac.X` where X is not a layer: a name of the facade, checked below
            wrong.append(f"line {line}: imports the package facade (`lightning_dlac`); import the layer instead")
        elif target != layer and LEVELS[target] >= LEVELS[layer]:
            wrong.append(f"line {line}: {name} ({target}, level {LEVELS[target]}) from {layer} (level {LEVELS[layer]})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_lightning_and_torchrec_stay_in_their_layers(path: Path) -> None:
    layer = _layer(path)
    for line, name in _imports(path):
        root = name.split(".")[0]
        if root == "lightning" and layer is not None:
            assert layer in LIGHTNING_LAYERS, f"line {line}: {layer}/ imports {name}; only {LIGHTNING_LAYERS} may"
        if root in ("torchrec", "fbgemm_gpu") and layer is not None:
            assert layer in TORCHREC_LAYERS, f"line {line}: {layer}/ imports {name}; only {TORCHREC_LAYERS} may"


def test_no_import_cycles_between_modules() -> None:
    """Among the imports a module runs when it is imported (its top level), no module reaches itself."""
    names = {_module_name(p): p for p in _modules()}
    graph = {
        name: {target for _, imported in _imports(path, top_level_only=True)
               for target in (imported, imported.rpartition(".")[0]) if target in names and target != name}
        for name, path in names.items()
    }  # fmt: skip
    # A package imports its own __init__ first; leave that edge out (it is not a cycle of the code's making).
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_library_never_imports_the_examples_or_the_tests() -> None:
    wrong = [f"{p.relative_to(REPO)}:{line}: {name}" for p in _modules() for line, name in _imports(p)
             if name.startswith(("lightning_dlac.examples", "tests", "benchmarks"))]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def _layer_imports() -> dict[str, set[str]]:
    """The other layers each layer imports, from every import of its modules."""
    found: dict[str, set[str]] = {layer: set() for layer in LEVELS}
    for path in _modules():
        layer = _layer(path)
        if layer is None:
            continue
        for _, name in _imports(path):
            target = _package_layer(name)
            if target and target != layer:
                found[layer].add(target)
    return found


def test_each_level_is_one_above_the_highest_layer_imported() -> None:
    """A layer drawn higher than its imports make it is a map of a plan, not of the code (engine/ once sat above
    comm/ while it imported nothing of the package)."""
    wrong = []
    for layer, targets in _layer_imports().items():
        level = 1 + max((LEVELS[t] for t in targets), default=-1)
        if LEVELS[layer] != level:
            wrong.append(f"{layer}/ is drawn at level {LEVELS[layer]} but imports {sorted(targets) or 'nothing'}:"
                         f" its level is {level}")
    assert not wrong, "\n".join(wrong) + "\n(change LEVELS here and the levels in docs/strategy.md's Architecture)"


def _architecture() -> str:
    text = (REPO / "docs" / "strategy.md").read_text()
    section = text[text.index("## Architecture"):]
    return section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section


def test_the_architecture_page_names_every_layer() -> None:
    section = _architecture()
    missing = [layer for layer in LEVELS if not re.search(rf"\b{layer}/", section)]
    assert not missing, f"docs/strategy.md's Architecture section does not name {missing}"


def test_the_architecture_table_is_the_codes_levels_imports_and_needs() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)/` \| (.*?) \| (.*?) \|$", _architecture(), flags=re.M)
    drawn = {layer: (int(level), set(re.findall(r"`(\w+)/`", imports)), needs) for level, layer, imports, needs in rows}
    assert set(drawn) == set(LEVELS), f"the table's rows: {sorted(drawn)}; the layers: {sorted(LEVELS)}"
    actual = _layer_imports()
    wrong = []
    for layer, (level, imports, needs) in drawn.items():
        if level != LEVELS[layer]:
            wrong.append(f"{layer}/: level {level} in the table, {LEVELS[layer]} in LEVELS")
        if imports != actual[layer]:
            wrong.append(f"{layer}/: the table says it imports {sorted(imports) or 'nothing'}, the code"
                         f" {sorted(actual[layer]) or 'nothing'}")
        if ("Lightning" in needs) != (layer in LIGHTNING_LAYERS) or ("TorchRec" in needs) != (layer in TORCHREC_LAYERS):
            wrong.append(f"{layer}/: needs {needs!r}; Lightning is for {sorted(LIGHTNING_LAYERS)}, TorchRec for"
                         f" {sorted(TORCHREC_LAYERS)}")
    assert not wrong, "docs/strategy.md's Architecture table is not the code:\n" + "\n".join(wrong)


def test_the_package_docstring_draws_the_same_levels() -> None:
    import lightning_dlac

    rows = re.findall(r"^\| (\d+) \| ``(\w+)/``", lightning_dlac.__doc__ or "", flags=re.M)
    assert {layer: int(level) for level, layer in rows} == LEVELS, "lightning_dlac/__init__.py's table of layers"
