"""docs/benchmarks.md's head: the rule every "met" follows and how long the last ``make bench-quick`` took."""

from __future__ import annotations

from benchmarks.lib.rule import RULE
from benchmarks.render.core import Block, Results, source_line


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


BLOCKS = {
    "rule": Block((), rule),
    "suite_duration": Block(("suite_quick.json",), suite_duration),
}
