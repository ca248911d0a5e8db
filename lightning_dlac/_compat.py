"""Renamed options: the old name keeps working for one release, with a warning that names the new one."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_warn


def renamed_option(owner: str, old: str, new: str, old_value: Any, new_value: Any, default: Any) -> Any:
    """The value of option ``new``, taking ``old_value`` (with a FutureWarning) where only the old name was set."""
    if old_value is None:
        return new_value
    if new_value != default and new_value != old_value:
        raise ValueError(f"{owner}: {old}={old_value!r} and {new}={new_value!r} name the same option; set only {new}.")
    rank_zero_warn(
        f"{owner}({old}=...) is deprecated and will be removed in the next release; use {new}={old_value!r}"
        f" (in YAML: `{new}: {old_value}`).",
        category=FutureWarning,
    )
    return old_value
