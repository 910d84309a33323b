"""Running the `sandbox` CLI the way a user does: its arguments, its output, its exit code.

By default the CLI runs in this process (click's test runner, in a thread of its own so that its
`anyio.run` never meets a test's event loop), which keeps the quick tier quick. Tests whose claim
is about separate processes (state shared through the journal, races between deciders, what a
killed process leaves) pass `process=True` and get a real `python -m sandbox`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CWD_LOCK = threading.Lock()  # the runner changes the process's cwd and stdio while it runs


def run_cli(
    *args: str,
    config: Path | None = None,
    timeout: float = 300,
    process: bool = False,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`sandbox [--config FILE] ARGS...` from the repo root; output captured as text."""
    prefix = ["--config", str(config)] if config is not None else []
    argv = [*prefix, *args]
    if process:
        return subprocess.run(
            [sys.executable, "-m", "sandbox", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            input=input,
        )
    return _in_process(argv, input, timeout)


def _in_process(argv: list[str], stdin: str | None, timeout: float) -> subprocess.CompletedProcess[str]:
    from click.testing import CliRunner
    from loguru import logger

    from sandbox.cli import main

    outcome: dict[str, object] = {}

    def invoke() -> None:
        outcome["result"] = CliRunner().invoke(main, argv, input=stdin, prog_name="sandbox")

    with _CWD_LOCK:
        previous = os.getcwd()
        os.chdir(ROOT)
        try:
            worker = threading.Thread(target=invoke, daemon=True)
            worker.start()
            worker.join(timeout)
        finally:
            os.chdir(previous)
            # the CLI set up its own log sink on a stream that is gone now; the library goes quiet again
            logger.remove()
            logger.disable("sandbox")
    if worker.is_alive():
        raise subprocess.TimeoutExpired(["sandbox", *argv], timeout)
    result = outcome["result"]
    exc = getattr(result, "exception", None)
    code = int(getattr(result, "exit_code", 1))
    stderr = str(getattr(result, "stderr", ""))
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback

        info = getattr(result, "exc_info", None)
        stderr += "".join(traceback.format_exception(*info)) if info else repr(exc)
    return subprocess.CompletedProcess(["sandbox", *argv], code, str(getattr(result, "stdout", "")), stderr)
