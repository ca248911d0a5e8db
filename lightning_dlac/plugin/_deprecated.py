"""The spellings of lightning-dlac 0.1 that keep working for one release, each with a warning that names its
replacement (docs/api.md lists them).

``DLACStrategy`` took 20 flat options; each is a field of one of its three config objects now (:data:`FLAT_OPTIONS`):

- ``sharding_types``, ``table_constraints``, ``embedding_optimizer``, ``embedding_lr``, ``adagrad_epsilon``,
  ``memory_budget_bytes``, ``find_unused_parameters``, ``static_graph``, ``bucket_cap_mb``:
  ``sharding=ShardingOptions(<same name>=...)``;
- ``eps``, ``backward_eps``, ``error_every``, ``fallback_check_every``, ``overlap``, ``compress_peers``, ``pieces``:
  ``compression=CompressionOptions(<same name>=...)``; ``backward_compression``, ``codec_impl``:
  ``CompressionOptions(backward=...)``, ``(impl=...)``; ``compress=False``: ``CompressionOptions(enabled=False)``,
  ``compress="auto"``: ``CompressionOptions(auto_fallback=True)``;
- ``verify_checkpoints``: ``checkpointing=CheckpointOptions(verify=...)``.

:func:`flat_options` declares them so that LightningCLI (jsonargparse) accepts them in YAML too: it follows the
strategy's ``**deprecated`` into that call and reads its signature. Their default, ``argparse.SUPPRESS``, keeps them
out of ``--print_config`` unless a config gives them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from lightning.pytorch.utilities.rank_zero import rank_zero_deprecation

# jsonargparse adds an argument whose default is argparse.SUPPRESS to a config only when it is given.
_UNSET: Any = argparse.SUPPRESS
# Frames between warnings.warn in Lightning's rank_zero_deprecation and the caller of the function calling warn():
# _warn, rank_zero_warn, its rank_zero_only wrapper, rank_zero_deprecation, warn, the function, its caller.
_STACKLEVEL = 7
_KEPT = "The old spelling keeps working for one release (docs/api.md)."

# flat option -> (the strategy's config parameter, the field of its config object)
FLAT_OPTIONS: dict[str, tuple[str, str]] = {
    "sharding_types": ("sharding", "sharding_types"),
    "table_constraints": ("sharding", "table_constraints"),
    "embedding_optimizer": ("sharding", "embedding_optimizer"),
    "embedding_lr": ("sharding", "embedding_lr"),
    "adagrad_epsilon": ("sharding", "adagrad_epsilon"),
    "memory_budget_bytes": ("sharding", "memory_budget_bytes"),
    "find_unused_parameters": ("sharding", "find_unused_parameters"),
    "static_graph": ("sharding", "static_graph"),
    "bucket_cap_mb": ("sharding", "bucket_cap_mb"),
    "compress": ("compression", "enabled"),  # False -> enabled=False, "auto" -> auto_fallback=True
    "eps": ("compression", "eps"),
    "backward_compression": ("compression", "backward"),
    "backward_eps": ("compression", "backward_eps"),
    "codec_impl": ("compression", "impl"),
    "error_every": ("compression", "error_every"),
    "fallback_check_every": ("compression", "fallback_check_every"),
    "overlap": ("compression", "overlap"),
    "compress_peers": ("compression", "compress_peers"),
    "pieces": ("compression", "pieces"),
    "verify_checkpoints": ("checkpointing", "verify"),
}
# The strategy's config parameters, in the order the replacement call is written.
GROUPS = ("sharding", "compression", "checkpointing")


def flat_options(
    *,
    sharding_types: Sequence[str] = _UNSET,
    table_constraints: Mapping[str, Mapping[str, Any]] | None = _UNSET,
    embedding_optimizer: str = _UNSET,
    embedding_lr: float = _UNSET,
    adagrad_epsilon: float = _UNSET,
    memory_budget_bytes: int | None = _UNSET,
    compress: bool | Literal["auto"] = _UNSET,
    eps: float = _UNSET,
    backward_compression: str = _UNSET,
    backward_eps: float = _UNSET,
    codec_impl: str = _UNSET,
    error_every: int = _UNSET,
    fallback_check_every: int = _UNSET,
    overlap: bool | None = _UNSET,
    compress_peers: str | Callable[[int, int], bool] = _UNSET,
    pieces: int = _UNSET,
    find_unused_parameters: bool = _UNSET,
    static_graph: bool = _UNSET,
    bucket_cap_mb: int = _UNSET,
    verify_checkpoints: bool = _UNSET,
) -> dict[str, Any]:
    """The deprecated flat options of ``DLACStrategy`` that were given, by name.

    Args:
        sharding_types: Deprecated: ``sharding.sharding_types``.
        table_constraints: Deprecated: ``sharding.table_constraints``.
        embedding_optimizer: Deprecated: ``sharding.embedding_optimizer``.
        embedding_lr: Deprecated: ``sharding.embedding_lr``.
        adagrad_epsilon: Deprecated: ``sharding.adagrad_epsilon``.
        memory_budget_bytes: Deprecated: ``sharding.memory_budget_bytes``.
        compress: Deprecated: ``compression.enabled`` (``false``), ``compression.auto_fallback`` (``"auto"``).
        eps: Deprecated: ``compression.eps``.
        backward_compression: Deprecated: ``compression.backward``.
        backward_eps: Deprecated: ``compression.backward_eps``.
        codec_impl: Deprecated: ``compression.impl``.
        error_every: Deprecated: ``compression.error_every``.
        fallback_check_every: Deprecated: ``compression.fallback_check_every``.
        overlap: Deprecated: ``compression.overlap``.
        compress_peers: Deprecated: ``compression.compress_peers``.
        pieces: Deprecated: ``compression.pieces``.
        find_unused_parameters: Deprecated: ``sharding.find_unused_parameters``.
        static_graph: Deprecated: ``sharding.static_graph``.
        bucket_cap_mb: Deprecated: ``sharding.bucket_cap_mb``.
        verify_checkpoints: Deprecated: ``checkpointing.verify``.
    """
    return {name: value for name, value in locals().items() if value is not _UNSET}


def check_names(owner: str, given: Mapping[str, Any]) -> None:
    """Refuse a keyword that is neither an option nor a deprecated flat option, as Python would, naming the fix."""
    unknown = [name for name in given if name not in FLAT_OPTIONS]
    if unknown:
        raise TypeError(
            f"{owner}.__init__() got an unexpected keyword argument {unknown[0]!r}; its options are in"
            " docs/configuration.md (sharding=ShardingOptions(...), compression=CompressionOptions(...),"
            " checkpointing=CheckpointOptions(...))."
        )


def _field_value(flat: str, value: Any) -> tuple[str, Any]:
    """(field, value) of the config object that flat option ``flat`` set to ``value``."""
    _, field = FLAT_OPTIONS[flat]
    if flat != "compress":
        return field, value
    if value is True or value is False:
        return "enabled", value
    if value == "auto":
        return "auto_fallback", True
    raise ValueError(f"compress={value!r} is not supported; choose true, false or 'auto'.")


def _shown(value: Any) -> str:
    """``value`` as Python source where it is plain data, else ``...``."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return repr(str(value) if isinstance(value, str) else value)
    if isinstance(value, (list, tuple, dict)):
        plain = all(isinstance(v, (str, int, float, bool, type(None), list, tuple, dict))
                    for v in (value.values() if isinstance(value, dict) else value))  # fmt: skip
        return repr(value) if plain else "..."
    return "..."


def regroup(owner: str, given: Mapping[str, Any], configs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Move the deprecated flat options ``given`` into the strategy's config objects ``configs`` (by parameter name).

    A field counts as set in a config object when it differs from that class's default; a flat option for a field
    that is set there too is refused (which one applies would be a guess).

    Returns:
        The config objects with the flat options applied (validated again), and the deprecation message to give
        (``None`` when no flat option was given).

    Raises:
        ValueError: An option given both ways, or a flat value the config object rejects.
    """
    if not given:
        return configs, None
    changes: dict[str, dict[str, tuple[str, Any]]] = {group: {} for group in GROUPS}
    for flat, value in given.items():
        group, _ = FLAT_OPTIONS[flat]
        field, converted = _field_value(flat, value)
        changes[group][field] = (flat, converted)
    out = dict(configs)
    for group, fields_given in changes.items():
        if not fields_given:
            continue
        config = configs[group]
        default = type(config)()
        for field, (flat, _) in fields_given.items():
            if getattr(config, field) != getattr(default, field):
                raise ValueError(
                    f"{owner}({flat}=...) and {group}={type(config).__name__}({field}=...) set the same option; give"
                    f" it once, as {group}={type(config).__name__}({field}=...) ({flat}= is deprecated)."
                )
        try:
            out[group] = replace(config, **{field: value for field, (_, value) in fields_given.items()})
        except (ValueError, TypeError) as err:
            flats = ", ".join(f"{flat}=..." for flat, _ in fields_given.values())
            fields_new = ", ".join(f"{field}=..." for field in fields_given)
            raise type(err)(f"{err} (given as the deprecated {owner}({flats}), now"
                            f" {group}={type(config).__name__}({fields_new}))") from None
    old = ", ".join(f"{flat}={_shown(value)}" for flat, value in given.items())
    new = ", ".join(
        f"{group}={type(configs[group]).__name__}("
        + ", ".join(f"{field}={_shown(value)}" for field, (_, value) in changes[group].items()) + ")"
        for group in GROUPS if changes[group]
    )  # fmt: skip
    yaml = ", ".join(f"init_args.{group}.{field}" for group in GROUPS for field in changes[group])
    return out, f"{owner}({old}) is deprecated; use {owner}({new}) (YAML: {yaml}). {_KEPT}"


def warn(message: str) -> None:
    """A deprecation warning (rank 0) pointing at the caller of the function that calls this one."""
    rank_zero_deprecation(message, stacklevel=_STACKLEVEL)


def moved(old: str, new: str, note: str = "") -> None:
    """Warn that ``old`` (a property read) is deprecated in favour of ``new``; called from the property."""
    rank_zero_deprecation(f"{old} is deprecated; use {new}{note}. {_KEPT}", stacklevel=_STACKLEVEL)
