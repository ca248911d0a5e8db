"""docs/strategy.md's figures: the sparse-dist pipeline against unpipelined training, measured, and what
``dlac estimate`` models of it (computed when the page is rendered)."""

from __future__ import annotations

import re

from benchmarks.lib.pipeline import pipeline_lines, pipeline_table
from benchmarks.lib.rule import verdict_text
from benchmarks.render.core import Block, Results, awaiting, source_line


def pipeline(results: Results) -> list[str]:
    """The sparse-dist pipeline against unpipelined training (issue 29): each pipelined variant beside its twin
    (separate launches) with the phases that explain it and the target, then the same within one launch."""
    data = results.get("e2e_pipeline.json")
    cfg = data["config"]
    rows = data["results"]
    lines = [source_line("e2e_pipeline.json", data, results.shown), "",
             f"Batch {cfg['batch_size']} per rank, {cfg['world_size']} gloo ranks, model `{cfg.get('model', 'dlrm')}`;"
             f" every variant its own launch, {cfg['repeats']} repeat(s) in {cfg.get('order', 'round-robin')} order,"
             f" {cfg['steps']} timed steps after {cfg['warmup']} warm-up steps per launch. Steps: median over the"
             " pooled steps (per step, the slower rank); speed: the unpipelined step over the pipelined one (above 1"
             " the pipeline pays), per-repeat range in brackets; phases per step, mean over ranks.", "",
             *(pipeline_table(rows) or ["This run had no pipelined variant beside its unpipelined twin."])]
    targets = [t for t in data.get("targets", []) if "pipelined" in t["variant"]]
    if targets:
        lines += ["", "Target (by the rule of docs/benchmarks.md):", ""]
        lines += [f"- {t['rate']}: {t['target']}: {verdict_text(t)}" for t in targets]
    alternate = results.get("e2e_pipeline_alternate.json")
    if alternate is None:
        return [*lines, "", *awaiting(["e2e_pipeline_alternate.json"], short=True)]
    acfg = alternate["config"]
    return [*lines, "", source_line("e2e_pipeline_alternate.json", alternate, results.shown), "",
            f"Within one launch ({acfg['repeats']} launches per variant, batch {acfg['batch_size']}, {acfg['warmup']}"
            f" warm-up and {acfg['steps']} timed steps in blocks unpipelined and pipelined in turn): the steps whose"
            " ids were sent during the step before against the unpipelined steps of the same launch, and each kind's"
            " phases per step:", "", *pipeline_lines(alternate["results"])]


# The two `dlac estimate` runs of docs/strategy.md's pipeline model: a GPU cluster, and a machine like this one.
PIPELINE_MODEL_CLUSTER = ("--world-sizes 8,64,512 --gbit 100 --latency-us 5 --compute-ms 5 --encode-gbps 100"
                          " --decode-gbps 100 --cast-gbps 500 --forward-ratio 29 --backward-ratio 9 --ids-per-sample 26"
                          " --pipeline sparse_dist")


PIPELINE_MODEL_HERE = ("--shared --world-sizes 2 --gbit 1 --compute-ms 700 --encode-gbps 100 --decode-gbps 100"
                       " --cast-gbps 500 --forward-ratio 29 --backward-ratio 9 --ids-per-sample 26"
                       " --pipeline sparse_dist")


def _estimate(args: str) -> list[str]:
    """What `dlac estimate ARGS` prints (its rank-zero log lines)."""
    import logging

    from lightning_dlac.commands.estimate import main as estimate

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.extend(record.getMessage().splitlines())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        estimate(args.split())
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
    return lines


def pipeline_model(results: Results) -> list[str]:
    """The model's outputs for the pipeline (not measurements), computed by `dlac estimate` itself."""
    cluster, here = _estimate(PIPELINE_MODEL_CLUSTER), _estimate(PIPELINE_MODEL_HERE)
    gains = [float(x) for line in here if "pipelined over unpipelined step:" in line
             for x in re.findall(r"([\d.]+)x", line.split("pipelined over unpipelined step:", 1)[1])]
    verdict = ("beside that much compute, the pipeline cannot reach the 1.1x target however much of the input dist it"
               " hides" if gains and max(gains) < 1.1 else "the model says the pipeline can pay even here")
    return ["The model's outputs for the inputs given (computed by `dlac estimate` when this page is rendered; not"
            " measurements). A GPU cluster, 100 Gbit/s per GPU, 5 us per message, 5 ms of compute, the DLRM's"
            " compression ratios assumed:", "", f"    dlac estimate {PIPELINE_MODEL_CLUSTER}", "", cluster[0], "",
            *cluster[1:], "",
            "A machine like this one, one loopback shared by 2 ranks at 1 Gbit/s and a step of the order of a second:",
            "", f"    dlac estimate {PIPELINE_MODEL_HERE}", "", *[line for line in here if line.startswith("- ")], "",
            f"So {verdict}."]


BLOCKS = {
    "pipeline": Block(("e2e_pipeline.json",), pipeline, optional=("e2e_pipeline_alternate.json",)),
    "pipeline_model": Block((), pipeline_model),
}
