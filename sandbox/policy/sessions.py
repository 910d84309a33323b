"""Session keys: which agent a key belongs to, whether it is main, whether it was spawned."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.errors import UsageError


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
        UsageError: the key is empty or names a different agent.
    """
    key = raw.strip()
    if not key:
        raise UsageError("the session key is empty")
    if key.startswith("agent:"):
        _, _, tail = key.partition(":")
        owner, _, rest = tail.partition(":")
        if owner != agent:
            raise UsageError(f"session key {key!r} belongs to agent {owner!r}, not {agent!r}")
        if not rest:
            raise UsageError(f"session key {key!r} has nothing after the agent id")
        return SessionKey(raw=key, agent=owner, rest=rest)
    return SessionKey(raw=f"agent:{agent}:{key}", agent=agent, rest=key)


def agent_of(raw: str) -> str | None:
    """The agent id a key names (`agent:<id>:...`), or None."""
    if raw.startswith("agent:"):
        owner = raw.split(":", 2)[1]
        return owner or None
    return None
