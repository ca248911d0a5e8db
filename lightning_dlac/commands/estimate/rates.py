"""What the step-time model reads from files: a finished run's measurements (``dlac_run.json``, ``--from-run``) and a
GPU's codec rates (a ``benchmarks/cuda_codec_bench.py`` JSON, ``--device-rates``), as the model's inputs.

Both files go through one reader (:func:`read_json`), so a file that is missing, unreadable or not JSON fails the same
way whichever option named it: with the option, the file, the reason and what to give instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dlac.commands.estimate.model import Codec, Topology, Workload, predict_policy

_KINDS = {dict: "object", list: "list"}


def read_json(path: str | Path, where: str, fix: str, members: Mapping[str, type]) -> dict[str, Any]:
    """Read the JSON object in the file at ``path`` and check that it has the members a reader needs.

    Args:
        path: The file.
        where: How the errors name the file (the option that gave it, and the path).
        fix: What to give instead, for the errors.
        members: The members the object must have, each with its JSON type (``dict``: an object, ``list``).

    Returns:
        The object.

    Raises:
        ValueError: The file cannot be read (missing, a directory, not permitted), is not JSON, or is not an object
            with every one of ``members``; the message names ``where``, the reason and ``fix``.
    """
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"{where}: cannot read it ({err.strerror or err}); {fix}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where} is not JSON ({err}); {fix}.") from None
    for name, kind in members.items():
        if not isinstance(data, dict) or not isinstance(data.get(name), kind):
            raise ValueError(f"{where} has no {name!r} {_KINDS.get(kind, kind.__name__)}; {fix}.")
    return data


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
    where = f"--from-run {str(path)!r}"
    return rates_from_summary(read_json(path, where, fix, {"summary": dict})["summary"], where, fix)


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
    data = read_json(path, where, fix, {"results": list})
    rows = data["results"]
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
