"""Container-sandbox orchestrator for AI-agent tools.

The public surface, and nothing else: everything behind it is private. Names load on first
use (PEP 562), so `import sandbox` and the CLI's start stay cheap.
"""

import typing as _typing

from sandbox._lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from sandbox.config import Config, load_config, load_config_text
    from sandbox.engine.orchestrator import Orchestrator, Session
    from sandbox.errors import ConfigError, ErrorCode, SandboxError, UsageError
    from sandbox.tools.spec import ToolResult


def _installed_version() -> str:
    """The version pip installed (pyproject.toml is its one source); a checkout that was never
    installed says so rather than guessing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-sandbox")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _installed_version()

__all__ = [
    "Config",
    "ConfigError",
    "ErrorCode",
    "Orchestrator",
    "SandboxError",
    "Session",
    "ToolResult",
    "UsageError",
    "load_config",
    "load_config_text",
]

_HOMES = {
    "Config": "sandbox.config",
    "ConfigError": "sandbox.errors",
    "ErrorCode": "sandbox.errors",
    "Orchestrator": "sandbox.engine.orchestrator",
    "SandboxError": "sandbox.errors",
    "Session": "sandbox.engine.orchestrator",
    "ToolResult": "sandbox.tools.spec",
    "UsageError": "sandbox.errors",
    "load_config": "sandbox.config",
    "load_config_text": "sandbox.config",
}


if not _typing.TYPE_CHECKING:  # type checkers see the imports above: a misspelt name stays an error
    __getattr__ = _lazy_names(__name__, _HOMES, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# The library stays quiet until the application enables its logs: see sandbox/_log.py.
