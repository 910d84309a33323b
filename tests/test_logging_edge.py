"""The library's logs: quiet by default, the application's choice kept, loguru loaded only when used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# a crash logged the way the executor logs one (`logger.exception("tool_call_crashed")`), in a
# frame holding a call's arguments, through the CLI's own sink
SCRIPT_CRASH = """
from sandbox._edge import want_logging
want_logging("INFO", serialize=False)
from sandbox._log import logger
def handler(arguments):
    content = arguments["content"]
    return content.encode("ascii")
try:
    handler({"content": "export API_TOKEN=" + "hun" + "ter2hun" + "ter2 \\u00e9"})  # not in the source text
except Exception:
    logger.exception("tool_call_crashed")
"""


def test_a_crash_logged_by_the_cli_shows_where_not_the_arguments_it_held(tmp_path: Path) -> None:
    """loguru's default sink annotates each frame of a traceback with its variables' values: a
    crash in a handler would print the call's arguments, secrets and all, to the service's log."""
    script = tmp_path / "crash.py"  # a file: loguru annotates only frames whose source it can read
    script.write_text(SCRIPT_CRASH)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    assert "tool_call_crashed" in run.stderr and "UnicodeEncodeError" in run.stderr and "handler" in run.stderr
    assert "hunter2" not in run.stderr
