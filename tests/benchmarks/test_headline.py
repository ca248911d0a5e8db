"""The headline rows of README.md and docs/benchmarks.md hide nothing their results files say (issue 55 items 3, 5,
6 and 7): every target a file records is shown with its verdict, a codec that could not run is named, no rendered
line shows a path of the machine a run was made on, README keeps at most 8 rows, and the two plots are drawn from the
committed files the same way each time."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.render import plots
from benchmarks.render.blocks import blocks_in, render_block
from benchmarks.render.core import DOCS, Results, shown_command
from benchmarks.render.figures import stale, write_figure
from benchmarks.render.readme import headline_rows

HEADLINES = (("README.md", "readme_headline"), ("docs/benchmarks.md", "headline"))
README_ROWS = 8


def _rows(body: str) -> list[str]:
    """The table rows of a headline block (no header, no separator)."""
    table = [line for line in body.splitlines() if line.startswith("|")]
    return [line for line in table[2:]]


def recorded_targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target a results file records as judged: its ``targets`` list, each frontier's targets (where: the
    dataset) and each world's frontier targets (where: the world)."""
    found = [dict(t, where=t.get("rate") or f"{t.get('payload')} eps {t.get('eps')}")
             for t in (data.get("targets") if isinstance(data.get("targets"), list) else [])]
    found += [dict(t, where=f["dataset"]) for f in data.get("frontier") or [] for t in f.get("targets", [])]
    found += [dict(t, where=f"world {w['world']}", world=True) for w in data.get("per_world") or []
              for t in (w.get("frontier") or {}).get("targets", [])]
    return found


def hidden_targets(body: str, results: Results) -> list[str]:
    """What the rows of a headline block leave out of their results files: a target not shown with its verdict (met
    targets may instead be counted, "k of n targets met", when every missed one is named), or a codec that could
    not run and is not named as such."""
    rows: dict[str, list[str]] = {}
    for row in _rows(body):
        for name in re.findall(r"`([\w.-]+\.json)`", row.rsplit("|", 2)[-2]):
            rows.setdefault(name, []).append(row)
    hidden = []
    for name, shown in rows.items():
        text = "\n".join(shown)
        data = results.get(name)
        targets = recorded_targets(data)
        per_world = [t for t in targets if t.get("world")]
        targets = [t for t in targets if not t.get("world")]
        wheres = {n: {t["where"] for t in targets if t["target"] == n} for n in {t["target"] for t in targets}}
        # A row with many targets may count the met ones ("k of n targets met", n counting any the renderer
        # judges from the file's launches too) when it names every missed one.
        counts = [(int(k), int(n)) for k, n in re.findall(r"(\d+) of (\d+) targets met", text)]
        missed = sum(not t["met"] for t in targets)
        counted = any(n >= len(targets) and n - k >= missed for k, n in counts)
        for t in targets:
            key = f"{t['where']}: {t['target']}" if len(wheres[t["target"]]) > 1 else t["target"]
            verdict = "not judged (benchmark error)" if t.get("invalid") else "met" if t["met"] else "not met"
            if f"{key}: **{verdict}**" not in text and (not t["met"] or not counted):
                hidden.append(f"{name}: {key}: {verdict}")
        for target, n in Counter(t["target"] for t in per_world).items():
            met = sum(t["met"] for t in per_world if t["target"] == target)
            if f"{target}: met in {met} of {n} worlds" not in text:
                hidden.append(f"{name}: {target}: met in {met} of {n} worlds")
        for failed in data.get("failed") or []:
            label = failed.get("label") or failed.get("variant")
            if not re.search(re.escape(label) + r"[^|]*could not run", text):
                hidden.append(f"{name}: {label} could not run")
    return hidden


@pytest.mark.parametrize(("doc", "block"), HEADLINES)
def test_no_headline_row_hides_a_target_of_its_file(doc: str, block: str, committed: Results) -> None:
    body = blocks_in((REPO / doc).read_text())[block]
    assert _rows(body), f"{doc} has no headline rows"
    hidden = hidden_targets(body, committed)
    assert not hidden, f"{doc}'s headline rows leave out what their results files say:\n" + "\n".join(hidden)


def test_the_hidden_target_check_finds_a_missed_target_left_out(committed: Results) -> None:
    body = render_block("readme_headline", committed)
    assert hidden_targets(body, committed) == []
    missed = next(t for name in ("e2e_qcomm_race_starved.json", "e2e_throttled.json")
                  for t in recorded_targets(committed.get(name)) if not t["met"])
    shown = f"{missed['target']}: **not met**"
    assert shown in body
    tampered = "\n".join(re.sub(re.escape(shown) + r" \([^)]*\);? ?", "", row) if shown in row else row
                         for row in body.splitlines())
    assert any(missed["target"] in h for h in hidden_targets(tampered, committed))
    # Shown as met when it was not: caught too.
    assert hidden_targets(body.replace(shown, f"{missed['target']}: **met**"), committed)


def test_a_codec_that_could_not_run_is_named(committed: Results) -> None:
    body = render_block("readme_headline", committed)
    race = next(row for row in _rows(body) if "`e2e_qcomm_race.json`" in row)
    (failed,) = committed.get("e2e_qcomm_race.json")["failed"]
    assert re.search(re.escape(failed["label"]) + r"[^|]*could not run", race)
    assert hidden_targets(body.replace("could not run", "ran"), committed)


def test_every_baseline_faster_than_dlac_is_named_as_such(committed: Results) -> None:
    """In each speed row, every TorchRec codec of the same run faster than the DLAC configuration the row shows (found
    by its speed-up in the DLAC cell) is named "faster than DLAC" (10 Gbit/s: INT8/FP16 1.15x against 1.14x)."""
    checked = 0
    for row in headline_rows(committed):
        (name,) = row.files
        runs = committed.get(name).get("results")
        if not isinstance(runs, list) or not runs or "speedup_vs_fp32" not in runs[0]:
            continue
        for shown in re.findall(r"(\d+\.\d\d)x FP32", row.dlac):
            (dlac,) = [r for r in runs if not r["variant"].startswith(("qcomm", "fp32", "ceiling"))
                       and r.get("speedup_vs_fp32") is not None and f"{r['speedup_vs_fp32']:.2f}" == shown]
            for q in runs:
                if q["rate"] == dlac["rate"] and q["variant"].startswith("qcomm") \
                        and (q.get("speedup_vs_fp32") or 0) > dlac["speedup_vs_fp32"]:
                    assert re.search(re.escape(q["label"]) + r" [\d.]+x: \*\*faster than DLAC\*\*", row.baseline), \
                        (name, q["rate"], q["label"], row.baseline)
                    checked += 1
    assert checked >= 3  # 10 Gbit/s, unthrottled and DLRM v2 in the committed files


def test_readme_keeps_at_most_8_short_headline_rows_and_docs_every_row(committed: Results) -> None:
    readme = _rows(blocks_in((REPO / "README.md").read_text())["readme_headline"])
    every = _rows(blocks_in((REPO / "docs/benchmarks.md").read_text())["headline"])
    assert 0 < len(readme) <= README_ROWS < len(every)
    cells = [cell.strip() for row in readme for cell in row.strip("|").split(" | ")]
    assert max(len(c) for c in cells) <= 260, max(cells, key=len)
    # Every README row is a row of the full table, which links the same sections.
    files = {f for row in readme for f in re.findall(r"`([\w.-]+\.json)`", row)}
    assert files <= {f for row in every for f in re.findall(r"`([\w.-]+\.json)`", row)}


def test_readme_names_the_missed_targets_of_the_rows_it_leaves_to_docs() -> None:
    readme = blocks_in((REPO / "README.md").read_text())["readme_headline"]
    every = _rows(blocks_in((REPO / "docs/benchmarks.md").read_text())["headline"])
    files = set(re.findall(r"`([\w.-]+\.json)`", "\n".join(_rows(readme))))
    left = [row for row in every if not set(re.findall(r"`([\w.-]+\.json)`", row)) & files]
    assert left
    for row in left:
        for missed in re.findall(r"[^;|]*: \*\*not met\*\*", row.split(" | ")[3]):
            assert missed.strip() in readme, missed


# ---------------------------------------------------------------------------------------------------------------------
# No machine path in a rendered line

ABSOLUTE = re.compile(r"(?<![\w.:/<>~-])/(?:[\w.+-]+/)+[\w.+-]*")


@pytest.mark.parametrize("doc", DOCS)
def test_no_rendered_block_holds_an_absolute_path(doc: str) -> None:
    paths = [f"{name}: {m.group(0)}" for name, body in blocks_in((REPO / doc).read_text()).items()
             for m in ABSOLUTE.finditer(body)]
    assert not paths, f"{doc}: rendered lines show paths of the machine they ran on:\n" + "\n".join(paths)


def test_the_absolute_path_scan_finds_one() -> None:
    assert ABSOLUTE.findall("Command: `python /root/x/benchmarks/codec_bench.py --json-out /work/main/r.json`.") \
        == ["/root/x/benchmarks/codec_bench.py", "/work/main/r.json"]
    assert not ABSOLUTE.findall("see https://arxiv.org/abs/2407.04272 and docs/benchmarks.md, err/eb, KiB / step")


@pytest.mark.parametrize(("recorded", "shown"), [
    ("python benchmarks/codec_bench.py --json-out /work/main/benchmarks/results/codec_bench.json",
     "python benchmarks/codec_bench.py --json-out benchmarks/results/codec_bench.json"),
    ("python /root/clone/benchmarks/cuda_codec_bench.py --repeat 10 --json-out /root/out/4_bench.json",
     "python benchmarks/cuda_codec_bench.py --repeat 10 --json-out <elsewhere>/4_bench.json"),
    ("python benchmarks/scaling_model.py /work/main/benchmarks/results/e2e_throttled.json",
     "python benchmarks/scaling_model.py benchmarks/results/e2e_throttled.json"),
    ("python -m benchmarks.soak --json-out benchmarks/results/soak.json",
     "python -m benchmarks.soak --json-out benchmarks/results/soak.json"),
])
def test_a_recorded_command_is_shown_relative_to_the_repository(recorded: str, shown: str) -> None:
    assert shown_command(recorded) == shown


def test_every_committed_command_is_shown_without_a_machine_path() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        command = json.loads(path.read_text())["metadata"]["command"]
        assert not ABSOLUTE.search(shown_command(command)), (path.name, shown_command(command))


def test_missing_results_keep_the_headlines_awaited(tmp_path: Path) -> None:
    assert render_block("headline", Results(tmp_path)).startswith("*Awaiting `make bench-quick`")


# ---------------------------------------------------------------------------------------------------------------------
# The headline's plots (benchmarks/render/plots.py)


@pytest.mark.parametrize("shown", sorted(plots.FIGURES))
def test_a_plot_is_drawn_the_same_twice_and_a_stale_one_is_caught(shown: str, committed: Results,
                                                                  tmp_path: Path) -> None:
    figure = plots.FIGURES[shown]
    first, again = tmp_path / "first.svg", tmp_path / "again.svg"
    write_figure(figure, committed, first)
    write_figure(figure, committed, again)
    assert first.read_bytes() == again.read_bytes()
    assert stale(figure, committed, REPO / shown) is None, f"{shown} is stale: run python -m benchmarks.render"
    # One figure of one of its files changed: the committed plot no longer is the one the files draw.
    other = tmp_path / "other"
    other.mkdir()
    for name in figure.files:
        shutil.copy(RESULTS / name, other / name)
    data = json.loads((other / figure.files[0]).read_text())
    data["metadata"]["date"] = "2027-01-01T00:00:00+00:00"
    (other / figure.files[0]).write_text(json.dumps(data))
    assert stale(figure, Results(other), REPO / shown) == "drawn from other results files"


def test_every_plot_is_shown_under_both_headlines() -> None:
    readme = blocks_in((REPO / "README.md").read_text())["readme_headline"]
    docs = blocks_in((REPO / "docs/benchmarks.md").read_text())["headline"]
    for shown in plots.FIGURES:
        assert f"]({shown})" in readme and f"]({shown.removeprefix('docs/')})" in docs
