"""The library's logs: quiet by default, the application's choice kept, loguru loaded only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

# one tool call through the library, which logs `tool_call_finished`; prints how many such lines
CALL = """
import anyio, tempfile
from sandbox import Orchestrator, load_config_text
from sandbox.testing import FakeBackend
config = load_config_text("state_dir: " + tempfile.mkdtemp() + "\\nagents: {defaults: {sandbox: {mode: all}}}", source="t.yaml")
async def call():
    async with Orchestrator(config, backend=FakeBackend()) as orch:
        await orch.session("agent:main:t").call("exec", {"command": "true"})
anyio.run(call)
print(len([l for l in lines if "tool_call_finished" in l]))
"""

SCRIPT_QUIET = (
    """
from loguru import logger
lines = []
logger.add(lines.append)
"""
    + CALL
)

SCRIPT_ENABLED_FIRST = (
    """
from loguru import logger
lines = []
logger.add(lines.append)
logger.enable("sandbox")  # the application decides before the library is used
"""
    + CALL
)


def run(script: str) -> str:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.mark.slow
def test_library_is_quiet_by_default() -> None:
    """Without the application enabling them, the library's log lines go nowhere."""
    assert run(SCRIPT_QUIET) == "0"


@pytest.mark.slow
def test_an_application_that_enabled_logs_first_keeps_them() -> None:
    """`logger.enable("sandbox")` before the library's first use is not undone by its loading."""
    assert run(SCRIPT_ENABLED_FIRST) == "1"


@pytest.mark.slow
def test_help_does_not_load_loguru() -> None:
    """`sandbox --help` never imports loguru (nothing logs)."""
    code = "import sys, runpy; sys.argv=['sandbox','--help']\ntry:\n runpy.run_module('sandbox', run_name='__main__')\nexcept SystemExit: pass\nprint('loguru' in sys.modules, file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().endswith("False"), done.stderr
