"""docs/benchmarks.md's step-time model: its validation on this machine, its projection to GPU clusters, and the
projection at the GPU kernel rates measured on a lent GPU."""

from __future__ import annotations

import statistics

from benchmarks.lib.scaling import DIMS, projection_table, validation_table
from benchmarks.render.core import Block, Results, source_line
from lightning_dlac.commands.estimate import METHOD_LABELS, Codec, Link, Workload, device_rates, predict_all


def scaling_validation(results: Results) -> list[str]:
    data = results.get("scaling_model.json")
    res = data["results"]
    checked = res["validation"]
    lines = [source_line("scaling_model.json", data, results.shown), "",
             f"TorchRec's INT8/FP16 cast rate timed in the same run: **{res['cast_gb_s']:.2f} GB/s** (one thread);"
             f" dense parameters {res['dense_params']:,}."]
    for source in dict.fromkeys(r["source"] for r in checked):
        rows = [r for r in checked if r["source"] == source]
        errors = [abs(r["error"]) for r in rows]
        within = sum(1 for e in errors if e <= 0.15)
        lines += ["", f"Calibrated from and predicting `{results.shown}/{source}`: |error| median"
                  f" {100 * statistics.median(errors):.0f}%, max {100 * max(errors):.0f}%; {within} of {len(errors)}"
                  " predictions within the 15% target.", "", *validation_table(rows)]
    return lines


def scaling_projection(results: Results) -> list[str]:
    data = results.get("scaling_model.json")
    cfg = data["config"]
    codecs = " or ".join(f"{g:g} GB/s" for g in cfg["gpu_codec_gbps"])
    return [source_line("scaling_model.json", data, results.shown), "",
            f"The inputs no measurement here supports, stated as assumptions: **{cfg['gpu_compute_ms']:g} ms of compute"
            f" per step on one GPU**, **TorchRec's INT8/FP16 casts at {cfg['gpu_cast_gbps']:g} GB/s**, and the **GPU"
            f" DLAC codec at {codecs}** (encode = decode, gradients alike).", "",
            *projection_table(data["results"]["projection"])]


def gpu_projection(results: Results) -> list[str]:
    """The projection's cluster at the GPU kernel rates cuda_codec_bench.json measured (issue 34 item 2): the step
    model of ``dlac estimate --device-rates`` with TorchRec's MX4 beside the other methods, the compute and dense
    parameters of the projection above, DLAC's ratios from its validated run."""

    bench, model = results.get("cuda_codec_bench.json"), results.get("scaling_model.json")
    rates = device_rates(results.directory / "cuda_codec_bench.json")
    cfg, res = model["config"], model["results"]
    two = [r for r in res["validation"] if r["world"] == 2 and r["method"] == "dlac_dlac"]
    ratios = (two[0]["forward_ratio"], two[0]["backward_ratio"])
    workload = Workload(cfg["batch"], DIMS, cfg["gpu_compute_ms"], res["dense_params"],
                        cfg["gpu_allreduce_hidden"])
    codec = Codec(ratios[0], ratios[1], rates.encode_gb_s, rates.decode_gb_s, rates.backward_encode_gb_s,
                  rates.backward_decode_gb_s, rates.cast_gb_s, mx4_encode_gb_s=rates.mx4_encode_gb_s,
                  mx4_decode_gb_s=rates.mx4_decode_gb_s)
    methods = codec.methods()
    lines = [source_line("cuda_codec_bench.json", bench, results.shown),
             source_line("scaling_model.json", model, results.shown), "",
             f"Rates measured on the {rates.device} (GB/s of float32, the criteo payload at eps 0.01 as the exchange"
             f" calls the codec): DLAC encode {rates.encode_gb_s:.1f} / decode {rates.decode_gb_s:.1f}, gradients"
             f" {rates.backward_encode_gb_s:.1f} / {rates.backward_decode_gb_s:.1f}; FP16 cast"
             f" {rates.cast_gb_s:.0f}"
             + (f"; MX4 {rates.mx4_encode_gb_s:.0f} / {rates.mx4_decode_gb_s:.0f}" if codec.has_mx4 else
                f"; MX4 not measured ({rates.mx4_missing})")
             + f". DLAC's ratios {ratios[0]:.1f}x forward / {ratios[1]:.1f}x gradients (the validated 2-rank run);"
             f" MX4 {workload.mx4_ratio:.2f}x, INT8 {workload.int8_ratio:.2f}x from the dims. Still assumed:"
             f" **{cfg['gpu_compute_ms']:g} ms of compute per step**.", "",
             "| link | GPUs | FP32 ms | " + " | ".join(f"{METHOD_LABELS.get(m, m)} speedup"
                                                      for m in methods[1:]) + " | fastest |",
             "|---|---:|---:|" + "---:|" * (len(methods) - 1) + "---|"]
    for name, gbit, latency in (("25 Gbit/s Ethernet", 25.0, cfg["eth_latency_us"]),
                                ("100 Gbit/s Ethernet", 100.0, cfg["eth_latency_us"]),
                                ("400 Gbit/s InfiniBand", 400.0, cfg["ib_latency_us"])):
        link = Link(gbit, latency, "per_gpu")
        for world in (8, 64, 512):
            preds = predict_all(workload, codec, link, world)
            fp32 = preds["fp32"].step_ms
            best = min(methods, key=lambda m: preds[m].step_ms)
            lines.append(f"| {name} | {world} | {fp32:.1f} | "
                         + " | ".join(f"{fp32 / preds[m].step_ms:.2f}x" for m in methods[1:])
                         + f" | {METHOD_LABELS.get(best, best)} |")
    return lines


BLOCKS = {
    "scaling_validation": Block(("scaling_model.json",), scaling_validation),
    "scaling_projection": Block(("scaling_model.json",), scaling_projection),
    "gpu_projection": Block(("cuda_codec_bench.json", "scaling_model.json"), gpu_projection),
}
