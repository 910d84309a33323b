"""One error root with stable, model-facing codes.

Every error the library raises on purpose is a :class:`SandboxError` and carries an
:class:`ErrorCode`. The CLI exit code and the HTTP status of a code come from the single table
below, so the three views never disagree; the one exception is the usage family
(:class:`ConfigError`, :class:`UsageError`: INVALID_ARGUMENTS, but exit code 2, the Unix
convention for "you asked wrongly"), whose exit code is :data:`USAGE_EXIT_CODE`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """The codes a model or a caller can act on (DESIGN.md, "Error codes")."""

    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    CONFLICT = "CONFLICT"
    TIMEOUT = "TIMEOUT"
    QUEUE_FULL = "QUEUE_FULL"
    QUEUE_TIMEOUT = "QUEUE_TIMEOUT"
    BLOCKED = "BLOCKED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_TIMEOUT = "APPROVAL_TIMEOUT"
    RATE_LIMITED = "RATE_LIMITED"
    NETWORK_ERROR = "NETWORK_ERROR"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
    RETRY_EXHAUSTED = "RETRY_EXHAUSTED"
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    KILLED = "KILLED"
    INTERNAL = "INTERNAL"


RETRYABLE_CODES = frozenset(
    {
        ErrorCode.TIMEOUT,
        ErrorCode.NETWORK_ERROR,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SERVICE_UNAVAILABLE,
        ErrorCode.SANDBOX_UNAVAILABLE,
        ErrorCode.QUEUE_TIMEOUT,
    }
)

# code -> (CLI exit code, HTTP status). Usage and config errors exit 2; a tool-level
# failure exits 1; the engine being unreachable is 3 so scripts can tell it apart.
_STATUS: dict[ErrorCode, tuple[int, int]] = {
    ErrorCode.TOOL_NOT_FOUND: (1, 404),
    ErrorCode.INVALID_ARGUMENTS: (1, 422),
    ErrorCode.PERMISSION_DENIED: (1, 403),
    ErrorCode.FILE_NOT_FOUND: (1, 404),
    ErrorCode.CONFLICT: (1, 409),
    ErrorCode.TIMEOUT: (1, 504),
    ErrorCode.QUEUE_FULL: (1, 429),
    ErrorCode.QUEUE_TIMEOUT: (1, 429),
    ErrorCode.BLOCKED: (1, 403),
    ErrorCode.APPROVAL_DENIED: (1, 403),
    ErrorCode.APPROVAL_TIMEOUT: (1, 408),
    ErrorCode.RATE_LIMITED: (1, 429),
    ErrorCode.NETWORK_ERROR: (1, 502),
    ErrorCode.SERVICE_UNAVAILABLE: (1, 503),
    ErrorCode.SANDBOX_UNAVAILABLE: (3, 503),
    ErrorCode.RETRY_EXHAUSTED: (1, 503),
    ErrorCode.QUOTA_EXCEEDED: (1, 507),
    ErrorCode.KILLED: (1, 500),
    ErrorCode.INTERNAL: (1, 500),
}

USAGE_EXIT_CODE = 2


def exit_code_for(code: ErrorCode) -> int:
    """Return the CLI exit code for an error code."""
    return _STATUS[code][0]


def http_status_for(code: ErrorCode) -> int:
    """Return the HTTP status for an error code."""
    return _STATUS[code][1]


class SandboxError(Exception):
    """Root of every error this library raises on purpose.

    Args:
        code: the stable code a model or caller can act on.
        message: one sentence saying what happened and what to do.
        **details: structured context (paths, names); never secrets.
    """

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def retryable(self) -> bool:
        """Whether retrying the same call may succeed."""
        return self.code in RETRYABLE_CODES

    @property
    def exit_code(self) -> int:
        """The CLI exit code for this error."""
        return exit_code_for(self.code)

    @property
    def http_status(self) -> int:
        """The HTTP status for this error."""
        return http_status_for(self.code)


class ConfigError(SandboxError):
    """The configuration is invalid; each problem names its key path.

    Code INVALID_ARGUMENTS; CLI exit code 2.

    Args:
        problems: one human-readable line per problem, already located.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENTS, "\n".join(problems), problems=problems)
        self.problems = problems

    @property
    def exit_code(self) -> int:
        """Exit code 2, like every usage error."""
        return USAGE_EXIT_CODE


class UsageError(SandboxError):
    """The caller asked for something that cannot mean anything (unknown agent, bad session key,
    bad flag). Code INVALID_ARGUMENTS; CLI exit code 2.

    Args:
        message: what was asked and why it cannot be done.
        **details: structured context (names); never secrets.
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENTS, message, **details)

    @property
    def exit_code(self) -> int:
        """Exit code 2, like every usage error."""
        return USAGE_EXIT_CODE


class SandboxUnavailable(SandboxError):
    """The container engine cannot be reached or refused to create the sandbox."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(ErrorCode.SANDBOX_UNAVAILABLE, message, **details)


class BindRefused(SandboxError):
    """A bind mount was refused by a validation rule."""

    def __init__(self, message: str, *, rule: str, path: str, fix: str) -> None:
        super().__init__(ErrorCode.PERMISSION_DENIED, message, rule=rule, path=path, fix=fix)
        self.rule = rule
        self.path = path
        self.fix = fix
