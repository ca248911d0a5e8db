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
device's. ``--device-rates`` reads every GPU rate from a ``benchmarks/cuda_codec_bench.py`` JSON
(:func:`~lightning_dlac.commands.estimate.rates.device_rates`): DLAC's encode and decode from the forward payload's
rows at one bound and the gradient payload's for the backward, the cast rate from the FP16 row, MX4's from fbgemm's
Triton kernels' rows, so the GPU comparison of the methods is the kernels' measured one, not the CPU's.

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
| | beyond what this model makes of its own policy ``p`` on these links (``rates.wait_from_run``) |

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
:func:`~lightning_dlac.commands.estimate.rates.rates_from_run`), and every other policy that step with only the
modelled exchange replaced. What the remainder also holds, and therefore carries to every policy unchanged: any
error of the wire terms on the run's links, and, since a run times the gradient exchange as one phase, the gradient
codec time that the forward's codec rates (the gradients' default) miss. That part belongs in truth to the
compressed peers' shares only (all of it under ``all``, ``(W - G) / (W - 1)`` of it under ``other_nodes``, none
under ``none``), so the model over-predicts the policies that compress less by the rest. A run measured elsewhere
(another topology, batch or model) has its wait on other terms: give ``--wait-ms`` then (0 leaves it out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from lightning_dlac.comm.peers import OTHER_NODES, RULES, SAME_NODE

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
# The policies modelled: each of compress_peers' named rules (comm/peers.py's RULES; "auto" picks one per job), and
# the baseline they are judged against, no peer compressed (FP32 to every peer: DLACStrategy(compress=False), not a
# compress_peers value).
NO_PEERS = "none"
POLICIES = (NO_PEERS, *RULES)
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
            policy (measured: :func:`~lightning_dlac.commands.estimate.rates.wait_from_run`; 0: the ranks are
            balanced).
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
    links = RULES.get(policy, ())  # the link classes the policy compresses (none for NO_PEERS)
    near_compressed, far_compressed = SAME_NODE in links, OTHER_NODES in links
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
        why = (" ('auto' is not a rule of its own: it picks one of the others per job, which this compares)"
               if policy == "auto" else "")
        raise ValueError(f"compress_peers policy {policy!r} is not modelled{why}; choose one of {list(POLICIES)}.")
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
