"""``dlac estimate``: does DLAC pay on a given cluster? A model of one training step's time, from measured inputs.

| module | job |
|---|---|
| ``model`` | the cost model: links, workload, codec rates, nodes; a step per method and per ``compress_peers`` policy |
| ``rates`` | the model's inputs read from files: a finished run's ``dlac_run.json``, a GPU's codec benchmark JSON |
| ``cli`` | the command: its arguments, the defaults it fills from those files, the tables it prints |

Every public name of the three is importable from here (``from lightning_dlac.commands.estimate import predict``), as
it was when they were one module; the benchmarks and tests import them so. Standard library only at import, so
``dlac estimate --help`` starts at once.
"""

from __future__ import annotations

from typing import Any

from lightning_dlac.commands.estimate import cli, model, rates
from lightning_dlac.commands.estimate.cli import main, pipeline_gains, policy_table, table
from lightning_dlac.commands.estimate.model import (
    ALL_METHODS,
    INT8_ROW_DIM,
    LINK_KINDS,
    METHOD_LABELS,
    METHODS,
    MX4_GROUP_SIZE,
    MX4_METHOD,
    NO_PEERS,
    PIPELINES,
    POLICIES,
    POLICY_LABELS,
    Codec,
    Link,
    Prediction,
    Topology,
    Workload,
    combine_ratios,
    input_dist_ms,
    predict,
    predict_all,
    predict_policies,
    predict_policy,
)
from lightning_dlac.commands.estimate.rates import (
    FP16_ROW,
    GRADIENT_PAYLOAD,
    MX4_ROW,
    RUN_FIELDS,
    DeviceRates,
    RunRates,
    device_rates,
    rates_from_run,
    rates_from_summary,
    read_json,
    wait_from_run,
)

__all__ = [
    "ALL_METHODS",
    "FP16_ROW",
    "GRADIENT_PAYLOAD",
    "INT8_ROW_DIM",
    "LINK_KINDS",
    "METHODS",
    "METHOD_LABELS",
    "MX4_GROUP_SIZE",
    "MX4_METHOD",
    "MX4_ROW",
    "NO_PEERS",
    "PIPELINES",
    "POLICIES",
    "POLICY_LABELS",
    "RUN_FIELDS",
    "Codec",
    "DeviceRates",
    "Link",
    "Prediction",
    "RunRates",
    "Topology",
    "Workload",
    "combine_ratios",
    "device_rates",
    "input_dist_ms",
    "main",
    "pipeline_gains",
    "policy_table",
    "predict",
    "predict_all",
    "predict_policies",
    "predict_policy",
    "rates_from_run",
    "rates_from_summary",
    "read_json",
    "table",
    "wait_from_run",
]


def __getattr__(name: str) -> Any:
    # The one module's private helpers (``_dims``, ``_positive``, ...) resolve from the module that holds them now.
    for module in (model, rates, cli):
        if name in vars(module):
            return vars(module)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
