"""Which peers a rank compresses for: per-peer compression by link class.

On a cluster the all-to-all mixes two kinds of links: peers on the same node (NVLink, shared memory: hundreds of
GB/s) and peers on other nodes (a NIC shared by the node's GPUs). Encoding for a same-node peer costs codec time and
saves bytes on a link that was never the bottleneck, so by default a multi-node job compresses only the payloads that
cross nodes and sends the others as they are (float32, bit-exact), as TorchRec would.

A policy (``CompressionConfig(compress_peers=...)``, through ``DLACStrategy`` a ``CompressionOptions`` field) is one of

- ``"auto"`` (default): ``"other_nodes"`` when the job spans more than one node and its ranks are GPUs on NCCL (a
  node's GPUs share a fabric far faster than its NIC); ``"all"`` otherwise: on a single node (its ranks compress for
  each other only because the user asked for DLAC there: a machine without a fast interconnect, the benchmarks'
  throttled loopback), and on gloo, where a node's ranks talk over loopback TCP whose bytes cost CPU time, which
  compressing them saves ("other nodes only" against "all" on two emulated nodes of CPU ranks,
  benchmarks/e2e_topology.py: docs/benchmarks.md, 'Two nodes: per-peer compression on an emulated network';
  "all" sends fewer bytes);
- ``"all"``: every other rank;
- ``"other_nodes"``: only ranks on another node;
- a function ``(src, dst) -> bool`` of two ranks of the exchange's process group, or the dotted import path of one
  (``"my_package.policies.compress_between_racks"``, for YAML): whether ``src``'s payload for ``dst`` is compressed.

The policy applies in both directions: a gradient goes back compressed exactly where its embeddings came compressed
(the reverse link is the same link). A rank's node is read from the launcher: torchrun's ``GROUP_RANK``, else
Lightning's ``NODE_RANK``, else SLURM's ``SLURM_NODEID``, else the host name; :func:`discover_nodes` gathers them over
the process group, so every rank holds the same :class:`PeerPlan`.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

PeerPolicy = str | Callable[[int, int], bool]
SAME_NODE, OTHER_NODES = "same_node", "other_nodes"  # the link classes between two ranks (PeerPlan.link)
# The named rules, and the link classes whose payloads each compresses. This is the one list of policies: "auto"
# picks one of these per job, and `dlac estimate` models each of them (beside no compression at all).
RULES = {"all": (SAME_NODE, OTHER_NODES), "other_nodes": (OTHER_NODES,)}
POLICIES = ("auto", *RULES)  # the names compress_peers accepts
NODE_VARIABLES = ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")  # read in this order; the host name where none is set


def check_policy(policy: PeerPolicy) -> PeerPolicy:
    """``policy`` itself where it is a policy name or a callable, the function a dotted import path names; a clear
    error otherwise."""
    if callable(policy) or policy in POLICIES:
        return policy
    names = ", ".join(map(repr, POLICIES))
    if isinstance(policy, str) and "." in policy:
        module, _, name = policy.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"compress_peers={policy!r}: cannot import {name!r} from {module!r} ({err}). Give"
                             f" {names} or the import path of a function (src, dst) -> bool.") from None
        if not callable(fn):
            raise ValueError(f"compress_peers={policy!r} names a {type(fn).__name__}, not a function (src, dst) ->"
                             " bool.")
        return fn
    raise ValueError(f"compress_peers={policy!r} is not supported; choose {names}, a function (src, dst) -> bool or"
                     " its import path.")


def node_key(environ: dict[str, str] | None = None) -> str:
    """What identifies this process's node: the first of ``GROUP_RANK`` / ``NODE_RANK`` / ``SLURM_NODEID`` that is
    set, else the host name."""
    env = os.environ if environ is None else environ
    for name in NODE_VARIABLES:
        if env.get(name, "") != "":
            return f"{name}={env[name]}"
    return f"host={socket.gethostname()}"


def number_nodes(keys: Sequence[str]) -> tuple[int, ...]:
    """Node index of each rank: its key's place among the distinct keys, by first appearance."""
    index: dict[str, int] = {}
    return tuple(index.setdefault(k, len(index)) for k in keys)


def link_class(nodes: Sequence[int], a: int, b: int) -> str:
    """The link class between ranks ``a`` and ``b`` on ``nodes`` (the node of each rank): :data:`SAME_NODE` or
    :data:`OTHER_NODES`."""
    return SAME_NODE if nodes[a] == nodes[b] else OTHER_NODES


def backend_of(pg: dist.ProcessGroup) -> str | None:
    """The backend of ``pg`` (``"nccl"``, ``"gloo"``), ``None`` without an initialized default group."""
    import torch.distributed as dist  # not at the top: `dlac estimate` reads this module's policies without torch

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return str(dist.get_backend(pg))
    except (RuntimeError, ValueError):  # a stand-in process group
        return None


def discover_nodes(pg: dist.ProcessGroup, node: int | str | None = None) -> tuple[int, ...]:
    """The node of every rank of ``pg`` (by group rank): each rank's ``node`` where given (a launcher's node rank,
    as Lightning's cluster environment reports it), its :func:`node_key` otherwise; every rank must call it. Without
    an initialized default group (a stand-in process group), one node."""
    import torch.distributed as dist

    world = pg.size()
    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return (0,) * world
    keys: list[str | None] = [None] * world
    dist.all_gather_object(keys, node_key() if node is None else f"node={node}", group=pg)
    return number_nodes([str(k) for k in keys])


@dataclass(frozen=True)
class PeerPlan:
    """Which (source, destination) payloads of an exchange are DLAC-encoded; the rest go as they are.

    Args:
        compressed: ``compressed[src][dst]``, one row per rank; a rank's own block is never sent (its entry is
            ``False`` whatever the policy said).
        nodes: The node of each rank (for the link classes of the counters).
    """

    compressed: tuple[tuple[bool, ...], ...]
    nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        world = len(self.nodes)
        if len(self.compressed) != world or any(len(row) != world for row in self.compressed):
            raise ValueError(f"a peer plan of {world} ranks needs a {world} x {world} matrix.")

    @classmethod
    def everyone(cls, world: int) -> PeerPlan:
        """Every payload compressed, all ranks on one node (``"all"``; the plan of a layout that is not given one)."""
        return cls.from_policy("all", (0,) * world)

    @classmethod
    def from_policy(cls, policy: PeerPolicy, nodes: Sequence[int], backend: str | None = None) -> PeerPlan:
        """The plan ``policy`` (see the module docstring) makes for ranks on ``nodes`` whose process group runs on
        ``backend`` (``"nccl"``, ``"gloo"``; ``"auto"`` compresses within nodes unless it is NCCL)."""
        policy = check_policy(policy)
        nodes = tuple(nodes)
        if policy == "auto":
            policy = "other_nodes" if len(set(nodes)) > 1 and backend == "nccl" else "all"
        if isinstance(policy, str):
            links = RULES[policy]

            def rule(s: int, d: int) -> bool:
                return link_class(nodes, s, d) in links
        else:
            rule = policy
        world = len(nodes)
        matrix = []
        for s in range(world):
            row = []
            for d in range(world):
                value = rule(s, d) if s != d else False
                if not isinstance(value, bool):
                    raise ValueError(f"compress_peers returned {value!r} for ({s}, {d}); it must return True or"
                                     " False.")
                row.append(value)
            matrix.append(tuple(row))
        return cls(tuple(matrix), nodes)

    @property
    def world(self) -> int:
        return len(self.nodes)

    @property
    def any(self) -> bool:
        """Whether any payload of the exchange is compressed (if not, it is TorchRec's uncompressed exchange)."""
        return any(any(row) for row in self.compressed)

    def to(self, rank: int) -> tuple[bool, ...]:
        """Per destination, whether ``rank`` compresses its payload for it."""
        return self.compressed[rank]

    def source(self, rank: int) -> tuple[bool, ...]:
        """Per source, whether its payload for ``rank`` comes compressed."""
        return tuple(row[rank] for row in self.compressed)

    def link(self, a: int, b: int) -> str:
        """The link class between ranks ``a`` and ``b``: ``"same_node"`` or ``"other_nodes"``."""
        return link_class(self.nodes, a, b)

    def describe(self, rank: int) -> str:
        """One line for logs: what ``rank`` compresses for whom."""
        others = [d for d in range(self.world) if d != rank]
        on = [d for d in others if self.compressed[rank][d]]
        nodes = len(set(self.nodes))
        return (f"{nodes} node(s); rank {rank} compresses for {len(on)} of its {len(others)} peers"
                f" ({', '.join(map(str, on)) or 'none'})")


def runs(flags: Sequence[bool]) -> list[tuple[bool, int, int]]:
    """Maximal runs of equal ``flags`` as ``(flag, lo, hi)`` ranges, in order."""
    out: list[tuple[bool, int, int]] = []
    for i, f in enumerate(flags):
        if out and out[-1][0] == f:
            out[-1] = (f, out[-1][1], i + 1)
        else:
            out.append((f, i, i + 1))
    return out
