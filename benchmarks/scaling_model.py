"""The step-time model of lightning_dlac.commands.estimate, validated on this machine's throttled runs and projected
to GPU clusters; prints the tables and writes JSON.

    python -m benchmarks.scaling_model benchmarks/results/e2e_throttled.json [e2e_world3.json e2e_world4.json]

Validation, per results file and world size (2, 3, 4 ranks; they share one loopback, so the link is ``shared``):
the inputs come from the launches at the file's fastest rate (unthrottled, else 10 Gbit/s), the predictions are
for its slower rates, launched in the same run (interleaved, so under the same load), and the error is
prediction / measurement - 1.

- compute per step: the DLAC-both-directions median step at the calibration rate minus its exchanges' measured
  phase times (forward encode, exchange, decode; the backward exchange) and the model's dense all-reduce (FP32's
  exchanges have no phase times: subtracting their modelled wire time at a nominal rate the throttled loopback
  does not reach over-counted compute);
- DLAC ratios: forward and gradient bytes raw / sent, from the DLAC launches;
- DLAC codec rates: forward encode and decode GB/s from the DLAC launches' phase times; gradient codec rate from
  the DLAC-both-directions launch's backward time minus its modelled wire time;
- TorchRec's INT8 / FP16 cast rate: timed here on this CPU (one thread), its qcomm codecs on a batch's buffer.

Projection: ``--gpu-*`` inputs (compute per step, codec rates of the GPU; replace ``--gpu-codec-gbps`` by the measured
figure once benchmarks/gpu_session.sh has run on a GPU) at 8-512 GPUs on 100 Gbit/s Ethernet and 400 Gbit/s
InfiniBand per GPU, with the ratios measured here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.paths import RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import load_results, start_run, write_results
from benchmarks.lib.scaling import DIMS, projection_table, validation_table
from lightning_dlac.commands.estimate import (
    Codec,
    Link,
    Workload,
    predict,
    predict_all,
)

# e2e variant -> modelled method
VARIANT_METHOD = {"fp32": "fp32", "qcomm_int8_fp16": "int8_fp16", "dlac_bf16": "dlac_bf16", "dlac_dlac": "dlac_dlac"}
RATE_GBIT = {"1gbit": 1.0, "10gbit": 10.0}  # and "unthrottled": --loopback-gbit


def dense_params() -> int:
    """Dense parameters of the e2e benchmark's DLRM (its all-reduce)."""
    from lightning_dlac.examples.dlrm import DLRMModule
    from lightning_dlac.examples.synthetic import SyntheticCriteoDataModule

    data = SyntheticCriteoDataModule(max_rows=1000, batch_size=8, seed=0)
    model = DLRMModule(data.num_embeddings_per_feature, embedding_dim=DIMS[0])
    ebc = set(map(id, model.embedding_bag_collection.parameters()))
    return sum(p.numel() for p in model.parameters() if id(p) not in ebc)


def cast_gb_s(batch: int, repeats: int = 5) -> float:
    """TorchRec's qcomm INT8 forward + FP16 backward codecs, encode and decode of one batch's buffer each, on this
    CPU with one thread: GB/s of float32 per codec pass (the model's ``cast_gb_s``)."""
    import torch
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp

    torch.set_num_threads(1)
    codecs = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.INT8,
                                                    backward_precision=CommType.FP16))
    pair = codecs[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name]
    x = torch.randn(batch, sum(DIMS))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for codec in (pair.forward, pair.backward):
            ctx = codec.create_context()
            codec.decode(codec.encode(x, ctx), ctx)
        best = min(best, time.perf_counter() - t0)
    return 4 * x.numel() * 4 / best / 1e9  # four passes over the buffer: two encodes, two decodes


def _rows(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        data = load_results(path)
        for row in data["results"]:
            row = dict(row)
            row.setdefault("world_size", 2)
            row["batch"] = data["config"].get("batch_size")  # the run's samples per rank (else --batch)
            row["source"] = path.name
            rows.append(row)
    return rows


def _pick(rows: list[dict[str, Any]], rate: str, variant: str) -> dict[str, Any] | None:
    found = [r for r in rows if r["rate"] == rate and r["variant"] == variant]
    return found[0] if found else None


def calibrate(rows: list[dict[str, Any]], world: int, rate: str, args: argparse.Namespace, cast: float,
              params: int) -> tuple[Workload, Codec] | None:
    """The model's inputs at ``world`` ranks from the launches at ``rate`` (None if a needed launch is missing)."""
    fwd = _pick(rows, rate, "dlac_bf16") or _pick(rows, rate, "dlac_dlac")
    both = _pick(rows, rate, "dlac_dlac")
    if fwd is None or both is None:
        return None
    loop = Link(RATE_GBIT.get(rate, args.loopback_gbit), args.latency_us, "shared")
    raw = fwd["fwd_raw_bytes_per_step"]
    codec_probe = Codec(1.0, 1.0, 1.0, 1.0, cast_gb_s=cast)
    batch = fwd.get("batch") or args.batch
    base = Workload(batch, DIMS, 0.0, params)
    # Compute: the DLAC-both-directions step minus its exchanges' phase times (measured by the exchange itself) and
    # the modelled dense all-reduce. FP32's exchanges are not timed by phase, so subtracting them would rest on the
    # link model at the calibration rate, where the tc-throttled loopback delivers less than its nominal rate (CPU
    # work on shared cores): that over-counted compute by 15-20% and pushed every prediction up alike.
    measured_comm = sum(both[k] for k in ("fwd_encode_ms", "fwd_exchange_ms", "fwd_decode_ms", "bwd_a2a_ms"))
    allreduce = predict("fp32", base, codec_probe, loop, world).allreduce_ms
    compute = max(0.0, both["median_step_ms"] - measured_comm - allreduce)
    enc = raw / (fwd["fwd_encode_ms"] * 1e-3) / 1e9
    dec = raw / (fwd["fwd_decode_ms"] * 1e-3) / 1e9
    ratio_f = both["fwd_raw_bytes_per_step"] / both["fwd_sent_bytes_per_step"]
    ratio_b = both["bwd_raw_bytes_per_step"] / both["bwd_sent_bytes_per_step"]
    # The gradient codec: the backward phase's time minus its wire time at the unthrottled rate.
    wire_b = predict("dlac_dlac", base, Codec(ratio_f, ratio_b, enc, dec, cast_gb_s=cast), loop,
                     world).parts["backward_wire_ms"]
    codec_b_ms = max(both["bwd_a2a_ms"] - wire_b, 1e-3)
    rate_b = 2 * both["bwd_raw_bytes_per_step"] / (codec_b_ms * 1e-3) / 1e9
    workload = Workload(batch, DIMS, compute, params)
    return workload, Codec(ratio_f, ratio_b, enc, dec, rate_b, rate_b, cast)


def validate(rows: list[dict[str, Any]], args: argparse.Namespace, cast: float, params: int) -> list[dict[str, Any]]:
    out = []
    for source, world in sorted({(r["source"], r["world_size"]) for r in rows}):
        run = [r for r in rows if r["source"] == source and r["world_size"] == world]
        rates = {r["rate"] for r in run}
        calibration = next((c for c in ("unthrottled", "10gbit") if c in rates), None)
        inputs = calibrate(run, world, calibration, args, cast, params) if calibration else None
        if inputs is None:
            print(f"{source}, {world} ranks: no DLAC-both-directions launch at a fast rate to calibrate from; skipped")
            continue
        workload, codec = inputs
        for rate, gbit in RATE_GBIT.items():
            if rate == calibration or rate not in rates:
                continue
            link = Link(gbit, args.latency_us, "shared")
            for variant, method in VARIANT_METHOD.items():
                measured = _pick(run, rate, variant)
                if measured is None:
                    continue
                pred = predict(method, workload, codec, link, world)
                spread = measured.get("launch_median_ms") or [measured["median_step_ms"]]
                out.append(dict(
                    source=source, calibrated_on=calibration,
                    world=world, rate=rate, variant=variant, method=method, predicted_ms=pred.step_ms,
                    measured_ms=measured["median_step_ms"], launch_medians_ms=spread,
                    error=pred.step_ms / measured["median_step_ms"] - 1, compute_ms=workload.compute_ms,
                    forward_ratio=codec.forward_ratio, backward_ratio=codec.backward_ratio,
                    encode_gb_s=codec.encode_gb_s, decode_gb_s=codec.decode_gb_s,
                    backward_gb_s=codec.backward_encode_gb_s, cast_gb_s=cast, parts=pred.parts,
                ))
    return out


def project(args: argparse.Namespace, ratios: tuple[float, float], params: int) -> list[dict[str, Any]]:
    workload = Workload(args.batch, DIMS, args.gpu_compute_ms, params, args.gpu_allreduce_hidden)
    out = []
    for name, gbit, latency in (("100 Gbit/s Ethernet", 100.0, args.eth_latency_us),
                                ("400 Gbit/s InfiniBand", 400.0, args.ib_latency_us)):
        link = Link(gbit, latency, "per_gpu")
        for gbps in args.gpu_codec_gbps:
            codec = Codec(ratios[0], ratios[1], gbps, gbps, cast_gb_s=args.gpu_cast_gbps)
            for world in (8, 16, 32, 64, 128, 256, 512):
                preds = predict_all(workload, codec, link, world)
                out.append(dict(link=name, gbit=gbit, latency_us=latency, codec_gb_s=gbps, world=world,
                                **{f"{m}_ms": p.step_ms for m, p in preds.items()}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="results files of python -m benchmarks.e2e_bandwidth")
    parser.add_argument("--batch", type=int, default=4096,
                        help="samples per rank of the projection (and of runs whose file does not say)")
    parser.add_argument("--loopback-gbit", type=float, default=16.0, help="unthrottled loopback rate here, Gbit/s")
    parser.add_argument("--latency-us", type=float, default=50.0, help="gloo message cost on loopback, microseconds")
    parser.add_argument("--gpu-compute-ms", type=float, default=5.0,
                        help="ASSUMED compute per step on one GPU at this batch (no GPU measured it)")
    parser.add_argument("--gpu-codec-gbps", default="100,20",
                        help="GPU DLAC codec GB/s (encode = decode), comma-separated scenarios; 100 is the target")
    parser.add_argument("--gpu-cast-gbps", type=float, default=500.0, help="ASSUMED GPU INT8/FP16 quantize GB/s")
    parser.add_argument("--gpu-allreduce-hidden", type=float, default=0.0, help="share of the all-reduce hidden")
    parser.add_argument("--eth-latency-us", type=float, default=5.0, help="per-message cost, 100 Gbit/s Ethernet")
    parser.add_argument("--ib-latency-us", type=float, default=2.0, help="per-message cost, 400 Gbit/s InfiniBand")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "scaling_model.json")
    args = parser.parse_args()
    metadata = start_run(__spec__.name, vars(args))
    missing = [p for p in args.results if not p.is_file()]
    if missing:
        parser.error(f"no such results file(s): {[str(p) for p in missing]}; run python -m benchmarks.e2e_bandwidth"
                     " first")
    try:
        args.gpu_codec_gbps = [float(v) for v in args.gpu_codec_gbps.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--gpu-codec-gbps {args.gpu_codec_gbps!r}: comma-separated numbers, e.g. 100,20")

    rows = _rows(args.results)
    params = dense_params()
    cast = cast_gb_s(args.batch)
    print(f"dense parameters {params}; TorchRec INT8/FP16 cast here {cast:.2f} GB/s (one thread)")
    checked = validate(rows, args, cast, params)
    print("\n".join(validation_table(checked)))
    errors = [abs(r["error"]) for r in checked]
    if errors:
        print(f"|error|: median {100 * statistics.median(errors):.0f}%, max {100 * max(errors):.0f}%"
              f" over {len(errors)} predictions")
    two = [r for r in checked if r["world"] == 2 and r["method"] == "dlac_dlac"]
    ratios = (two[0]["forward_ratio"], two[0]["backward_ratio"]) if two else (29.0, 9.0)
    projected = project(args, ratios, params)
    print()
    print(f"projection: ratios {ratios[0]:.1f}x forward / {ratios[1]:.1f}x gradients (measured here, 2 ranks),"
          f" compute {args.gpu_compute_ms:g} ms per step (assumed)")
    print("\n".join(projection_table(projected)))
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_results(args.json_out, metadata, config | {"results": [str(p) for p in args.results]},
                  {"validation": checked, "projection": projected, "cast_gb_s": cast, "dense_params": params})
    print(f"\nwrote {args.json_out}")


if __name__ == "__main__":
    main()
