"""The ``dlac`` command: LightningCLI with the example DLRM, the synthetic Criteo-like data and DLACStrategy as
defaults.

``dlac fit --config examples/configs/dlrm_synthetic.yaml`` trains; ``dlac fit --print_config`` shows every option.
Any LightningModule / LightningDataModule can be swapped in with ``class_path`` / ``init_args``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

DEFAULT_MODEL = "lightning_dlac.examples.dlrm.DLRMModule"
DEFAULT_DATA = "lightning_dlac.examples.data.SyntheticCriteoDataModule"


class DLACCLI(LightningCLI):
    """LightningCLI that defaults to the example DLRM and sizes it from its datamodule (tables, features)."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}, "data": {"class_path": DEFAULT_DATA}})
        # The datamodule knows the table sizes (e.g. capped Criteo cardinalities); the model must agree with it.
        for attr in ("num_embeddings_per_feature", "feature_names", "num_dense_features"):
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")


def main(args: Sequence[str] | None = None, run: bool = True) -> DLACCLI:
    """Entry point of the ``dlac`` console script.

    Args:
        args: Command-line arguments; ``None`` reads ``sys.argv``.
        run: Run the subcommand (``fit``, ``validate``, ...). With ``False`` only parse and instantiate.
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
        save_config_kwargs={"overwrite": True},
        **kwargs,
    )


if __name__ == "__main__":
    main()
