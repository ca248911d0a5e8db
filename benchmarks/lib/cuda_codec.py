"""The GPU codec benchmark's batches and table (``python -m benchmarks.cuda_codec_bench``, on a lent GPU): its four
payloads cut as the forward all-to-all sends them (26 tables x dim 64, 8 destinations), the error measure, and the
table its rows are printed, written and rendered in. Imports torch and numpy only: the lent GPU machine has neither
TorchRec nor Lightning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from benchmarks.lib import gpu_payloads
from benchmarks.lib.payloads import zipf_payload
from benchmarks.lib.results import write_results

TABLES, DIM, DESTS = 26, 64, 8
PAYLOADS = ("zipf", "criteo", "multihot", "gradient")
COLUMNS = ["payload", "codec", "ratio", "encode GB/s", "decode GB/s", "enc x memcpy", "dec x memcpy", "err/range",
           "op enc", "op dec", "parity", "syncs e/d"]
WIDTHS = [9, 30, 7, 12, 12, 13, 13, 10, 8, 8, 22, 9]


def payload(name: str, batch: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """Payload ``name`` on the host, [8 * batch, 26 * 64] float32, and a line saying what it is."""
    if name == "zipf":
        rows = DESTS * batch
        x = torch.cat([zipf_payload(rows, DIM, seed=seed + t) for t in range(TABLES)], dim=1)
        return x, "Zipf(1.1) lookups from 26 random 2000-row tables"
    data = gpu_payloads.load()
    return gpu_payloads.build(name, data, batch, DESTS, seed), f"{name}: {data['description']}"


def max_error_over_range(x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest ``|x - y|`` of each chunk (one destination's rows x one table's columns) over that chunk's range
    (max - min), the largest over the chunks (a constant chunk counts its error over the smallest float32)."""
    shape = (DESTS, x.size(0) // DESTS, TABLES, DIM)
    xs = x.reshape(shape)
    err = (xs - y.reshape(shape)).abs().amax(dim=(1, 3))
    span = (xs.amax(dim=(1, 3)) - xs.amin(dim=(1, 3))).clamp_min(torch.finfo(torch.float32).tiny)
    return float((err / span).max())


class Table:
    """Rows printed and flushed as they come, and the JSON rewritten after each; codecs that could not run are
    printed and listed as ``not_measured`` (payload, codec, reason)."""

    def __init__(self, json_out: Path, metadata: dict[str, Any], config: dict[str, Any]) -> None:
        self.rows: list[dict[str, Any]] = []
        self.not_measured: list[dict[str, str]] = []
        self.json_out, self.metadata, self.config = json_out, metadata, config
        self.memcpy_gbps: dict[str, float] = {}
        print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, WIDTHS)), flush=True)

    def add(self, row: dict[str, Any]) -> None:
        if row["codec"] == "memcpy":
            self.memcpy_gbps[row["payload"]] = row["encode_gbps"]
        base = self.memcpy_gbps.get(row["payload"])
        for key in ("encode", "decode"):
            gbps = row.get(f"{key}_gbps")
            row[f"{key}_x_memcpy"] = gbps / base if gbps and base else None
        self.rows.append(row)
        print("  ".join(c.ljust(w) for c, w in zip(self.cells(row), WIDTHS)), flush=True)
        self.write()

    def skip(self, payload: str, codec: str, reason: str) -> None:
        """``codec`` could not be measured on ``payload``: say why, and record it."""
        self.not_measured.append({"payload": payload, "codec": codec, "reason": reason})
        print(f"{payload}: {codec} not measured ({reason})", flush=True)
        self.write()

    def write(self) -> None:
        write_results(self.json_out, dict(self.metadata), self.config, self.rows, not_measured=self.not_measured)

    @staticmethod
    def not_measured_lines(entries: list[dict[str, str]]) -> list[str]:
        """One line per codec that was not measured, its payloads and the reason (the same on every payload, as a
        rule, so said once)."""
        grouped: dict[tuple[str, str], list[str]] = {}
        for e in entries:
            grouped.setdefault((e["codec"], e["reason"]), []).append(e["payload"])
        return [f"- {codec} not measured on {', '.join(payloads)}: {reason}"
                for (codec, reason), payloads in grouped.items()]

    @staticmethod
    def cells(row: dict[str, Any]) -> list[str]:
        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        syncs = row.get("syncs")
        return [row["payload"], row["codec"], num(row.get("ratio"), ".1f") + ("x" if row.get("ratio") else ""),
                num(row.get("encode_gbps"), ".1f"), num(row.get("decode_gbps"), ".1f"),
                num(row.get("encode_x_memcpy"), ".3f"), num(row.get("decode_x_memcpy"), ".3f"),
                num(row.get("max_err_range"), ".2e"), num(row.get("op_encode_gbps"), ".1f"),
                num(row.get("op_decode_gbps"), ".1f"),
                row.get("parity", "-"), "-" if syncs is None else f"{syncs[0]}/{syncs[1]}"]
