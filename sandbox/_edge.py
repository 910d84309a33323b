"""Settings the application (the CLI) makes at its edge, before the library is loaded.

Imports nothing, so setting them costs nothing; `sandbox._log` applies them when the library's
logger is first needed.
"""

from __future__ import annotations

import sys
from typing import Any

_logging: dict[str, Any] | None = None


def want_logging(level: str, *, serialize: bool) -> None:
    """Log to stderr at `level` (JSON lines with `serialize`), from now on or when first needed."""
    global _logging
    _logging = {"level": level.upper(), "serialize": serialize}
    if "sandbox._log" in sys.modules:  # already loaded (an in-process caller): apply now
        apply_logging()


def apply_logging() -> None:
    """Apply what `want_logging` asked for (called by sandbox._log on its first import)."""
    if _logging is None:
        return
    from loguru import logger  # loguru loads only once logs are wanted: asking costs nothing

    logger.remove()
    # no variable values in tracebacks (loguru's default): a crash's frames hold call arguments
    logger.add(sys.stderr, level=_logging["level"], serialize=_logging["serialize"], diagnose=False)
    logger.enable("sandbox")
