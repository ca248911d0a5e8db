"""The ``dlac`` command.

- ``dlac fit|validate|test|predict``: LightningCLI with the example DLRM, the synthetic Criteo-like data and
  DLACStrategy as defaults (``--print_config`` shows every option; any LightningModule / LightningDataModule can be
  swapped in with ``class_path`` / ``init_args``). Imports Lightning and TorchRec (:mod:`lightning_dlac._trainer_cli`).
- ``dlac preprocess criteo --output DIR INPUT...``: Criteo TSV to TorchRec's binary layout
  (:mod:`lightning_dlac.criteo`). Imports NumPy.
- ``dlac report LOG_DIR``: rebuild a finished run's compression report (:mod:`lightning_dlac.report`).
- ``dlac estimate ...``: predicted step times on a cluster (:mod:`lightning_dlac.estimate`).

This module imports only the standard library: the subcommand decides what else loads, so the light ones start at
once. A user error raised while a Trainer subcommand builds its model, data, strategy or callbacks (a bad value, a
missing file) ends the command with the library's message, the option that set the value as it was given, and exit
status 2; ``--debug`` (anywhere on the command line) or ``DLAC_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_MODEL = "lightning_dlac.examples.dlrm.DLRMModule"
DEFAULT_DATA = "lightning_dlac.examples.synthetic.SyntheticCriteoDataModule"
ENV_DEBUG = "DLAC_DEBUG"
DEBUG_FLAG = "--debug"
# Exit status of a command that stopped on a user error (argparse's and jsonargparse's for a bad argument).
USER_ERROR_STATUS = 2
TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
# Components whose options LightningCLI also accepts without ".init_args" (subclass mode).
_SHORT_KEYS = ("model", "data", "trainer")

__all__ = ["CLIUserError", "build_cli", "main"]


class CLIUserError(ValueError):
    """A value given to ``dlac`` that the library rejected while the run was being built.

    Attributes:
        option: The option(s) that set it, as given on the command line (or the config key), if known.
        component: The class that rejected it (``DLACStrategy``, ``CriteoTSVDataModule``, ``Trainer``).
    """

    def __init__(self, message: str, option: str | None, component: str) -> None:
        where = f"{option} ({component})" if option else component
        super().__init__(f"{where}: {message}")
        self.option = option
        self.component = component
        self.message = message


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is what the library raises for bad input (a value, a type, a file, a Lightning setting)."""
    if isinstance(error, (ValueError, TypeError, OSError)):
        return True
    return any(cls.__name__ == "MisconfigurationException" for cls in type(error).__mro__)


def _options_given(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(dotted name without ``init_args``, the option as typed) of every ``--option`` in ``argv``."""
    out = []
    for i, token in enumerate(argv):
        if not token.startswith("--") or token == "--":
            continue
        name, eq, _ = token[2:].partition("=")
        typed = token
        if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            typed = f"{token} {argv[i + 1]}"
        out.append((".".join(p for p in name.split(".") if p != "init_args"), typed))
    return out


def name_option(argv: Sequence[str], key: str, params: Sequence[str], message: str) -> str | None:
    """Name the option behind an error: the component ``key``'s options on the command line whose parameter the
    message names, else all its options on the command line, else the parameters the message names (set in a config
    file or left at their defaults), spelled as an option; None if nothing points anywhere.

    Args:
        argv: The command line.
        key: The component's key in the config (``data``, ``trainer.strategy``, ``trainer.callbacks``).
        params: The component's parameter names.
        message: The library's error message.
    """
    short = ".".join(p for p in key.split(".") if p != "init_args")
    given = [(name[len(short) + 1 :], typed) for name, typed in _options_given(argv) if name.startswith(short + ".")]
    named = [p for p in params if re.search(rf"(?<![\w.]){re.escape(p)}(?!\w)", message)]
    hits = [typed for param, typed in given if param in named]
    if hits:
        return ", ".join(hits)
    if given:
        return ", ".join(typed for _, typed in given)
    if named:
        spelled = key if key in _SHORT_KEYS else f"{key}.init_args"
        return ", ".join(f"--{spelled}.{p}" for p in named)
    return None


def build_cli(args: Sequence[str] | None = None, run: bool = True) -> Any:
    """Parse ``args`` and build the trainer, model and datamodule (a LightningCLI); run the subcommand unless
    ``run=False``.

    Args:
        args: Command-line arguments; ``None`` reads ``sys.argv``.
        run: Run the subcommand (``fit``, ``validate``, ...). With ``False`` only parse and instantiate, and then
            ``args`` holds no subcommand.

    Raises:
        CLIUserError: A value the library rejected while building the run (the message names the option).
    """
    from lightning_dlac._trainer_cli import build_cli as build

    return build(args, run)


def _debug_requested(argv: list[str]) -> bool:
    """Remove ``--debug`` from ``argv`` (in place); True if it was there or ``DLAC_DEBUG`` is set."""
    flagged = DEBUG_FLAG in argv
    while DEBUG_FLAG in argv:
        argv.remove(DEBUG_FLAG)
    return flagged or os.environ.get(ENV_DEBUG, "").strip().lower() in ("1", "true", "yes")


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``dlac`` console script: dispatch the subcommand; a Trainer subcommand logs its final
    metrics on rank 0, or stops on a user error with its message and status 2."""
    from_sys = args is None
    argv = list(sys.argv[1:] if from_sys else args)
    debug = _debug_requested(argv)
    if debug:
        # Ranks that Lightning launches re-run sys.argv (without the flag, removed below): they inherit this.
        os.environ[ENV_DEBUG] = "1"
    command = argv[0] if argv else ""
    if command == "report":  # not a Trainer subcommand
        from lightning_dlac.report import main as report_main

        report_main(argv[1:])
        return
    if command == "estimate":  # a model of step times on a cluster
        from lightning_dlac.estimate import main as estimate_main

        estimate_main(argv[1:])
        return
    if command == "preprocess":  # dataset conversion
        from lightning_dlac.criteo.command import main as preprocess_main

        status = preprocess_main(argv[1:])
        if status:
            sys.exit(status)
        return
    if from_sys:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (and warns when given both)
    try:
        cli = build_cli(None if from_sys else argv)
    except CLIUserError as error:
        if debug:
            raise
        subcommand = next((a for a in argv if a in TRAINER_SUBCOMMANDS), None)
        print(f"dlac{' ' + subcommand if subcommand else ''}: error: {error}", file=sys.stderr)
        print(f"(run with {DEBUG_FLAG} or {ENV_DEBUG}=1 to see the traceback)", file=sys.stderr)
        sys.exit(USER_ERROR_STATUS)
    from lightning_dlac._trainer_cli import report_finished

    report_finished(cli)


if __name__ == "__main__":
    main()
