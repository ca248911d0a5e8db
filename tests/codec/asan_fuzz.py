"""Fuzz the native codec built with AddressSanitizer (and UndefinedBehaviorSanitizer): any out-of-bounds read or
write, use after free or undefined behaviour in the C++ kernels aborts the run with a report.

    make asan-fuzz            # or: python tests/codec/asan_fuzz.py [--n 20000]

It builds cuda_ext/dlac_cpu.cpp with -fsanitize=address,undefined into a temporary directory, re-executes itself
with libasan preloaded (Python itself is not instrumented), and feeds the native decoder mutated, truncated and
foreign buffers and multi-chunk payloads with wrong sizes (every one must decode or raise CodecError), and the
encoder random shapes, bounds and values (every output must decode within the bound). It also builds the CUDA
pipeline compiled for the host (tests/codec/emulated_grid.cpp) so, and runs on it what the GPU session runs under
compute-sanitizer memcheck (tests/codec/cuda_sanitizer_workload.py: every mode, and damaged payloads decoded whole
and by chunk, each buffer its own allocation) and the grids of tests/codec/grid_cases.py: the host's stand-in for
memcheck of the device kernels' code where no GPU is.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAN_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


def _preload() -> str:
    """libasan first, then libstdc++: Python is not linked against libstdc++, and without it preloaded ASan cannot
    find the real __cxa_throw when the kernels throw (its CHECK fails on the first CodecError)."""
    paths = []
    for lib in ("libasan.so", "libstdc++.so"):
        out = subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True, check=True)
        path = out.stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            sys.exit(f"{lib} not found: install the compiler's runtime (e.g. apt install libasan8 libstdc++-dev)")
        paths.append(os.path.realpath(path))
    return " ".join(paths)


def _codec_only() -> None:
    """Import lightning_dlac's codec without the package's __init__ (which imports Lightning, and through
    torchmetrics matplotlib, whose C++ exceptions trip the preloaded ASan runtime): the fuzz needs only the codec."""
    import types

    pkg = types.ModuleType("lightning_dlac")
    pkg.__path__ = [str(REPO / "lightning_dlac")]
    sys.modules["lightning_dlac"] = pkg
    sys.path[:0] = [str(REPO / "tests" / "codec"), str(REPO)]  # the fuzz helpers import the codec tests' conftest


def _build(build_dir: Path) -> None:
    import torch  # noqa: F401 - loads libtorch before the extension
    from torch.utils import cpp_extension

    from lightning_dlac.codec import _loader

    cpp_extension.load(
        name="dlac_asan",
        sources=[str(REPO / "cuda_ext" / "dlac_cpu.cpp")],
        extra_cflags=["-O1", "-g", "-std=c++17", "-ffp-contract=off", "-fopenmp", *SAN_FLAGS],
        extra_ldflags=["-fopenmp", *SAN_FLAGS],
        extra_include_paths=[str(REPO / "cuda_ext")],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    emu_dir = build_dir / "emulation"
    emu_dir.mkdir(exist_ok=True)
    cpp_extension.load(
        name="dlac_emu_asan",
        sources=[str(REPO / "tests" / "codec" / "emulated_grid.cpp")],
        extra_cflags=["-O1", "-g", "-std=c++17", "-ffp-contract=off", "-fopenmp", *SAN_FLAGS],
        extra_ldflags=["-fopenmp", *SAN_FLAGS],
        extra_include_paths=[str(REPO / "cuda_ext")],
        build_directory=str(emu_dir),
        is_python_module=False,
        verbose=False,
    )
    # The sanitized library registered torch.ops.dlac; make the codec use it instead of building its own.
    _loader._state["loaded"] = True
    from lightning_dlac.codec import _fake  # noqa: F401


def _fuzz(n: int, seed: int) -> None:
    import torch

    from lightning_dlac.codec import CodecError, decode, decode_grid, encode, encode_grid
    from tests.codec.test_codec_errors import _fuzz as mutate_and_decode

    # 1. Single buffers: bit flips, truncation/extension, structural mutations behind a fixed checksum.
    mutate_and_decode(n, seed=seed, impls=["native"])

    # 2. Multi-chunk payloads with wrong sizes and cut-off payloads.
    rnd = random.Random(seed + 1)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n // 10):
        rows, dims = rnd.randint(0, 40), [rnd.randint(1, 12) for _ in range(rnd.randint(1, 4))]
        x = torch.randn(rows, sum(dims), generator=gen) * rnd.choice([1e-3, 1.0, 1e4])
        rs = [0, rows // 2, rows]
        cs = [0]
        for d in dims:
            cs.append(cs[-1] + d)
        payload, sizes = encode_grid(x, rs, cs, eps=rnd.choice([1e-4, 0.01, 0.2]), impl="native")
        bad_sizes = sizes.clone()
        if bad_sizes.numel() > 1:
            i, j = rnd.sample(range(bad_sizes.numel()), 2)
            shift = min(int(bad_sizes[i]), rnd.randint(1, 64))
            bad_sizes[i] -= shift
            bad_sizes[j] += shift
        cut = payload[: rnd.randrange(payload.numel() + 1)]
        for p, s in ((payload, bad_sizes), (cut, sizes)):
            try:
                decode_grid(p, s, rs, cs, impl="native")
            except (CodecError, ValueError):
                pass

    # 3. The encoder on random shapes, bounds and values (denormals, huge ranges, NaN/Inf, constants).
    for _ in range(n // 10):
        rows, dim = rnd.randint(0, 64), rnd.randint(1, 40)
        kind = rnd.randrange(5)
        if kind == 0:
            x = torch.randn(rows, dim, generator=gen)
        elif kind == 1:
            x = torch.randn(rows, dim, generator=gen) * 1e-40  # denormals
        elif kind == 2:
            x = torch.randn(rows, dim, generator=gen) * 1e37  # huge range
        elif kind == 3:
            x = torch.full((rows, dim), rnd.uniform(-5, 5))
        else:
            x = torch.randn(rows, dim, generator=gen)
            if x.numel():
                x.view(-1)[rnd.randrange(x.numel())] = rnd.choice([float("nan"), float("inf"), -float("inf")])
        eps = rnd.choice([1e-6, 1e-3, 0.05, 0.5])
        y = decode(encode(x, eps=eps, impl="native"), impl="native")
        finite = torch.isfinite(x)
        inf = ~finite & ~x.isnan()
        assert torch.equal(torch.isnan(y), torch.isnan(x)) and torch.equal(x[inf], y[inf])
    # 4. The CUDA pipeline compiled for the host (torch.ops.dlac_emu), held to the CPU kernels: the GPU session's
    # memcheck workload and the grids the CUDA tests run.
    from cuda_sanitizer_workload import Check, all_modes_grid, damaged, grid_round_trip, later_step_grid
    from grid_cases import CASES

    check = Check()
    grid = all_modes_grid()
    payload, sizes = grid_round_trip(check, torch.ops.dlac_emu, "cpu", "all modes", grid)
    grid_round_trip(check, torch.ops.dlac_emu, "cpu", "a later step", later_step_grid())
    for name, case in sorted(CASES.items()):
        grid_round_trip(check, torch.ops.dlac_emu, "cpu", name, case())
    damaged_n, rejected = damaged(check, torch.ops.dlac_emu, "cpu", payload, sizes, grid[1], grid[2], n // 10)
    assert not check.failures, check.failures
    print(f"asan fuzz: {n} mutated buffers, {n // 10} multi-chunk payloads, {n // 10} encodes; emulated device "
          f"pipeline: {check.calls - 2 * damaged_n} grid results and {damaged_n} damaged payloads ({rejected} "
          "rejected) equal to the CPU kernels: no sanitizer report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=6000, help="mutated single buffers (and n/10 of the other kinds)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--_inside", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._inside is None:
        with tempfile.TemporaryDirectory(prefix="dlac_asan_") as tmp:
            env = {**os.environ, "LD_PRELOAD": _preload(), "PYTHONPATH": str(REPO),
                   "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
            cmd = [sys.executable, __file__, "--n", str(args.n), "--seed", str(args.seed), "--_inside", tmp]
            sys.exit(subprocess.run(cmd, env=env).returncode)
    _codec_only()
    _build(Path(args._inside))
    _fuzz(args.n, args.seed)


if __name__ == "__main__":
    main()
