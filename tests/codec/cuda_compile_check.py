"""Compile-check the CUDA kernels without a GPU (``make cuda-check``): build cuda_ext/ with its .cu sources exactly as
the JIT loader does on a GPU machine, load the library, and check that it registers CUDA kernels for both ops.

Needs a CUDA build of torch (``make cuda-check`` runs it twice: with torch 2.14.1+cu130 from .venv-cuda and with
2.11.0+cu130, the lent GPU machine's image, from .venv-cuda-image; benchmarks/gpu_session.sh runs it on a machine
without a GPU) and the CUDA toolkit (CUDA_HOME, else derived from the nvcc on PATH). Imports only torch and the
checkout's codec package (which needs torch alone), so the CUDA venv needs nothing else. Exit status 0 on success;
the build log's tail on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _loader():
    # The checkout's package (the CUDA venvs install only torch): the loader builds through lightning_dlac.native.
    sys.path.insert(0, str(ROOT))
    from lightning_dlac.codec import _loader

    return _loader


def _cuda_home() -> str | None:
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    # /usr/local/bin/nvcc may be a wrapper script that execs the toolkit's nvcc: follow it to the toolkit root.
    text = Path(nvcc).read_text(errors="replace") if Path(nvcc).stat().st_size < 4096 else ""
    for word in text.split():
        if word.endswith("/bin/nvcc") and Path(word).is_file():
            return str(Path(word).parents[1])
    return str(Path(nvcc).resolve().parents[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"),
                        help="TORCH_CUDA_ARCH_LIST for the build (default 9.0, the H200)")
    args = parser.parse_args()
    if torch.version.cuda is None:
        print(f"torch {torch.__version__} is a CPU build: the CUDA sources need a CUDA build (make cuda-check)")
        return 2
    home = _cuda_home()
    if home is None:
        print("no CUDA toolkit: set CUDA_HOME or put nvcc on PATH")
        return 2
    if not (Path(home) / "bin" / "nvcc").is_file():
        print(f"no CUDA toolkit at CUDA_HOME={home} (it has no bin/nvcc): point CUDA_HOME at the toolkit")
        return 2
    os.environ["CUDA_HOME"] = home
    os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch
    loader = _loader()
    sources, headers = loader._sources(with_cuda=True)
    cu = [p.name for p in sources if p.suffix == ".cu"]
    if not cu:
        print(f"no .cu sources in {loader.sources_dir()}")
        return 1
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), CUDA_HOME={home}, arch {args.arch}: building "
          + ", ".join(p.name for p in sources))
    start = time.perf_counter()
    try:
        directory = loader.build_library(sources, headers, prefix="dlac_cuda_check")
    except loader.NativeUnavailable as e:
        print(e)
        return 1
    print(f"built and loaded in {time.perf_counter() - start:.0f} s: {directory}")
    missing = [
        f"{op} ({key})" for op in ("dlac::encode_grid", "dlac::decode_grid") for key in ("CPU", "CUDA")
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
    ]
    if missing:
        print("the library does not register: " + ", ".join(missing))
        return 1
    print("dlac::encode_grid and dlac::decode_grid have CPU and CUDA kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
