"""Does DLAC pay on a given cluster? A model of one training step's time for FP32, TorchRec's INT8/FP16 (and, given
its rates, MX4) qcomm codecs and DLAC, from measured inputs (``dlac estimate``, ``benchmarks/scaling_model.py``).

A step is compute plus the two pooled-embedding all-to-alls (forward embeddings, backward gradients) plus the part
of the dense gradient all-reduce that the backward does not hide, plus (when ``ids_per_sample`` is given) the part
of the input dist (the all-to-all of the ids) that is not hidden: all of it unpipelined, what the step's compute does
not cover under TorchRec's sparse-dist pipeline (``DLACStrategy(pipeline="sparse_dist")``, which sends the next
batch's ids during the current step). Nothing here measures anything: every input is a number the user measured
(or assumes, and says so).

| quantity | formula |
|---|---|
| bytes a rank sends per direction, raw | ``R = (W - 1) / W * B * D * 4`` (``D`` columns, spread evenly) |
| the same, sent | ``R / ratio`` (FP32 1; FP16/BF16 2; INT8 in rows of 32 values ``4 * 32 / 40 = 3.2``; DLAC measured) |
| MX4's ratio | ``128 D / (17 D')`` (``D'``: ``D`` rounded up to a multiple of 32) |
| wire time, ``per_gpu`` link | ``alpha * messages + 8 * sent / bandwidth`` (every GPU its own link, full bisection) |
| wire time, ``shared`` link | ``alpha * messages + 8 * W * sent / bandwidth`` (one link for all: tc on loopback) |
| messages per direction | ``W - 1``; DLAC ``2 (W - 1)`` (sizes, then payload) |
| DLAC codec time | ``R / encode_rate + R / decode_rate`` (a rank's own rows are neither encoded nor sent) |
| cast codec time | ``2 * B * D * 4 / cast_rate`` (TorchRec quantizes and dequantizes the whole buffer) |
| MX4 codec time | ``B * D * 4 / mx4_encode_rate + B * D * 4 / mx4_decode_rate`` (the whole buffer, as the cast) |
| dense all-reduce (ring) | ``alpha * 2 (W - 1) + 8 * 2 (W - 1) / W * P * 4 / bandwidth`` (``* W`` on a shared link) |
| input dist, bytes a rank sends | ``(W - 1) / W * B * (4 F + 8 I)`` (int32 length per feature ``F``, int64 id ``I``) |
| input dist, time | wire time of those bytes in ``3 (W - 1)`` messages (splits, lengths, ids) |
| input dist on the step's path | unpipelined: all of it; ``sparse_dist``: ``max(0, input dist - compute)`` |
| step | ``compute + input dist on the path + forward + backward + (1 - hidden) * all-reduce`` |

MX4 is TorchRec's ``CommType.MX4`` qcomm codec (fbgemm's ``fp32_to_mx4``: groups of 32 values sharing an 8-bit
exponent, 4-bit e2m1 values, rows padded to a multiple of 32 columns: ``D'`` is ``D`` rounded up to 32,
:attr:`Workload.mx4_ratio`), in both directions, with no size exchange (its sizes follow from the shapes). Its rates
have no default: the method is modelled, and ``dlac estimate`` prints its column, only where both are given
(``--mx4-encode-gbps`` / ``--mx4-decode-gbps``, or ``--device-rates``), as every codec rate of the CLI is the user's
device's. ``--device-rates`` reads every GPU rate from a ``benchmarks/cuda_codec_bench.py`` JSON (:func:`device_rates`):
DLAC's encode and decode from the forward payload's rows at one bound and the gradient payload's for the backward, the
cast rate from the FP16 row, MX4's from fbgemm's Triton kernels' rows, so the GPU comparison of the methods is the
kernels' measured one, not the CPU's.

What it leaves out, on purpose: NVLink between GPUs of one node (every byte is costed at the network's rate, which is
pessimistic for 8-GPU nodes; the topology model below separates the two), congestion and incast beyond the bandwidth
term, overlap of the embedding exchanges with compute (DLAC's and TorchRec's exchanges are costed as fully exposed, as
they are in a sparse-dist step too: that pipeline moves only the ids), the cost of hiding the input dist (on a GPU its
own stream; on CPU ranks, gloo's thread competes with the step for the cores, which is why the pipeline buys less
there), and ratio changes with scale (the ratios are per table and per batch: measure them at the batch size you will
run). Without ``ids_per_sample`` the input dist is not modelled: it is part of ``compute_ms``, as a measured step
includes it.

**Nodes and their two link classes** (``dlac estimate --nodes N --ranks-per-node G --intra-gbit ... --inter-gbit
...``, :func:`predict_policy`): which peers to compress (``DLACStrategy(compress_peers=...)``). ``W = N G`` ranks; a
rank sends one share ``S = B * D * 4 / W`` to each of its ``W - 1`` peers, ``G - 1`` of them on its node and
``W - G`` on other nodes. The intra-node bandwidth is per rank (each GPU's own link into the node's fabric, NVLink);
the inter-node bandwidth is per node (all its NICs together), shared by the node's ``G`` ranks.

| quantity | formula |
|---|---|
| wire time, same node | ``alpha * m (G - 1) + 8 * (G - 1) S / r / intra`` |
| wire time, other nodes | ``alpha * m (W - G) + 8 * G * (W - G) S / r / inter`` (the node's ranks share its NICs) |
| ``r`` of a link class | compressed: the direction's DLAC ratio; else 1 (float32) |
| ``m``, messages per peer | 2 where the policy compresses for any peer (sizes to every peer, then payload); else 1 |
| codec time | ``C / encode_rate + C / decode_rate``, ``C`` the raw bytes of the compressed peers' shares |
| a direction | ``codec + max(same node, other nodes)`` (the two link classes carry their bytes at once) |
| step | ``compute + wait + forward + backward`` (exposed, as above) |
| wait, from a run | ``max(0, a2a - forward(p) - backward(p))``: the run's exchange time per step and rank |
| | beyond what this model makes of its own policy ``p`` on these links (:func:`wait_from_run`) |

Policies: ``none`` (FP32 to every peer), ``all`` (DLAC to every peer) and ``other_nodes`` (DLAC to the ranks on
other nodes, FP32 within the node); gradients go back compressed where their embeddings came compressed, as
``compress_peers`` does. With one rank per node ``all`` and ``other_nodes`` are the same policy; with one node
``other_nodes`` is ``none``. The dense all-reduce and the input dist are the same under every policy and left out of
this comparison (a ``compute_ms`` read from a run holds them as they ran).

**The wait on the slowest rank.** The ranks meet at every exchange, so a rank that is ahead waits there for the
slowest one, and a run times that wait as exchange time: ``compute = (train_s - a2a_s) / steps`` is the *mean* rank's
compute, below the slowest rank's, and the step is the slowest rank's compute plus the exchanges. The model's codec
and wire terms cover none of that wait, so a step built from them and the mean compute falls short by it under every
policy. The wait is a property of the ranks' imbalance (data, cores, stragglers), not of which peers are compressed,
so it is measured once and kept as a fixed cost per step: from a run on the same nodes, it is the run's exchange time
per step and rank (``a2a_s``, all four phases, training steps only) less the model's forward and backward for the
policy the run used (``all``, or ``other_nodes`` where it sent forward bytes as they are). That makes the run's own
policy predict the run's own step exactly (compute + a2a; its median step where the summary has one, see
:func:`rates_from_run`), and every other policy that step with only the modelled exchange replaced. What the
remainder also holds, and therefore carries to every policy unchanged: any error of the wire terms on the run's
links, and, since a run times the gradient exchange as one phase, the gradient codec time that the forward's codec
rates (the gradients' default) miss. That part belongs in truth to the compressed peers' shares only (all of it
under ``all``, ``(W - G) / (W - 1)`` of it under ``other_nodes``, none under ``none``), so the model over-predicts
the policies that compress less by the rest. A run measured elsewhere (another topology, batch or model) has its
wait on other terms: give ``--wait-ms`` then (0 leaves it out).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

LINK_KINDS = ("per_gpu", "shared")
PIPELINES = (None, "sparse_dist")
METHODS = ("fp32", "int8_fp16", "dlac_bf16", "dlac_dlac")  # always modelled: their rates are required
MX4_METHOD = "mx4"  # modelled where the codec has MX4 rates (Codec.has_mx4): they have no default
ALL_METHODS = (*METHODS, MX4_METHOD)
METHOD_LABELS = {
    "fp32": "FP32 (TorchRec)",
    "int8_fp16": "TorchRec qcomm INT8 fwd / FP16 bwd",
    "dlac_bf16": "DLAC fwd / BF16 bwd",
    "dlac_dlac": "DLAC both directions",
    "mx4": "TorchRec qcomm MX4 fwd / MX4 bwd",
}
MX4_GROUP_SIZE = 32  # values sharing one 8-bit exponent (TorchRec's MX_GROUP_SIZE_DEFAULT)
INT8_ROW_DIM = 32  # values per scale-and-bias row of TorchRec's INT8 qcomm (fbgemm quantize_comm's ROW_DIM_DEFAULT)
POLICIES = ("none", "all", "other_nodes")
POLICY_LABELS = {
    "none": "none (FP32 to every peer)",
    "all": "all (DLAC to every peer)",
    "other_nodes": "other_nodes (DLAC across nodes, FP32 within)",
}


def _positive(value: float, name: str, allow_zero: bool = False) -> float:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"{name}={value!r} must be a finite number {'>= 0' if allow_zero else '> 0'}.")
    return float(value)


@dataclass(frozen=True)
class Link:
    """The interconnect.

    Args:
        gbit_s: Bandwidth in Gbit/s: per GPU (``per_gpu``) or for all ranks together (``shared``).
        latency_us: Cost of one message in microseconds (the alpha of an alpha-beta model).
        kind: ``per_gpu`` (a cluster: every GPU its own NIC, full bisection) or ``shared`` (one link that every
            rank's bytes cross, as this project's tc-throttled loopback).
    """

    gbit_s: float
    latency_us: float = 10.0
    kind: str = "per_gpu"

    def __post_init__(self) -> None:
        _positive(self.gbit_s, "gbit_s")
        _positive(self.latency_us, "latency_us", allow_zero=True)
        if self.kind not in LINK_KINDS:
            raise ValueError(f"link kind {self.kind!r} is not supported; choose one of {list(LINK_KINDS)}.")

    def wire_s(self, sent_bytes: float, world: int, messages: int) -> float:
        """Seconds to send ``sent_bytes`` from every rank at once, in ``messages`` messages per rank."""
        through = sent_bytes * (world if self.kind == "shared" else 1)
        return messages * self.latency_us * 1e-6 + 8 * through / (self.gbit_s * 1e9)


@dataclass(frozen=True)
class Workload:
    """The model and the batch, per rank.

    Args:
        batch_per_rank: Samples per rank per step.
        embedding_dims: Dimension of every pooled-embedding feature (one entry per table / feature).
        compute_ms: Step time without the embedding all-to-alls and the dense all-reduce (measure a step with
            them removed, or an unthrottled FP32 step minus their modelled time, as ``scaling_model.py`` does).
        dense_params: Dense parameters, all-reduced in float32 every step.
        allreduce_hidden: Share of the dense all-reduce hidden behind the backward (0: fully exposed).
        ids_per_sample: Ids per sample over all features (one-hot: one per feature; multi-hot: the pooling factors'
            sum), sent in the input dist. 0 leaves the input dist out of the model (then ``compute_ms`` holds it).
        wait_ms: Per step, the ranks' wait for the slowest rank at the exchanges, the same under every method and
            policy (measured: :func:`wait_from_run`; 0: the ranks are balanced).
    """

    batch_per_rank: int
    embedding_dims: tuple[int, ...]
    compute_ms: float
    dense_params: int = 0
    allreduce_hidden: float = 0.0
    ids_per_sample: float = 0.0
    wait_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.batch_per_rank < 1:
            raise ValueError(f"batch_per_rank={self.batch_per_rank} must be >= 1.")
        if not self.embedding_dims or min(self.embedding_dims) < 1:
            raise ValueError(f"embedding_dims={self.embedding_dims!r} needs one dimension >= 1 per table.")
        _positive(self.compute_ms, "compute_ms", allow_zero=True)
        if self.dense_params < 0:
            raise ValueError(f"dense_params={self.dense_params} must be >= 0.")
        if not 0 <= self.allreduce_hidden <= 1:
            raise ValueError(f"allreduce_hidden={self.allreduce_hidden} must be between 0 and 1.")
        _positive(self.ids_per_sample, "ids_per_sample", allow_zero=True)
        _positive(self.wait_ms, "wait_ms", allow_zero=True)

    @property
    def total_dim(self) -> int:
        return sum(self.embedding_dims)

    @property
    def int8_ratio(self) -> float:
        """TorchRec's row-wise INT8 qcomm: fbgemm quantizes the flattened buffer in rows of ``INT8_ROW_DIM`` values
        (``QuantizationContext``'s default row_dim, which TorchRec keeps for INT8), one byte per value plus a float32
        scale and bias per row: ``4 * 32 / (32 + 8) = 3.2`` whatever the tables' dims."""
        return 4 * INT8_ROW_DIM / (INT8_ROW_DIM + 8)

    @property
    def mx4_ratio(self) -> float:
        """TorchRec's MX4 (fbgemm's ``fp32_to_mx4``, group size 32): each row padded to a multiple of 32 columns
        ``D'``, then half a byte per value and one shared-exponent byte per group of 32: ``4 D / (D' / 2 + D' / 32) =
        128 D / (17 D')``. TorchRec pads each rank's columns (the dims of the tables it holds); the model spreads the
        columns evenly and pads their total, which is exact where every rank's columns are a multiple of 32 (every
        table's dim is, as 64 or 128)."""
        padded = -(-self.total_dim // MX4_GROUP_SIZE) * MX4_GROUP_SIZE
        return 4 * self.total_dim / (padded // 2 + padded // MX4_GROUP_SIZE)


@dataclass(frozen=True)
class Codec:
    """Measured compression ratios and codec rates (per rank, on the device kind the run uses).

    Args:
        forward_ratio: DLAC forward ratio (raw / sent bytes, size exchange included); see :func:`combine_ratios`.
        backward_ratio: DLAC gradient ratio.
        encode_gb_s: DLAC encode rate, GB/s of float32 input (forward).
        decode_gb_s: DLAC decode rate, GB/s of float32 output (forward).
        backward_encode_gb_s: The same for gradients (they compress less and encode slower); default the forward's.
        backward_decode_gb_s: The same for gradients; default the forward's.
        cast_gb_s: TorchRec's qcomm quantize-or-cast rate, GB/s of float32 (INT8, FP16, BF16).
        mx4_encode_gb_s: TorchRec's MX4 quantize rate, GB/s of float32 input; ``None`` (the default): MX4 is not
            modelled (there is no measured rate to default to: give your device's, e.g. from
            ``benchmarks/cuda_codec_bench.py``'s ``mx4 (fbgemm triton)`` rows).
        mx4_decode_gb_s: TorchRec's MX4 dequantize rate, GB/s of float32 output; ``None`` with the encode rate.
    """

    forward_ratio: float
    backward_ratio: float
    encode_gb_s: float
    decode_gb_s: float
    backward_encode_gb_s: float | None = None
    backward_decode_gb_s: float | None = None
    cast_gb_s: float = 4.0
    mx4_encode_gb_s: float | None = None
    mx4_decode_gb_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("forward_ratio", "backward_ratio", "encode_gb_s", "decode_gb_s", "cast_gb_s"):
            _positive(getattr(self, name), name)
        for name in ("backward_encode_gb_s", "backward_decode_gb_s", "mx4_encode_gb_s", "mx4_decode_gb_s"):
            if getattr(self, name) is not None:
                _positive(getattr(self, name), name)
        if (self.mx4_encode_gb_s is None) != (self.mx4_decode_gb_s is None):
            raise ValueError("MX4 needs both rates: give mx4_encode_gb_s and mx4_decode_gb_s (--mx4-encode-gbps and"
                             " --mx4-decode-gbps), or neither.")

    @property
    def has_mx4(self) -> bool:
        """Whether the MX4 method can be modelled (both its rates given)."""
        return self.mx4_encode_gb_s is not None and self.mx4_decode_gb_s is not None

    def methods(self) -> tuple[str, ...]:
        """The methods these rates model: :data:`METHODS`, and MX4 where its rates are given."""
        return ALL_METHODS if self.has_mx4 else METHODS

    def rates(self, backward: bool) -> tuple[float, float]:
        """(encode, decode) GB/s of one direction."""
        if backward:
            return (self.backward_encode_gb_s or self.encode_gb_s, self.backward_decode_gb_s or self.decode_gb_s)
        return self.encode_gb_s, self.decode_gb_s


def combine_ratios(raw_bytes: Mapping[str, float], ratios: Mapping[str, float]) -> float:
    """One ratio for several tables: their raw bytes over the sum of their sent bytes (``raw / ratio`` each)."""
    missing = sorted(set(raw_bytes) - set(ratios))
    if missing:
        raise ValueError(f"no ratio for table(s) {missing}.")
    sent = sum(raw / _positive(ratios[t], f"ratio of {t!r}") for t, raw in raw_bytes.items())
    return sum(raw_bytes.values()) / sent if sent else 1.0


@dataclass(frozen=True)
class Prediction:
    """One method's predicted step, in milliseconds."""

    method: str
    world: int
    compute_ms: float
    forward_ms: float
    backward_ms: float
    allreduce_ms: float
    parts: dict[str, float] = field(default_factory=dict)  # codec and wire time of each direction, the input dist's
    input_dist_ms: float = 0.0  # the input dist on the step's path (the part a pipeline does not hide)
    wait_ms: float = 0.0  # the ranks' wait for the slowest rank (Workload.wait_ms)

    @property
    def step_ms(self) -> float:
        return (self.compute_ms + self.wait_ms + self.input_dist_ms + self.forward_ms + self.backward_ms
                + self.allreduce_ms)


def _direction_ms(encoding: str, ratio: float, rates: tuple[float, float], cast_gb_s: float, workload: Workload,
                  link: Link, world: int, mx4_rates: tuple[float, float] | None = None) -> tuple[float, float]:
    """(codec ms, wire ms) of one all-to-all direction sent as ``encoding`` (``raw``, ``cast``, ``mx4`` or
    ``dlac``)."""
    raw = (world - 1) / world * workload.batch_per_rank * workload.total_dim * 4
    messages = world - 1
    if encoding == "raw":
        codec_s = 0.0
    elif encoding == "cast":
        codec_s = 2 * workload.batch_per_rank * workload.total_dim * 4 / (cast_gb_s * 1e9)
    elif encoding == "mx4":
        assert mx4_rates is not None  # predict() checks Codec.has_mx4
        buffer = workload.batch_per_rank * workload.total_dim * 4  # the whole buffer, own rows included, as the cast
        codec_s = buffer / (mx4_rates[0] * 1e9) + buffer / (mx4_rates[1] * 1e9)
    else:
        codec_s = raw / (rates[0] * 1e9) + raw / (rates[1] * 1e9)
        messages *= 2  # the size exchange before the payload
    return codec_s * 1e3, link.wire_s(raw / ratio, world, messages) * 1e3


def input_dist_ms(workload: Workload, link: Link, world: int) -> float:
    """The input dist of one step (TorchRec's KJT all-to-all of the ids: splits, int32 lengths, int64 ids), in ms."""
    if not workload.ids_per_sample:
        return 0.0
    sent = (world - 1) / world * workload.batch_per_rank * (4 * len(workload.embedding_dims)
                                                            + 8 * workload.ids_per_sample)
    return link.wire_s(sent, world, 3 * (world - 1)) * 1e3


def predict(method: str, workload: Workload, codec: Codec, link: Link, world: int,
            pipeline: str | None = None) -> Prediction:
    """The step time of ``method`` (one of :data:`ALL_METHODS`; ``mx4`` needs ``codec``'s MX4 rates) on ``world``
    ranks, unpipelined or under ``pipeline`` (``"sparse_dist"``: the input dist hidden behind the step's compute, as
    far as it reaches)."""
    if method not in ALL_METHODS:
        raise ValueError(f"method {method!r} is not modelled; choose one of {list(ALL_METHODS)}.")
    if method == MX4_METHOD and not codec.has_mx4:
        raise ValueError("method 'mx4' needs the MX4 codec rates: Codec(mx4_encode_gb_s=..., mx4_decode_gb_s=...)"
                         " (dlac estimate --mx4-encode-gbps / --mx4-decode-gbps, or --device-rates).")
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline {pipeline!r} is not modelled; choose one of {list(PIPELINES)}.")
    if world < 2:
        raise ValueError(f"world={world} must be >= 2 (one rank exchanges nothing).")
    forward, backward = {
        "fp32": (("raw", 1.0), ("raw", 1.0)),
        "int8_fp16": (("cast", workload.int8_ratio), ("cast", 2.0)),
        "dlac_bf16": (("dlac", codec.forward_ratio), ("cast", 2.0)),
        "dlac_dlac": (("dlac", codec.forward_ratio), ("dlac", codec.backward_ratio)),
        "mx4": (("mx4", workload.mx4_ratio), ("mx4", workload.mx4_ratio)),
    }[method]
    enc, dec = codec.mx4_encode_gb_s, codec.mx4_decode_gb_s
    mx4 = (enc, dec) if enc is not None and dec is not None else None
    fwd = _direction_ms(*forward, codec.rates(False), codec.cast_gb_s, workload, link, world, mx4)
    bwd = _direction_ms(*backward, codec.rates(True), codec.cast_gb_s, workload, link, world, mx4)
    ring = 2 * (world - 1) / world * workload.dense_params * 4
    allreduce = link.wire_s(ring, world, 2 * (world - 1)) * 1e3 if workload.dense_params else 0.0
    ids = input_dist_ms(workload, link, world)
    exposed = max(0.0, ids - workload.compute_ms) if pipeline == "sparse_dist" else ids
    return Prediction(method, world, workload.compute_ms, sum(fwd), sum(bwd),
                      (1 - workload.allreduce_hidden) * allreduce,
                      {"forward_codec_ms": fwd[0], "forward_wire_ms": fwd[1], "backward_codec_ms": bwd[0],
                       "backward_wire_ms": bwd[1], "input_dist_ms": ids}, exposed, workload.wait_ms)


def predict_all(workload: Workload, codec: Codec, link: Link, world: int,
                pipeline: str | None = None) -> dict[str, Prediction]:
    """Every method's prediction, keyed by method (MX4 where ``codec`` has its rates: :meth:`Codec.methods`)."""
    return {m: predict(m, workload, codec, link, world, pipeline) for m in codec.methods()}


@dataclass(frozen=True)
class Topology:
    """Nodes of equal size and the two link classes between their ranks.

    Args:
        nodes: Nodes in the job.
        ranks_per_node: Ranks (GPUs) on each node, the same on every node.
        intra_gbit_s: Bandwidth within a node in Gbit/s, per rank: each GPU's own link into the node's fabric.
        inter_gbit_s: Bandwidth out of a node in Gbit/s, per node: all of its NICs together, shared by its ranks
            (eight GPUs with one 400 Gbit/s NIC each: 3200).
        latency_us: Cost of one message in microseconds, on either link class.
    """

    nodes: int
    ranks_per_node: int
    intra_gbit_s: float
    inter_gbit_s: float
    latency_us: float = 10.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError(f"nodes={self.nodes} and ranks_per_node={self.ranks_per_node} must both be >= 1.")
        if self.world < 2:
            raise ValueError("1 node x 1 rank exchanges nothing: give at least 2 ranks in all.")
        _positive(self.intra_gbit_s, "intra_gbit_s")
        _positive(self.inter_gbit_s, "inter_gbit_s")
        _positive(self.latency_us, "latency_us", allow_zero=True)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def intra(self) -> Link:
        """A rank's own link to the ranks of its node."""
        return Link(self.intra_gbit_s, self.latency_us, "per_gpu")

    @property
    def inter(self) -> Link:
        """The node's link to the other nodes, which its ranks share (:meth:`Link.wire_s` with ``world`` the
        ranks per node)."""
        return Link(self.inter_gbit_s, self.latency_us, "shared")


def _policy_direction_ms(policy: str, ratio: float, rates: tuple[float, float], workload: Workload,
                         topology: Topology) -> tuple[float, float, float]:
    """(codec ms, same-node wire ms, other-node wire ms) of one all-to-all direction under ``policy``."""
    share = workload.batch_per_rank * workload.total_dim * 4 / topology.world  # raw bytes for one peer
    near, far = topology.ranks_per_node - 1, topology.world - topology.ranks_per_node  # peers of each class
    near_compressed, far_compressed = policy == "all", policy in ("all", "other_nodes")
    compressed = share * (near * near_compressed + far * far_compressed)
    codec_s = compressed / (rates[0] * 1e9) + compressed / (rates[1] * 1e9)

    messages = 2 if compressed else 1  # per peer: the size exchange goes to every peer, raw ones included

    def wire_s(link: Link, peers: int, on: bool, sharing: int) -> float:
        if not peers:
            return 0.0
        return link.wire_s(peers * share / (ratio if on else 1.0), sharing, peers * messages)

    intra = wire_s(topology.intra, near, near_compressed, 1)
    inter = wire_s(topology.inter, far, far_compressed, topology.ranks_per_node)
    return codec_s * 1e3, intra * 1e3, inter * 1e3


def predict_policy(policy: str, workload: Workload, codec: Codec, topology: Topology) -> Prediction:
    """The step of ``policy`` (one of :data:`POLICIES`: which peers get DLAC, in both directions) on
    ``topology``: compute, the wait on the slowest rank and the two exchanges; no all-reduce and no input dist (the
    same under every policy).
    ``Prediction.method`` holds the policy; ``parts`` each direction's codec, same-node and other-node wire time."""
    if policy not in POLICIES:
        raise ValueError(f"compress_peers policy {policy!r} is not modelled; choose one of {list(POLICIES)}.")
    parts: dict[str, float] = {}
    totals = []
    for direction, ratio in (("forward", codec.forward_ratio), ("backward", codec.backward_ratio)):
        codec_ms, intra_ms, inter_ms = _policy_direction_ms(policy, ratio, codec.rates(direction == "backward"),
                                                            workload, topology)
        parts.update({f"{direction}_codec_ms": codec_ms, f"{direction}_same_node_ms": intra_ms,
                      f"{direction}_other_nodes_ms": inter_ms})
        totals.append(codec_ms + max(intra_ms, inter_ms))
    return Prediction(policy, topology.world, workload.compute_ms, totals[0], totals[1], 0.0, parts,
                      wait_ms=workload.wait_ms)


def predict_policies(workload: Workload, codec: Codec, topology: Topology) -> dict[str, Prediction]:
    """Every policy's prediction, keyed by policy."""
    return {p: predict_policy(p, workload, codec, topology) for p in POLICIES}


def policy_table(predictions: Mapping[str, Prediction]) -> list[str]:
    """A markdown table of the policies (each direction's codec and the two link classes' wire time, the step and
    its speedup over ``none``), and a line naming the fastest."""
    none = predictions["none"].step_ms
    lines = ["| compress_peers | forward ms (codec + max(same node, other nodes)) | backward ms | step ms (speedup) |",
             "|---|---:|---:|---:|"]
    for policy, p in predictions.items():
        cells = []
        for d, total in (("forward", p.forward_ms), ("backward", p.backward_ms)):
            codec_ms, near, far = (p.parts[f"{d}_{k}_ms"] for k in ("codec", "same_node", "other_nodes"))
            cells.append(f"{total:.2f} ({codec_ms:.2f} + max({near:.2f}, {far:.2f}))")
        lines.append(f"| {POLICY_LABELS[policy]} | {' | '.join(cells)} | {p.step_ms:.2f} ({none / p.step_ms:.2f}x) |")
    best = min(p.step_ms for p in predictions.values())
    ties = [q for q, p in predictions.items() if p.step_ms == best]
    slower = ", ".join(f"{q} {p.step_ms / best:.2f}x" for q, p in predictions.items() if q not in ties)
    lines.append(f"Fastest: {' = '.join(ties)}, a step of {best:.2f} ms"
                 + (f" (the others take longer: {slower})" if slower else ""))
    return lines


# ---------------------------------------------------------------------------------------------------- a run's rates

RUN_FIELDS = ("world_size", "batches", "raw_bytes", "sent_bytes", "encode_ms", "decode_ms")


@dataclass(frozen=True)
class RunRates:
    """What a finished run measured, as the model's inputs (:func:`rates_from_run`).

    Args:
        forward_ratio: Forward raw over sent bytes (size exchange included).
        encode_gb_s: Encode rate per rank, GB/s of float32 input.
        decode_gb_s: Decode rate per rank, GB/s of float32 output.
        compute_ms: A training step per rank without its exchanges; ``None`` where the run did not record it.
        backward_ratio: Gradient raw over sent bytes (size exchange included, bytes sent as they are left out);
            ``None`` where the summary has no gradient bytes (runs before they were recorded).
        exchanges_ms: The run's exchanges per training step and rank, all four phases (``a2a_s``: codec, wire and
            the wait for the slowest rank); ``None`` where the run did not record it.
        policy: The ``compress_peers`` policy the run's bytes show: ``other_nodes`` where it sent forward bytes as
            they are, else ``all`` (what :func:`wait_from_run` models the run as).
        step_ms: The run's median training step (``None`` where the summary has none); where it is known,
            ``compute_ms`` and ``exchanges_ms`` are those of such a step (see :func:`rates_from_run`).
    """

    forward_ratio: float
    encode_gb_s: float
    decode_gb_s: float
    compute_ms: float | None
    backward_ratio: float | None = None
    exchanges_ms: float | None = None
    policy: str = "all"
    step_ms: float | None = None


def rates_from_run(path: str | Path) -> RunRates:
    """The ratio, codec rates and compute of the run whose ``dlac_run.json`` (``DLACCallback(report=True)``) is at
    ``path`` (the file or its directory), from its ``summary``.

    Its counters are sums over ranks and its times per training step and rank, so: ratio ``raw_bytes /
    sent_bytes``; encode rate ``raw_bytes / (encode_ms * batches * world_size)`` (decode alike); compute ``(train_s
    - a2a_s) / (batches * world_size)``, the training batches' wall time less the exchanges timed within them
    (it holds the dense all-reduce and the input dist as they ran). Validation exchanges count in both the bytes
    and the codec times; an exchange sent uncompressed (``compress="auto"``'s fallback) counts its bytes but no codec
    time, so the rates read high when the run fell back. The forward bytes a per-peer plan sent as they are
    (``forward_passed_bytes``: ``compress_peers`` left those peers uncompressed) are taken out of both, so the ratio and
    the rates are the codec's. The gradient ratio is ``(backward_raw_bytes - backward_passed_bytes) /
    (backward_sent_bytes - backward_passed_bytes)``, whatever the run's gradient encoding was (bf16's is 2); the
    gradient codec's rates are not in the summary (the gradient exchange is timed as one phase, ``backward_ms``), so
    the model keeps the forward's for them. Files written before the gradient bytes were recorded load with
    ``backward_ratio=None``.

    A typical step, not the mean one: ``train_s`` and ``a2a_s`` are sums, so a few slow steps (a loaded machine, a
    straggler) pull compute and exchanges above what most steps take, and a prediction made of them above the median
    step a benchmark judges. Where the summary has ``step_ms`` (the median batch wall time over ranks and training
    batches), compute and exchanges are shared out of that median step in the proportion the sums hold them: both
    scaled by ``step_ms / (train_s / (batches * world_size))`` (the summary has no per-step phase times, so the slow
    steps are taken to stretch compute and exchanges alike). Files without ``step_ms`` give the means, as before.

    Raises:
        ValueError: The file is missing or not JSON, or lacks a field the rates need (named, with the fix).
    """
    from lightning_dlac.plugin.report import RUN_FILE

    path = Path(path)
    if path.is_dir():
        path = path / RUN_FILE
    fix = (f"give the {RUN_FILE} that DLACCallback(report=True) wrote into a finished run's log directory, or the"
           " flags it would supply (--forward-ratio, --encode-gbps, --decode-gbps, --compute-ms)")
    try:
        run = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"--from-run {str(path)!r}: cannot read it ({err.strerror or err}); {fix}.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--from-run {str(path)!r} is not JSON ({err}); {fix}.") from None
    summary = run.get("summary") if isinstance(run, dict) else None
    if not isinstance(summary, dict):
        raise ValueError(f"--from-run {str(path)!r} has no 'summary' object; {fix}.")
    return rates_from_summary(summary, f"--from-run {str(path)!r}", fix)


def rates_from_summary(summary: Mapping[str, Any], where: str = "the run summary",
                       fix: str = "give a dlac_run.json summary") -> RunRates:
    """:func:`rates_from_run` of a ``summary`` object already read (``where`` and ``fix`` go into the errors)."""
    values: dict[str, float] = {}
    for name in RUN_FIELDS:
        value = summary.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            what = "missing" if value is None else f"not a number ({value!r})"
            raise ValueError(f"{where}: summary.{name} is {what}; {fix}.")
        values[name] = float(value)
    for name in RUN_FIELDS:
        if values[name] <= 0:
            raise ValueError(f"{where}: summary.{name} is {values[name]:g}, so the run compressed"
                             f" nothing to measure (no training batch, or every exchange sent uncompressed); {fix}.")
    passed = summary.get("forward_passed_bytes", 0)  # runs before per-peer compression have none
    if isinstance(passed, (int, float)) and 0 < passed < values["raw_bytes"]:
        values["raw_bytes"] -= passed
        values["sent_bytes"] -= passed
    rank_steps = values["batches"] * values["world_size"]
    compute_ms = exchanges_ms = step_ms = None
    if all(_number(summary.get(n)) for n in ("train_s", "a2a_s")):
        compute_ms = max(0.0, (summary["train_s"] - summary["a2a_s"]) * 1e3 / rank_steps)
        exchanges_ms = max(0.0, summary["a2a_s"] * 1e3 / rank_steps)
        step_ms = summary.get("step_ms")
        if _number(step_ms) and step_ms > 0 and summary["train_s"] > 0:
            typical = step_ms * 1e-3 * rank_steps / summary["train_s"]  # the median step over the mean one
            compute_ms, exchanges_ms = compute_ms * typical, exchanges_ms * typical
        else:
            step_ms = None
    backward_ratio = None
    if all(_number(summary.get(n)) for n in ("backward_raw_bytes", "backward_sent_bytes")):
        gone = summary.get("backward_passed_bytes", 0) if _number(summary.get("backward_passed_bytes", 0)) else 0
        raw, sent = summary["backward_raw_bytes"] - gone, summary["backward_sent_bytes"] - gone
        backward_ratio = raw / sent if raw > 0 and sent > 0 else None
    return RunRates(
        forward_ratio=values["raw_bytes"] / values["sent_bytes"],
        encode_gb_s=values["raw_bytes"] / (values["encode_ms"] * 1e-3 * rank_steps) / 1e9,
        decode_gb_s=values["raw_bytes"] / (values["decode_ms"] * 1e-3 * rank_steps) / 1e9,
        compute_ms=compute_ms,
        backward_ratio=backward_ratio,
        exchanges_ms=exchanges_ms,
        policy="other_nodes" if isinstance(passed, (int, float)) and passed > 0 else "all",
        step_ms=step_ms,
    )


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def wait_from_run(rates: RunRates, workload: Workload, codec: Codec, topology: Topology) -> float | None:
    """The run's wait for the slowest rank per step, in ms: its exchange time per step and rank less the forward and
    backward :func:`predict_policy` gives its own policy (``rates.policy``) on ``topology`` for ``workload`` and
    ``codec`` (its wait left out), at least 0; ``None`` where the run recorded no exchange time. Meaningful where
    the run ran on ``topology`` with ``workload``'s batch and dims (see the module docstring)."""
    if rates.exchanges_ms is None:
        return None
    own = predict_policy(rates.policy, workload, codec, topology)
    return max(0.0, rates.exchanges_ms - own.forward_ms - own.backward_ms)


def table(predictions: Mapping[int, Mapping[str, Prediction]]) -> list[str]:
    """A markdown table: per world size, each method's step time and speedup over FP32 (the methods predicted)."""
    methods = [m for m in ALL_METHODS if all(m in preds for preds in predictions.values())]
    lines = ["| ranks | " + " | ".join(f"{METHOD_LABELS[m]} ms (speedup)" for m in methods) + " |",
             "|---:|" + "---:|" * len(methods)]
    for world, preds in predictions.items():
        fp32 = preds["fp32"].step_ms
        cells = [f"{preds[m].step_ms:.1f} ({fp32 / preds[m].step_ms:.2f}x)" for m in methods]
        lines.append(f"| {world} | " + " | ".join(cells) + " |")
    return lines


def pipeline_gains(pipelined: Mapping[int, Mapping[str, Prediction]],
                   unpipelined: Mapping[int, Mapping[str, Prediction]]) -> list[str]:
    """One line per world size: the input dist a step sends and what the pipeline leaves of it, and each method's
    unpipelined step over its pipelined one (above 1: the pipeline pays)."""
    lines = []
    for world, preds in pipelined.items():
        any_pred = next(iter(preds.values()))
        gains = ", ".join(f"{METHOD_LABELS[m]} {unpipelined[world][m].step_ms / preds[m].step_ms:.2f}x"
                          for m in ALL_METHODS if m in preds)
        lines.append(f"- {world} ranks: input dist {any_pred.parts['input_dist_ms']:.2f} ms per step, on the path"
                     f" {any_pred.input_dist_ms:.2f} ms with the pipeline; pipelined over unpipelined step: {gains}")
    return lines


# ------------------------------------------------------------------------------------------------- a GPU's rates

MX4_ROW = "mx4 (fbgemm triton)"  # benchmarks/cuda_codec_bench.py's codec names
FP16_ROW = "fp16"
GRADIENT_PAYLOAD = "gradient"


@dataclass(frozen=True)
class DeviceRates:
    """The codec rates a ``benchmarks/cuda_codec_bench.py`` run measured on one GPU, as the model's inputs
    (:func:`device_rates`); GB/s of float32.

    Args:
        device: The GPU the file names.
        encode_gb_s: DLAC encode, the forward payload's row at the bound, as the exchange calls it.
        decode_gb_s: DLAC decode, the same row.
        cast_gb_s: The FP16 row's encode and decode as one rate (``2 / (1 / encode + 1 / decode)``: the model costs
            a cast as ``2 * bytes / cast_rate``).
        backward_encode_gb_s: DLAC encode of the ``gradient`` payload's row at the bound; ``None`` where the file
            has none.
        backward_decode_gb_s: The same row's decode.
        mx4_encode_gb_s: fbgemm's Triton MX4 quantize, the forward payload's ``mx4 (fbgemm triton)`` row; ``None``
            where the file has none.
        mx4_decode_gb_s: The same row's dequantize.
        mx4_missing: Why there is no MX4 row ("" where there is one): the file's ``not_measured`` reason, or that it
            has none.
    """

    device: str
    encode_gb_s: float
    decode_gb_s: float
    cast_gb_s: float
    backward_encode_gb_s: float | None = None
    backward_decode_gb_s: float | None = None
    mx4_encode_gb_s: float | None = None
    mx4_decode_gb_s: float | None = None
    mx4_missing: str = ""


def device_rates(path: str | Path, payload: str = "criteo", eps: float = 0.01) -> DeviceRates:
    """The GPU codec rates of the ``benchmarks/cuda_codec_bench.py`` JSON at ``path``: DLAC's from the
    ``dlac eps=<eps>`` row of ``payload`` (the backward's from the ``gradient`` payload's row at the same bound, where
    the file has one), the cast rate from ``payload``'s ``fp16`` row, MX4's from its ``mx4 (fbgemm triton)`` row
    (``None``, and the reason, where the file has none: MX4 is optional in the model).

    Raises:
        ValueError: The file is missing, not JSON, an emulated rehearsal, or lacks the DLAC or FP16 row (named,
            with the file and the fix).
    """
    path = Path(path)
    where = f"--device-rates {str(path)!r}"
    fix = ("give the JSON that benchmarks/cuda_codec_bench.py wrote on a GPU (benchmarks/results/cuda_codec_bench.json,"
           " or a GPU session's 4_bench.json), or the rates as flags (--encode-gbps, --decode-gbps, --cast-gbps,"
           " --mx4-encode-gbps, --mx4-decode-gbps)")
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{where}: cannot read it ({err.strerror or err}); {fix}.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{where} is not JSON ({err}); {fix}.") from None
    rows = data.get("results") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{where} has no 'results' list of rows; {fix}.")
    config = data.get("config") if isinstance(data.get("config"), dict) else {}
    if config.get("emulated"):
        raise ValueError(f"{where} is a rehearsal on the host (cuda_codec_bench.py --emulate), not a GPU's rates;"
                         f" {fix}.")

    def rates(payload_name: str, codec: str) -> tuple[float, float] | None:
        for row in rows:
            if isinstance(row, dict) and row.get("payload") == payload_name and row.get("codec") == codec:
                enc, dec = row.get("encode_gbps"), row.get("decode_gbps")
                if _number(enc) and _number(dec) and enc > 0 and dec > 0:
                    return float(enc), float(dec)
        return None

    def required(payload_name: str, codec: str) -> tuple[float, float]:
        found = rates(payload_name, codec)
        if found is None:
            payloads = sorted({str(r.get("payload")) for r in rows if isinstance(r, dict)})
            raise ValueError(f"{where} has no row payload {payload_name!r}, codec {codec!r} with encode and decode"
                             f" GB/s (its payloads: {', '.join(payloads) or 'none'}); choose --device-payload and"
                             f" --device-eps among its rows, or {fix}.")
        return found

    dlac = f"dlac eps={eps:g}"
    forward = required(payload, dlac)
    cast = required(payload, FP16_ROW)
    backward = rates(GRADIENT_PAYLOAD, dlac)
    mx4 = rates(payload, MX4_ROW)
    missing = ""
    if mx4 is None:
        reasons = [str(e.get("reason")) for e in data.get("not_measured") or []
                   if isinstance(e, dict) and e.get("payload") == payload and e.get("codec") == MX4_ROW]
        missing = (f"{where} has no row payload {payload!r}, codec {MX4_ROW!r}"
                   + (f" (not measured: {reasons[0]})" if reasons else " (a run from before the MX4 rows)"))
    return DeviceRates(
        device=str(config.get("device", "?")), encode_gb_s=forward[0], decode_gb_s=forward[1],
        cast_gb_s=2 / (1 / cast[0] + 1 / cast[1]),
        backward_encode_gb_s=backward[0] if backward else None, backward_decode_gb_s=backward[1] if backward else None,
        mx4_encode_gb_s=mx4[0] if mx4 else None, mx4_decode_gb_s=mx4[1] if mx4 else None, mx4_missing=missing)


# ---------------------------------------------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of whole numbers (e.g. 8,64,512).") from None
    if not values:
        raise ValueError("an empty list: give at least one number.")
    return values


def _dims(text: str) -> tuple[int, ...]:
    """``26x64`` (26 tables of dim 64), ``64,128,32`` or a mix: ``26x64,2x128``."""
    dims: list[int] = []
    for part in text.split(","):
        count, _, dim = part.strip().rpartition("x")
        try:
            dims.extend([int(dim)] * (int(count) if count else 1))
        except ValueError:
            raise ValueError(f"embedding dims {text!r}: write COUNTxDIM or DIM, comma-separated (e.g. 26x64).") \
                from None
    return tuple(dims)


def main(argv: list[str] | None = None) -> None:
    """``dlac estimate``: predicted step time and speedup of FP32, INT8/FP16 and DLAC on your cluster; with
    ``--nodes``, of each ``compress_peers`` policy on nodes of fast intra-node and slower inter-node links."""
    parser = argparse.ArgumentParser(
        prog="dlac estimate", description=main.__doc__,
        epilog="Every default is this project's measured DLRM (26 tables x dim 64, batch 4096 per rank, ratios from"
               " benchmarks/e2e_bandwidth.py) except the ones only your cluster can supply: --compute-ms and the"
               " codec rates of your device (or --from-run, a finished run's measurements; --device-rates, a GPU's"
               " kernel rates). TorchRec's MX4 is modelled where its rates are given (--mx4-encode-gbps and"
               " --mx4-decode-gbps, or --device-rates). See docs/benchmarks.md, 'Scaling model', and"
               " docs/multinode.md, 'Which peers to compress'.")
    parser.add_argument("--world-sizes", default=None,
                        help="ranks (GPUs), comma-separated (default 8,16,32,64,128,256,512; not with --nodes)")
    parser.add_argument("--gbit", type=float, default=None,
                        help="link bandwidth, Gbit/s (per GPU unless --shared; default 100; not with --nodes)")
    parser.add_argument("--latency-us", type=float, default=5.0,
                        help="cost of one message to one peer, microseconds (an all-to-all sends W - 1)")
    parser.add_argument("--shared", action="store_true", help="one link for all ranks (an emulated loopback)")
    topology = parser.add_argument_group(
        "nodes", "all four together: the compress_peers policies (none, all, other_nodes) on N nodes x G ranks")
    topology.add_argument("--nodes", type=int, default=None, help="nodes in the job")
    topology.add_argument("--ranks-per-node", type=int, default=None, help="ranks (GPUs) per node")
    topology.add_argument("--intra-gbit", type=float, default=None,
                          help="bandwidth within a node, Gbit/s per rank (each GPU's NVLink)")
    topology.add_argument("--inter-gbit", type=float, default=None,
                          help="bandwidth out of a node, Gbit/s per node (all its NICs, shared by its ranks)")
    parser.add_argument("--batch", type=int, default=4096, help="samples per rank per step")
    parser.add_argument("--dims", default="26x64", help="pooled-embedding dims: COUNTxDIM or DIM, comma-separated")
    parser.add_argument("--from-run", default=None, metavar="DLAC_RUN_JSON",
                        help="a finished run's dlac_run.json (or its directory): the forward and gradient ratios,"
                             " codec rates, compute per step and (with --nodes) wait on the slowest rank it measured"
                             " (that compute holds the dense all-reduce as it ran: add --dense-params 0 not to count"
                             " it twice); flags given as well override it")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="step time without the embedding all-to-alls and the dense all-reduce (measured)")
    parser.add_argument("--dense-params", type=int, default=159_553, help="dense parameters (float32 all-reduce)")
    parser.add_argument("--allreduce-hidden", type=float, default=0.0, help="share of the all-reduce hidden, 0-1")
    parser.add_argument("--ids-per-sample", type=float, default=0.0,
                        help="ids per sample over all features, sent in the input dist (one-hot DLRM: 26); 0 leaves"
                             " the input dist in --compute-ms")
    parser.add_argument("--pipeline", choices=["none", "sparse_dist"], default="none",
                        help="sparse_dist: DLACStrategy(pipeline='sparse_dist'), the input dist hidden behind compute")
    parser.add_argument("--forward-ratio", type=float, default=None, help="DLAC forward ratio (measured; default 29)")
    parser.add_argument("--backward-ratio", type=float, default=None,
                        help="DLAC gradient ratio (measured; default the run's with --from-run, else 9)")
    parser.add_argument("--wait-ms", type=float, default=None,
                        help="per step, the ranks' wait for the slowest rank at the exchanges (default: with --nodes"
                             " and --from-run, the run's exchange time beyond the model's for its own policy on these"
                             " nodes; else 0)")
    parser.add_argument("--encode-gbps", type=float, default=None, help="DLAC encode GB/s per rank (your device)")
    parser.add_argument("--decode-gbps", type=float, default=None, help="DLAC decode GB/s per rank (your device)")
    parser.add_argument("--backward-encode-gbps", type=float, default=None, help="gradients; default --encode-gbps")
    parser.add_argument("--backward-decode-gbps", type=float, default=None, help="gradients; default --decode-gbps")
    parser.add_argument("--cast-gbps", type=float, default=None,
                        help="TorchRec qcomm INT8/FP16 quantize GB/s per rank (your device; not with --nodes)")
    parser.add_argument("--mx4-encode-gbps", type=float, default=None,
                        help="TorchRec qcomm MX4 quantize GB/s per rank (your device): with --mx4-decode-gbps, adds"
                             " the MX4 method (not with --nodes)")
    parser.add_argument("--mx4-decode-gbps", type=float, default=None,
                        help="TorchRec qcomm MX4 dequantize GB/s per rank (your device)")
    gpu = parser.add_argument_group(
        "GPU rates", "every codec rate from one benchmarks/cuda_codec_bench.py run on a GPU (flags given override it)")
    gpu.add_argument("--device-rates", default=None, metavar="CUDA_CODEC_BENCH_JSON",
                        help="DLAC encode/decode (the payload's row at --device-eps; gradients from the gradient"
                             " payload's), the cast rate (fp16 row) and MX4's (mx4 (fbgemm triton) row; required"
                             " unless --mx4-encode-gbps and --mx4-decode-gbps are given)")
    gpu.add_argument("--device-payload", default="criteo", help="the forward payload's rows (default criteo)")
    gpu.add_argument("--device-eps", type=float, default=0.01, help="the DLAC rows' bound (default 0.01)")
    args = parser.parse_args(argv)
    from lightning.pytorch.utilities.rank_zero import rank_zero_info  # after parsing: `--help` stays instant

    gbit = 100.0 if args.gbit is None else args.gbit  # None until here: --nodes refuses it given
    try:
        topo = _topology(args)
        from_device = _fill_from_device(args)
        read, rates = _fill_from_run(args)
        workload = Workload(args.batch, _dims(args.dims), args.compute_ms, args.dense_params, args.allreduce_hidden,
                            args.ids_per_sample, args.wait_ms or 0.0)
        codec = Codec(args.forward_ratio, args.backward_ratio, args.encode_gbps, args.decode_gbps,
                      args.backward_encode_gbps, args.backward_decode_gbps,
                      1.0 if args.cast_gbps is None else args.cast_gbps,  # None: --nodes, which has no cast
                      args.mx4_encode_gbps, args.mx4_decode_gbps)
        if topo is not None and rates is not None and args.wait_ms is None:
            wait = wait_from_run(rates, workload, codec, topo)
            if wait is not None:
                workload = replace(workload, wait_ms=wait)
                read += (f"; wait on the slowest rank {wait:.2f} ms per step (the run's exchanges beyond this"
                         f" model's for its policy {rates.policy} on these nodes)")
        if topo is not None:
            policies = predict_policies(workload, codec, topo)
        else:
            worlds = _ints("8,16,32,64,128,256,512" if args.world_sizes is None else args.world_sizes)
            link = Link(gbit, args.latency_us, "shared" if args.shared else "per_gpu")
            pipeline = None if args.pipeline == "none" else args.pipeline
            preds = {w: predict_all(workload, codec, link, w, pipeline) for w in worlds}
    except ValueError as err:
        parser.error(str(err))
    if from_device:
        rank_zero_info(f"dlac estimate: from {args.device_rates}: {from_device}")
    if read:
        rank_zero_info(f"dlac estimate: from {args.from_run}: {read}")
    if topo is not None:
        rank_zero_info(f"dlac estimate: {topo.nodes} nodes x {topo.ranks_per_node} ranks; within a node"
                       f" {topo.intra_gbit_s:g} Gbit/s per rank, across nodes {topo.inter_gbit_s:g} Gbit/s per node"
                       f" (shared by its {topo.ranks_per_node} ranks); {topo.latency_us:g} us per message; batch"
                       f" {args.batch} x {workload.total_dim} columns per rank; step = compute"
                       + (f" + wait on the slowest rank ({workload.wait_ms:.2f} ms)" if workload.wait_ms else "")
                       + " + both exchanges")
        for line in policy_table(policies):
            rank_zero_info(line)
        return
    ids = (f"; input dist of {args.ids_per_sample:g} ids per sample"
           f" {'hidden behind compute where it fits (sparse_dist)' if pipeline else 'on the path (unpipelined)'}"
           if args.ids_per_sample else "")
    rank_zero_info(f"dlac estimate: {gbit:g} Gbit/s {'shared' if args.shared else 'per GPU'},"
                   f" {args.latency_us:g} us per message; batch {args.batch} x {workload.total_dim} columns per"
                   f" rank{ids}")
    for line in table(preds):
        rank_zero_info(line)
    if pipeline is not None and args.ids_per_sample:
        unpipelined = {w: predict_all(workload, codec, link, w) for w in worlds}
        for line in pipeline_gains(preds, unpipelined):
            rank_zero_info(line)


def _topology(args: argparse.Namespace) -> Topology | None:
    """The nodes the four topology flags describe, or ``None`` when none is given (the single-link model)."""
    flags = {"--nodes": args.nodes, "--ranks-per-node": args.ranks_per_node, "--intra-gbit": args.intra_gbit,
             "--inter-gbit": args.inter_gbit}
    given = [f for f, v in flags.items() if v is not None]
    if not given:
        return None
    missing = [f for f in flags if f not in given]
    if missing:
        raise ValueError(f"{', '.join(given)} without {', '.join(missing)}: the topology model needs all four"
                         " (e.g. --nodes 2 --ranks-per-node 8 --intra-gbit 3600 --inter-gbit 3200).")
    single = {"--world-sizes": args.world_sizes, "--gbit": args.gbit, "--shared": args.shared or None,
              "--cast-gbps": args.cast_gbps, "--mx4-encode-gbps": args.mx4_encode_gbps,
              "--mx4-decode-gbps": args.mx4_decode_gbps, "--ids-per-sample": args.ids_per_sample or None,
              "--pipeline": None if args.pipeline == "none" else args.pipeline}
    clash = [f for f, v in single.items() if v is not None]
    if clash:
        raise ValueError(f"{', '.join(clash)} belong(s) to the single-link model; with --nodes the ranks are nodes x"
                         " --ranks-per-node, the links --intra-gbit and --inter-gbit, and the dense all-reduce and"
                         " the input dist (the same under every policy) are left out: drop them.")
    return Topology(args.nodes, args.ranks_per_node, args.intra_gbit, args.inter_gbit, args.latency_us)


def _fill_from_device(args: argparse.Namespace) -> str:
    """Fill the codec rates the user did not give from ``--device-rates`` (the cast and MX4 rates only for the
    single-link model: ``--nodes`` has neither); what was read, as a line for the log ("" without it). An MX4 row
    the file lacks is an error unless both MX4 flags are given: the comparison is stated or refused, never dropped."""
    if args.device_rates is None:
        return ""
    rates = device_rates(args.device_rates, args.device_payload, args.device_eps)
    fills = [("encode_gbps", rates.encode_gb_s, "DLAC encode"), ("decode_gbps", rates.decode_gb_s, "DLAC decode"),
             ("backward_encode_gbps", rates.backward_encode_gb_s, "gradient encode"),
             ("backward_decode_gbps", rates.backward_decode_gb_s, "gradient decode")]
    if args.nodes is None:
        if rates.mx4_encode_gb_s is None and (args.mx4_encode_gbps is None or args.mx4_decode_gbps is None):
            raise ValueError(f"{rates.mx4_missing}: run benchmarks/cuda_codec_bench.py with fbgemm's Triton kernels"
                             " (DLAC_FBGEMM_TRITON) on the GPU, or give --mx4-encode-gbps and --mx4-decode-gbps.")
        fills += [("cast_gbps", rates.cast_gb_s, "cast (fp16)"),
                  ("mx4_encode_gbps", rates.mx4_encode_gb_s, "MX4 encode"),
                  ("mx4_decode_gbps", rates.mx4_decode_gb_s, "MX4 decode")]
    taken = []
    for dest, value, label in fills:
        if getattr(args, dest) is None and value is not None:
            setattr(args, dest, value)
            taken.append(f"{label} {value:.3g}")
    where = f"{rates.device}, payload {args.device_payload}, dlac eps={args.device_eps:g}"
    return f"{where}: GB/s " + (", ".join(taken) if taken else "none taken (every rate given as a flag)")


def _fill_from_run(args: argparse.Namespace) -> tuple[str, RunRates | None]:
    """Fill the rates the user did not give from ``--from-run``, then the defaults; check the required ones are
    there. Returns what was read from the run, as a line for the log ("" without ``--from-run``), and the run's
    rates (``None`` without it)."""
    taken = []
    rates = None
    if args.from_run is not None:
        rates = rates_from_run(args.from_run)
        for dest, value, label in (("forward_ratio", rates.forward_ratio, "forward ratio {:.2f}"),
                                   ("encode_gbps", rates.encode_gb_s, "encode {:.3g} GB/s"),
                                   ("decode_gbps", rates.decode_gb_s, "decode {:.3g} GB/s"),
                                   ("compute_ms", rates.compute_ms, "compute {:.2f} ms per step"),
                                   ("backward_ratio", rates.backward_ratio, "gradient ratio {:.2f}")):
            if getattr(args, dest) is None and value is not None:
                setattr(args, dest, value)
                taken.append(label.format(value))
    if args.forward_ratio is None:
        args.forward_ratio = 29.0
    gradient_ratio_read = args.backward_ratio is not None and any(t.startswith("gradient") for t in taken)
    if args.backward_ratio is None:
        args.backward_ratio = 9.0
    needed = ["--compute-ms", "--encode-gbps", "--decode-gbps"]
    if args.nodes is None:
        needed.append("--cast-gbps")
    missing = [f for f in needed if getattr(args, f[2:].replace("-", "_")) is None]
    if missing:
        why = (f" ({args.from_run} recorded no train_s / a2a_s)" if args.from_run and "--compute-ms" in missing
               else "")
        raise ValueError(f"{', '.join(missing)} required: give them{why}, or --from-run with a finished run's"
                         " dlac_run.json for the codec rates and the compute.")
    tail = ("; gradient codec rates from the flags, else the forward's (a run times the gradient exchange as one"
            " phase)" if gradient_ratio_read else "; gradient ratio and rates from the flags")
    return ", ".join(taken) + (tail if taken else ""), rates
