"""The library's logger: loguru's, quiet until the application (our CLI, or yours) enables it.

Library modules import `logger` from here, never from loguru directly, so that the first module
that logs also makes the library quiet (`logger.disable("sandbox")`), and commands that log
nothing (`sandbox --help`, `sandbox explain`) never load loguru at all. The CLI states how it
wants logs in `sandbox._edge` before anything is imported; they are applied here, on first use.
"""

from __future__ import annotations

from loguru import logger

from sandbox import _edge

__all__ = ["logger"]


def _application_decided() -> bool:
    # an application that enabled (or disabled) the library's logs before its first use keeps
    # its choice; loguru keeps the choices in this list (no public accessor)
    return any(name == "sandbox." for name, _ in logger._core.activation_list)  # type: ignore[attr-defined]


if not _application_decided():
    logger.disable("sandbox")
_edge.apply_logging()
