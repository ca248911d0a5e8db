"""docs/benchmarks.md's head: the rule every "met" follows, how long the last ``make bench-quick`` took, and the
library versions each results file was measured under against the pinned set."""

from __future__ import annotations

from benchmarks.lib.results import PINS, pinned_versions
from benchmarks.lib.rule import RULE
from benchmarks.render.core import Block, Results, source_line

VERSIONED = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu")  # the packages a move of the pins changes


def rule(results: Results) -> list[str]:
    return [f"**The rule for every \"met\" on this page and in the README: {RULE}** A *repeat* is one launch of each"
            " variant in a run that alternates their order (ABBA); a ratio is reported as the pooled medians' ratio"
            " with the range of the per-repeat ratios. Figures without repeats (compression ratios, which the same"
            " input always gives) are judged on their one value; codec speeds on the timed calls."]


def suite_duration(results: Results) -> list[str]:
    """How long the last ``make bench-quick`` took, step by step, from its own record."""
    d = results.get("suite_quick.json")
    record = d.get("results", d)  # files from before the suite wrote metadata keep the record at the top
    steps = record["steps"]
    slowest = sorted(steps, key=lambda st: -st["seconds"])[:3]
    failed = [st["output"] for st in steps if st["returncode"]]
    return [source_line("suite_quick.json", d, results.shown), "",
            f"The last `make bench-quick` took **{record['seconds'] / 60:.1f} minutes** for {len(steps)} steps"
            + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else "") + "; the longest: "
            + ", ".join(f"`{st['output']}` {st['seconds'] / 60:.1f} min" for st in slowest) + "."]


def _release(version: str) -> str:
    """A version without its local build tag (``2.13.0+cpu`` -> ``2.13.0``): the release the pins name."""
    return version.split("+", 1)[0]


def version_sets(results: Results, names: list[str]) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """The results files ``names`` grouped by the versions of :data:`VERSIONED` their runs recorded."""
    by_set: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        found = results.get(name)["metadata"].get("versions", {})
        by_set.setdefault(tuple((k, found[k]) for k in VERSIONED if k in found), []).append(name)
    return by_set


def describe(versions: tuple[tuple[str, str], ...]) -> str:
    """A set of versions as the blocks write it (``torch 2.13.0+cpu, torchrec 1.8.0``)."""
    return ", ".join(f"{k} {v}" for k, v in versions) or "no versions recorded"


def pinned_set() -> str:
    """The pinned versions of :data:`VERSIONED`, as the blocks write them."""
    pinned = pinned_versions()
    return ", ".join(f"{k} {pinned[k]}" for k in VERSIONED if k in pinned)


def versions(results: Results) -> list[str]:
    """Which results files were measured under the pinned library versions and which under another set, each set
    named: a figure stands for the versions its run had until it is rerun under the pins."""
    pinned = pinned_versions()
    names = sorted(p.name for p in results.directory.glob("*.json"))
    by_set = version_sets(results, names)

    def matches(versions: tuple[tuple[str, str], ...]) -> bool:
        return all(_release(v) == pinned[k] for k, v in versions if k in pinned) and \
            {k for k, _ in versions} >= {k for k in VERSIONED if k in pinned}

    current = [n for versions, files in by_set.items() if matches(versions) for n in files]
    lines = [f"**Library versions.** The pinned set ({', '.join(f'`{p}`' for p in PINS)}) is {pinned_set()}."
             f" {len(current)} of the {len(names)} results files were measured under it"
             + (f" ({', '.join(f'`{n}`' for n in current)})" if current else "") + "."]
    others = [(versions, files) for versions, files in by_set.items() if not matches(versions)]
    if others:
        lines += ["", "Measured under another set (each block's source line names its run's versions; its figures"
                  " stand for those versions until rerun under the pins, `make bench-quick` / `make bench`):", ""]
        lines += [f"- {describe(versions)}: {len(files)} file(s), {', '.join(f'`{n}`' for n in files)}"
                  for versions, files in others]
    return lines


BLOCKS = {
    "versions": Block((), versions),
    "rule": Block((), rule),
    "suite_duration": Block(("suite_quick.json",), suite_duration),
}
