"""Every figure block of README.md and docs/ agrees with the results file it is rendered from (``python -m
benchmarks.render``), so a stale figure cannot land; and the rule that says whether a target is met, the
like-for-like ceiling's check and the byte accounting of the accuracy benchmark do what the docs say."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks.lib import e2e
from benchmarks.lib.accuracy import normalize_bytes, over_seeds
from benchmarks.lib.frontier import frontier, frontier_lines
from benchmarks.lib.paths import REPO, RESULTS
from benchmarks.lib.pipeline import alternate_problem
from benchmarks.lib.plan import ELSEWHERE, STEPS, depth_writing, steps_at
from benchmarks.lib.results import pinned_versions, write_results
from benchmarks.lib.rule import RULE, judge
from benchmarks.render.blocks import BLOCKS, blocks_in, render_block, render_text
from benchmarks.render.calibration import CAPPED, calibration_ablation, calibration_perturb, calibration_worlds
from benchmarks.render.codec import dlrm_v2_reading
from benchmarks.render.core import DOCS, Results
from benchmarks.render.e2e import overlap_default
from benchmarks.render.frontier import FAMILY_FRONTIER_FILE, _undominated_lines, default_standing, frontier_worlds
from benchmarks.render.readme import _family_frontier_row
from benchmarks.render.strategy import pipeline_model


@pytest.mark.parametrize("doc", DOCS)
def test_every_rendered_block_matches_its_results_file(doc: str, committed: Results) -> None:
    text = (REPO / doc).read_text()
    blocks = blocks_in(text)
    assert blocks, f"{doc} has no rendered block"
    for name, body in blocks.items():
        assert body == render_block(name, committed), (
            f"{doc}: block {name!r} differs from what benchmarks/results/ gives; run `python -m benchmarks.render`"
            " (or `make render`) and commit the result with the results files"
        )


def test_every_block_has_a_renderer_and_every_renderer_a_block() -> None:
    used = [name for doc in DOCS for name in blocks_in((REPO / doc).read_text())]
    assert sorted(set(used)) == sorted(BLOCKS) and len(used) == len(set(used))


def test_the_rule_is_stated_at_the_top_of_docs_benchmarks() -> None:
    head = (REPO / "docs/benchmarks.md").read_text().split("\n## ", 1)[0]
    assert RULE in head


def test_every_results_file_a_block_reads_is_made_by_a_suite_depth_or_a_gpu_session() -> None:
    on_gpu = {Path(path).name: module for module, made in ELSEWHERE.items() for path, how in made
              if "gpu_session.sh" in how}
    session = (REPO / "benchmarks/gpu_session.sh").read_text()
    for name, block in BLOCKS.items():
        for f in (*block.files, *block.optional):
            if f in on_gpu:  # made on a lent GPU: benchmarks/gpu_session.sh runs the script that writes it
                assert f"-m {on_gpu[f]} " in session, f"block {name}: gpu_session.sh does not run {on_gpu[f]}"
                continue
            assert depth_writing(f) in ("quick", "full"), f"block {name}: no `make bench*` depth writes {f}"
    quick = {s.output for s in steps_at("quick")}
    assert {"codec_bench.json", "e2e_throttled.json", "e2e_unthrottled.json"} <= quick
    assert {s.output for s in STEPS} == {s.output for s in steps_at("full")}  # the full depth makes every file


def test_a_stale_figure_is_caught(committed: Results) -> None:
    text = (REPO / "docs/benchmarks.md").read_text()
    name, body = next(iter(blocks_in(text).items()))
    tampered = text.replace(body, body.replace("\n", " 1.23x\n", 1), 1)
    assert blocks_in(tampered)[name] != blocks_in(render_text(tampered, committed))[name]


def test_missing_results_are_awaited_not_presented(tmp_path: Path) -> None:
    empty = Results(tmp_path)
    body = render_block("readme_headline", empty)
    assert body.startswith("*Awaiting `make bench-quick`") and "e2e_throttled.json" in body
    assert not re.search(r"\d", re.sub(r"`[^`]*`", "", body))  # no figure in it
    assert "`make bench` (`benchmarks/results/adaptive_accuracy_dlrm_v2.json`)" in render_block(
        "dlrm_v2_summary", empty)


@pytest.mark.parametrize(("pooled", "per_repeat", "met"), [
    (0.95, [0.91, 0.92, 0.93], True),
    (0.95, [0.91, 0.92, 0.85], True),  # two of three repeats
    (0.95, [0.91, 0.80, 0.85], False),  # the pooled median alone is not enough
    (0.85, [0.91, 0.92, 0.93], False),  # nor the repeats alone
    (0.95, [0.91, 0.85], False),  # one of two is less than two thirds
    (0.95, [], False),
])
def test_a_target_is_met_by_the_pooled_median_and_two_thirds_of_the_repeats(pooled: float, per_repeat: list[float],
                                                                             met: bool) -> None:
    verdict = judge("t", pooled, per_repeat, 0.9)
    assert verdict["met"] is met
    assert verdict["repeats_meeting"] == sum(v >= 0.9 for v in per_repeat)
    assert judge("t", 0.5, [0.5, 0.6, 2.0], 1.0, at_least=False)["met"]  # "at most" targets


def _row(rate: str, variant: str, launch_ms: list[float]) -> dict:
    from statistics import median

    return dict(rate=rate, variant=variant, label=variant, median_step_ms=median(launch_ms),
                launch_median_ms=launch_ms, fwd_a2a_share=None, fwd_raw_bytes_per_step=1.0,
                fwd_sent_bytes_per_step=1.0, bwd_sent_bytes_per_step=1.0, fwd_ratio=1.0, final_loss=0.5)


def test_a_dlac_launch_faster_than_its_ceiling_is_a_benchmark_error_not_a_result() -> None:

    rows = [_row("1gbit", "fp32", [600, 610, 620]), _row("1gbit", "dlac_dlac", [300, 310, 250]),
            _row("1gbit", "ceiling_dlac_dlac", [280, 300, 290])]
    errors = e2e.ceiling_checks(rows)
    assert [e["repeat"] for e in errors] == [2]  # 250 ms against 290: 14% faster than its ceiling
    assert "benchmark error" in errors[0]["message"]
    targets = {t["target"]: t for t in e2e.judge_targets(rows, errors)}
    ceiling = targets["DLAC both directions >= 0.9 of its ceiling"]
    assert ceiling["invalid"] and not ceiling["met"]
    assert ceiling["per_repeat"] == pytest.approx([280 / 300, 300 / 310, 290 / 250])
    assert e2e.ceiling_checks([*rows[:2], _row("1gbit", "ceiling_dlac_dlac", [290, 300, 260])]) == []


def test_variants_alternate_abba_and_run_on_library_defaults() -> None:

    names = ["fp32", "dlac_dlac", "ceiling_dlac_dlac"]
    assert [e2e.launch_order(names, r) for r in range(3)] == [names, names[::-1], names]
    for v in e2e.VARIANTS.values():
        base = v.name.removesuffix("_pipelined").removesuffix("_alternate")  # a pipelined variant: its twin's name
        assert (base != v.name) is (v.pipeline is not None)
        if v.overlap is not None:
            assert base.endswith("_sync" if v.overlap is False else "_overlap")


def test_qcomm_bytes_of_old_results_files_are_converted_to_remote_traffic() -> None:

    rows = [
        dict(dataset="d", seed=0, variant="uncompressed", steps=2, fwd_raw_bytes=0, fwd_sent_bytes=0, val_auroc=0.8),
        dict(dataset="d", seed=0, variant="constant 0.01", steps=2, fwd_raw_bytes=1000, fwd_sent_bytes=100,
             bwd_raw_bytes=1000, bwd_sent_bytes=500, val_auroc=0.8),
        dict(dataset="d", seed=0, variant="qcomm INT8/FP16", steps=2, fwd_raw_bytes=2000, fwd_sent_bytes=640,
             bwd_raw_bytes=0, bwd_sent_bytes=0, val_auroc=0.8),
    ]
    fixed = {r["variant"]: r for r in normalize_bytes(rows)}
    assert (fixed["qcomm INT8/FP16"]["fwd_raw_bytes"], fixed["qcomm INT8/FP16"]["fwd_sent_bytes"]) == (1000, 320)
    assert fixed["uncompressed"]["fwd_sent_bytes"] == 1000  # the fp32 reference
    summary = {s["variant"]: s for s in over_seeds(list(fixed.values()))}
    assert summary["constant 0.01"]["fwd_ratio_mean"] == pytest.approx(10.0)
    assert summary["qcomm INT8/FP16"]["vs_constant_mean"] == pytest.approx(3.2)
    again = normalize_bytes(list(fixed.values()))  # converting twice changes nothing
    assert [r["fwd_sent_bytes"] for r in again] == [r["fwd_sent_bytes"] for r in fixed.values()]


def _frontier_rows(default_fwd: float) -> list[dict]:
    """Three seeds of made-up launches: (variant, AUROC difference per seed, forward and backward bytes per step)."""
    launches = [
        ("uncompressed", (0.0, 0.0, 0.0), 1000, 1000),
        ("qcomm FP16/FP16", (0.001, 0.001, 0.001), 500, 500),
        ("qcomm MX4/MX4", (-0.005, -0.005, -0.005), 140, 140),
        ("constant 0.002", (0.0005, 0.0015, 0.0), 150, 500),
        ("DLAC default", (-0.01, -0.01, -0.01), default_fwd, 500),
    ]
    return [dict(dataset="criteo", seed=seed, variant=v, steps=10, val_auroc=0.7 + deltas[seed],
                 fwd_raw_bytes=10_000, fwd_sent_bytes=fwd * 10, bwd_raw_bytes=10_000, bwd_sent_bytes=bwd * 10,
                 byte_accounting="remote") for v, deltas, fwd, bwd in launches for seed in range(3)]


def test_the_frontier_counts_a_qcomm_point_dominated_only_within_the_paired_noise() -> None:

    (f,) = frontier(_frontier_rows(default_fwd=100))
    pairs = {p["qcomm"]: p for p in f["pairs"]}
    # constant 0.002 against FP16: per-seed differences -0.0005, +0.0005, -0.001: mean -0.00033, 2 SE 0.00088
    (c,) = [c for c in pairs["qcomm FP16/FP16"]["candidates"] if c["dlac"] == "constant 0.002"]
    assert c["auroc_diff"] == pytest.approx(-0.001 / 3) and c["noise"] == pytest.approx(2 * 0.00076376 / 3 ** 0.5,
                                                                                         rel=1e-4)
    assert pairs["qcomm FP16/FP16"]["dominated_by"] == ["constant 0.002"] and c["no_more_total_bytes"]
    assert pairs["qcomm MX4/MX4"]["dominated_by"] == []  # the default is cheaper but 0.005 worse, with no noise
    every, default = f["targets"]
    assert not every["met"] and every["not_dominated"] == ["qcomm MX4/MX4"]
    assert default["met"] and default["on_frontier"]  # nothing sends fewer forward bytes than it
    (f,) = frontier(_frontier_rows(default_fwd=200))  # now cheaper and better points exist
    beaten = {b["variant"] for b in f["targets"][1]["beaten_by"]}
    assert not f["targets"][1]["met"] and beaten == {"constant 0.002", "qcomm MX4/MX4"}
    failed = [dict(dataset="criteo", variant="qcomm FP8/FP8", seed=0, error="RuntimeError: no", seeds_not_launched=[1])]
    text = "\n".join(frontier_lines([f], failed))
    assert "qcomm FP8/FP8: TorchRec could not run it here (seed 0; not launched again for seeds 1): `RuntimeError" \
        in text


def test_the_pipeline_block_sets_each_pipelined_variant_beside_its_twin_and_judges_the_target(
        tmp_path: Path) -> None:

    def row(variant: str, launch_ms: list[float], input_dist_ms: float) -> dict:
        return dict(_row("1gbit", variant, launch_ms), label=e2e.VARIANTS[variant].label, input_dist_ms=input_dist_ms,
                    embedding_fwd_ms=30.0)

    rows = [row("dlac_dlac", [1000, 1150, 900], 20.0), row("dlac_dlac_pipelined", [800, 1000, 1000], 5.0)]
    (target,) = [t for t in e2e.judge_targets(rows, []) if t["variant"] == "dlac_dlac_pipelined"]
    assert target["pooled"] == pytest.approx(1000 / 1000) and not target["met"]  # medians 1000 and 1000
    assert target["per_repeat"] == pytest.approx([1000 / 800, 1150 / 1000, 900 / 1000])
    cfg = dict(batch_size=4096, world_size=2, repeats=3, steps=6, warmup=2, order="ABBA")
    metadata = dict(command="python benchmarks/e2e_bandwidth.py", git_commit="0123456789abcdef", git_dirty=False,
                    date="2026-01-01T00:00:00+00:00", cores=2, cpu="a CPU", loadavg_before=[1.0, 1.0, 1.0],
                    versions={"torch": "2"})
    write_results(tmp_path / "e2e_pipeline.json", metadata, cfg, rows, targets=[target], errors=[])
    body = render_block("pipeline", Results(tmp_path))
    # Unpipelined 1000 ms, pipelined 1000 ms (pooled medians); per repeat 1.25, 1.15, 0.90; input dist 2% of a step.
    assert "| 1gbit | DLAC both directions | 1000 | 1000 | 1.00x (0.90-1.25) | 20.0 -> 5.0 (2.0%) | 30.0 -> 30.0 |" \
        in body
    verdict = "DLAC both directions, pipelined >= 1.1x unpipelined: **not met**: 1.00; per repeat 0.90-1.25, 2 of 3"
    assert verdict in body
    assert body.rstrip().endswith("(Further figures awaiting `make bench-quick`"
                                  " (`benchmarks/results/e2e_pipeline_alternate.json`).)")
    assert render_block("pipeline", Results(tmp_path / "none")).startswith(
        "*Awaiting `make bench-quick` (`benchmarks/results/e2e_pipeline.json`")
    # The alternating variants need both kinds of block among the timed steps.
    assert alternate_problem(4, 16) is None and alternate_problem(0, 12) is None
    assert "hold only one kind" in alternate_problem(8, 4) and "hold only one kind" in alternate_problem(0, 8)


def test_the_modelled_figures_of_docs_strategy_are_what_its_dlac_estimate_commands_print() -> None:
    """docs/strategy.md quotes `dlac estimate`'s model of the pipeline (not measurements) in a block rendered by
    running the commands it shows; the block states the cluster's gains at every size and the verdict for a machine
    like this one."""
    block = "\n".join(pipeline_model(Results(RESULTS)))
    gains = re.findall(r"- (\d+) ranks: input dist ([\d.]+) ms .*?DLAC both directions ([\d.]+)x", block)
    assert [w for w, *_ in gains] == ["8", "64", "512", "2"], block
    cluster = [float(g) for _, _, g in gains[:3]]
    assert 1.0 < cluster[0] < cluster[2]  # the pipeline pays more as the cluster grows
    assert "cannot reach the 1.1x target" in block


# ---------------------------------------------------------------------------------------------------------------------
# A rendered conclusion follows the figures: rendered from made-up results on both sides of the claim


def _results_with(tmp_path: Path, name: str, edit) -> Results:  # noqa: ANN001 - a function of the rows

    data = json.loads((RESULTS / name).read_text())
    edit(data["results"])
    (tmp_path / name).write_text(json.dumps(data))
    return Results(tmp_path)


@pytest.mark.parametrize(("overlap_ms", "says"), [
    (0.8, "overlapping paid at every rate of this run"),
    (1.2, "on gloo the synchronous exchange stays the default"),
])
def test_the_overlap_sentence_follows_the_figures(tmp_path: Path, overlap_ms: float, says: str) -> None:
    def edit(rows: list[dict]) -> None:
        sync = {r["rate"]: r for r in rows if r["variant"] == "dlac_dlac"}
        for r in rows:
            if r["variant"] == "dlac_dlac_overlap":
                base = sync[r["rate"]]
                r["median_step_ms"] = base["median_step_ms"] * overlap_ms
                r["launch_median_ms"] = [m * overlap_ms for m in base["launch_median_ms"]]

    text = "\n".join(overlap_default(_results_with(tmp_path, "e2e_pipeline.json", edit)))
    assert says in text, text


@pytest.mark.parametrize(("a2a_ms", "speedup", "says"), [
    (200.0, 1.02, "the DCN's compute the rest, so the bytes saved barely show"),
    (1200.0, 1.02, "so the codec's own time is what holds it back"),
    (1200.0, 1.5, "and the bytes saved show"),
])
def test_the_dlrm_v2_reading_follows_the_figures(a2a_ms: float, speedup: float, says: str) -> None:
    row = {"median_step_ms": 1600.0, "fwd_a2a_ms": a2a_ms / 2, "bwd_a2a_ms": a2a_ms / 2, "speedup_vs_fp32": speedup}
    assert says in dlrm_v2_reading(row)


# ---------------------------------------------------------------------------------------------------------------------
# No figure outside a rendered block: a hand-written measurement would drift from the data


NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"
# A measured figure, as the docs write them: a ratio (31x), a share (15%), a rate (GB/s, rows/s), a time (ms, s), a
# size in MiB, a signed AUROC difference (-0.0025); ranges of them too (2.7-3.5 GB/s).
FIGURE = re.compile(rf"(?<![\w.`/=])(?:{NUMBER}(?:\s?-\s?{NUMBER})?)(?:x\b|\s?%|\s?GB/s|\s?rows/s|\s?ms\b|\s?s\b"
                    rf"|\s?MiB\b|\s?min(?:utes)?\b)|(?<![\w.])[-+]0\.\d{{3,4}}\b")
# Figures that are not measurements: constants of the code, defaults, targets and paper values, each with its
# reason. Keep this short; a measurement belongs in a results file and a rendered block.
ALLOWED = {
    "100 GB/s": "the GPU codec's throughput target (issue 17), not a measurement",
    "300 s": "a constant: pytest-timeout's default (pyproject.toml) and the GPU session's budget (gpu_session.sh)",
    "150 s": "the GPU session's allowance for a cold machine start, an assumption stated as one",
    "900 s": "the device tool's 15-minute budget",
    "600 s": "a constant of tests/comm/test_reliability.py (the survivor's collective timeout)",
    "60 s": "a constant of the test launcher (pytest-timeout per CUDA test)",
    "15 s": "a constant of tests/comm/test_reliability.py (the hung peer's timeout)",
    "4 s": "a constant of tests/comm/test_comm.py (the collective timeout under test)",
    "12 minutes": "a target (issue 36: the pytest part of `make test` on 2 idle cores)",
    "30 min": "a default (DLACStrategy(timeout=...), torch's collective timeout)",
    "15%": "a target (the scaling model's |error|) or a default (gradient_tolerance=0.15)",
    "10%": "a tolerance of tests/adaptive/test_gradient_calibration.py, or a default share of the run",
    "0.1%": "a default (sensitivity_tolerance=1e-3)",
    "5%": "a constant: the benchmark error threshold of a launch faster than its ceiling (CEILING_TOLERANCE)",
    "90%": "a target (ratio within 90% of dedup + order-0 entropy)",
    "2x": "FP16's ratio, a format's constant",
    "16x": "a constant of the uncompressed fallback (its longest check interval)",
    "1.1x": "a target (issue 29: pipelined >= 1.1x unpipelined)",
    "1.15x": "a target (issue 34: >= 1.15x the fastest qcomm variant)",
    "1.5 GB/s": "a target (one-thread gradient codec speed)",
    "1.8x": "a target (issue 14)",
    "0.97x": "a target (issue 25: compress=\"auto\" unthrottled)",
    "2%": "a target (issue 56: the soak's growth per 10,000 steps)",
    "50 ms": "a constant of lightning_dlac/comm/liveness.py (WRITE_INTERVAL_S: how often the marks reach the store)",
    "1.5 s": "a constant of lightning_dlac/comm/liveness.py (the pause between two reads of the marks)",
    "5 s": "a constant of lightning_dlac/comm/liveness.py (READ_TIMEOUT: reading the marks gives up)",
    "1%": "a setting (issue 56: the emulated network's packet loss)",
    "5-50 ms": "a setting (issue 56: the emulated network's jitter)",
}


def _figures(doc: str) -> list[tuple[int, str]]:
    text = (REPO / doc).read_text()
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731 - keep line numbers
    text = re.sub(r"<!-- BEGIN render:([\w-]+) -->.*?<!-- END render:\1 -->", blank, text, flags=re.S)
    text = re.sub(r"```.*?```", blank, text, flags=re.S)  # commands and examples
    # inline code (option values, commands), which may wrap onto the next line but never spans a paragraph
    text = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))*`", lambda m: "``" + blank(m), text)
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        found += [(number, m.group(0).strip()) for m in FIGURE.finditer(line)]
    return found


DOC_FILES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOC_FILES)
def test_no_figure_outside_a_rendered_block(doc: str) -> None:
    """Every measured figure of README.md and docs/ is rendered from a results file (``python -m benchmarks.render``);
    what is left outside the blocks is a constant on the commented list above."""
    stray = [f"{doc}:{line}: {fig}" for line, fig in _figures(doc) if fig not in ALLOWED]
    assert not stray, "figures outside a rendered block (render them from a results file, or remove them):\n" + \
        "\n".join(stray)


def test_the_figure_scan_finds_a_hand_written_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "doc.md").write_text("Intro.\n\nThe codec runs at 2.7-3.5 GB/s and saves 29.2x; AUROC -0.0025.\n"
                                     "<!-- BEGIN render:x -->\n31x\n<!-- END render:x -->\n`--rate 4x`\n"
                                     "A command that wraps, `make\n test`, took 11.1 minutes.\n"
                                     "```\n10 ms\n```\n")
    assert [fig for _, fig in _figures("doc.md")] == ["2.7-3.5 GB/s", "29.2x", "-0.0025",
                                                                "11.1 minutes"]


def test_every_results_file_carries_its_metadata_and_is_rendered() -> None:
    """No orphan results: a committed results file says where it comes from (commit, date, machine, command) and
    some rendered block reads it; a file nothing reads or that predates the metadata is regenerated or deleted."""

    read = {f for block in BLOCKS.values() for f in (*block.files, *block.optional)}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        metadata = data.get("metadata") if isinstance(data, dict) else None
        assert metadata and metadata.get("git_commit") and metadata.get("command"), \
            f"{path.name} has no metadata: regenerate it with its `make bench*` step or delete it"
        assert path.name in read, f"{path.name} is read by no rendered block (benchmarks/render/): render or delete it"


def test_the_worlds_block_shows_each_worlds_noise_floor_when_the_file_has_one(tmp_path: Path) -> None:

    name = "calibration_worlds_quick.json"
    data = json.loads((RESULTS / name).read_text())
    for k, w in enumerate(data["per_world"]):
        w["noise_floor"] = {"train_seeds": 5, "floor": 0.0005 * (k + 1)}
    (tmp_path / name).write_text(json.dumps(data))
    lines = calibration_worlds(Results(tmp_path))
    floor = [line for line in lines if line.startswith("Noise floor per world")]
    assert len(floor) == 1 and "5 paired training seeds" in floor[0]
    assert floor[0].endswith("1000 0.0005, 1001 0.0010, 1002 0.0015.")
    for w in data["per_world"]:  # a run from before paired training seeds: one seed per arm, no floor to show
        del w["noise_floor"]
    (tmp_path / name).write_text(json.dumps(data))
    assert "Noise floor" not in "\n".join(calibration_worlds(Results(tmp_path)))


def test_the_worlds_summary_judges_each_world_against_its_floor_when_the_run_has_one(tmp_path: Path) -> None:
    """The issue's two AUROC judgements are also shown with each world's margin widened to its floor: with a quick
    run's floors of several hundredths, 0.001 alone says nothing."""

    name = "calibration_worlds_quick.json"
    data = json.loads((RESULTS / name).read_text())
    data["summary"].update(within_floor_of_all_tight=2 / 3, worse_than_all_loose_beyond_floor=1)
    (tmp_path / name).write_text(json.dumps(data))
    lines = calibration_worlds(Results(tmp_path))
    header = next(line for line in lines if line.startswith("| summary |"))
    assert "within the floor of all-tight" in header and "worse than all-loose beyond the floor" in header
    row = next(line for line in lines if line.startswith("| default"))
    assert row.count("|") == header.count("|") and "| 67% | 1 |" in row
    for key in ("within_floor_of_all_tight", "worse_than_all_loose_beyond_floor"):  # a run without floors
        for summary in (v for k, v in data.items() if k.startswith("summary")):
            summary.pop(key, None)
    (tmp_path / name).write_text(json.dumps(data))
    header = next(line for line in calibration_worlds(Results(tmp_path)) if line.startswith("| summary"))
    assert "floor" not in header


def test_a_worlds_run_stopped_early_says_how_many_worlds_it_planned(tmp_path: Path) -> None:

    name = "calibration_worlds_quick.json"
    data = json.loads((RESULTS / name).read_text())
    data["config"]["seeds_planned"] = [*data["config"]["seeds"], 1003, 1004]
    (tmp_path / name).write_text(json.dumps(data))
    text = "\n".join(calibration_worlds(Results(tmp_path)))
    assert "the run was stopped after 3 of the 5 worlds it planned" in text


def test_the_perturbation_block_reads_the_spread_of_the_constant_bounds(tmp_path: Path) -> None:

    constants = [{"eps": 0.0099, "val_auroc": 0.9431}, {"eps": 0.01, "val_auroc": 0.9426},
                 {"eps": 0.0101, "val_auroc": 0.857}]
    data = {"metadata": {"git_commit": "0" * 40, "command": "x", "date": "2026-12-04T00:00:00+00:00"},
            "config": {"worlds": "eval", "steps": 1000},
            "perturb": {"world": 1000, "train_seed": 1, "uncompressed": 0.9559, "constants": constants,
                        "spread": 0.9431 - 0.857}}
    (tmp_path / "calibration_perturb.json").write_text(json.dumps(data))
    lines = calibration_perturb(Results(tmp_path))
    assert "| 0.0101 | 0.8570 | -0.0989 |" in lines
    assert lines[-1] == "A one-percent change of the bound moves this run's AUROC by up to 0.0861 (86x the 0.001 the" \
        " issue judges)."


def test_a_settled_ablation_marks_the_seeds_whose_arm_reached_the_cap(tmp_path: Path) -> None:

    name = "calibration_ablation_eval.json"
    data = json.loads((RESULTS / name).read_text())
    assert data["config"]["settle"]
    for r in data["results"]:  # every arm settled but one ablation arm under the second seed
        r["settled"] = not (r["variant"] == "loose:t_f3" and r["train_seed"] == 1)
    (tmp_path / name).write_text(json.dumps(data))
    lines = calibration_ablation(Results(tmp_path), name)
    marked = [line for line in lines if CAPPED in line]
    row = [line for line in marked if line.startswith("| t_f3 |")]
    assert len(row) == 1 and row[0].split(" | ")[3].count(CAPPED) == 1
    assert row[0].split(" | ")[3].split(", ")[1].endswith(CAPPED)  # the second seed's cost
    assert [line for line in marked if not line.startswith("| ")] == [f"{CAPPED}: the arm reached the cap"
                                                                        " without settling."]
    for r in data["results"]:
        r["settled"] = True
    (tmp_path / name).write_text(json.dumps(data))
    assert CAPPED not in "\n".join(calibration_ablation(Results(tmp_path), name))


def test_the_family_frontier_says_by_how_much_an_undominated_qcomm_point_is_missed() -> None:

    per_world = json.loads((RESULTS / FAMILY_FRONTIER_FILE).read_text())["per_world"]
    # A world of the committed file, with one qcomm point that has cheaper DLAC points made undominated whatever
    # the run found: the lines are read from the pair, so the test does not hang on a result.
    world, missed = next((w, p) for w in per_world for p in w["frontier"]["pairs"]
                         if any(c["no_more_fwd_bytes"] and c["seeds"] for c in p["candidates"]))
    for p in world["frontier"]["pairs"]:
        p["dominated_by"] = [] if p is missed else p["dominated_by"] or ["a DLAC point"]
    fewer = [c for c in missed["candidates"] if c["no_more_fwd_bytes"] and c["seeds"]]
    closest = max(fewer, key=lambda c: c["auroc_diff"] + c["noise"])
    (line,) = _undominated_lines([world])[1:]
    assert line.startswith(f"- world {world['world']}, {missed['qcomm']} (") and "not dominated" in line
    assert f"{closest['dlac']} (" in line and f"{closest['auroc_diff']:+.5f} AUROC from it" in line
    assert f"beyond the noise {closest['noise']:.5f}." in line
    for c in missed["candidates"]:  # no DLAC point as cheap: said so, not left out
        c["no_more_fwd_bytes"] = False
    assert _undominated_lines([world])[1:] == [line.split(" not dominated;")[0]
                                                      + " not dominated; no DLAC point sends as few forward bytes."]
    missed["dominated_by"] = [closest["dlac"]]
    assert _undominated_lines([world]) == []


def _default_on_the_frontier(per_world: list) -> None:
    """Judge the default on the frontier in each of these worlds of a frontier file."""
    for _, x in default_standing(per_world):
        x.update(on_frontier=True, met=True)


def test_the_family_frontier_readme_row_says_so_far_until_every_world_has_its_planned_seeds(tmp_path) -> None:


    (step,) = [s for s in STEPS if s.output == FAMILY_FRONTIER_FILE]
    worlds, seeds = step.count("--count"), step.count("--train-seeds")
    data = json.loads((RESULTS / FAMILY_FRONTIER_FILE).read_text())
    _default_on_the_frontier(data["per_world"])  # whatever the run found (next test: near)

    def row(n_worlds: int, n_seeds: int) -> str:
        data["summary"]["worlds"], data["config"]["train_seeds"] = n_worlds, n_seeds
        (tmp_path / FAMILY_FRONTIER_FILE).write_text(json.dumps(data))
        (line,) = _family_frontier_row(Results(tmp_path))
        return line.targets.full

    assert "so far" not in row(worlds, seeds)
    assert row(worlds, seeds - 1).endswith(
        f" worlds so far ({seeds - 1} or more of the {seeds} paired seeds per world `make bench` runs)"
        " (forward bytes)")
    short = row(worlds - 1, 1)
    assert f"so far ({worlds - 1} of the {worlds} worlds and 1 or more of the {seeds} paired seeds" in short


def test_the_family_frontier_says_where_the_default_is_near_the_frontier_only_within_noise(tmp_path) -> None:
    """"Near" is within the paired noise, which on a world whose arms reach the cap unsettled is of the size of
    their swings: the block counts each world's settled arms and names the points that beat a near default, and the
    README row says in how many worlds the default is on the frontier and where it is only near."""

    data = json.loads((RESULTS / FAMILY_FRONTIER_FILE).read_text())
    first, *others = data["per_world"]
    _default_on_the_frontier(others)
    (near,) = [x for x in first["frontier"]["targets"] if "on_frontier" in x]
    near.update(met=True, on_frontier=False, beaten_by=[{"variant": "constant 0.05", "auroc_diff": 0.0097,
                                                         "noise": 0.0244, "seeds": 5, "beyond_noise": False}])
    runs = [r for r in data["results"] if r["world"] == first["world"]]
    for i, r in enumerate(runs):
        r["settled"] = i % 2 == 0
    (tmp_path / FAMILY_FRONTIER_FILE).write_text(json.dumps(data))
    text = "\n".join(frontier_worlds(Results(tmp_path)))
    (line,) = [x for x in text.splitlines() if x.startswith(f"| {first['world']} |")]
    assert line.split(" | ")[3] == f"{(len(runs) + 1) // 2} of {len(runs)}" and line.endswith("| near |")
    assert (f"World {first['world']}: the default is off the frontier and counts as near it only within noise:"
            " constant 0.05 has no more forward bytes and +0.0097 AUROC over it (noise 0.0244, 5 paired"
            " seeds).") in text
    (row,) = _family_frontier_row(Results(tmp_path))
    worlds = len(data["per_world"])
    assert (f"the default on or near the frontier: met in {worlds} of {worlds} worlds, on it in {len(others)} and"
            f" near it only within noise on world {first['world']} (forward bytes)") in row.targets.full


def test_the_versions_block_says_which_results_were_measured_under_the_pinned_set(tmp_path: Path) -> None:
    """A move of the pins marks every figure measured under the old set: the block counts the files run under the
    pinned versions (a local build tag such as +cpu is the same release) and names every other set with its files."""
    pinned = pinned_versions()
    assert {"torch", "torchrec", "fbgemm-gpu-cpu"} <= set(pinned)
    current = {"torch": f"{pinned['torch']}+cpu", "torchrec": pinned["torchrec"],
               "fbgemm-gpu-cpu": pinned["fbgemm-gpu-cpu"]}
    for name, versions in (("new.json", current), ("old.json", dict(current, torch="1.0.0")),
                           ("gpu.json", {"torch": "2.11.0"})):
        write_results(tmp_path / name, {"command": "python -m benchmarks.x", "date": "2026-12-06T00:00:00+00:00",
                                        "versions": versions}, {}, [])
    text = "\n".join(render_block("versions", Results(tmp_path)).splitlines())
    assert "1 of the 3 results files were measured under it (`new.json`)" in text
    assert f"- torch 1.0.0, torchrec {pinned['torchrec']}, fbgemm-gpu-cpu {pinned['fbgemm-gpu-cpu']}: 1 file(s)," \
           " `old.json`" in text
    assert "- torch 2.11.0: 1 file(s), `gpu.json`" in text  # the lent GPU's image: no TorchRec to pin
