"""A process's random number state, carried in a checkpoint so that a restart draws what the interrupted run would
have drawn (no Lightning here).

A model that draws at random while it trains (dropout, sampled negatives, noise) continues exactly after a restart
only if every rank's generators continue where they were: torch's CPU generator, the current CUDA device's (where
CUDA is initialized), NumPy's global one and Python's :mod:`random`. Lightning saves none of them
(``seed_everything`` only seeds at the start), so a restarted rank would otherwise draw from a fresh seed.

:func:`capture` returns them as plain data and tensors (a checkpoint's ``meta.pt`` loads with
``torch.load(weights_only=True)``), :func:`restore` puts them back, and :func:`for_rank` picks a rank's state from
the states of the ranks that saved:

- resumed on as many ranks as saved: rank ``r`` gets the state rank ``r`` saved, and the run continues exactly;
- resumed on another number of ranks: ranks below the number saved get the state they saved, the others a state
  derived from the saved state of rank ``r mod saved`` and ``r`` (the same on every restart, different for every
  rank). The run cannot continue exactly (its batches are split differently too), and :func:`for_rank` says so.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture", "for_rank", "restore"]


def capture() -> dict[str, Any]:
    """This process's generator states: ``torch`` (CPU), ``cuda`` (the current device's, only where CUDA is
    initialized), ``numpy`` and ``python``, as tensors, lists and numbers."""
    version, internal, gauss = random.getstate()
    legacy = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"key": legacy["state"]["key"].tolist(), "pos": int(legacy["state"]["pos"]),
                  "has_gauss": int(legacy["has_gauss"]), "gauss": float(legacy["gauss"])},
        "python": [version, list(internal), gauss],
    }  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back the generator states :func:`capture` returned. A CUDA state is restored where CUDA is available; a
    state saved without one leaves the CUDA generator as it is."""
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(("MT19937", np.asarray(numpy["key"], dtype=np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["gauss"]))  # fmt: skip
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def for_rank(saved: list[dict[str, Any]], rank: int, world_size: int) -> tuple[dict[str, Any], str | None]:
    """The state rank ``rank`` of ``world_size`` resumes with, from the states the ranks that saved captured (one per
    rank, in rank order), and a warning when the restart cannot be exact (another number of ranks), else ``None``.
    See the module docstring for the rule."""
    if not saved:
        raise ValueError("no saved random state to resume from")
    warning = None
    if world_size != len(saved):
        warning = (
            f"The checkpoint was written by {len(saved)} rank(s) and resumes on {world_size}: ranks"
            f" 0-{min(len(saved), world_size) - 1} continue the random state they saved"
            + (f", ranks {len(saved)}-{world_size - 1} start from states derived from it" if world_size > len(saved)
               else "")
            + ". Random draws (dropout, sampling) cannot continue exactly as on the ranks that saved."
        )  # fmt: skip
    if rank < len(saved):
        return saved[rank], warning
    return _derived(saved[rank % len(saved)], rank), warning


def _derived(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """A state seeded from a hash of ``state`` and ``rank``: every restart of a rank beyond the saved ones draws the
    same numbers, and no two ranks draw alike."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(state["torch"].numpy().tobytes())
    digest.update(np.asarray(state["numpy"]["key"], dtype=np.uint32).tobytes())
    digest.update(repr((state["numpy"]["pos"], state["python"], rank)).encode())
    seed = int.from_bytes(digest.digest(), "little")
    kept = capture()
    try:
        torch.manual_seed(seed)  # also seeds every CUDA device's generator where CUDA is initialized
        np.random.seed(seed % 2**32)
        random.seed(seed)
        return capture()
    finally:
        restore(kept)
