"""One error root with stable, model-facing codes.

Every error the library raises on purpose is a :class:`SandboxError` and carries an
:class:`ErrorCode`. The CLI exit code and the HTTP status of a code come from the single table
below, so the three views never disagree; the one exception is the usage family
(:class:`ConfigError`, :class:`UsageError`: INVALID_ARGUMENTS, but exit code 2, the Unix
convention for "you asked wrongly"), whose exit code is :data:`USAGE_EXIT_CODE`.
"""

from __future__ import annotations

import errno
import sys
from enum import StrEnum
from pathlib import Path
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


class PortUnreachable(SandboxUnavailable):
    """A sandbox's loopback port cannot be reached for a preview (runtime/agent/ports.py).

    `why`: busy (too many connections), not_listening, not_accepting (its backlog is full),
    not_owner (the server runs as another user), no_relay (an agent too old to carry ports),
    closed (the server closed it)."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message, why=why)
        self.why = why


class BindRefused(SandboxError):
    """A bind mount was refused by a validation rule."""

    def __init__(self, message: str, *, rule: str, path: str, fix: str) -> None:
        super().__init__(ErrorCode.PERMISSION_DENIED, message, rule=rule, path=path, fix=fix)
        self.rule = rule
        self.path = path
        self.fix = fix


class StateError(SandboxError):
    """A file the orchestrator keeps in its state dir is damaged or cannot be read. It is never
    replaced silently (a new instance id would orphan every container of the old one; a new token
    file would lose every stored token): the message names the file and the fix.

    Code INTERNAL (nothing a caller can retry; the operator has to act).

    Args:
        message: what is wrong with the file.
        path: the file.
        fix: what the operator can do.
    """

    def __init__(self, message: str, path: Path, fix: str) -> None:
        super().__init__(ErrorCode.INTERNAL, f"{message}; fix: {fix}", path=str(path), fix=fix)
        self.path = path
        self.fix = fix


# SQLite's primary result code for "database or disk is full"; sqlite3 itself is not imported
# here (a CLI start does not pay for it): its exceptions exist only once it is loaded
SQLITE_FULL = 13
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
FULL_DISK_HINT = "the disk is full (no space left on the device); retry once space is freed"


def out_of_space(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says that a disk (or a disk quota) is
    full: ENOSPC or EDQUOT from the OS, SQLITE_FULL from SQLite."""
    sqlite3 = sys.modules.get("sqlite3")
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if sqlite3 is not None and isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)  # set only on errors the library reported
            if isinstance(code, int) and code & 0xFF == SQLITE_FULL:
                return True
        exc = exc.__cause__ or exc.__context__
    return False


def storage_error(exc: BaseException, what: str) -> SandboxError:
    """The error for a state-dir write that failed with `exc`: SERVICE_UNAVAILABLE (retryable)
    when the disk is full, else INTERNAL. `what` says what could not be done."""
    if out_of_space(exc):
        return SandboxError(ErrorCode.SERVICE_UNAVAILABLE, f"{what}: {FULL_DISK_HINT}")
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return SandboxError(ErrorCode.INTERNAL, f"{what} ({reason})")


def unavailable_when_full(exc: BaseException) -> SandboxError:
    """A call's failure as the caller sees it: an INTERNAL error (or a foreign exception) that
    comes from a full disk is SERVICE_UNAVAILABLE, which is retryable, since the same call
    succeeds once space is freed; every other SandboxError keeps its own code (a full disk
    under a workspace stays QUOTA_EXCEEDED), every other foreign exception is INTERNAL.

    SERVICE_UNAVAILABLE, not SANDBOX_UNAVAILABLE: the disk is the service's own storage (the
    journal, the state dir), not the container engine, whose failures exit 3 in the CLI.
    """
    if isinstance(exc, SandboxError) and exc.code != ErrorCode.INTERNAL:
        return exc
    if out_of_space(exc):
        # a fixed text: the original names state-dir files, and no result hands a tenant a host path
        return SandboxError(ErrorCode.SERVICE_UNAVAILABLE, f"the service could not record the call: {FULL_DISK_HINT}")
    if isinstance(exc, SandboxError):
        return exc
    return SandboxError(ErrorCode.INTERNAL, f"internal error ({exc.__class__.__name__})")


NOT_RECORDED = "the service could not record the call, so it was not run (the operator's log says why)"


def unrecorded(exc: SandboxError) -> SandboxError:
    """A call the journal could not record, as its caller sees it: a full disk is retryable
    (unavailable_when_full); any other INTERNAL reason is the operator's to read, never the
    tenant's (it names files under the state dir and the database's own words)."""
    mapped = unavailable_when_full(exc)
    return SandboxError(ErrorCode.INTERNAL, NOT_RECORDED) if mapped.code == ErrorCode.INTERNAL else mapped
