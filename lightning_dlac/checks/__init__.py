"""The option checkers every layer shares: a plain-data option in, the value (converted where it must be) out, or a
``ValueError`` that names the option and what it accepts.

The bottom of the package, with ``native/`` and ``testing/``: pure Python, it imports nothing of ``lightning_dlac``
and no torch, so every layer may use it (a checker of one layer's own notion, such as
:func:`lightning_dlac.adaptive.check_relative_bound`, stays in that layer).
"""

from lightning_dlac.checks.options import check_count, parse_enum

__all__ = ["check_count", "parse_enum"]
