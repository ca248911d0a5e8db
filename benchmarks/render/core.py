"""What every rendered block shares: the results files of a directory, loaded once each; the block record; the
line that says where a block's figures come from; the text of a block whose files are missing; number formats."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.paths import REPO
from benchmarks.lib.plan import depth_writing
from benchmarks.lib.results import load_results
from benchmarks.lib.rule import span

DOCS = ("README.md", "docs/benchmarks.md", "docs/adaptive.md", "docs/strategy.md", "docs/multinode.md",
        "docs/data.md", "docs/codec.md", "docs/reliability.md")


BLOCK = re.compile(r"<!-- BEGIN render:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- END render:(?P=name) -->", re.S)


class Results:
    """The results files of one directory, loaded once each; ``used`` collects those the blocks read."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        resolved = self.directory.resolve()
        self.shown = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)
        self._cache: dict[str, dict[str, Any] | None] = {}
        self.used: set[str] = set()

    def get(self, name: str) -> dict[str, Any] | None:
        if name not in self._cache:
            path = self.directory / name
            self._cache[name] = load_results(path) if path.is_file() else None
        if self._cache[name] is not None:
            self.used.add(name)
        return self._cache[name]


@dataclass(frozen=True)
class Block:
    """A rendered block: the results files it reads (all needed unless ``optional``) and what makes its lines."""

    files: tuple[str, ...]
    render: Callable[..., list[str]]
    optional: tuple[str, ...] = ()


# The repository's top-level folders: an absolute path through one of them is a path of the clone a run was made in.
REPO_FOLDERS = ("benchmarks", "cuda_ext", "docs", "examples", "lightning_dlac", "requirements", "tests")
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/<>~-])/(?:[\w.+-]+/)*[\w.+-]+")


def shown_command(command: str) -> str:
    """A recorded command as a reader of the repository can run it: each absolute path through the clone the run was
    made in becomes relative to the repository (``/work/main/benchmarks/results/x.json`` ->
    ``benchmarks/results/x.json``), and a path outside any clone is shown by its file name (``<elsewhere>/x.json``):
    the machine's folders say nothing to a reader and are not theirs.

    Args:
        command: The command a results file records.

    Returns:
        The command with no absolute path in it.
    """
    def relative(m: re.Match) -> str:
        parts = m.group(0).split("/")[1:]
        inside = [i for i, part in enumerate(parts[:-1]) if part in REPO_FOLDERS]
        return "/".join(parts[inside[-1]:]) if inside else f"<elsewhere>/{parts[-1]}"

    return ABSOLUTE_PATH.sub(relative, command)


def short_commit(commit: str | None) -> str:
    return commit[:10] if commit else "not recorded"


def source_line(name: str, data: dict[str, Any], where: str = "benchmarks/results") -> str:
    """Where a block's figures come from: the file, the commit, date, machine, load and depth of the run."""
    m = data["metadata"]
    if m.get("legacy"):
        torch = m.get("versions", {}).get("torch", "?")
        return (f"From `{where}/{name}` (written before results files carried their metadata; command:"
                f" `{shown_command(str(m.get('command')))}`; {m.get('cores', '?')} cores, torch {torch}).")
    load = ""
    if m.get("loadavg_before") and m.get("loadavg_after"):
        load = f", load average {m['loadavg_before'][0]:.1f} before and {m['loadavg_after'][0]:.1f} after"
    depth = f", `make bench{'' if m.get('depth') == 'full' else '-' + m['depth']}`" if m.get("depth") else ""
    versions = m.get("versions", {})
    dirty = " (with local changes)" if m.get("git_dirty") else ""
    resumed = "".join((f" It keeps (`--resume`) the {part['launches']} launches of worlds {part.get('worlds')} that"
                       f" the run of commit {short_commit(part.get('git_commit'))}, {part.get('date')}, made before it"
                       f" stopped" if "launches" in part else
                       f" It continues (`--resume`) the run of commit {short_commit(part.get('git_commit'))},"
                       f" {part.get('date')}, that wrote worlds {part.get('worlds')}")
                      + (f" under {part['train_seeds']} training seeds" if "train_seeds" in part else "")
                      + (f" (of {part['train_seeds_planned']} planned: stopped partway)"
                         if "train_seeds_planned" in part else "")
                      + f" (command: `{shown_command(str(part.get('command')))}`)."
                      for part in m.get("resumed_from", []))
    reused = m.get("baselines_from")
    if reused:
        resumed += (f" Its baseline arms (uncompressed, all-tight, all-loose) of worlds {reused.get('worlds')} are"
                    f" those of `{Path(reused.get('path', '?')).name}` (`--baselines-from`; commit"
                    f" {short_commit(reused.get('git_commit'))}, {reused.get('date')}), reused, not rerun.")
    resumed += "".join(f" Judged again from its runs (`--rejudge`) by commit {short_commit(part.get('commit'))}"
                       f"{' (with local changes)' if part.get('git_dirty') else ''}, {part.get('date')}."
                       for part in data.get("rejudged", []))
    return (f"From `{where}/{name}`: commit {short_commit(m.get('git_commit'))}{dirty}, {m.get('date')},"
            f" {m.get('cores')} cores ({m.get('cpu', '?')}){load}{depth}; torch {versions.get('torch', '?')},"
            f" torchrec {versions.get('torchrec', '?')}, lightning {versions.get('lightning', '?')}. Command:"
            f" `{shown_command(str(m.get('command')))}`.{resumed}")


def awaiting(files: list[str], short: bool = False) -> list[str]:
    """The block's text while results files are missing: which command writes each (``short``: one clause, for a
    part of a block)."""
    commands = {"quick": "make bench-quick", "full": "make bench"}
    by_command: dict[str, list[str]] = {}
    for f in files:
        by_command.setdefault(commands.get(depth_writing(f), "its benchmark script"), []).append(f)
    parts = [f"`{cmd}` ({', '.join(f'`benchmarks/results/{f}`' for f in names)})" for cmd, names in by_command.items()]
    if short:
        return [f"(Further figures awaiting {' and '.join(parts)}.)"]
    return [f"*Awaiting {' and '.join(parts)}: these figures are rendered from those results files, which are not"
            " committed yet. Until then nothing here is presented as measured.*"]


def fmt_x(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else f"{v:{fmt}}x"


def fmt_plain(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else f"{v:{fmt}}"


def fmt_range(values: list[float], fmt: str = ".2f") -> str:
    return span(values, fmt) if values else "-"


def pick(rows: list[dict[str, Any]], rate: str, variant: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["rate"] == rate and r["variant"] == variant), None)


def speed(r: dict[str, Any] | None) -> str:
    if r is None or r.get("speedup_vs_fp32") is None:
        return "(not in this run)"
    return f"**{r['speedup_vs_fp32']:.2f}x** (per repeat {fmt_range(r['speedup_vs_fp32_per_repeat'])})"
