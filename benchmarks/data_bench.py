"""Criteo data path at full size: `dlac preprocess criteo` against TorchRec's converter, and CriteoBinaryDataModule
opening and feeding a generated set of at least 20M rows.

Preprocess: a TSV of ``--rows`` lines (the Criteo sample ../shared/data/criteo_kaggle_head10k.tsv repeated, else
generated Criteo-like lines) converted by ``preprocess_criteo`` (native parser, 1 and 2 workers), by the pure-Python
parser on a ``--python-rows`` slice, and by TorchRec's ``BinaryCriteoUtils.tsv_to_npys`` on a ``--torchrec-rows``
slice (TorchRec's converter holds every row in Python lists, so the full file would take minutes). Each conversion
runs in its own process, which reports its wall time and peak resident memory (ru_maxrss); the arrays of the
TorchRec slice are checked identical to ours. Rates are rows/s, ratios against TorchRec's rate in the same run.

Loader: ``--loader-rows`` rows (default 20M: four "days" of 5M; three train, one held out) written in TorchRec's
layout under ``--workdir``, then per rank of 2 (each in its own process, one thread, as a rank runs), reading each
batch with ``pread`` (the default) and through memory maps (``mmap_mode=True``): time to open (construct + setup +
first batch), batches/s over all of the rank's training batches, and how resident memory grew while reading them
(VmRSS, split into anonymous memory and file pages: memory-mapped rows are page cache, shared and reclaimable). The
demo model's training step is timed on the same batch size for the ratio (forward + backward +
dense optimizer step of DLRMModule with dlrm_criteo_binary.yaml's sizes, one thread; the embedding tables frozen,
so this is a lower bound on a real step and the ratio is conservative).

    python -m benchmarks.data_bench      # then python -m benchmarks.render puts the tables into docs/benchmarks.md

The generated files are deleted at the end (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.data import fmt_rate, tables
from benchmarks.lib.paths import CRITEO_SAMPLE, REPO, RESULTS
from benchmarks.lib.plan import outputs_help
from benchmarks.lib.results import start_run, write_results

ROW_BYTES = 13 * 4 + 26 * 8 + 4  # dense float32 + sparse int64 + label int32


# ---------------------------------------------------------------------------------------------------------------------
# Children: each measurement in a fresh process, reporting JSON on its last stdout line.


def _status_mib() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    kind = spec["kind"]
    if kind == "preprocess":
        from lightning_dlac.criteo import preprocess_criteo, resolve_parser

        resolve_parser(spec["impl"])  # build/load outside the timing
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        [r] = preprocess_criteo([spec["input"]], spec["output"], workers=spec["workers"], impl=spec["impl"],
                                progress=False, overwrite=True)  # fmt: skip
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return dict(seconds=r.seconds, rows=r.rows, maxrss_mib=peak, baseline_rss_mib=base)
    if kind == "torchrec":
        import warnings

        from torchrec.datasets.criteo import BinaryCriteoUtils

        out = Path(spec["output"])
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            BinaryCriteoUtils.tsv_to_npys(spec["input"], str(out / "tr_dense.npy"), str(out / "tr_sparse.npy"),
                                          str(out / "tr_labels.npy"))  # fmt: skip
        seconds = time.perf_counter() - t0
        rows = int(np.load(out / "tr_labels.npy", mmap_mode="r").shape[0])
        return dict(seconds=seconds, rows=rows, maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    baseline_rss_mib=base)  # fmt: skip
    if kind == "loader":
        import torch

        torch.set_num_threads(1)
        from lightning_dlac.examples.binary import CriteoBinaryDataModule

        before = _status_mib()
        t0 = time.perf_counter()
        dm = CriteoBinaryDataModule(spec["data_dir"], train_stems=spec["train"], val_stems=spec["val"],
                                    batch_size=spec["batch_size"], max_rows=spec["max_rows"],
                                    mmap_mode=spec["mmap_mode"])  # fmt: skip
        dm.set_rank(spec["rank"], spec["world_size"])
        dm.setup("fit")
        loader = iter(dm.train_dataloader())
        next(loader)
        open_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        n = 1 + sum(1 for _ in loader)
        seconds = time.perf_counter() - t1
        after = _status_mib()
        share = dm.num_train_batches * spec["batch_size"] * ROW_BYTES / 2**20
        return dict(open_seconds=open_s, batches=n, batches_per_second=(n - 1) / seconds, rows_per_rank=n * spec[
            "batch_size"], share_mib=share, rss_before=before, rss_after=after)  # fmt: skip
    if kind == "train_step":
        import torch

        torch.set_num_threads(1)
        from lightning_dlac.examples.dlrm import DLRMModule

        from lightning_dlac.criteo import capped_cardinalities

        b = spec["batch_size"]
        sizes = capped_cardinalities(spec["max_rows"])
        model = DLRMModule(sizes, embedding_dim=64, dense_arch_layer_sizes=[512, 256, 64],
                           over_arch_layer_sizes=[512, 256, 1], learning_rate=0.01)  # fmt: skip
        model.embedding_bag_collection.requires_grad_(False)
        opt = torch.optim.Adagrad([p for p in model.parameters() if p.requires_grad], lr=0.01)
        from lightning_dlac.examples.base import make_batch

        from lightning_dlac.criteo import FEATURE_NAMES

        gen = torch.Generator().manual_seed(0)
        ids = torch.cat([torch.randint(0, n, (b,), generator=gen) for n in sizes])
        batch = make_batch(torch.rand(b, 13, generator=gen), ids, (torch.rand(b, generator=gen) < 0.25).float(),
                           feature_names=FEATURE_NAMES)
        times = []
        for i in range(spec["steps"] + 3):
            t0 = time.perf_counter()
            loss = model.loss_fn(model(batch), batch.labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        return dict(step_seconds=float(np.median(times)), steps=len(times))
    raise ValueError(kind)


def _run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1" if spec["kind"] in ("loader", "train_step") else "2")
    proc = subprocess.run([sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['kind']} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------------
# Inputs.


def _synthetic_lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        dense = ["" if rng.random() < 0.2 else str(int(rng.expovariate(1e-2))) for _ in range(13)]
        sparse = ["" if rng.random() < 0.1 else f"{rng.getrandbits(32):08x}" for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *dense, *sparse]))
    return lines


def _write_tsv(path: Path, rows: int, source: list[bytes]) -> None:
    block = b"".join(source)
    with path.open("wb") as f:
        for _ in range(rows // len(source)):
            f.write(block)
        f.write(b"".join(source[: rows % len(source)]))


def _head(src: Path, dst: Path, rows: int) -> None:
    with src.open("rb") as f, dst.open("wb") as g:
        for _, line in zip(range(rows), f):
            g.write(line)


def _write_binary(directory: Path, stem: str, rows: int, seed: int) -> None:
    """A TorchRec-layout set of ``rows`` rows, written in chunks (never all in memory)."""
    from lightning_dlac.criteo import binary_paths

    rng = np.random.default_rng(seed)
    dense_p, sparse_p, labels_p = binary_paths(directory, stem)
    fmt = np.lib.format
    dense = fmt.open_memmap(dense_p, mode="w+", dtype=np.float32, shape=(rows, 13))
    sparse = fmt.open_memmap(sparse_p, mode="w+", dtype=np.int64, shape=(rows, 26))
    labels = fmt.open_memmap(labels_p, mode="w+", dtype=np.int32, shape=(rows, 1))
    chunk = 1 << 20
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        dense[lo:hi] = rng.exponential(2.0, size=(hi - lo, 13)).astype(np.float32)
        sparse[lo:hi] = rng.integers(0, 2**32, size=(hi - lo, 26), dtype=np.int64)
        labels[lo:hi] = (rng.random((hi - lo, 1)) < 0.25).astype(np.int32)
    for arr in (dense, sparse, labels):
        arr.flush()
        del arr


# ---------------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, epilog=outputs_help(__spec__.name),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=4_000_000, help="TSV rows for our converter")
    parser.add_argument("--torchrec-rows", type=int, default=200_000, help="TSV rows for TorchRec's converter")
    parser.add_argument("--python-rows", type=int, default=500_000, help="TSV rows for the pure-Python parser")
    parser.add_argument("--loader-rows", type=int, default=20_000_000, help="rows of the generated binary set")
    parser.add_argument("--batch-size", type=int, default=2048, help="loader and train-step batch size per rank")
    parser.add_argument("--max-rows", type=int, default=100_000, help="table cap (dlrm_criteo_binary.yaml's)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each conversion (the median is reported)")
    parser.add_argument("--skip-loader", action="store_true", help="only the preprocessing part")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dlac_data_bench"))
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json-out", type=Path, default=RESULTS / "data_bench.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    metadata = start_run(__spec__.name, vars(args))
    if args.loader_rows < 4 and not args.skip_loader:
        parser.error("--loader-rows must be at least 4 (four days)")

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        # --- preprocess ---
        if CRITEO_SAMPLE.is_file():
            source = CRITEO_SAMPLE.read_bytes().splitlines(keepends=True)
            source_name = f"the Criteo sample ({CRITEO_SAMPLE.name}, {len(source):,} real rows) repeated"
        else:
            source = [(line + "\n").encode() for line in _synthetic_lines(10_000)]
            source_name = "10,000 generated Criteo-like rows repeated"
        tsv = work / "day_0"
        _write_tsv(tsv, args.rows, source)
        tr_slice, py_slice = work / "torchrec_slice.tsv", work / "python_slice.tsv"
        _head(tsv, tr_slice, args.torchrec_rows)
        _head(tsv, py_slice, args.python_rows)
        print(f"TSV: {args.rows:,} rows ({tsv.stat().st_size / 2**20:.0f} MiB) of {source_name}", flush=True)

        pre: list[dict[str, Any]] = []
        runs = [
            ("TorchRec tsv_to_npys", dict(kind="torchrec", input=str(tr_slice), output=str(work / "tr"))),
            ("dlac preprocess, Python parser, 1 worker",
             dict(kind="preprocess", impl="ref", workers=1, input=str(py_slice), output=str(work / "py"))),
            ("dlac preprocess, native, 1 worker",
             dict(kind="preprocess", impl="native", workers=1, input=str(tsv), output=str(work / "n1"))),
            ("dlac preprocess, native, 2 workers",
             dict(kind="preprocess", impl="native", workers=2, input=str(tsv), output=str(work / "n2"))),
        ]  # fmt: skip
        for name, spec in runs:
            Path(spec["output"]).mkdir(parents=True, exist_ok=True)
            # Every converter runs the same number of times and is reported by the same statistic, the median run
            # (the machine is shared: one disturbed run moves neither side).
            tries = sorted((_run_child(spec, args.timeout) for _ in range(args.repeat)), key=lambda t: t["seconds"])
            r = dict(tries[(len(tries) - 1) // 2])
            r.update(name=name, rate=r["rows"] / r["seconds"], all_seconds=[t["seconds"] for t in tries],
                     maxrss_mib=max(t["maxrss_mib"] for t in tries))  # fmt: skip
            pre.append(r)
            print(f"  {name}: {r['rows']:,} rows in {r['seconds']:.2f} s ({fmt_rate(r['rate'])} rows/s; all runs"
                  f" {', '.join(f'{t:.2f}' for t in r['all_seconds'])} s), peak RSS {r['maxrss_mib']:.0f} MiB",
                  flush=True)  # fmt: skip
        for r in pre:
            r["vs_torchrec"] = r["rate"] / pre[0]["rate"]
        # Identity on the TorchRec slice: our converter's arrays against TorchRec's.
        from lightning_dlac.criteo import binary_paths, preprocess_criteo

        preprocess_criteo([tr_slice], work / "check", workers=2, progress=False, overwrite=True)
        for ours, suffix in zip(binary_paths(work / "check", tr_slice.stem), ("dense", "sparse", "labels")):
            theirs = np.load(work / "tr" / f"tr_{suffix}.npy")
            mine = np.load(ours)
            if mine.dtype != theirs.dtype or not np.array_equal(mine, theirs):
                raise SystemExit(f"{ours} differs from TorchRec's tr_{suffix}.npy")
        print("  arrays identical to TorchRec's on its slice", flush=True)
        for d in ("tr", "py", "n1", "n2", "check"):
            shutil.rmtree(work / d, ignore_errors=True)
        for p in (tsv, tr_slice, py_slice):
            p.unlink()

        # --- loader ---
        loader: list[dict[str, Any]] = []
        step = None
        if not args.skip_loader:
            per_day = args.loader_rows // 4
            npy = work / "npy"
            npy.mkdir(exist_ok=True)
            t0 = time.perf_counter()
            for d, stem in enumerate(("day_0", "day_1", "day_2", "day_23")):
                _write_binary(npy, stem, per_day, seed=d)
            size = sum(p.stat().st_size for p in npy.iterdir()) / 2**30
            print(f"binary set: {4 * per_day:,} rows, {size:.1f} GiB, written in {time.perf_counter() - t0:.0f} s",
                  flush=True)  # fmt: skip
            for mmap_mode, rank in ((False, 0), (False, 1), (True, 0), (True, 1)):
                spec = dict(kind="loader", data_dir=str(npy), train=["day_0", "day_1", "day_2"], val=["day_23"],
                            batch_size=args.batch_size, max_rows=args.max_rows, rank=rank, world_size=2,
                            mmap_mode=mmap_mode)  # fmt: skip
                r = _run_child(spec, args.timeout)
                r.update(rank=rank, batch_size=args.batch_size, mmap_mode=mmap_mode)
                loader.append(r)
                print(f"  {'mmap' if mmap_mode else 'pread'} rank {rank}: open {r['open_seconds']:.3f} s,"
                      f" {r['batches']} batches at"
                      f" {r['batches_per_second']:.0f}/s, RSS after {r['rss_after']['VmRSS']:.0f} MiB (anonymous"
                      f" {r['rss_after']['RssAnon']:.0f}), share {r['share_mib']:.0f} MiB", flush=True)  # fmt: skip
            step = _run_child(dict(kind="train_step", batch_size=args.batch_size, max_rows=args.max_rows, steps=20),
                              args.timeout)  # fmt: skip
            step["batch_size"] = args.batch_size
            print(f"  demo train step: {step['step_seconds'] * 1e3:.1f} ms", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()

    table = tables([*pre, *loader, *([step] if step else [])])
    print()
    print("\n".join(table))
    cfg = dict(rows=args.rows, torchrec_rows=args.torchrec_rows, python_rows=args.python_rows, source=source_name,
               loader_rows=args.loader_rows, batch_size=args.batch_size, max_rows=args.max_rows,
               loadavg_before=load_before, loadavg_after=load_after)  # fmt: skip
    write_results(args.json_out, metadata, cfg, [*pre, *loader, *([step] if step else [])])
    print(f"\nload average (1/5/15 min) before {load_before}, after {load_after}")
    print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
