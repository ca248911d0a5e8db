"""The ``dlac`` command: LightningCLI with the example DLRM, the synthetic Criteo-like data and DLACStrategy as
defaults.

``dlac fit --config examples/configs/dlrm_synthetic.yaml`` trains; ``dlac fit --print_config`` shows every option.
Any LightningModule / LightningDataModule can be swapped in with ``class_path`` / ``init_args``.
``dlac report LOG_DIR`` rebuilds the compression report of a finished run (:mod:`lightning_dlac.report`).
``dlac preprocess criteo --output DIR INPUT...`` converts Criteo TSV files to TorchRec's binary layout
(:mod:`lightning_dlac.preprocess`). ``dlac estimate ...`` predicts step times on a cluster
(:mod:`lightning_dlac.estimate`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_dlac.callback import DLACCallback

DEFAULT_MODEL = "lightning_dlac.examples.dlrm.DLRMModule"
DEFAULT_DATA = "lightning_dlac.examples.data.SyntheticCriteoDataModule"


class DLACCLI(LightningCLI):
    """LightningCLI that defaults to the example DLRM and sizes it from its datamodule (tables, features)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}, "data": {"class_path": DEFAULT_DATA}})
        # The datamodule knows the table sizes (e.g. capped Criteo cardinalities); the model must agree with it.
        for attr in ("num_embeddings_per_feature", "feature_names", "num_dense_features"):
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")


class _SaveConfigWithTheLogs(SaveConfigCallback):
    """Writes ``config.yaml`` beside the logger's files. Without a logger the run has no directory of its own
    (Lightning would use the working directory), so it writes nothing; ``--print_config`` still shows the config."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.logger is not None:
            super().setup(trainer, pl_module, stage)


def build_cli(args: Sequence[str] | None = None, run: bool = True) -> DLACCLI:
    """Parse ``args`` and build the trainer, model and datamodule; run the subcommand unless ``run=False``.

    Args:
        args: Command-line arguments; ``None`` reads ``sys.argv``.
        run: Run the subcommand (``fit``, ``validate``, ...). With ``False`` only parse and instantiate, and then
            ``args`` holds no subcommand.
    """
    import lightning_dlac  # noqa: F401 - registers strategy="dlac"

    kwargs: dict[str, Any] = {}
    if not run:
        kwargs["run"] = False
    return DLACCLI(
        model_class=LightningModule,
        datamodule_class=LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=list(args) if args is not None else None,
        trainer_defaults={"strategy": "dlac", "accelerator": "cpu", "devices": 2},
        save_config_callback=_SaveConfigWithTheLogs,
        save_config_kwargs={"overwrite": True},
        **kwargs,
    )


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``dlac`` console script: run the subcommand, then log the final metrics on rank 0.

    ``dlac report LOG_DIR`` is handled here too (it is not a Trainer subcommand)."""
    argv = list(args) if args is not None else sys.argv[1:]
    if argv[:1] == ["report"]:
        from lightning_dlac.report import main as report_main

        report_main(argv[1:])
        return
    if argv[:1] == ["estimate"]:  # a model of step times on a cluster, not a Trainer subcommand
        from lightning_dlac.estimate import main as estimate_main

        estimate_main(argv[1:])
        return
    if argv[:1] == ["preprocess"]:  # dataset conversion, not a Trainer subcommand (lightning_dlac.preprocess)
        from lightning_dlac.preprocess import main as preprocess_main

        status = preprocess_main(argv[1:])
        if status:
            sys.exit(status)
        return
    cli = build_cli(args)  # None: LightningCLI reads sys.argv itself
    trainer = cli.trainer
    if trainer.is_global_zero and trainer.callback_metrics:
        metrics = ", ".join(f"{k}={float(v):.4f}" for k, v in sorted(trainer.callback_metrics.items()))
        rank_zero_info(f"dlac {cli.subcommand} finished after {trainer.global_step} steps: {metrics}")
        strategy = trainer.strategy
        reported = any(isinstance(cb, DLACCallback) and cb.active and cb.report for cb in trainer.callbacks)
        if getattr(strategy, "exchanges", None) and not (reported and cli.subcommand == "fit"):
            stats = strategy.total_comm_stats()
            rank_zero_info(
                f"dlac: rank 0 forward all-to-all sent {stats.sent_bytes / 2**20:.1f} MiB instead of"
                f" {stats.raw_bytes / 2**20:.1f} MiB ({stats.ratio:.1f}x smaller)"
            )
        log_dir = getattr(trainer.logger, "log_dir", None)  # not trainer.log_dir: that one is a collective
        if log_dir:
            rank_zero_info(f"dlac: logs in {log_dir}")


if __name__ == "__main__":
    main()
