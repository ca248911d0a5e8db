"""The configuration reference (docs/configuration.md) lists every option of the public classes with the defaults
the code has."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta
from pathlib import Path

import pytest

from lightning_dlac import DLACCallback, DLACStrategy

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
LIGHTNING_FILLED = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision_plugin"}


def _documented(cls: type) -> dict[str, str]:
    text = DOC.read_text()
    section = text.split(f"### {cls.__name__}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(\w+)` \| `(.*?)` \|", section, flags=re.M))


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
