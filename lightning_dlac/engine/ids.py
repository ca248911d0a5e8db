"""Ids outside their tables fail loudly, naming the feature, its largest id and the table's size.

TorchRec checks a sharded module's first batch only, and only warns ("Feature item has range (4, 1627) which is out
of range (0, 1583)") among hundreds of lines; every later batch's ids go to the lookup kernels as they are, which on
CPU read whatever lies past the table and on GPU may fault far from the cause. :func:`install_id_checks` wraps the
``input_dist`` of every sharded embedding module of a ``DistributedModelParallel`` (the entry both the plain forward
and TorchRec's train pipeline go through), so every rank checks the ids it is about to send:

- on CPU, every batch: one comparison of every id with its table's size, small beside a step;
- on an accelerator, where reading the verdict waits for the device, the first ``first`` batches of a module and
  then every ``every``-th.

TorchRec only; no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["DEVICE_CHECK_EVERY", "DEVICE_CHECK_FIRST", "IdRangeError", "check_ids", "checked_batches",
           "install_id_checks"]

# On an accelerator: the batches checked first, then every how many.
DEVICE_CHECK_FIRST = 16
DEVICE_CHECK_EVERY = 64


class IdRangeError(ValueError):
    """An id outside its embedding table."""


def check_ids(features: Any, rows: Mapping[str, int], where: str = "a batch") -> None:
    """Raise :class:`IdRangeError` if an id of ``features`` (a KeyedJaggedTensor) lies outside its feature's table.

    Args:
        features: The ids, keyed by feature.
        rows: Rows of the table of each feature (features not in it are not checked).
        where: What the ids are, for the message.
    """
    keys = list(features.keys())
    known = [k for k in keys if k in rows]
    if not known:
        return
    values = features.values()
    lengths = torch.tensor(features.length_per_key(), device=values.device)
    limits = torch.tensor([rows.get(k, torch.iinfo(torch.int64).max) for k in keys], device=values.device)
    bound = limits.repeat_interleave(lengths, output_size=values.numel())
    if not bool(((values < 0) | (values >= bound)).any()):
        return
    for key, ids in zip(keys, torch.split(values, features.length_per_key())):
        if key in rows and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows[key]):
            low, high, size = int(ids.min()), int(ids.max()), rows[key]
            raise IdRangeError(
                f"{where}: feature {key!r} has ids from {low} to {high}, outside its table of {size} rows (ids must"
                f" lie in [0, {size})). The lookup would read past the table. Give the table at least {high + 1}"
                f" rows (num_embeddings of its config), or map the feature's ids into it (e.g. modulo {size})."
            )


def _feature_rows(module: nn.Module) -> dict[str, int]:
    """Feature -> rows of its table, from a sharded module's table configs."""
    configs = getattr(module, "_embedding_bag_configs", None) or getattr(module, "_embedding_configs", None) or []
    return {feature: int(c.num_embeddings) for c in configs for feature in c.feature_names}


def install_id_checks(model: nn.Module, device: torch.device, first: int = DEVICE_CHECK_FIRST,
                      every: int = DEVICE_CHECK_EVERY) -> list[str]:
    """Check the ids every sharded embedding module of ``model`` is given (module docstring); return the names of
    the modules checked.

    Args:
        model: A ``DistributedModelParallel`` (or any module holding TorchRec's sharded embedding modules).
        device: The rank's device: every batch is checked on CPU, a sample on an accelerator.
        first: On an accelerator, the batches of each module checked first.
        every: On an accelerator, then every how many.
    """
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    checked = []
    for name, module in model.named_modules():
        if not isinstance(module, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)):
            continue
        rows = _feature_rows(module)
        if rows and not getattr(module, "_dlac_ids_checked", False):
            module.input_dist = _checked(module.input_dist, rows, name or type(module).__name__,
                                         checked_batches(device, first, every))
            module._dlac_ids_checked = True
            checked.append(name)
    return checked


def checked_batches(device: torch.device, first: int = DEVICE_CHECK_FIRST,
                    every: int = DEVICE_CHECK_EVERY) -> Callable[[int], bool]:
    """Whether a module's ``n``-th batch (from 0) is checked on ``device``: every one on CPU; on an accelerator the
    first ``first``, then every ``every``-th."""
    if device.type == "cpu":
        return lambda n: True
    return lambda n: n < first or n % every == 0


def _checked(input_dist: Callable[..., Any], rows: Mapping[str, int], name: str,
             due: Callable[[int], bool]) -> Callable[..., Any]:
    calls = 0

    def input_dist_checked(ctx: Any, features: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if due(calls):
            check_ids(features, rows, where=f"the batch given to {name}")
        calls += 1
        return input_dist(ctx, features, *args, **kwargs)

    return input_dist_checked
