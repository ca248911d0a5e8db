"""What benchmarks/gpu_session.sh runs under compute-sanitizer: encodes and decodes on the GPU that reach every kernel
and every chunk mode, and decodes of damaged payloads, each held to the CPU kernels.

    python tests/codec/cuda_sanitizer_workload.py small                  # racecheck, synccheck, initcheck
    python tests/codec/cuda_sanitizer_workload.py damaged --count 100    # memcheck: and 100 damaged payloads
    python tests/codec/cuda_sanitizer_workload.py damaged --emulate      # no GPU: the same, emulated on the host

``small``: grids that hold every mode (CONST, RAW with NaN and Inf, PACK, HUFF, DEDUP, a chunk that keeps a later
quantization step, empty and zero-width blocks) and every grid case of the CUDA tests (tests/codec/grid_cases.py:
dims 8 to 128, relative and absolute bounds, multi-hot, gradients, thousands of chunks), encoded on the device and
decoded with host and device sizes. ``damaged``: that too, then ``--count`` damaged copies of the first payload (a
bit flip; bytes overwritten behind a recomputed checksum, so the Huffman and PACK decoders see them; a chunk cut short
with its size), each decoded as a whole grid and the damaged chunk alone: a count, not a time, so a slow run cannot
pass on fewer. For memcheck to see an
access past a buffer, each must be an allocation of its own size: run it with PYTORCH_NO_CUDA_MEMORY_CACHING=1
(the session script does; the caching allocator hands out pieces of larger blocks), so a read past the damaged chunk
is a read past its allocation. Every verdict must equal the CPU decoder's (the same message, or the same bits).

--emulate runs the calls through the CUDA pipeline compiled for the host (tests/codec/emulated_grid.cpp): a
rehearsal of this script where there is no GPU. Exit status: 0 if every result equals the CPU kernels', 1 if not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from conftest import bits, zipf_payload  # noqa: E402
from grid_cases import CASES, damaged_payloads, empty_and_zero_width, verdict  # noqa: E402

from lightning_dlac.codec import _loader  # noqa: E402


def all_modes_grid() -> tuple[torch.Tensor, list[int], list[int], torch.Tensor, bool]:
    """Zipf tables (DEDUP), noise (HUFF; RAW in the row block that holds a NaN and an Inf), a wide alphabet (PACK),
    a raw block (bound 0), a constant one, and an empty row block (CONST chunks)."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat([zipf_payload(rows=512, dim=16, vocab=40), zipf_payload(rows=512, dim=24, vocab=300, seed=1),
                   torch.randn(512, 8, generator=g), torch.rand(512, 4, generator=g), torch.randn(512, 4, generator=g),
                   torch.full((512, 4), 0.25)], dim=1)
    x[7, 40] = float("nan")
    x[50, 41] = float("inf")
    cs = [0, 16, 40, 48, 52, 56, 60]
    return x, [0, 100, 100, 512], cs, torch.tensor([0.01, 0.05, 0.01, 1e-4, 0.0, 0.01]), True


def later_step_grid() -> tuple[torch.Tensor, list[int], list[int], torch.Tensor, bool]:
    """Values near the smallest floats whose chunk keeps the step 1.9921875 eb (codes redone after the first step
    missed; found by search, as test_codec_device_pipeline.py's test of it)."""
    rng = np.random.default_rng(111)
    a = rng.standard_normal((200, 16)) * 10.0 ** rng.integers(-44, -36, size=(200, 16))
    return torch.from_numpy(a.astype(np.float32)), [0, 200], [0, 16], torch.tensor([0.003]), True


def own(t: torch.Tensor, device: str) -> torch.Tensor:
    """t in an allocation of exactly its size on ``device`` (a host tensor made by frombuffer shares a bytearray's
    larger buffer: cloned; AddressSanitizer then sees a read past its end, as memcheck does on the GPU)."""
    return t.clone() if device == "cpu" else t.to(device)


class Check:
    """Counts results and remembers every one that differs from the CPU kernels'."""

    def __init__(self) -> None:
        self.calls, self.failures = 0, []

    def equal(self, what: str, ok: bool) -> None:
        self.calls += 1
        if not ok:
            self.failures.append(what)
            print(f"DIFFERS: {what}", flush=True)


def grid_round_trip(check: Check, ops, device: str, name: str, grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode on the device and decode with host and with device sizes, all against the CPU kernels."""
    x, rs, cs, bounds, relative = grid
    want, want_sizes = torch.ops.dlac.encode_grid(x, rs, cs, bounds, relative)
    payload, sizes = ops.encode_grid(own(x, device), rs, cs, bounds, relative)
    check.equal(f"{name}: payload", torch.equal(sizes.cpu(), want_sizes) and torch.equal(payload.cpu(), want))
    decoded = torch.ops.dlac.decode_grid(want, want_sizes, rs, cs)
    for where, s in (("host", want_sizes), ("device", want_sizes.to(device))):  # as the exchange receives them
        out = ops.decode_grid(own(want, device), s, rs, cs)
        check.equal(f"{name}: decoded with {where} sizes", torch.equal(bits(out.cpu()), bits(decoded)))
    return want, want_sizes


def damaged(check: Check, ops, device: str, payload: torch.Tensor, sizes: torch.Tensor, rs: list[int],
            cs: list[int], count: int) -> tuple[int, int]:
    """``count`` damaged copies of the payload decoded on the device, whole and the damaged chunk alone; (payloads,
    rejected)."""
    done, rejected = 0, 0
    offs = [0]
    for size in sizes.tolist():
        offs.append(offs[-1] + size)
    for mutated, new_sizes, chunk in damaged_payloads(payload, sizes, count, seed=13):
        got, err = verdict(ops.decode_grid, own(mutated, device), new_sizes, rs, cs)
        want, want_err = verdict(torch.ops.dlac.decode_grid, mutated, new_sizes, rs, cs)
        same = err == want_err and (err is not None or torch.equal(bits(got.cpu()), bits(want)))
        check.equal(f"damaged payload {done} (chunk {chunk}): {err!r} vs the CPU's {want_err!r}", same)
        # The damaged chunk alone, in an allocation of its own size.
        r, c = chunk // (len(cs) - 1), chunk % (len(cs) - 1)
        piece = mutated[offs[chunk]: offs[chunk] + int(new_sizes[chunk])].clone()
        one = [0, rs[r + 1] - rs[r]], [0, cs[c + 1] - cs[c]]
        size = torch.tensor([piece.numel()])
        got, err = verdict(ops.decode_grid, own(piece, device), size, *one)
        want, want_err = verdict(torch.ops.dlac.decode_grid, piece, size, *one)
        same = err == want_err and (err is not None or torch.equal(bits(got.cpu()), bits(want)))
        check.equal(f"damaged chunk {chunk} alone: {err!r} vs the CPU's {want_err!r}", same)
        done += 1
        rejected += want_err is not None
    return done, rejected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["small", "damaged"])
    parser.add_argument("--count", type=int, default=100, help="damaged payloads to decode (damaged mode)")
    parser.add_argument("--emulate", action="store_true", help="no GPU: the CUDA pipeline compiled for the host")
    args = parser.parse_args()
    start = time.perf_counter()
    _loader.load_native()
    if args.emulate:
        headers = sorted(_loader.sources_dir().glob("*.h"))
        _loader.build_library([HERE / "emulated_grid.cpp"], headers, prefix="dlac_emu")
        ops, device = torch.ops.dlac_emu, "cpu"
    else:
        if not torch.cuda.is_available():
            print("no device: torch.cuda.is_available() is False (--emulate rehearses this on the host)")
            return 2
        ops, device = torch.ops.dlac, "cuda"
    print(f"sanitizer workload ({args.mode}, {'emulated on the host' if args.emulate else device}): native kernels "
          f"loaded in {time.perf_counter() - start:.1f} s", flush=True)
    check = Check()
    grid = all_modes_grid()
    payload, sizes = grid_round_trip(check, ops, device, "all modes", grid)
    grid_round_trip(check, ops, device, "a later quantization step", later_step_grid())
    grid_round_trip(check, ops, device, "empty and zero-width blocks", empty_and_zero_width())
    for name, case in sorted(CASES.items()):
        grid_round_trip(check, ops, device, f"grid case {name}", case())
    line = f"sanitizer workload ({args.mode}): {check.calls} results"
    if args.mode == "damaged":
        n, rejected = damaged(check, ops, device, payload, sizes, grid[1], grid[2], args.count)
        line += f", {n} damaged payloads decoded whole and by chunk ({rejected} rejected)"
        if n < args.count:
            check.equal(f"damaged payloads: {n} of the {args.count} asked for", False)
    if device == "cuda":
        torch.cuda.synchronize()
    verdict_line = "all equal to the CPU kernels'" if not check.failures else f"{len(check.failures)} DIFFER"
    print(f"{line}, {verdict_line}, in {time.perf_counter() - start:.0f} s", flush=True)
    return 0 if not check.failures else 1


if __name__ == "__main__":
    sys.exit(main())
