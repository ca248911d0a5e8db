"""Codec benchmark: DLAC against FP16, fbgemm INT8 row-wise, SZ3, ZFP and the entropy reference figures (and with
``--qcomm fp8 mx4`` TorchRec's qcomm FP8 and MX4 codecs).

Payloads: (a) 4096x64 float32 rows looked up from an embedding table with Zipf id frequencies; (b) the pooled
embeddings (26 tables x dim 64) of 2,048 Criteo rows, captured from the example DLRM after it trained ~3 epochs on
the rows before them, and ``gradient``: the loss gradients w.r.t. those pooled embeddings (the backward exchange's
payload; target 1.5 GB/s one-thread encode and decode); (c) ``dlrm_v2`` / ``dlrm_v2_iid``: the multi-hot pooled
embeddings (26 tables x dim 128) of 2,048 synthetic samples from MLPerf's DLRM v2 (DLRM_DCN, MLPerf pooling factors)
after a short training. Every error-bounded method gets the same absolute bound per table chunk, ``abs_eb =
float32(eps) * (max - min)``. Prints a table, checks the DESIGN.md targets, writes JSON and optionally the "##
Codec" block of docs/benchmarks.md (through ``python -m benchmarks.render``).

    python -m benchmarks.codec_bench                       # full run (~2-4 min on 2 cores)
    python -m benchmarks.codec_bench --quick               # smoke run, small sizes

Optional extras (benchmark only, not project dependencies; a method whose package is missing is skipped with a
note): ``pip install pysz zfpy`` (SZ3 and ZFP). fbgemm-gpu (INT8 row-wise) and torchrec come with the project.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.lib.codec import check_targets, format_targets, format_text
from benchmarks.lib.paths import CRITEO_SAMPLE, RESULTS
from benchmarks.lib.payloads import criteo_payload, dlrm_v2_payloads, zipf_payload
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results
from lightning_dlac.codec import decode_grid, encode_grid, inspect_grid, max_error, native_available

# ----------------------------------------------------------------------------------------------------------------
# Timing and helpers
# ----------------------------------------------------------------------------------------------------------------


def _time(fn: Callable[[], object], repeat: int, min_seconds: float) -> list[float]:
    """Seconds of each of at least ``repeat`` calls, made for at least ``min_seconds`` (after one warm-up call)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def _chunks(x: torch.Tensor, cs: list[int]) -> list[torch.Tensor]:
    return [x[:, cs[c]: cs[c + 1]].contiguous() for c in range(len(cs) - 1)]


def _abs_bound(chunk: torch.Tensor, eps: float) -> float:
    """The codec's bound rule: float32(eps) * (max - min), in float32."""
    lo, hi = chunk.min(), chunk.max()
    return float(torch.tensor(eps, dtype=torch.float32) * (hi - lo))


def _entropy_bits(values: torch.Tensor) -> float:
    """Total order-0 entropy (bits) of a stream of integers."""
    if values.numel() == 0:
        return 0.0
    _, counts = torch.unique(values.reshape(-1), return_counts=True)
    p = counts.double() / values.numel()
    return float(-(counts.double() * torch.log2(p)).sum())


def _err_over_range(chunks: list[torch.Tensor], decoded: list[torch.Tensor]) -> float:
    return max(
        float((a.double() - b.double()).abs().max() / max(float(a.max() - a.min()), 1e-30))
        for a, b in zip(chunks, decoded)
    )


# ----------------------------------------------------------------------------------------------------------------
# Methods: each returns a result dict (compressed bytes, errors, timings) for one payload and bound
# ----------------------------------------------------------------------------------------------------------------


class Ctx:
    """One payload with its chunks, and the timing settings."""

    def __init__(self, name: str, x: torch.Tensor, cs: list[int], args: argparse.Namespace) -> None:
        self.name, self.x, self.cs = name, x, cs
        self.chunks = _chunks(x, cs)
        self.raw_bytes = x.numel() * 4
        self.repeat, self.min_seconds = args.repeat, args.min_seconds
        self.threads = args.threads

    def gbps(self, fn: Callable[[], object], threads: int) -> list[float]:
        """GB/s of raw float32 of every timed call of ``fn`` on ``threads`` threads."""
        torch.set_num_threads(threads)
        try:
            return [self.raw_bytes / t / 1e9 for t in _time(fn, self.repeat, self.min_seconds)]
        finally:
            torch.set_num_threads(1)

    def timed(self, enc: Callable[[], object], dec: Callable[[], object], all_threads: bool = True) -> dict:
        """Median GB/s (``enc_gbps_1t``, ...) and every call's (``enc_gbps_1t_calls``, ...)."""
        calls = dict(enc_gbps_1t=self.gbps(enc, 1), dec_gbps_1t=self.gbps(dec, 1))
        if all_threads and self.threads > 1:
            calls.update(enc_gbps_all=self.gbps(enc, self.threads), dec_gbps_all=self.gbps(dec, self.threads))
        out: dict[str, Any] = {k: float(np.median(v)) for k, v in calls.items()}
        out.update({f"{k}_calls": v for k, v in calls.items()})
        return out


def bench_memcpy(ctx: Ctx) -> dict:
    return dict(method="memcpy (x.clone())", eps=None, ratio=1.0, **ctx.timed(ctx.x.clone, ctx.x.clone))


def bench_dlac(ctx: Ctx, eps: float, impl: str, time_it: bool) -> dict:
    rs = [0, ctx.x.shape[0]]
    payload, sizes = encode_grid(ctx.x, rs, ctx.cs, eps=eps, impl=impl)
    infos = inspect_grid(payload, sizes)
    y = decode_grid(payload, sizes, rs, ctx.cs, impl=impl)
    decoded = _chunks(y, ctx.cs)
    err = max(max_error(a, b) / i.abs_eb if i.abs_eb > 0 else 0.0 for a, b, i in zip(ctx.chunks, decoded, infos))
    modes = collections.Counter(str(i.mode.name if hasattr(i.mode, "name") else i.mode) for i in infos)
    row = dict(
        method=f"DLAC ({impl})", eps=eps, ratio=ctx.raw_bytes / payload.numel(), compressed_bytes=payload.numel(),
        max_err_over_eb=err, max_err_over_range=_err_over_range(ctx.chunks, decoded),
        modes=dict(sorted(modes.items())),
    )
    if time_it:
        row.update(ctx.timed(lambda: encode_grid(ctx.x, rs, ctx.cs, eps=eps, impl=impl),
                             lambda: decode_grid(payload, sizes, rs, ctx.cs, impl=impl)))
    return row


def dlac_forced_sizes(ctx: Ctx, eps: float) -> dict[str, float | None] | None:
    """Ratio each lossless mode would reach if forced on every quantized chunk (the API cannot force a mode, so
    this applies the reference encoder's exact size rules from docs/codec.md to its own codes; sizes only)."""
    try:
        from lightning_dlac.codec import reference as ref
        from lightning_dlac.codec.format import HEADER_SIZE, HUFF_MAX_ALPHABET, bits_for, ceil_div
    except ImportError:
        return None
    totals: dict[str, int | None] = {"PACK": 0, "HUFF": 0, "DEDUP": 0}
    for chunk in ctx.chunks:
        rows, dim = chunk.shape
        mode, q = ref.quantize(chunk, eps, True)
        if mode is not None:  # CONST or RAW: every mode gives the actual buffer
            size = HEADER_SIZE if str(mode).upper().endswith("CONST") else HEADER_SIZE + 4 * rows * dim
            for k in totals:
                totals[k] = None if totals[k] is None else totals[k] + size
            continue
        codes = q[3]
        flat = codes.reshape(-1)
        qmax, n = int(flat.max()), flat.numel()
        pack = ceil_div(n * bits_for(qmax), 8)
        huff = None
        if qmax + 1 <= HUFF_MAX_ALPHABET:
            freq = torch.bincount(flat, minlength=qmax + 1)
            huff = ref.huff_stream_size(n, qmax + 1, freq, ref.huffman_lengths(freq.tolist()))
        uniq, index = ref.unique_rows(codes)
        dedup = ref._best_stream(uniq.reshape(-1), qmax)[1] + ref._best_stream(index, uniq.shape[0] - 1)[1]
        for k, v in (("PACK", pack), ("HUFF", huff), ("DEDUP", dedup)):
            totals[k] = None if totals[k] is None or v is None else totals[k] + HEADER_SIZE + v
    return {k: (ctx.raw_bytes / v if v else None) for k, v in totals.items()}


def bench_fp16(ctx: Ctx) -> dict:
    y = ctx.x.half()
    decoded = _chunks(y.float(), ctx.cs)
    return dict(method="FP16 cast", eps=None, ratio=ctx.raw_bytes / (y.numel() * 2), compressed_bytes=y.numel() * 2,
                max_err_over_eb=None, max_err_over_range=_err_over_range(ctx.chunks, decoded),
                **ctx.timed(ctx.x.half, y.float))


def bench_int8(ctx: Ctx) -> dict:
    # One row = one table's 64-wide vector of one sample (scale and bias per row, as TorchRec's qcomm INT8).
    x_rows = ctx.x.reshape(ctx.x.shape[0], len(ctx.cs) - 1, -1).reshape(-1, ctx.cs[1] - ctx.cs[0])
    enc = lambda: torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x_rows)  # noqa: E731
    dec_op = torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat
    q = enc()
    y = dec_op(q).reshape(ctx.x.shape)
    return dict(method="fbgemm INT8 row-wise", eps=None, ratio=ctx.raw_bytes / q.numel(), compressed_bytes=q.numel(),
                max_err_over_eb=None, max_err_over_range=_err_over_range(ctx.chunks, _chunks(y, ctx.cs)),
                **ctx.timed(enc, lambda: dec_op(q)))


# TorchRec's qcomm codecs that the e2e race runs besides INT8 (issue 34): their forward codec as TorchRec builds it
# for the CPU, applied to the whole send buffer as its pooled all-to-all does.
QCOMM_CODECS = {"fp8": "TorchRec qcomm FP8", "mx4": "TorchRec qcomm MX4"}


def bench_qcomm(ctx: Ctx, precision: str) -> dict:
    """TorchRec's qcomm codec of ``precision`` (``fp8``, ``mx4``) on the payload: ratio, max error over each table
    chunk's range, GB/s."""
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp

    registry = get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=CommType(precision), backward_precision=CommType.FP32),
        device=torch.device("cpu"))
    codec = registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name].forward
    qctx = codec.create_context()
    enc = lambda: codec.encode(ctx.x, qctx)  # noqa: E731
    q = enc()
    y = codec.decode(q, qctx).reshape(-1)[: ctx.x.numel()].reshape(ctx.x.shape).float()
    nbytes = q.numel() * q.element_size()
    return dict(method=QCOMM_CODECS[precision], eps=None, ratio=ctx.raw_bytes / nbytes, compressed_bytes=nbytes,
                max_err_over_eb=None, max_err_over_range=_err_over_range(ctx.chunks, _chunks(y, ctx.cs)),
                **ctx.timed(enc, lambda: codec.decode(q, qctx)))


def bench_sz3(ctx: Ctx, eps: float, time_it: bool) -> dict:
    import pysz

    arrays = [c.numpy() for c in ctx.chunks]
    configs = []
    for a, c in zip(arrays, ctx.chunks):
        cfg = pysz.szConfig(a.shape)
        cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
        cfg.absErrorBound = _abs_bound(c, eps)
        configs.append(cfg)
    enc = lambda: [pysz.sz.compress(a, cfg)[0] for a, cfg in zip(arrays, configs)]  # noqa: E731
    comp = enc()
    dec = lambda: [pysz.sz.decompress(b, np.float32, a.shape)[0] for b, a in zip(comp, arrays)]  # noqa: E731
    decoded = [torch.from_numpy(np.ascontiguousarray(d)) for d in dec()]
    nbytes = sum(b.nbytes for b in comp)
    row = dict(method="SZ3 (pysz, ABS)", eps=eps, ratio=ctx.raw_bytes / nbytes, compressed_bytes=nbytes,
               max_err_over_eb=max(max_error(a, b) / cfg.absErrorBound
                                   for a, b, cfg in zip(ctx.chunks, decoded, configs)),
               max_err_over_range=_err_over_range(ctx.chunks, decoded))
    if time_it:  # pysz is built without OpenMP: one thread whatever torch is set to
        row.update(ctx.timed(enc, dec, all_threads=False))
    return row


def bench_zfp(ctx: Ctx, eps: float, time_it: bool) -> dict:
    import zfpy

    arrays = [c.numpy() for c in ctx.chunks]
    tols = [_abs_bound(c, eps) for c in ctx.chunks]
    enc = lambda: [zfpy.compress_numpy(a, tolerance=t) for a, t in zip(arrays, tols)]  # noqa: E731
    comp = enc()
    dec = lambda: [zfpy.decompress_numpy(b) for b in comp]  # noqa: E731
    decoded = [torch.from_numpy(np.ascontiguousarray(d)) for d in dec()]
    nbytes = sum(len(b) for b in comp)
    row = dict(method="ZFP (zfpy, accuracy)", eps=eps, ratio=ctx.raw_bytes / nbytes, compressed_bytes=nbytes,
               max_err_over_eb=max(max_error(a, b) / t for a, b, t in zip(ctx.chunks, decoded, tols)),
               max_err_over_range=_err_over_range(ctx.chunks, decoded))
    if time_it:  # zfpy's Python binding compresses serially
        row.update(ctx.timed(enc, dec, all_threads=False))
    return row


def entropy_figures(ctx: Ctx, eps: float) -> list[dict]:
    """Order-0 entropy of q = round((x - min) / (2 * abs_eb)), and dedup (unique code rows + per-row index) + order-0
    entropy of both streams; bits summed over the table chunks, no headers."""
    h0 = hd = 0.0
    for c in ctx.chunks:
        eb = _abs_bound(c, eps)
        if eb <= 0:
            continue  # a constant chunk carries no information
        q = torch.round((c.double() - float(c.min())) / (2 * eb)).to(torch.int64)
        h0 += _entropy_bits(q)
        uniq, index = torch.unique(q, dim=0, return_inverse=True)
        hd += _entropy_bits(uniq) + _entropy_bits(index)
    return [
        dict(method="order-0 entropy of codes", eps=eps, ratio=ctx.raw_bytes * 8 / max(h0, 1.0), reference=True),
        dict(method="dedup + order-0 entropy", eps=eps, ratio=ctx.raw_bytes * 8 / max(hd, 1.0), reference=True),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.03, 0.05])
    parser.add_argument("--impl", choices=["auto", "native", "ref"], default="auto",
                        help="DLAC implementation; auto = native if it builds, else the reference")
    parser.add_argument("--criteo", type=Path, default=CRITEO_SAMPLE, help="Criteo Kaggle TSV (skipped if absent)")
    parser.add_argument("--epochs", type=int, default=3, help="DLRM training epochs before capturing")
    parser.add_argument("--repeat", type=int, default=5, help="at least this many timed calls per measurement")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="and at least this long per measurement")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the 'all threads' setting")
    parser.add_argument("--json-out", type=Path, default=RESULTS / "codec_bench.json")
    parser.add_argument("--quick", action="store_true", help="smoke run: small payloads, 1 epoch, short timings")
    parser.add_argument("--dlrm-v2-steps", type=int, default=32,
                        help="training steps of the DLRM v2 (DCN, multi-hot) model before capturing its payloads")
    parser.add_argument("--qcomm", nargs="*", default=[], choices=sorted(QCOMM_CODECS),
                        help="also TorchRec's qcomm codecs of these precisions (fbgemm's FP8 and MX4 kernels)")
    parser.add_argument("--no-dlrm-v2", action="store_true", help="skip the dlrm_v2 / dlrm_v2_iid payloads")
    args = parser.parse_args()
    metadata = start_run(__spec__.name, vars(args))
    if args.quick:
        args.repeat, args.min_seconds, args.epochs = 2, 0.02, 1

    impl = args.impl if args.impl != "auto" else ("native" if native_available() else "ref")
    notes: list[str] = [f"DLAC implementation: {impl} (native_available() = {native_available()})"]
    time_dlac = True
    if impl == "ref":
        notes.append("DLAC timings are the pure-PyTorch reference, not the native kernels")
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
        have_int8 = True
    except ImportError:
        have_int8 = False
        notes.append("fbgemm INT8 row-wise skipped: fbgemm_gpu is not installed")
    available = {}
    for mod, label in (("pysz", "SZ3"), ("zfpy", "ZFP")):
        try:
            __import__(mod)
            available[label] = True
        except ImportError:
            available[label] = False
            notes.append(f"{label} skipped: `pip install {mod}` to include it")

    torch.set_num_threads(1)
    rows = 512 if args.quick else 4096
    payloads = [("zipf", zipf_payload(rows, 64), [0, 64], f"{rows}x64 Zipf(1.1) lookups from a 2000-row table")]
    if args.criteo.is_file():
        torch.set_num_threads(args.threads)  # training is not what is measured
        x, grad, cs, desc, gdesc = criteo_payload(args.criteo, 256 if args.quick else 2048, args.epochs, 10_000,
                                                  max_samples=2048 if args.quick else None)
        torch.set_num_threads(1)
        payloads += [("criteo", x, cs, desc), ("gradient", grad, cs, gdesc)]
    else:
        notes.append(f"criteo and gradient payloads skipped: {args.criteo} not found (pass --criteo PATH)")
    if not args.no_dlrm_v2:
        torch.set_num_threads(args.threads)
        payloads += dlrm_v2_payloads(256 if args.quick else 2048, 4 if args.quick else args.dlrm_v2_steps,
                                     64 if args.quick else 256, 10_000)
        torch.set_num_threads(1)

    results: list[dict] = []
    forced: list[dict] = []
    for name, x, cs, desc in payloads:
        ctx = Ctx(name, x, cs, args)
        print(f"[{name}] {desc}: {x.shape[0]}x{x.shape[1]} float32, {len(cs) - 1} table chunk(s)", flush=True)
        rows_out = [bench_memcpy(ctx), bench_fp16(ctx)]
        if have_int8:
            rows_out.append(bench_int8(ctx))
            rows_out += [bench_qcomm(ctx, precision) for precision in args.qcomm]
        for eps in args.eps:
            rows_out.append(bench_dlac(ctx, eps, impl, time_dlac))
            sizes = dlac_forced_sizes(ctx, eps)
            if sizes is not None:
                forced.append(dict(payload=name, eps=eps, **{f"{k}_ratio": v for k, v in sizes.items()}))
            if available["SZ3"]:
                rows_out.append(bench_sz3(ctx, eps, True))
            if available["ZFP"]:
                rows_out.append(bench_zfp(ctx, eps, True))
            rows_out += entropy_figures(ctx, eps)
        for r in rows_out:
            r["payload"] = name
        results += rows_out
        print(format_text(rows_out) + "\n", flush=True)

    targets = check_targets(results, impl)
    text = format_text(results)
    print(text)
    if forced:
        print("\nDLAC ratio if one lossless mode were forced on every chunk (sizes by the reference's rules):")
        for f in forced:
            print(f"  {f['payload']:<8} eps {f['eps']:<5} " + "  ".join(
                f"{k[:-6]} {'-' if v is None else format(v, '.2f')}" for k, v in f.items() if k.endswith("_ratio")))
    print("\nDESIGN.md targets:")
    print(format_targets(targets, markdown=False))
    for n in notes:
        print(f"note: {n}")

    extra = dict(impl=impl, notes=notes, machine_threads=args.threads,
                        payloads={n: dict(shape=list(x.shape), chunks=len(cs) - 1, description=d)
                                  for n, x, cs, d in payloads})
    write_results(args.json_out, metadata, vars(args), results, forced_mode_ratios=forced, targets=targets,
                  **extra)
    print(f"wrote {args.json_out} (python -m benchmarks.render puts it into docs/benchmarks.md and README.md)")


if __name__ == "__main__":
    main()
