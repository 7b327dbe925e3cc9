"""Command-line output that never fails on encoding.

Under a non-UTF-8 locale (``LC_ALL=C PYTHONUTF8=0``) or ``PYTHONIOENCODING=ascii`` Python's stdout is strict
ASCII: printing a model name, a path or a field with a non-ASCII character would raise a traceback after the
run's files were written. The CLIs (eval.run, eval.orin through eval.run.run, eval.report, eval.site) call
:func:`tolerant_output` first; the files they write name their encoding (UTF-8) and do not depend on the locale.
"""

from __future__ import annotations

import sys


def tolerant_output() -> None:
    """stdout replaces what its encoding cannot show ("?"); stderr escapes it (its default unless set strict)."""
    for stream, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:  # not a text stream of its own (a test's capture): nothing to change
            continue
        try:
            reconfigure(errors=errors)
        except (ValueError, OSError):  # a closed or detached stream: printing to it fails on its own terms
            pass
