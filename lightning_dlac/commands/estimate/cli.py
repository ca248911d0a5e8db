"""``dlac estimate``: the command line of the step-time model (:mod:`lightning_dlac.commands.estimate.model`), with
the rates it reads from a run or a GPU's benchmark (:mod:`lightning_dlac.commands.estimate.rates`); arguments in,
tables out. Lightning is imported after parsing, so ``dlac estimate --help`` imports neither it nor torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace

from lightning_dlac.commands.estimate.model import (
    ALL_METHODS,
    METHOD_LABELS,
    NO_PEERS,
    POLICIES,
    POLICY_LABELS,
    Codec,
    Link,
    Prediction,
    Topology,
    Workload,
    predict_all,
    predict_policies,
)
from lightning_dlac.commands.estimate.rates import RunRates, device_rates, rates_from_run, wait_from_run

# ------------------------------------------------------------------------------------------------------ what it prints


def table(predictions: Mapping[int, Mapping[str, Prediction]]) -> list[str]:
    """A markdown table: per world size, each method's step time and speedup over FP32 (the methods predicted)."""
    methods = [m for m in ALL_METHODS if all(m in preds for preds in predictions.values())]
    lines = ["| ranks | " + " | ".join(f"{METHOD_LABELS[m]} ms (speedup)" for m in methods) + " |",
             "|---:|" + "---:|" * len(methods)]
    for world, preds in predictions.items():
        fp32 = preds["fp32"].step_ms
        cells = [f"{preds[m].step_ms:.1f} ({fp32 / preds[m].step_ms:.2f}x)" for m in methods]
        lines.append(f"| {world} | " + " | ".join(cells) + " |")
    return lines


def pipeline_gains(pipelined: Mapping[int, Mapping[str, Prediction]],
                   unpipelined: Mapping[int, Mapping[str, Prediction]]) -> list[str]:
    """One line per world size: the input dist a step sends and what the pipeline leaves of it, and each method's
    unpipelined step over its pipelined one (above 1: the pipeline pays)."""
    lines = []
    for world, preds in pipelined.items():
        any_pred = next(iter(preds.values()))
        gains = ", ".join(f"{METHOD_LABELS[m]} {unpipelined[world][m].step_ms / preds[m].step_ms:.2f}x"
                          for m in ALL_METHODS if m in preds)
        lines.append(f"- {world} ranks: input dist {any_pred.parts['input_dist_ms']:.2f} ms per step, on the path"
                     f" {any_pred.input_dist_ms:.2f} ms with the pipeline; pipelined over unpipelined step: {gains}")
    return lines


def policy_table(predictions: Mapping[str, Prediction]) -> list[str]:
    """A markdown table of the policies (each direction's codec and the two link classes' wire time, the step and
    its speedup over ``none``), and a line naming the fastest."""
    none = predictions[NO_PEERS].step_ms
    lines = ["| compress_peers | forward ms (codec + max(same node, other nodes)) | backward ms | step ms (speedup) |",
             "|---|---:|---:|---:|"]
    for policy, p in predictions.items():
        cells = []
        for d, total in (("forward", p.forward_ms), ("backward", p.backward_ms)):
            codec_ms, near, far = (p.parts[f"{d}_{k}_ms"] for k in ("codec", "same_node", "other_nodes"))
            cells.append(f"{total:.2f} ({codec_ms:.2f} + max({near:.2f}, {far:.2f}))")
        lines.append(f"| {POLICY_LABELS[policy]} | {' | '.join(cells)} | {p.step_ms:.2f} ({none / p.step_ms:.2f}x) |")
    best = min(p.step_ms for p in predictions.values())
    ties = [q for q, p in predictions.items() if p.step_ms == best]
    slower = ", ".join(f"{q} {p.step_ms / best:.2f}x" for q, p in predictions.items() if q not in ties)
    lines.append(f"Fastest: {' = '.join(ties)}, a step of {best:.2f} ms"
                 + (f" (the others take longer: {slower})" if slower else ""))
    return lines


# ------------------------------------------------------------------------------------------------------- its arguments


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of whole numbers (e.g. 8,64,512).") from None
    if not values:
        raise ValueError("an empty list: give at least one number.")
    return values


def _dims(text: str) -> tuple[int, ...]:
    """``26x64`` (26 tables of dim 64), ``64,128,32`` or a mix: ``26x64,2x128``."""
    dims: list[int] = []
    for part in text.split(","):
        count, _, dim = part.strip().rpartition("x")
        try:
            dims.extend([int(dim)] * (int(count) if count else 1))
        except ValueError:
            raise ValueError(f"embedding dims {text!r}: write COUNTxDIM or DIM, comma-separated (e.g. 26x64).") \
                from None
    return tuple(dims)


def main(argv: list[str] | None = None) -> None:
    """``dlac estimate``: predicted step time and speedup of FP32, INT8/FP16 and DLAC on your cluster; with
    ``--nodes``, of each ``compress_peers`` policy on nodes of fast intra-node and slower inter-node links."""
    parser = argparse.ArgumentParser(
        prog="dlac estimate", description=main.__doc__,
        epilog="Every default is this project's measured DLRM (26 tables x dim 64, batch 4096 per rank, ratios from"
               " benchmarks/e2e_bandwidth.py) except the ones only your cluster can supply: --compute-ms and the"
               " codec rates of your device (or --from-run, a finished run's measurements; --device-rates, a GPU's"
               " kernel rates). TorchRec's MX4 is modelled where its rates are given (--mx4-encode-gbps and"
               " --mx4-decode-gbps, or --device-rates). See docs/benchmarks.md, 'Scaling model', and"
               " docs/multinode.md, 'Which peers to compress'.")
    parser.add_argument("--world-sizes", default=None,
                        help="ranks (GPUs), comma-separated (default 8,16,32,64,128,256,512; not with --nodes)")
    parser.add_argument("--gbit", type=float, default=None,
                        help="link bandwidth, Gbit/s (per GPU unless --shared; default 100; not with --nodes)")
    parser.add_argument("--latency-us", type=float, default=5.0,
                        help="cost of one message to one peer, microseconds (an all-to-all sends W - 1)")
    parser.add_argument("--shared", action="store_true", help="one link for all ranks (an emulated loopback)")
    topology = parser.add_argument_group(
        "nodes", f"all four together: the compress_peers policies ({', '.join(POLICIES)}) on N nodes x G ranks")
    topology.add_argument("--nodes", type=int, default=None, help="nodes in the job")
    topology.add_argument("--ranks-per-node", type=int, default=None, help="ranks (GPUs) per node")
    topology.add_argument("--intra-gbit", type=float, default=None,
                          help="bandwidth within a node, Gbit/s per rank (each GPU's NVLink)")
    topology.add_argument("--inter-gbit", type=float, default=None,
                          help="bandwidth out of a node, Gbit/s per node (all its NICs, shared by its ranks)")
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--dims", default="26x64", help="pooled-embedding dims: COUNTxDIM or DIM, comma-separated")
    parser.add_argument("--from-run", default=None, metavar="DLAC_RUN_JSON",
                        help="a finished run's dlac_run.json (or its directory): the forward and gradient ratios,"
                             " codec rates, compute per step and (with --nodes) wait on the slowest rank it measured"
                             " (that compute holds the dense all-reduce as it ran: add --dense-params 0 not to count"
                             " it twice); flags given as well override it")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="step time without the embedding all-to-alls and the dense all-reduce (measured)")
    parser.add_argument("--dense-params", type=int, default=159_553, help="dense parameters (float32 all-reduce)")
    parser.add_argument("--allreduce-hidden", type=float, default=0.0, help="share of the all-reduce hidden, 0-1")
    parser.add_argument("--ids-per-sample", type=float, default=0.0,
                        help="ids per sample over all features, sent in the input dist (one-hot DLRM: 26); 0 leaves"
                             " the input dist in --compute-ms")
    parser.add_argument("--pipeline", choices=["none", "sparse_dist"], default="none",
                        help="sparse_dist: DLACStrategy(pipeline='sparse_dist'), the input dist hidden behind compute")
    parser.add_argument("--forward-ratio", type=float, default=None, help="DLAC forward ratio (measured; default 29)")
    parser.add_argument("--backward-ratio", type=float, default=None,
                        help="DLAC gradient ratio (measured; default the run's with --from-run, else 9)")
    parser.add_argument("--wait-ms", type=float, default=None,
                        help="per step, the ranks' wait for the slowest rank at the exchanges (default: with --nodes"
                             " and --from-run, the run's exchange time beyond the model's for its own policy on these"
                             " nodes; else 0)")
    parser.add_argument("--encode-gbps", type=float, default=None, help="DLAC encode GB/s per rank (your device)")
    parser.add_argument("--decode-gbps", type=float, default=None, help="DLAC decode GB/s per rank (your device)")
    parser.add_argument("--backward-encode-gbps", type=float, default=None, help="gradients; default --encode-gbps")
    parser.add_argument("--backward-decode-gbps", type=float, default=None, help="gradients; default --decode-gbps")
    parser.add_argument("--cast-gbps", type=float, default=None,
                        help="TorchRec qcomm INT8/FP16 quantize GB/s per rank (your device; not with --nodes)")
    parser.add_argument("--mx4-encode-gbps", type=float, default=None,
                        help="TorchRec qcomm MX4 quantize GB/s per rank (your device): with --mx4-decode-gbps, adds"
                             " the MX4 method (not with --nodes)")
    parser.add_argument("--mx4-decode-gbps", type=float, default=None,
                        help="TorchRec qcomm MX4 dequantize GB/s per rank (your device)")
    gpu = parser.add_argument_group(
        "GPU rates", "every codec rate from one benchmarks/cuda_codec_bench.py run on a GPU (flags given override it)")
    gpu.add_argument("--device-rates", default=None, metavar="CUDA_CODEC_BENCH_JSON",
                        help="DLAC encode/decode (the payload's row at --device-eps; gradients from the gradient"
                             " payload's), the cast rate (fp16 row) and MX4's (mx4 (fbgemm triton) row; required"
                             " unless --mx4-encode-gbps and --mx4-decode-gbps are given)")
    gpu.add_argument("--device-payload", default="criteo", help="the forward payload's rows (default criteo)")
    gpu.add_argument("--device-eps", type=float, default=0.01, help="the DLAC rows' bound (default 0.01)")
    args = parser.parse_args(argv)
    from lightning.pytorch.utilities.rank_zero import rank_zero_info  # after parsing: `--help` stays instant

    gbit = 100.0 if args.gbit is None else args.gbit  # None until here: --nodes refuses it given
    try:
        topo = _topology(args)
        from_device = _fill_from_device(args)
        read, rates = _fill_from_run(args)
        workload = Workload(args.batch, _dims(args.dims), args.compute_ms, args.dense_params, args.allreduce_hidden,
                            args.ids_per_sample, args.wait_ms or 0.0)
        codec = Codec(args.forward_ratio, args.backward_ratio, args.encode_gbps, args.decode_gbps,
                      args.backward_encode_gbps, args.backward_decode_gbps,
                      1.0 if args.cast_gbps is None else args.cast_gbps,  # None: --nodes, which has no cast
                      args.mx4_encode_gbps, args.mx4_decode_gbps)
        if topo is not None and rates is not None and args.wait_ms is None:
            wait = wait_from_run(rates, workload, codec, topo)
            if wait is not None:
                workload = replace(workload, wait_ms=wait)
                read += (f"; wait on the slowest rank {wait:.2f} ms per step (the run's exchanges beyond this"
                         f" model's for its policy {rates.policy} on these nodes)")
        if topo is not None:
            policies = predict_policies(workload, codec, topo)
        else:
            worlds = _ints("8,16,32,64,128,256,512" if args.world_sizes is None else args.world_sizes)
            link = Link(gbit, args.latency_us, "shared" if args.shared else "per_gpu")
            pipeline = None if args.pipeline == "none" else args.pipeline
            preds = {w: predict_all(workload, codec, link, w, pipeline) for w in worlds}
    except ValueError as err:
        parser.error(str(err))
    if from_device:
        rank_zero_info(f"dlac estimate: from {args.device_rates}: {from_device}")
    if read:
        rank_zero_info(f"dlac estimate: from {args.from_run}: {read}")
    if topo is not None:
        rank_zero_info(f"dlac estimate: {topo.nodes} nodes x {topo.ranks_per_node} ranks; within a node"
                       f" {topo.intra_gbit_s:g} Gbit/s per rank, across nodes {topo.inter_gbit_s:g} Gbit/s per node"
                       f" (shared by its {topo.ranks_per_node} ranks); {topo.latency_us:g} us per message; batch"
                       f" {args.batch} x {workload.total_dim} columns per rank; step = compute"
                       + (f" + wait on the slowest rank ({workload.wait_ms:.2f} ms)" if workload.wait_ms else "")
                       + " + both exchanges")
        for line in policy_table(policies):
            rank_zero_info(line)
        return
    ids = (f"; input dist of {args.ids_per_sample:g} ids per sample"
           f" {'hidden behind compute where it fits (sparse_dist)' if pipeline else 'on the path (unpipelined)'}"
           if args.ids_per_sample else "")
    rank_zero_info(f"dlac estimate: {gbit:g} Gbit/s {'shared' if args.shared else 'per GPU'},"
                   f" {args.latency_us:g} us per message; batch {args.batch} x {workload.total_dim} columns per"
                   f" rank{ids}")
    for line in table(preds):
        rank_zero_info(line)
    if pipeline is not None and args.ids_per_sample:
        unpipelined = {w: predict_all(workload, codec, link, w) for w in worlds}
        for line in pipeline_gains(preds, unpipelined):
            rank_zero_info(line)


def _topology(args: argparse.Namespace) -> Topology | None:
    """The nodes the four topology flags describe, or ``None`` when none is given (the single-link model)."""
    flags = {"--nodes": args.nodes, "--ranks-per-node": args.ranks_per_node, "--intra-gbit": args.intra_gbit,
             "--inter-gbit": args.inter_gbit}
    given = [f for f, v in flags.items() if v is not None]
    if not given:
        return None
    missing = [f for f in flags if f not in given]
    if missing:
        raise ValueError(f"{', '.join(given)} without {', '.join(missing)}: the topology model needs all four"
                         " (e.g. --nodes 2 --ranks-per-node 8 --intra-gbit 3600 --inter-gbit 3200).")
    single = {"--world-sizes": args.world_sizes, "--gbit": args.gbit, "--shared": args.shared or None,
              "--cast-gbps": args.cast_gbps, "--mx4-encode-gbps": args.mx4_encode_gbps,
              "--mx4-decode-gbps": args.mx4_decode_gbps, "--ids-per-sample": args.ids_per_sample or None,
              "--pipeline": None if args.pipeline == "none" else args.pipeline}
    clash = [f for f, v in single.items() if v is not None]
    if clash:
        raise ValueError(f"{', '.join(clash)} belong(s) to the single-link model; with --nodes the ranks are nodes x"
                         " --ranks-per-node, the links --intra-gbit and --inter-gbit, and the dense all-reduce and"
                         " the input dist (the same under every policy) are left out: drop them.")
    return Topology(args.nodes, args.ranks_per_node, args.intra_gbit, args.inter_gbit, args.latency_us)


def _fill_from_device(args: argparse.Namespace) -> str:
    """Fill the codec rates the user did not give from ``--device-rates`` (the cast and MX4 rates only for the
    single-link model: ``--nodes`` has neither); what was read, as a line for the log ("" without it). An MX4 row
    the file lacks is an error unless both MX4 flags are given: the comparison is stated or refused, never dropped."""
    if args.device_rates is None:
        return ""
    rates = device_rates(args.device_rates, args.device_payload, args.device_eps)
    fills = [("encode_gbps", rates.encode_gb_s, "DLAC encode"), ("decode_gbps", rates.decode_gb_s, "DLAC decode"),
             ("backward_encode_gbps", rates.backward_encode_gb_s, "gradient encode"),
             ("backward_decode_gbps", rates.backward_decode_gb_s, "gradient decode")]
    if args.nodes is None:
        if rates.mx4_encode_gb_s is None and (args.mx4_encode_gbps is None or args.mx4_decode_gbps is None):
            raise ValueError(f"{rates.mx4_missing}: run benchmarks/cuda_codec_bench.py with fbgemm's Triton kernels"
                             " (DLAC_FBGEMM_TRITON) on the GPU, or give --mx4-encode-gbps and --mx4-decode-gbps.")
        fills += [("cast_gbps", rates.cast_gb_s, "cast (fp16)"),
                  ("mx4_encode_gbps", rates.mx4_encode_gb_s, "MX4 encode"),
                  ("mx4_decode_gbps", rates.mx4_decode_gb_s, "MX4 decode")]
    taken = []
    for dest, value, label in fills:
        if getattr(args, dest) is None and value is not None:
            setattr(args, dest, value)
            taken.append(f"{label} {value:.3g}")
    where = f"{rates.device}, payload {args.device_payload}, dlac eps={args.device_eps:g}"
    return f"{where}: GB/s " + (", ".join(taken) if taken else "none taken (every rate given as a flag)")


def _fill_from_run(args: argparse.Namespace) -> tuple[str, RunRates | None]:
    """Fill the rates the user did not give from ``--from-run``, then the defaults; check the required ones are
    there. Returns what was read from the run, as a line for the log ("" without ``--from-run``), and the run's
    rates (``None`` without it)."""
    taken = []
    rates = None
    if args.from_run is not None:
        rates = rates_from_run(args.from_run)
        for dest, value, label in (("forward_ratio", rates.forward_ratio, "forward ratio {:.2f}"),
                                   ("encode_gbps", rates.encode_gb_s, "encode {:.3g} GB/s"),
                                   ("decode_gbps", rates.decode_gb_s, "decode {:.3g} GB/s"),
                                   ("compute_ms", rates.compute_ms, "compute {:.2f} ms per step"),
                                   ("backward_ratio", rates.backward_ratio, "gradient ratio {:.2f}")):
            if getattr(args, dest) is None and value is not None:
                setattr(args, dest, value)
                taken.append(label.format(value))
    if args.forward_ratio is None:
        args.forward_ratio = 29.0
    gradient_ratio_read = args.backward_ratio is not None and any(t.startswith("gradient") for t in taken)
    if args.backward_ratio is None:
        args.backward_ratio = 9.0
    needed = ["--compute-ms", "--encode-gbps", "--decode-gbps"]
    if args.nodes is None:
        needed.append("--cast-gbps")
    missing = [f for f in needed if getattr(args, f[2:].replace("-", "_")) is None]
    if missing:
        why = (f" ({args.from_run} recorded no train_s / a2a_s)" if args.from_run and "--compute-ms" in missing
               else "")
        raise ValueError(f"{', '.join(missing)} required: give them{why}, or --from-run with a finished run's"
                         " dlac_run.json for the codec rates and the compute.")
    tail = ("; gradient codec rates from the flags, else the forward's (a run times the gradient exchange as one"
            " phase)" if gradient_ratio_read else "; gradient ratio and rates from the flags")
    return ", ".join(taken) + (tail if taken else ""), rates
