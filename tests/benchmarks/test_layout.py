"""The benchmarks package keeps the layout benchmarks/__init__.py draws: scripts at its top that import only the
library, a library that imports neither a script nor the renderer, a renderer split by the document section it
renders, no private name crossing a module, no ``sys.path`` edit in the benchmarks or their tests, and every script's
``--help`` naming the results files it writes and how long their committed runs took."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.lib.paths import BENCHMARKS, REPO
from benchmarks.lib.plan import ELSEWHERE, STEPS

SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")
MODULES = sorted(p for p in BENCHMARKS.rglob("*.py"))
RENDER_LINES = 600  # issue 52: no render module over 600 lines


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, names taken from it) of every import in ``path``, inside functions too."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            yield node.lineno, base, [alias.name for alias in node.names]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def _script_of(module: str, names: list[str]) -> str | None:
    """The script an import reaches, if it reaches one: ``benchmarks.<script>`` (also ``from benchmarks import
    <script>``) or a script's bare name, as the scripts imported each other before the package."""
    parts = module.split(".")
    if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in SCRIPTS:
        return parts[1]
    if module == "benchmarks":
        return next((n for n in names if n in SCRIPTS), None)
    return module if module in SCRIPTS else None


def test_no_script_imports_another_and_nothing_imports_a_script() -> None:
    wrong = [f"{_where(p, line)}: imports the script {script}" for p in MODULES for line, module, names in _imports(p)
             if (script := _script_of(module, names)) is not None and p != BENCHMARKS / f"{script}.py"]
    assert not wrong, "a script imports only the library (move what it shares into benchmarks/lib/):\n" + \
        "\n".join(wrong)


def test_the_library_imports_neither_the_renderer_nor_the_tests() -> None:
    wrong = [f"{_where(p, line)}: imports {module}" for p in sorted((BENCHMARKS / "lib").rglob("*.py"))
             for line, module, _ in _imports(p) if module.startswith(("benchmarks.render", "tests"))]
    wrong += [f"{_where(p, line)}: imports {module}" for p in MODULES for line, module, _ in _imports(p)
              if module.split(".")[0] == "tests"]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module() -> None:
    wrong = [f"{_where(p, line)}: takes {n} from {module}" for p in MODULES for line, module, names in _imports(p)
             if module.startswith("benchmarks") and module != _module_name(p) for n in names if n.startswith("_")]
    assert not wrong, "a name other modules use is public (no leading underscore):\n" + "\n".join(wrong)


@pytest.mark.parametrize("path", sorted((BENCHMARKS / "render").glob("*.py")), ids=lambda p: p.name)
def test_no_render_module_is_over_its_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= RENDER_LINES, f"{path.name} has {lines} lines: split it by the section it renders"


def _sys_path_edits(path: Path) -> list[int]:
    """Lines where ``path`` touches ``sys.path`` (an insert, an append, a slice assignment or any other use)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
                   and isinstance(n.value, ast.Name) and n.value.id == "sys"})


def test_neither_the_benchmarks_nor_the_tests_edit_sys_path() -> None:
    tests = [p for p in sorted((REPO / "tests").rglob("*.py")) if p.name.startswith("test_") or p.name == "conftest.py"]
    wrong = [_where(p, line) for p in [*MODULES, *tests] for line in _sys_path_edits(p)]
    assert not wrong, "import the package instead (the repository root is on pytest's path): " + ", ".join(wrong)


def test_every_script_is_planned() -> None:
    planned = {s.module for s in STEPS} | set(ELSEWHERE)
    missing = [s for s in SCRIPTS if f"benchmarks.{s}" not in planned]
    assert not missing, f"scripts the plan (benchmarks/lib/plan.py) does not know: {missing}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_says_what_it_writes_and_how_long_it_took(script: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "What it writes" in text, text
    epilog = text.split("What it writes", 1)[1]
    for step in (s for s in STEPS if s.module == module.__name__):
        (line,) = [line for line in epilog.splitlines() if f"benchmarks/results/{step.output} " in line]
        assert "took" in line or "no committed run" in line, line
    for path, _ in ELSEWHERE.get(module.__name__, ()):
        assert not path or path in epilog


@pytest.mark.slow
def test_the_gpu_scripts_import_torch_and_numpy_alone() -> None:
    """The lent GPU machine has neither Lightning nor TorchRec: its scripts, and the package on the way, import
    neither."""
    code = ("import sys, benchmarks.cuda_codec_bench, benchmarks.cuda_profile;"
            " print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torchrec', 'fbgemm_gpu'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", f"the GPU scripts import {out.stdout.strip()}"
