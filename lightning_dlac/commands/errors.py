"""User errors of the ``dlac`` command: the error a Trainer subcommand ends with, and how the option behind it is
named in the user's own spelling. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Exit status of a command that stopped on a user error (argparse's and jsonargparse's for a bad argument).
USER_ERROR_STATUS = 2
# Components whose options LightningCLI also accepts without ".init_args" (subclass mode).
_SHORT_KEYS = ("model", "data", "trainer")

__all__ = ["USER_ERROR_STATUS", "CLIUserError", "is_user_error", "name_option"]


class CLIUserError(ValueError):
    """A value given to ``dlac`` that the library rejected while the run was being built.

    Args:
        message: What is wrong with the value.
        option: The option(s) that set it, as given on the command line (or the config key); ``None`` if unknown.
        component: The class that rejected it.

    Attributes:
        option: The option(s) that set it, as given on the command line (or the config key), if known.
        component: The class that rejected it (``DLACStrategy``, ``CriteoTSVDataModule``, ``Trainer``).
        rank: The rank it was raised on (0 outside a process group); only rank 0 reports it.
    """

    rank: int = 0

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


def name_option(argv: Sequence[str], key: str, params: Sequence[str], message: str, group: bool = False) -> str | None:
    """Name the option behind an error: the component ``key``'s options on the command line whose parameter the
    message names, else the parameter the message names first (set in a config file or left at its default), spelled
    as an option, else all the component's options on the command line; None if nothing points anywhere.

    Args:
        argv: The command line.
        key: The component's key in the config (``data``, ``trainer.strategy``, ``trainer.callbacks``), or a config
            object's among another component's options (``trainer.strategy.init_args.compression``).
        params: The component's parameter names (a config object's field names).
        message: The library's error message.
        group: ``key`` is a config object's: its fields are spelled right after it, with no ``init_args``.
    """
    short = ".".join(p for p in key.split(".") if p != "init_args")
    given = [(name[len(short) + 1 :], typed) for name, typed in _options_given(argv) if name.startswith(short + ".")]
    found = {p: re.search(rf"(?<![\w.]){re.escape(p)}(?!\w)", message) for p in params}
    named = sorted((p for p, m in found.items() if m), key=lambda p: found[p].start())  # in the message's order
    hits = [typed for param, typed in given if param in named]
    if hits:
        return ", ".join(hits)
    if named:
        spelled = key if key in _SHORT_KEYS or group else f"{key}.init_args"
        return f"--{spelled}.{named[0]}"  # the one the message is about (it names it first)
    if given:
        return ", ".join(typed for _, typed in given)
    return None
