"""Container-sandbox orchestrator for AI-agent tools.

The public surface, and nothing else: everything behind it is private.
"""

from loguru import logger as _logger

from sandbox.config import Config, load_config, load_config_text
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import ConfigError, ErrorCode, SandboxError
from sandbox.tools.spec import ToolResult

__version__ = "0.1.0"

__all__ = [
    "Config",
    "ConfigError",
    "ErrorCode",
    "Orchestrator",
    "SandboxError",
    "Session",
    "ToolResult",
    "load_config",
    "load_config_text",
]

# A library stays quiet until the application (our CLI, or yours) enables its logs.
_logger.disable("sandbox")
