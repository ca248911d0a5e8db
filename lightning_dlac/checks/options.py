"""Checkers of plain-data options (numbers, enum values given as strings): what the constructors of every layer
validate their arguments with, so that an option written in YAML fails with its name and the accepted values."""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

E = TypeVar("E", bound=Enum)


def check_count(value: Any, option: str, minimum: int) -> int:
    """Check that ``value`` is a whole number of at least ``minimum``.

    Args:
        value: The option's value as given (``True`` is not a count, though Python's ``bool`` is an ``int``).
        option: The option's name, for the error.
        minimum: The smallest accepted value.

    Returns:
        ``value``.

    Raises:
        ValueError: ``value`` is not an ``int`` or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{option}={value!r} must be a whole number >= {minimum}.")
    return value


def parse_enum(enum_cls: type[E], value: Any, option: str) -> E:
    """Convert ``value`` (a member of ``enum_cls`` or its value, as YAML gives it) to the member.

    Args:
        enum_cls: The enum the option takes.
        value: The option's value as given.
        option: The option's name, for the error.

    Returns:
        ``enum_cls(value)``.

    Raises:
        ValueError: ``value`` is none of ``enum_cls``'s values; the message lists them.
    """
    try:
        return enum_cls(value)
    except ValueError:
        accepted = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"{option}={value!r} is not supported; choose one of {accepted}.") from None
