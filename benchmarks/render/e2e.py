"""docs/benchmarks.md's end-to-end sections: training steps under a throttled interconnect against TorchRec's codecs
and DLAC's like-for-like ceiling, DLRM v2, the overlapped exchange, the exchange phase by phase, in pieces, and the
race against every TorchRec codec (full CPU, starved, 10 Gbit/s)."""

from __future__ import annotations

from typing import Any

from benchmarks.lib.e2e import VARIANTS, paired, table
from benchmarks.lib.rule import judge, span, verdict_text
from benchmarks.render.core import Block, Results, fmt_range, pick, source_line, speed


def e2e_rows(results: Results, *names: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                        list[dict[str, Any]], list[str]]:
    rows, targets, errors, sources = [], [], [], []
    for name in names:
        data = results.get(name)
        if data is None:
            continue
        rows += data["results"]
        targets += data.get("targets", [])
        errors += data.get("errors", [])
        sources.append(name)
    return rows, targets, errors, sources


def _ceiling_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        source = VARIANTS.get(r["variant"]).ceiling_of if r["variant"] in VARIANTS else None
        found = paired(rows, r["rate"], source, r["variant"]) if source else None
        if found:
            pooled, reps = found
            dlac = pick(rows, r["rate"], source)
            lines.append(f"- {r['rate']}: {VARIANTS[source].label} runs at {pooled:.2f} of its ceiling's speed"
                         f" (per repeat {fmt_range(reps)}); per step forward / backward the ceiling sent"
                         f" {r['fwd_sent_bytes_per_step'] / 2**20:.3f} / {r['bwd_sent_bytes_per_step'] / 2**20:.3f}"
                         f" MiB, DLAC {dlac['fwd_sent_bytes_per_step'] / 2**20:.3f} /"
                         f" {dlac['bwd_sent_bytes_per_step'] / 2**20:.3f} MiB.")
    return lines


def e2e_body(results: Results, names: tuple[str, ...]) -> list[str]:
    rows, targets, errors, sources = e2e_rows(results, *names)
    lines = []
    for name in sources:
        data = results.get(name)
        cfg = data["config"]
        lines += [source_line(name, data, results.shown), "",
                  f"Batch {cfg['batch_size']} per rank, {cfg['world_size']} gloo ranks (one thread each), model"
                  f" `{cfg.get('model', 'dlrm')}`; {cfg['repeats']} repeat(s) of every variant in"
                  f" {cfg.get('order', 'round-robin')} order, {cfg['steps']} timed steps after {cfg['warmup']} warm-up"
                  " steps per launch; median over the pooled steps (per step, the slower rank), ranges over the"
                  " launches. Bytes are per rank and step, to other ranks.", ""]
    lines += [*table(rows), ""]
    lines += _ceiling_lines(rows)
    if targets:
        lines += ["", "Targets (the rule above):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    if errors:
        lines += ["", "**Benchmark errors in this run** (its ceiling figures are not results):", ""]
        lines += [f"- {e['message']}" for e in errors]
    return lines


def e2e(results: Results) -> list[str]:
    return e2e_body(results, ("e2e_throttled.json", "e2e_unthrottled.json"))


def e2e_dlrm_v2(results: Results) -> list[str]:
    return e2e_body(results, ("e2e_dlrm_v2.json",))


def readme_e2e(results: Results) -> list[str]:
    rows, targets, errors, sources = e2e_rows(results, "e2e_throttled.json", "e2e_unthrottled.json")
    cfg = results.get(sources[0])["config"]
    bf16, int8 = pick(rows, "1gbit", "dlac_bf16"), pick(rows, "1gbit", "qcomm_int8_fp16")
    both = pick(rows, "1gbit", "dlac_dlac")
    clauses = []
    if bf16 is not None:
        clauses.append(f"DLAC forward + bf16 backward runs at {speed(bf16)} the speed of uncompressed FP32 and sends"
                       f" {bf16['fwd_ratio']:.0f}x fewer forward bytes")
    if int8 is not None:
        clauses.append(f"TorchRec's INT8/FP16 qcomm at {speed(int8)}")
    if both is not None:
        clauses.append(f"DLAC in both directions at {speed(both)} the speed of FP32")
    text = (f"End to end ({cfg['world_size']} ranks, batch {cfg['batch_size']} each, loopback throttled to 1 Gbit/s,"
            f" {cfg['repeats']} launches per variant in ABBA order; ratios are pooled medians with the per-repeat"
            f" range): {'; '.join(clauses)}")
    ceiling = paired(rows, "1gbit", "dlac_dlac", "ceiling_dlac_dlac")
    if ceiling:
        text += (f", {ceiling[0]:.2f} of its like-for-like ceiling (per repeat {fmt_range(ceiling[1])}; the null codec"
                 " in the same exchange, sending DLAC's bytes)")
    auto, fixed = pick(rows, "unthrottled", "dlac_auto"), pick(rows, "unthrottled", "dlac_bf16")
    if auto is not None:
        text += (". On a fast link (unthrottled), `CompressionOptions(auto_fallback=True)` runs at"
                 f" {speed(auto)} the speed of FP32 with {auto.get('uncompressed_share', 0):.0%} of its steps"
                 " uncompressed")
        if fixed is not None:
            text += f", where fixed compression (DLAC + bf16) runs at {speed(fixed)}"
    lines = [text + ".", ""]
    if targets:
        lines += ["Targets (by the rule of docs/benchmarks.md):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
        lines.append("")
    if errors:
        lines += ["**Benchmark errors in this run:** " + " ".join(e["message"] + "." for e in errors), ""]
    lines += [" ".join(source_line(n, results.get(n), results.shown) for n in sources)]
    return lines


def overlap_default(results: Results) -> list[str]:
    """Why gloo's default is synchronous: the overlapped exchanges against the synchronous ones (the default) at each
    rate, launch for launch, from the pipeline run (which launches both); the sentence follows the figures."""
    data = results.get("e2e_pipeline.json")
    rows, parts, faster = data["results"], [], []
    for rate in dict.fromkeys(r["rate"] for r in rows):
        found = paired(rows, rate, "dlac_dlac_overlap", "dlac_dlac")
        if found is None:
            continue
        pooled, per = found
        parts.append(f"at {rate} the overlapped exchanges ran at **{pooled:.2f}x** (per repeat {span(per)}) the speed"
                     f" of the synchronous ones")
        faster.append(pooled > 1 and sum(v > 1 for v in per) * 3 >= 2 * len(per))
    if not parts:
        return [source_line("e2e_pipeline.json", data, results.shown), "",
                "This run launched no `dlac_dlac_overlap` beside `dlac_dlac`."]
    if not any(faster):
        verdict = ("so on gloo the synchronous exchange stays the default: here the loopback transfer is CPU work on"
                   " the same cores, and launching it early makes it compete with the step's compute.")
    elif all(faster):
        verdict = ("so overlapping paid at every rate of this run: the gloo default (synchronous) should be"
                   " revisited.")
    else:
        verdict = "so neither way wins at every rate of this run; the gloo default (synchronous) stands until one does."
    return [source_line("e2e_pipeline.json", data, results.shown), "",
            "DLAC both directions on 2 gloo ranks, unpipelined: " + "; ".join(parts) + ", " + verdict]


QCOMM_RACE = ("qcomm_int8_fp16", "qcomm_fp8", "qcomm_mx4", "qcomm_mx4_bf16")


# Issue 34's target for each phase of the exchange: within 1.5x of its kernel's own time for the same bytes.
PHASE_TARGET = 1.5


# Issue 34 asked DLAC both directions for this share of its like-for-like ceiling at 1 Gbit/s; the benchmark judges and
# records the ceiling target of benchmarks/lib/e2e.py's TARGETS (0.9 there), and that one threshold is what is shown.
ISSUE_34_CEILING = 0.95


def ceiling_threshold(data: dict[str, Any], rate: str) -> float | None:
    """The threshold of the ceiling target a results file records at ``rate`` (None where it records none)."""
    return next((t["threshold"] for t in data.get("targets") or [] if t.get("rate") == rate
                 and t.get("reference", "").startswith("ceiling_")), None)


def exchange_profile(results: Results) -> list[str]:
    """Per backward encoding and direction: each phase's wall and CPU time and page faults, the kernels' own time for
    the same bytes and the phase / kernel ratios."""
    data = results.get("exchange_profile.json")
    lines = [source_line("exchange_profile.json", data, results.shown), ""]
    for backward, s in data["results"].items():
        b = s["bytes"]
        lines += [f"DLAC forward + {backward} backward, per call and rank: forward"
                  f" {b['forward_raw_bytes'] / 2**20:.1f} -> {b['forward_sent_bytes'] / 2**20:.2f} MiB, backward"
                  f" {b['backward_raw_bytes'] / 2**20:.1f} -> {b['backward_sent_bytes'] / 2**20:.2f} MiB.", "",
                  "| direction | phase | wall ms | CPU ms | page faults |", "|---|---|---:|---:|---:|"]
        for direction in ("forward", "backward"):
            d = s[direction]
            for phase, v in d["phases"].items():
                lines.append(f"| {direction} | {phase} | {v['wall_ms']:.2f} | {v['cpu_ms']:.2f} |"
                             f" {v['page_faults']:.0f} |")
            for op, k in d["kernels"].items():
                lines.append(f"| {direction} | *{op} kernel alone* | {k['ms']:.2f} | {k['cpu_ms']:.2f} | - |")
                if "one_address_ms" in k:
                    lines.append(f"| {direction} | *{op} kernel alone, one input tensor replayed* |"
                                 f" {k['one_address_ms']:.2f} | {k['one_address_cpu_ms']:.2f} | - |")
            lines.append(f"| {direction} | **step** | {d['wall_ms']:.2f} | {d['cpu_ms']:.2f} | - |")
        lines.append("")
        for direction in ("forward", "backward"):
            ratios = s[direction]["phase_over_kernel"]["cpu"]
            text = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None)
            phases = {k: v for k, v in ratios.items() if v is not None and k != "direction"}
            met = [k for k, v in phases.items() if v <= PHASE_TARGET]
            missed = [k for k, v in phases.items() if v > PHASE_TARGET]
            verdict = (f"within {PHASE_TARGET}x: {', '.join(met) or 'none'}"
                       + (f"; above it: {', '.join(missed)}" if missed else ""))
            lines.append(f"- {direction}, CPU time over the kernels' own: {text} ({verdict}).")
            encode = s[direction]["kernels"].get("encode", {})
            if "one_address_cpu_ms" in encode and "encode" in ratios:
                replay = encode["one_address_cpu_ms"] / encode["cpu_ms"]
                lines.append(f"- {direction}: the encode kernel replayed on one input tensor took {replay:.2f} of"
                             f" its CPU time on a new tensor each call; over that replay the encode phase would read"
                             f" {ratios['encode'] / replay:.2f}x.")
        lines.append("")
    return lines


def _against_every_qcomm(rows: list[dict[str, Any]], variants: tuple[str, ...], name: str) -> list[dict[str, Any]]:
    """Each of ``variants`` judged at >= 1.0x every qcomm variant that ran at each rate of ``rows`` (launches paired
    by repeat); ``name`` is formatted with ``variant`` and ``q``."""
    judged = []
    for rate in sorted({r["rate"] for r in rows}):
        for variant in variants:
            for q in [q for q in QCOMM_RACE if pick(rows, rate, q)]:
                found = paired(rows, rate, variant, q)
                if found:
                    judged.append(judge(name.format(variant=variant, q=q), found[0], found[1], 1.0, rate=rate))
    return judged


def race_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 34's target of a race at full CPU (e2e_qcomm_race.json) that the results file does not record, at each
    of its rates, judged by the rule: DLAC both directions >= 1.15x the fastest qcomm variant. (Its ceiling target and
    DLAC + bf16 against INT8/FP16 are in the file's own targets, each with the threshold the run judged.)"""
    targets = []
    for rate in sorted({r["rate"] for r in rows}):
        ran = [q for q in QCOMM_RACE if pick(rows, rate, q)]
        fastest = min(ran, key=lambda q: pick(rows, rate, q)["median_step_ms"]) if ran else None
        found = paired(rows, rate, "dlac_dlac", fastest) if fastest else None
        if found:
            targets.append(judge(f"DLAC both directions >= 1.15x the fastest qcomm variant ({fastest})", found[0],
                                 found[1], 1.15, rate=rate))
    return targets


def starved_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return _against_every_qcomm(rows, ("dlac_dlac",), "CPU-starved: DLAC both directions ahead of {q}")


def fast_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 34's target at 10 Gbit/s (e2e_qcomm_race_10gbit.json): DLAC no slower than any qcomm variant."""
    return _against_every_qcomm(rows, ("dlac_dlac", "dlac_bf16"), "{variant} no slower than {q}")


def qcomm_race(results: Results) -> list[str]:
    """The race of every TorchRec codec against DLAC, its starved twin, the codecs' own rows and issue 34's targets
    judged by the rule."""
    lines = e2e_body(results, ("e2e_qcomm_race.json",))
    failed = results.get("e2e_qcomm_race.json").get("failed", [])
    if failed:
        lines += ["", "Could not run here (TorchRec's error):", ""]
        lines += [f"- {f['rate']}: {f['label']}: `{f['error']}`" for f in failed]
    targets = race_targets(results.get("e2e_qcomm_race.json")["results"])
    fast = results.get("e2e_qcomm_race_10gbit.json")
    if fast is not None:
        lines += ["", "At 10 Gbit/s, against the fastest qcomm variant of the race above:", ""]
        lines += e2e_body(results, ("e2e_qcomm_race_10gbit.json",))
        targets += fast_targets(fast["results"])
    starved = results.get("e2e_qcomm_race_starved.json")
    if starved is not None:
        lines += ["", "With `--cpu-starved` (every rank's threads on one core):", ""]
        lines += e2e_body(results, ("e2e_qcomm_race_starved.json",))
        targets += starved_targets(starved["results"])
    recorded = ceiling_threshold(results.get("e2e_qcomm_race.json"), "1gbit")
    lines += ["", "Issue 34's targets that the results files do not record, judged here from their launches (the rule"
              " above):", ""]
    lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    if recorded is not None and recorded != ISSUE_34_CEILING:
        lines += ["", f"Issue 34 asked for {ISSUE_34_CEILING} of the ceiling at 1 Gbit/s; the benchmark judges and"
                  f" records {recorded} (`benchmarks/lib/e2e.py`'s TARGETS), the one threshold shown for that target"
                  " here and in README."]
    codecs = results.get("codec_bench_qcomm.json")
    if codecs is not None:
        lines += ["", source_line("codec_bench_qcomm.json", codecs, results.shown), "",
                  "| payload | method | eps | ratio | max error / chunk range | enc GB/s (1 thread) |"
                  " dec GB/s (1 thread) |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in codecs["results"]:
            if r["method"].startswith(("TorchRec", "fbgemm", "DLAC", "FP16")):
                eps = "-" if r["eps"] is None else f"{r['eps']:g}"
                lines.append(f"| {r['payload']} | {r['method']} | {eps} | {r['ratio']:.2f} |"
                             f" {r['max_err_over_range']:.2e} | {r['enc_gbps_1t']:.2f} | {r['dec_gbps_1t']:.2f} |")
    return lines


PIECE_VARIANTS = (("dlac_dlac", "ceiling_dlac_dlac"), ("dlac_dlac_pieces", "ceiling_dlac_dlac_pieces"))


def e2e_pieces(results: Results) -> list[str]:
    """The exchange whole and in 4 pieces, each with its own ceiling: the race table, where each step's exchange
    time goes, and the pieces' speed against the whole exchange (launches paired by repeat)."""
    lines = e2e_body(results, ("e2e_pieces.json",))
    rows = results.get("e2e_pieces.json")["results"]
    lines += ["", "Per step (medians over the pooled steps, the slower rank), ms: the exchange's phases, and what DLAC"
              " spends beyond its ceiling in them (its codec, and what waits on it):", "",
              "| rate | variant | fwd encode | fwd exchange | fwd decode | bwd exchange | step |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for rate in sorted({r["rate"] for r in rows}):
        for pair in PIECE_VARIANTS:
            for name in pair:
                r = pick(rows, rate, name)
                if r is not None:
                    lines.append(f"| {rate} | {r['label']} | {r['fwd_encode_ms']:.1f} | {r['fwd_exchange_ms']:.1f} |"
                                 f" {r['fwd_decode_ms']:.1f} | {r['bwd_a2a_ms']:.1f} | {r['median_step_ms']:.0f} |")
    lines.append("")
    # The codec kernels' own time for one step's bytes (the same model and batch: exchange_profile.py), and below, per
    # rate, the time beyond the ceiling that issue 34's target leaves DLAC. Not a bound on the race: the profile is
    # another run, its upstream gradient is random, and the ceiling's own copies are not taken off.
    profile = results.get("exchange_profile.json")
    kernel_ms = None
    if profile is not None and "dlac" in profile["results"]:
        kernels = profile["results"]["dlac"]
        kernel_ms = sum(kernels[d]["kernels"][op]["ms"] for d in ("forward", "backward") for op in ("encode", "decode"))
    for rate in sorted({r["rate"] for r in rows}):
        for variant, ceiling in PIECE_VARIANTS:
            a, c = pick(rows, rate, variant), pick(rows, rate, ceiling)
            if a is not None and c is not None:
                fwd = sum(a[k] - c[k] for k in ("fwd_encode_ms", "fwd_exchange_ms", "fwd_decode_ms"))
                lines.append(f"- {rate}: {a['label']} beyond its ceiling: forward {fwd:.1f} ms, backward"
                             f" {a['bwd_a2a_ms'] - c['bwd_a2a_ms']:.1f} ms, step"
                             f" {a['median_step_ms'] - c['median_step_ms']:.0f} ms.")
        ceiling = pick(rows, rate, "ceiling_dlac_dlac")
        threshold = ceiling_threshold(results.get("e2e_pieces.json"), rate)
        if kernel_ms is not None and ceiling is not None and threshold is not None:
            budget = ceiling["median_step_ms"] * (1 / threshold - 1)
            lines.append(f"- {rate}: at {threshold} of this ceiling (its target) DLAC both directions may spend"
                         f" {budget:.1f} ms per step beyond it; the codec kernels alone take {kernel_ms:.1f} ms per"
                         f" step and rank for these bytes (encode and decode, both directions, each encode on a new"
                         f" input; exchange_profile.json, one thread, its random upstream gradient)"
                         + (f": {kernel_ms - budget:.1f} ms of them would have to overlap the transfer."
                            if kernel_ms > budget else "."))
        for variant, reference, what in (("dlac_dlac_pieces", "dlac_dlac", "DLAC in 4 pieces against the whole"
                                          " exchange"),
                                         ("ceiling_dlac_dlac_pieces", "ceiling_dlac_dlac", "the null codec in 4"
                                          " pieces against the whole exchange")):
            found = paired(rows, rate, variant, reference)
            if found:
                per = ", ".join(f"{x:.2f}" for x in found[1])
                lines.append(f"- {rate}: {what}: speed {found[0]:.2f}x (per repeat {per}).")
    return lines


BLOCKS = {
    "e2e": Block(("e2e_throttled.json",), e2e, optional=("e2e_unthrottled.json",)),
    "e2e_summary": Block(("e2e_throttled.json",), readme_e2e, optional=("e2e_unthrottled.json",)),
    "e2e_dlrm_v2": Block(("e2e_dlrm_v2.json",), e2e_dlrm_v2),
    "overlap_default": Block(("e2e_pipeline.json",), overlap_default),
    "exchange_profile": Block(("exchange_profile.json",), exchange_profile),
    "e2e_pieces": Block(("e2e_pieces.json",), e2e_pieces, optional=("exchange_profile.json",)),
    "qcomm_race": Block(("e2e_qcomm_race.json",), qcomm_race,
                        optional=("e2e_qcomm_race_10gbit.json", "e2e_qcomm_race_starved.json",
                                  "codec_bench_qcomm.json")),
}
