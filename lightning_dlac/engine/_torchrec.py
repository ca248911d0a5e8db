"""One place that imports TorchRec and FBGEMM, so a missing or mismatched install fails with a message that says
what to install instead of an undefined-symbol traceback from deep inside an import chain."""

from __future__ import annotations

import importlib

TORCHREC_VERSION = "1.9.2"
FBGEMM_VERSION = "1.9.0"
TORCH_VERSION = "2.14"

_INSTALL_HINT = (
    "Install the pinned set: `pip install -r requirements/cpu.txt &&"
    f" pip install --no-deps torchrec=={TORCHREC_VERSION}`"
    f" (on a CUDA machine use requirements/cuda.txt, which brings fbgemm-gpu=={FBGEMM_VERSION}), or run `make venv`."
    f" fbgemm-gpu {FBGEMM_VERSION} and torchrec {TORCHREC_VERSION} pair with torch {TORCH_VERSION} only."
)


def require_torchrec() -> None:
    """Import torchrec and fbgemm_gpu, raising an actionable error when either is missing or mismatched.

    Raises:
        ModuleNotFoundError: if torchrec or fbgemm_gpu is not installed.
        ImportError: if they are installed but do not load (typically a torch / fbgemm version mismatch).
    """
    for name in ("fbgemm_gpu", "torchrec"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and err.name.split(".")[0] == name:
                msg = f"DLACStrategy needs `{name}`, which is not installed. {_INSTALL_HINT}"
                raise ModuleNotFoundError(msg) from err
            msg = f"`{name}` is installed but one of its dependencies is missing ({err}). {_INSTALL_HINT}"
            raise ImportError(msg) from err
        except (ImportError, OSError) as err:
            raise ImportError(
                f"`{name}` is installed but failed to load ({err}). This is almost always a torch / fbgemm-gpu version"
                f" mismatch. {_INSTALL_HINT}"
            ) from err
