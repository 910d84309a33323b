"""A command ended by SIGKILL that its own timeout did not send: what the exec tools say of it."""

from __future__ import annotations

from typing import Any

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.context import ToolContext

# a command ended by SIGKILL: 128 + 9 from a shell (in a sandbox); -9 from a process group run
# directly on the host (Python reports the signal as a negative code)
KILLED_EXITS = frozenset({128 + 9, -9})


def killed_error(ctx: ToolContext, body: dict[str, Any]) -> SandboxError:
    """A command ended by SIGKILL that its own timeout did not send was killed from outside: the
    out-of-memory killer at the sandbox's memory limit, far more often than not, or another
    orchestrator process (recovery, a session closed elsewhere). Never `ok`: what it printed and
    its exit code ride along as the failed result's output."""
    memory = ctx.agent.sandbox.docker.memory if ctx.sandboxed else None
    limit = f" ({ctx.agent.key_path}.sandbox.docker.memory is {memory})" if memory else ""
    return SandboxError(
        ErrorCode.KILLED,
        f"the command was killed from outside (SIGKILL, exit {body['exit_code']}) before it finished: most often it "
        f"used more memory than the sandbox has{limit}; use less (smaller inputs, streaming) or "
        "ask for a larger limit. What it printed and its exit code are in the output",
        output=body,
    )
