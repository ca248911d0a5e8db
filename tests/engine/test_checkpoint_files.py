"""The checkpoint directory format without processes: round trip, safe loading of meta.pt, and a checkpoint that
does not fit the model (lightning_dlac.engine.checkpoint)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from lightning_dlac.engine.checkpoint import META_FILE, load_sharded, save_sharded


class Payload:
    """An arbitrary object: unpickling it would run code of the pickler's choosing."""

    def __init__(self) -> None:
        self.value = 42


def _save(path: Path, **extra: object) -> None:
    checkpoint = {"state_dict": {"w": torch.arange(4.0)}, "epoch": 3, "loops": {"fit": [1, 2]}, **extra}
    save_sharded(checkpoint, path, {"state": {"w": torch.ones(2)}}, is_global_zero=True, barrier=lambda name: None)


def test_round_trip_loads_weights_into_the_given_state_and_plain_data_safely(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt")
    state, fused = {"w": torch.zeros(4)}, {"state": {"w": torch.zeros(2)}}
    loaded = load_sharded(tmp_path / "ckpt", state, fused)  # weights_only=True by default
    assert torch.equal(state["w"], torch.arange(4.0)) and torch.equal(fused["state"]["w"], torch.ones(2))
    assert loaded["epoch"] == 3 and loaded["loops"] == {"fit": [1, 2]} and loaded["state_dict"] is state


def test_a_checkpoint_carrying_an_arbitrary_object_is_refused_unless_trusted(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", hyper_parameters={"thing": Payload()})
    with pytest.raises(pickle.UnpicklingError, match=f"{META_FILE} holds objects other than plain data.*"
                                                     "weights_only=False"):
        load_sharded(tmp_path / "ckpt", {"w": torch.zeros(4)}, {"state": {"w": torch.zeros(2)}})
    trusted = load_sharded(tmp_path / "ckpt", {"w": torch.zeros(4)}, {"state": {"w": torch.zeros(2)}},
                           weights_only=False)
    assert trusted["hyper_parameters"]["thing"].value == 42


def test_a_checkpoint_for_other_tables_and_a_single_file_are_named(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="does not fit this model.*written for other tables"):
        load_sharded(tmp_path / "ckpt", {"w": torch.zeros(5)}, {"state": {"w": torch.zeros(2)}})
    (tmp_path / "model.ckpt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a DLACStrategy checkpoint directory"):
        load_sharded(tmp_path / "model.ckpt", {}, {})
