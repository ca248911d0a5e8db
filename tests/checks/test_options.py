"""The shared option checkers (lightning_dlac.checks): what they accept, what they return, and that every old import
location of a moved checker still gives the same function."""

from __future__ import annotations

import subprocess
import sys
from enum import Enum

import pytest

from lightning_dlac.checks import check_count, parse_enum


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(("value", "minimum"), [(0, 0), (3, 1), (10**12, 1)])
def test_check_count_returns_a_whole_number_at_the_minimum_or_above(value: int, minimum: int) -> None:
    assert check_count(value, "option", minimum) == value


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "2", None])
def test_check_count_names_the_option_and_the_minimum(value: object) -> None:
    with pytest.raises(ValueError, match=rf"^pieces={value!r} must be a whole number >= 1\.$".replace("(", r"\(")):
        check_count(value, "pieces", 1)


def test_parse_enum_takes_a_member_or_its_value() -> None:
    assert parse_enum(Colour, "blue", "colour") is Colour.BLUE
    assert parse_enum(Colour, Colour.RED, "colour") is Colour.RED


def test_parse_enum_lists_the_accepted_values() -> None:
    with pytest.raises(ValueError, match=r"^colour='green' is not supported; choose one of 'red', 'blue'\.$"):
        parse_enum(Colour, "green", "colour")


def test_the_old_locations_give_the_same_checkers() -> None:
    from lightning_dlac import adaptive
    from lightning_dlac.adaptive import bounds
    from lightning_dlac.engine import sharding

    assert adaptive.check_count is bounds.check_count is check_count
    assert "check_count" in adaptive.__all__
    assert sharding.parse_enum is parse_enum


def test_the_options_that_use_them_fail_with_their_own_name() -> None:
    from lightning_dlac.adaptive import DecaySchedule
    from lightning_dlac.comm.config import CompressionConfig

    with pytest.raises(ValueError, match=r"^schedule='cosine' is not supported; choose one of 'step', 'linear'"):
        DecaySchedule(kind="cosine")
    with pytest.raises(ValueError, match=r"^backward='int4' is not supported; choose one of 'fp32', 'bf16'"):
        CompressionConfig(backward="int4")
    with pytest.raises(ValueError, match=r"^pieces=0 must be a whole number >= 1\.$"):
        CompressionConfig(pieces=0)


@pytest.mark.slow  # a fresh Python process
def test_importing_the_checkers_imports_no_torch() -> None:
    code = "import sys, lightning_dlac.checks; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
