"""The ``dlac`` command.

- ``dlac fit|validate|test|predict``: LightningCLI with the example DLRM, the synthetic Criteo-like data and
  DLACStrategy as defaults (``--print_config`` shows every option; any LightningModule / LightningDataModule can be
  swapped in with ``class_path`` / ``init_args``). Imports Lightning and TorchRec
  (:mod:`lightning_dlac.commands.trainer`).
- ``dlac preprocess criteo --output DIR INPUT...``: Criteo TSV to TorchRec's binary layout
  (:mod:`lightning_dlac.criteo`). Imports NumPy.
- ``dlac report LOG_DIR``: rebuild a finished run's compression report (:mod:`lightning_dlac.commands.report`).
- ``dlac estimate ...``: predicted step times on a cluster (:mod:`lightning_dlac.commands.estimate`).

This module imports only the standard library: the subcommand decides what else loads, so the light ones start at
once. A user error raised while a Trainer subcommand builds its model, data, strategy or callbacks (a bad value, a
missing file) ends the command with the library's message, the option that set the value as it was given, and exit
status 2; ``--debug`` (anywhere on the command line) or ``DLAC_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from lightning_dlac.commands.errors import USER_ERROR_STATUS, CLIUserError

ENV_DEBUG = "DLAC_DEBUG"
DEBUG_FLAG = "--debug"
TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")

__all__ = ["CLIUserError", "build_cli", "main"]


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
    from lightning_dlac.commands.trainer import build_cli as build

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
        from lightning_dlac.commands.report import main as report_main

        report_main(argv[1:])
        return
    if command == "estimate":  # a model of step times on a cluster
        from lightning_dlac.commands.estimate import main as estimate_main

        estimate_main(argv[1:])
        return
    if command == "preprocess":  # dataset conversion
        from lightning_dlac.commands.preprocess import main as preprocess_main

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
    from lightning_dlac.commands.trainer import report_finished

    report_finished(cli)


if __name__ == "__main__":
    main()
