"""Container-sandbox orchestrator for AI-agent tools.

The public surface, and nothing else: everything behind it is private.
"""

from sandbox.config import Config, load_config, load_config_text
from sandbox.engine.orchestrator import Orchestrator, Session
from sandbox.errors import ConfigError, ErrorCode, SandboxError
from sandbox.tools.spec import ToolResult

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
