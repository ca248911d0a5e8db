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
status 2; ``--debug`` (anywhere on the command line) or ``DLAC_DEBUG=1`` shows the traceback instead. A run that a
peer ended by going silent (:class:`~lightning_dlac.comm.PeerTimeoutError`) ends likewise with one line, naming the
silent rank, the step and the exchange, and where the run checkpoints the command that resumes it; exit status 1.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from lightning_dlac.commands.errors import USER_ERROR_STATUS, CLIUserError

ENV_DEBUG = "DLAC_DEBUG"
DEBUG_FLAG = "--debug"
FAULT_STATUS = 1  # exit status of a run a fault ended (a peer that stopped answering), as for an uncaught error
TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")

__all__ = ["CLIUserError", "build_cli", "main"]


def build_cli(args: Sequence[str] | None = None, run: bool = True) -> Any:
    """Parse ``args``, build the trainer, model and datamodule (a LightningCLI) and run the subcommand.

    Args:
        args: Command-line arguments; ``None`` reads ``sys.argv``.
        run: Run the subcommand (``fit``, ``validate``, ...). With ``False`` only parse and instantiate, and then
            ``args`` holds no subcommand.

    Returns:
        The LightningCLI, with its trainer, model and datamodule.

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


def _stop(subcommand: str | None, message: str, rank: int = 0, status: int = USER_ERROR_STATUS) -> None:
    """End the command with one line on stderr and exit ``status`` (2: a user error). Rank 0 writes it; another rank
    writes it (prefixed with its rank) only where rank 0 may not have the same error: under an external launcher
    (torchrun, SLURM), or when rank 0, the process that Lightning's own launcher started it from, is still running
    a while later."""
    hint = f"(run with {DEBUG_FLAG} or {ENV_DEBUG}=1 to see the traceback)"
    line = f"dlac{' ' + subcommand if subcommand else ''}: error: {message} {hint}"
    if rank != 0:
        if not _rank_zero_stopped_too():
            print(f"[rank {rank}] {line}", file=sys.stderr, flush=True)
        sys.exit(status)
    print(line, file=sys.stderr, flush=True)
    sys.exit(status)


def _rank_zero_stopped_too(grace_s: float = 10.0) -> bool:
    """Whether rank 0, this process's parent under Lightning's own launcher, exits within ``grace_s`` (it does when
    the error is the same on every rank, having reported it)."""
    if any(v in os.environ for v in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID")):
        return False  # ranks are siblings under an external launcher: each reports its own
    parent, deadline = os.getppid(), time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            return True
        time.sleep(0.1)
    return False


def _peer_timeout(error: BaseException) -> Any:
    """The ``PeerTimeoutError`` behind ``error`` (a peer stopped answering), if any."""
    from lightning_dlac.comm.liveness import peer_timeout

    return peer_timeout(error)


def _resume_command(argv: Sequence[str]) -> str:
    """The command line that resumes the run ``argv`` (after ``dlac``) from its last checkpoint: ``argv`` with its
    own ``--ckpt_path`` replaced by ``--ckpt_path=last``.

    Args:
        argv: The command line after ``dlac``, as given.

    Returns:
        The command, quoted for a POSIX shell.
    """
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        if token == "--ckpt_path":
            skip = True
            continue
        if not token.startswith("--ckpt_path="):
            kept.append(token)
    return shlex.join(["dlac", *kept, "--ckpt_path=last"])


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``dlac`` console script: dispatch the subcommand.

    A Trainer subcommand logs its final metrics on rank 0, or stops on a user error with its message and status 2
    (the traceback with ``--debug`` or ``DLAC_DEBUG=1``).

    Args:
        args: The command line after ``dlac``; ``None`` reads ``sys.argv``.
    """
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
    subcommand = next((a for a in argv if a in TRAINER_SUBCOMMANDS), None)
    try:
        cli = build_cli(None if from_sys else argv)
    except CLIUserError as error:
        if debug:
            raise
        _stop(subcommand, str(error))
    except Exception as error:
        timeout = None if debug else _peer_timeout(error)
        if timeout is not None:  # a peer stopped answering: who, where, and how to resume, in one line
            if timeout.resume is not None:
                timeout.resume = _resume_command(argv)
            _stop(subcommand, str(timeout), rank=timeout.rank, status=FAULT_STATUS)
        # An error of the run itself (a Lightning setting the data cannot meet, a malformed input file), raised on
        # every rank: one line from rank 0, the ranks' tracebacks behind --debug.
        from lightning_dlac.commands.trainer import run_error

        user_error = None if debug else run_error(error, argv)
        if user_error is None:
            raise
        _stop(subcommand, str(user_error), rank=user_error.rank)
    from lightning_dlac.commands.trainer import report_finished

    report_finished(cli)


if __name__ == "__main__":
    main()
