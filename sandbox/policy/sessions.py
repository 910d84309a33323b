"""Session keys: which agent a key belongs to, whether it is main, whether it was spawned.

Keys are validated strictly wherever they enter (the API, the CLI, tool arguments): a key that
only looks like another once trimmed or case-folded (`" agent:x:main "`, `"main\\n"`) is refused,
never normalised into it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

from sandbox.errors import UsageError

MAX_KEY_LENGTH = 256
KEY_CHARSET = "A-Z a-z 0-9 and : . _ @ + -"
_KEY_CHARS = re.compile(r"[A-Za-z0-9:._@+-]+")


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid session key, or None when it is."""
    if not key:
        return "the session key is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"the session key is {len(key)} characters long; at most {MAX_KEY_LENGTH} are allowed"
    if not _KEY_CHARS.fullmatch(key):
        bad = next(c for c in key if not _KEY_CHARS.fullmatch(c))
        return f"the session key {key!r} contains {bad!r}; keys may use only {KEY_CHARSET}"
    if ".." in key:
        return f"the session key {key!r} contains '..'"
    if "" in key.split(":"):
        return f"the session key {key!r} has an empty segment (leading, trailing or doubled ':')"
    return None


def check_session_key(key: str) -> str:
    """Return `key` unchanged when valid.

    Raises:
        UsageError: naming the rule the key breaks.
    """
    problem = key_problem(key)
    if problem:
        raise UsageError(problem)
    return key


def _pydantic_check(key: str) -> str:
    problem = key_problem(key)
    if problem:
        raise ValueError(problem)
    return key


# For tool arguments that name a session: a bad key is INVALID_ARGUMENTS like any bad field.
SessionKeyArg = Annotated[str, AfterValidator(_pydantic_check)]


@dataclass(frozen=True)
class SessionKey:
    """A parsed session key (`agent:<id>:<rest>`; the main one is `agent:<id>:main`)."""

    raw: str
    agent: str
    rest: str

    @property
    def is_main(self) -> bool:
        """Whether this is the agent's main session."""
        return self.rest == "main"

    @property
    def spawn_depth(self) -> int:
        """How many `subagent:` hops separate this session from a top-level one."""
        return self.rest.split(":").count("subagent")


def parse_session_key(raw: str, agent: str) -> SessionKey:
    """Parse `raw` for `agent`; a key without the `agent:` prefix belongs to `agent`.

    Raises:
        UsageError: the key is not a valid key (see :func:`key_problem`), is too long once
            prefixed, or names a different agent.
    """
    key = check_session_key(raw)
    if key.startswith("agent:"):
        _, _, tail = key.partition(":")
        owner, _, rest = tail.partition(":")
        if owner != agent:
            raise UsageError(f"session key {key!r} belongs to agent {owner!r}, not {agent!r}")
        if not rest:
            raise UsageError(f"session key {key!r} has nothing after the agent id")
        return SessionKey(raw=key, agent=owner, rest=rest)
    full = check_session_key(f"agent:{agent}:{key}")
    return SessionKey(raw=full, agent=agent, rest=key)


def agent_of(raw: str) -> str | None:
    """The agent id a key names (`agent:<id>:...`), or None."""
    if raw.startswith("agent:"):
        owner = raw.split(":", 2)[1]
        return owner or None
    return None
