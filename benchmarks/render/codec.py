"""The codec's figures: docs/benchmarks.md's "Codec" (every method on every payload, its headline and DLRM v2's
payloads), its DLRM v2 summary and "Codec on GPU" (the CUDA kernels on a lent GPU), and docs/codec.md's summary of the
native codec per payload."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.lib.accuracy import load_rows, over_seeds
from benchmarks.lib.codec import markdown as codec_markdown
from benchmarks.lib.cuda_codec import COLUMNS, Table
from benchmarks.lib.rule import verdict_text
from benchmarks.render.core import Block, Results, awaiting, fmt_range, pick, source_line, speed


def codec(results: Results) -> list[str]:
    data = results.get("codec_bench.json")
    return [source_line("codec_bench.json", data, results.shown), "", *codec_markdown(data)]


def codec_rows(data: dict[str, Any], payload: str) -> dict[tuple[str, Any], dict[str, Any]]:
    return {(r["method"], r["eps"]): r for r in data["results"] if r["payload"] == payload}


def dlrm_v2_codec(results: Results) -> list[str]:
    data = results.get("codec_bench.json")
    lines = [source_line("codec_bench.json", data, results.shown), "",
             "| payload | method | eps | ratio | err/eb | enc 1t GB/s | dec 1t GB/s | modes |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    found = False
    for r in data["results"]:
        if not r["payload"].startswith("dlrm_v2") or r["method"].startswith("memcpy"):
            continue
        found = True
        modes = " ".join(f"{k}:{v}" for k, v in r.get("modes", {}).items())
        err = "-" if r.get("max_err_over_eb") is None else f"{r['max_err_over_eb']:.3f}"
        enc = "-" if r.get("enc_gbps_1t") is None else f"{r['enc_gbps_1t']:.2f}"
        dec = "-" if r.get("dec_gbps_1t") is None else f"{r['dec_gbps_1t']:.2f}"
        lines.append(f"| {r['payload']} | {r['method']} | {r['eps'] if r['eps'] is not None else '-'} |"
                     f" {r['ratio']:.2f} | {err} | {enc} | {dec} | {modes} |")
    if not found:
        return [source_line("codec_bench.json", data, results.shown), "",
                "This run had no DLRM v2 payloads (`--no-dlrm-v2`)."]
    targets = [t for t in data.get("targets", []) if t["payload"].startswith("dlrm_v2") and t["eps"] == 0.03
               and "GB/s" not in t["target"]]
    lines += ["", "Issue 14's codec targets at eps 0.03:"]
    lines += [f"- {t['payload']}: {t['target']}: {verdict_text(t)}" for t in targets]
    return lines


def readme_codec(results: Results) -> list[str]:
    d = results.get("codec_bench.json")
    crit = codec_rows(d, "criteo")
    if not crit:
        return ["The codec run in `benchmarks/results/codec_bench.json` had no Criteo payload (the sample file was"
                " missing)."]
    eps = sorted(e for (m, e) in crit if m.startswith("DLAC") and e is not None)
    dlac = [crit[(m, e)] for e in eps for (m, e2) in crit if m.startswith("DLAC") and e2 == e]
    ratios = " / ".join(f"{r['ratio']:.0f}x" for r in dlac)
    held = all(r["max_err_over_eb"] <= 1.0 for r in dlac)
    ent = [r["ratio"] / crit[("dedup + order-0 entropy", r["eps"])]["ratio"] for r in dlac
           if ("dedup + order-0 entropy", r["eps"]) in crit]
    parts = [f"On pooled embeddings of a DLRM trained on the real Criteo sample, the codec compresses **{ratios} at eps"
             f" {' / '.join(f'{e:g}' for e in eps)}** with the bound {'held on every element' if held else 'NOT held'}"]
    others = []
    sz3 = [crit.get(("SZ3 (pysz, ABS)", e)) for e in eps]
    if all(sz3):
        others.append("SZ3 at the same bound: " + " / ".join(f"{r['ratio']:.1f}x" for r in sz3))
    if ("fbgemm INT8 row-wise", None) in crit:
        others.append(f"fbgemm INT8 row-wise: {crit[('fbgemm INT8 row-wise', None)]['ratio']:.1f}x with no bound")
    others.append(f"FP16: {crit[('FP16 cast', None)]['ratio']:.0f}x")
    text = parts[0] + f" ({'; '.join(others)})"
    if ent:
        text += f", within {100 * min(ent):.0f}-{100 * max(ent):.0f}% of the dedup + order-0 entropy figure"
    timed = [r for p in ("zipf", "criteo") for r in codec_rows(d, p).values()
             if r["method"].startswith("DLAC") and r.get("enc_gbps_1t")]
    if timed:
        enc = [r["enc_gbps_1t"] for r in timed]
        dec = [r["dec_gbps_1t"] for r in timed]
        text += (f". Native single-thread speed (median call, Zipf and Criteo payloads): {fmt_range(enc, '.1f')} GB/s"
                 f" to compress and {fmt_range(dec, '.1f')} GB/s to decompress (targets 1 / 1.5 GB/s)")
    return [text + ".", "", source_line("codec_bench.json", d, results.shown)]


CODEC_PAYLOADS = {"zipf": "Zipf lookups, one 4096x64 chunk", "criteo": "Criteo DLRM pooled embeddings, 26 chunks",
                  "gradient": "their gradients (the backward payload), 26 chunks"}


def codec_summary(results: Results) -> list[str]:
    """The native codec per payload, one thread: the modes it chose, the ratio at each eps and its speed."""
    d = results.get("codec_bench.json")
    lines = [source_line("codec_bench.json", d, results.shown), "",
             "| payload | eps | modes | ratio | native encode GB/s | native decode GB/s |", "|---|---|---|---|---|---|"]
    for payload, label in CODEC_PAYLOADS.items():
        rows = sorted((r for r in codec_rows(d, payload).values() if r["method"] == "DLAC (native)"),
                      key=lambda r: r["eps"])
        if not rows:
            continue
        modes = ", ".join(sorted({m for r in rows for m in r.get("modes", {})}))
        enc = [r["enc_gbps_1t"] for r in rows if r.get("enc_gbps_1t")]
        dec = [r["dec_gbps_1t"] for r in rows if r.get("dec_gbps_1t")]
        eps = " / ".join(format(r["eps"], "g") for r in rows)
        ratios = " / ".join(format(r["ratio"], ".1f") for r in rows)
        lines.append(f"| {label} | {eps} | {modes} | {ratios} | {fmt_range(enc, '.1f') if enc else '-'} |"
                     f" {fmt_range(dec, '.1f') if dec else '-'} |")
    return lines


def dlrm_v2_reading(both: dict[str, Any]) -> str:
    """What the DLRM v2 end-to-end figures say, chosen by them: the exchanges' share of a DLAC step (its measured
    phases) and the speed against FP32."""
    a2a = (both.get("fwd_a2a_ms") or 0.0) + (both.get("bwd_a2a_ms") or 0.0)
    if not a2a:
        return ""
    share = a2a / both["median_step_ms"]
    pays = (both.get("speedup_vs_fp32") or 1.0) >= 1.1
    if share < 0.5 and not pays:
        return (f": the exchanges take {share:.0%} of a DLAC step, the DCN's compute the rest, so the bytes saved"
                " barely show here")
    if pays:
        return f": the exchanges take {share:.0%} of a DLAC step, and the bytes saved show"
    return f": the exchanges still take {share:.0%} of a DLAC step, so the codec's own time is what holds it back"


def readme_dlrm_v2(results: Results) -> list[str]:
    d = results.get("codec_bench.json")
    lines = []
    per_id, iid = codec_rows(d, "dlrm_v2"), codec_rows(d, "dlrm_v2_iid")
    if per_id and iid:
        eps = sorted(e for (m, e) in per_id if m.startswith("DLAC"))

        def ratios(rows: dict) -> str:
            return " / ".join(f"{rows[(m, e)]['ratio']:.0f}x" for e in eps for (m, e2) in rows
                              if m.startswith("DLAC") and e2 == e)

        int8 = per_id.get(("fbgemm INT8 row-wise", None))
        lines.append(
            "DLRM v2 (MLPerf's DLRM-DCNv2: DCN cross layers, dim 128, multi-hot features with MLPerf's pooling"
            " factors): on the multi-hot pooled embeddings of a trained `DLRM_DCN` the codec compresses"
            f" **{ratios(per_id)} at eps {' / '.join(f'{e:g}' for e in eps)}** when bags are a function of the id (as"
            f" MLPerf materialises them), and {ratios(iid)} when every id of a bag is drawn independently"
            + (f"; fbgemm INT8 row-wise is {int8['ratio']:.1f}x" if int8 else "") + ".")
    acc = results.get("adaptive_accuracy_dlrm_v2.json")
    if acc is not None:
        rows, _, _ = load_rows([results.directory / "adaptive_accuracy_dlrm_v2.json"])
        s = {x["variant"]: x for x in over_seeds(rows)}.get("DLAC homogenization")
        if s:
            lines.append(f"Trained through DLACStrategy ({len(s['seeds'])} seeds, {s['steps']} steps), the dual-level"
                         f" policy ends {s['delta_mean']:+.4f} AUROC from uncompressed on average (sd"
                         f" {s['delta_sd']:.4f}) with {s['fwd_ratio_mean']:.1f}x fewer forward bytes.")
    else:
        lines += awaiting(["adaptive_accuracy_dlrm_v2.json"], short=True)
    e2e_v2 = results.get("e2e_dlrm_v2.json")
    if e2e_v2 is not None:
        fp32 = pick(e2e_v2["results"], "1gbit", "fp32")
        both = pick(e2e_v2["results"], "1gbit", "dlac_dlac")
        if fp32 and both:
            lines.append(f"End to end at 1 Gbit/s on these CPUs a step takes {fp32['median_step_ms']:.0f} ms"
                         f" uncompressed and {both['median_step_ms']:.0f} ms with DLAC both ways"
                         f" ({speed(both)}){dlrm_v2_reading(both)}.")
    else:
        lines += awaiting(["e2e_dlrm_v2.json"], short=True)
    used = [n for n in ("codec_bench.json", "adaptive_accuracy_dlrm_v2.json", "e2e_dlrm_v2.json")
            if results.get(n) is not None]
    return [" ".join(lines), "", " ".join(source_line(n, results.get(n), results.shown) for n in used)]


GPU_TARGET_GBPS = 100.0  # docs/benchmarks.md, "Codec on GPU": each way, on an H200, for the realistic payloads


SYNC_COUNT_FIXED = "2026-12-04T15"  # cuda_codec_bench.py reads the sync debug mode's stderr from this session on


def cuda_codec(results: Results) -> list[str]:
    """The CUDA kernels on the lent GPU: every row of the run, and the 100 GB/s target judged per DLAC row."""
    data = results.get("cuda_codec_bench.json")
    rows = data["results"]
    cfg = data.get("config", {})
    # Runs before the bench read the sync debug mode's stderr counted only its Python warnings (the mode's own
    # notice, no synchronization): their column is left out rather than shown wrong.
    counted = data["metadata"].get("date", "") >= SYNC_COUNT_FIXED
    cols = COLUMNS if counted else COLUMNS[:-1]
    lines = [source_line("cuda_codec_bench.json", data, results.shown), "",
             f"{cfg.get('device')}, payloads of {cfg.get('batch')} rows per destination; GB/s of float32 input as the"
             " exchange calls the codec (op: the kernels alone), CUDA events; parity against the CPU kernels"
             + ("; synchronizations per encode / decode." if counted else ". The synchronizations per call are"
                " tests/codec/test_codec_cuda.py's (encode 1, decode 2, passed on the same machine): this run's own"
                " count read the wrong channel, so its column is left out."), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(Table.cells(r)[: len(cols)]) + " |" for r in rows]
    if data.get("not_measured"):  # a baseline that could not run there (no fbgemm, no Triton): said, not dropped
        lines += ["", *Table.not_measured_lines(data["not_measured"])]
    dlac = [r for r in rows if str(r["codec"]).startswith("dlac") and "host copies" not in r["codec"]
            and r.get("encode_gbps")]
    if dlac:
        enc = statistics.median(r["encode_gbps"] for r in dlac)
        dec = statistics.median(r["decode_gbps"] for r in dlac)
        met = sum(r["encode_gbps"] >= GPU_TARGET_GBPS and r["decode_gbps"] >= GPU_TARGET_GBPS for r in dlac)
        parity = sum(str(r.get("parity", "")).startswith("bytes+bits equal") for r in dlac)
        lines += ["", f"Target {GPU_TARGET_GBPS:.0f} GB/s each way: **{'met' if met == len(dlac) else 'not met'}**"
                  f" ({met} of {len(dlac)} DLAC rows; median encode {enc:.1f} GB/s, decode {dec:.1f} GB/s)."
                  f" Byte and bit parity with the CPU kernels: {parity} of {len(dlac)} rows."]
    return lines


BLOCKS = {
    "codec": Block(("codec_bench.json",), codec),
    "codec_headline": Block(("codec_bench.json",), readme_codec),
    "dlrm_v2_codec": Block(("codec_bench.json",), dlrm_v2_codec),
    "dlrm_v2_summary": Block(("codec_bench.json",), readme_dlrm_v2,
                             optional=("adaptive_accuracy_dlrm_v2.json", "e2e_dlrm_v2.json")),
    "codec_summary": Block(("codec_bench.json",), codec_summary),
    "cuda_codec": Block(("cuda_codec_bench.json",), cuda_codec),
}
