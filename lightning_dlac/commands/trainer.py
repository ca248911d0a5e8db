"""The Trainer subcommands of ``dlac`` (fit, validate, test, predict): LightningCLI with the example DLRM, the
synthetic Criteo-like data and DLACStrategy as defaults.

Imported by :mod:`lightning_dlac.commands.cli` only when a Trainer subcommand runs: it brings in Lightning, TorchRec
and the
callback, which ``dlac preprocess|report|estimate`` do not need.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_dlac.commands.errors import CLIUserError, is_user_error, name_option
from lightning_dlac.plugin.callback import DLACCallback
from lightning_dlac.plugin.registration import register

DEFAULT_MODEL = "lightning_dlac.examples.dlrm.DLRMModule"
DEFAULT_DATA = "lightning_dlac.examples.synthetic.SyntheticCriteoDataModule"


class _RecordFailures:
    """A jsonargparse instantiator that builds classes as the default one does and remembers which one raised: when
    a class sits in a Union (``trainer.strategy`` is ``str | Strategy``), jsonargparse keeps only the first
    alternative's error as the cause, so the library's own exception is recorded here instead."""

    def __init__(self) -> None:
        self.failures: list[BaseException] = []

    def __call__(self, class_type: type, *args: Any, **kwargs: Any) -> Any:
        try:
            return class_type(*args, **kwargs)
        except Exception as error:
            self.failures.append(error)
            raise


def _class_nodes(node: Any, path: str) -> Iterator[tuple[str, str, Any]]:
    """(key, class_path, init_args) of every ``class_path`` entry in a parsed config, depth first."""
    from jsonargparse import Namespace

    if isinstance(node, Namespace):
        if "class_path" in node:
            yield path, str(node["class_path"]), node.get("init_args")
        for key, value in vars(node).items():
            yield from _class_nodes(value, f"{path}.{key}" if path else key)
    elif isinstance(node, list):
        for value in node:
            yield from _class_nodes(value, path)


def _group_nodes(node: Any, path: str) -> Iterator[tuple[str, list[str]]]:
    """(key, field names) of every config-object group in a parsed config: an entry of a class's ``init_args``
    that is a mapping without a ``class_path`` of its own (``trainer.strategy.init_args.compression``)."""
    from jsonargparse import Namespace

    for key, _, init_args in _class_nodes(node, path):
        for name, value in vars(init_args or Namespace()).items():
            if isinstance(value, Namespace) and "class_path" not in value:
                yield f"{key}.init_args.{name}", list(vars(value))


def _library_error(error: BaseException) -> BaseException:
    """The first exception of ``error``'s cause chain that is a user error raised outside jsonargparse (which wraps
    what a constructor raised in errors of its own); ``error`` itself if there is none."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
        if is_user_error(current) and not module.startswith("jsonargparse"):
            return current
        current = current.__cause__ or current.__context__
    return error


class DLACCLI(LightningCLI):
    """LightningCLI that defaults to the example DLRM and sizes it from its datamodule (tables, features).

    A user error (a bad value, a missing file) raised while the model, data, strategy, callbacks or Trainer are built
    becomes one :class:`~lightning_dlac.commands.errors.CLIUserError` carrying the library's message and the option
    that set
    the value, as given on the command line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The arguments as given, to name the option behind an error in the user's own spelling.
        given = kwargs.get("args")
        self._argv: list[str] = [str(a) for a in given] if isinstance(given, (list, tuple)) else sys.argv[1:]
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": {"class_path": DEFAULT_MODEL}, "data": {"class_path": DEFAULT_DATA}})
        # The datamodule knows the table sizes (e.g. capped Criteo cardinalities); the model must agree with it.
        for attr in ("num_embeddings_per_feature", "feature_names", "num_dense_features"):
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")

    def instantiate_classes(self) -> None:
        recorder = _RecordFailures()
        # Last in precedence: Lightning's own instantiators for the model and the data still run those two.
        self.parser.add_instantiator(recorder, object, subclasses=True)
        try:
            super().instantiate_classes()
        except Exception as error:
            recorded = [e for e in recorder.failures if is_user_error(e)]
            cause = recorded[0] if recorded else _library_error(error)
            if not is_user_error(cause):
                raise
            # From the library's own exception: with --debug its traceback shows where the value was rejected.
            raise self._user_error(cause) from cause

    def _user_error(self, cause: BaseException) -> CLIUserError:
        """``cause`` as a CLIUserError naming the component that raised it and the option that set the value."""
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        nodes = list(_class_nodes(config, ""))
        key, params, component = None, [], type(cause).__name__
        groups = list(_group_nodes(config, ""))
        group = False
        # The constructor that raised: the outermost __init__ frame of the traceback whose object the config built,
        # a class (class_path) or a config object given as a group of fields (DLACStrategy's compression=).
        tb = cause.__traceback__
        while tb is not None and key is None:
            frame = tb.tb_frame
            owner = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
            if isinstance(owner, Trainer):
                key, params, component = "trainer", list(vars(config.get("trainer") or {})), "Trainer"
            elif owner is not None:
                for path, class_path, init_args in nodes:
                    if class_path.rsplit(".", 1)[-1] == type(owner).__name__:
                        key, component = path, type(owner).__name__
                        params = list(vars(init_args)) if init_args is not None else []
                        break
                else:
                    names = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else None
                    for path, fields in groups:
                        if names is not None and set(fields) == names:
                            key, params, component, group = path, fields, type(owner).__name__, True
                            break
            tb = tb.tb_next
        option = name_option(self._argv, key, params, str(cause), group=group) if key is not None else None
        return CLIUserError(str(cause), option=option, component=component)


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

    Raises:
        CLIUserError: A value the library rejected while building the run (the message names the option).
    """
    from lightning.pytorch.strategies import StrategyRegistry

    register(StrategyRegistry)  # strategy="dlac", the default below (importing lightning_dlac did it already)
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


# What a run (not its construction) raises when its input or its settings are wrong: Lightning's refusals, a value a
# component rejects once it sees the data (a malformed line, a batch off its declared layout), a missing file.
# TypeError is left out: raised at run time it is more often a bug, whose traceback matters.
_RUN_ERRORS = (ValueError, OSError)
# Where an error names its option: the components of the config, innermost first in the traceback.
_COMPONENTS = ((LightningDataModule, "data"), (LightningModule, "model"), (Trainer, "trainer"))


def run_error(error: BaseException, argv: Sequence[str]) -> CLIUserError | None:
    """The user error a Trainer subcommand's run raised, as a :class:`CLIUserError` naming the option behind it and
    carrying the rank it was raised on (``rank``, 0 outside a process group); ``None`` when ``error`` is not one
    (its traceback is then what the user needs)."""
    import torch.distributed as dist
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if not isinstance(error, (*_RUN_ERRORS, MisconfigurationException)) or isinstance(error, CLIUserError):
        return None
    key, component = None, type(error).__name__
    tb = error.__traceback__
    while tb is not None:  # the innermost frame whose `self` is a component of the config
        owner = tb.tb_frame.f_locals.get("self")
        found = next(((k, type(owner).__name__) for cls, k in _COMPONENTS if isinstance(owner, cls)), None)
        key, component = found or (key, component)
        tb = tb.tb_next
    params = list(inspect.signature(Trainer.__init__).parameters) if key == "trainer" else []
    option = name_option(argv, key, params, str(error)) if key is not None else None
    user_error = CLIUserError(str(error).strip(), option=option, component=component)
    user_error.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return user_error


def report_finished(cli: DLACCLI) -> None:
    """Log the final metrics (and, when no report did, this rank's all-to-all bytes) on rank 0."""
    trainer = cli.trainer
    if not (trainer.is_global_zero and trainer.callback_metrics):
        return
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
