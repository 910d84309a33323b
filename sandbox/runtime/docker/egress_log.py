"""The egress proxies' request lines, into the journal (`sandbox logs`, `GET /v1/logs`).

A proxy prints one JSON line per request; they are copied into the journal after each call of an
egress session, before its sandbox is removed, and when `sandbox logs` runs. Each proxy
incarnation is one pseudo call (`egress:<proxy id>`) whose notes are numbered, so a line is
journaled once even when two processes collect at the same time. The session of a line is the
sandbox's session (session scope) or its scope key (agent and shared scope: the proxy cannot
tell which of the sessions sharing the sandbox sent a request).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import docker.errors

from sandbox._log import logger
from sandbox.runtime.bounded import remember
from sandbox.runtime.docker import egress
from sandbox.runtime.egress_lines import journal_lines, parse_lines
from sandbox.runtime.naming import Labels

if TYPE_CHECKING:
    from sandbox.journal.store import Journal
    from sandbox.runtime.docker.backend import DockerBackend


def collect_sync(journal: Journal, client: Any, sandbox_name: str) -> int:
    """Copy a sandbox's new proxy lines into the journal; the number copied. Blocking."""
    try:
        attrs = client.api.inspect_container(egress.names(sandbox_name).proxy)
    except docker.errors.NotFound:
        return 0
    labels = attrs["Config"].get("Labels") or {}
    call_id = f"egress:{str(attrs['Id'])[:16]}"
    session = str(labels.get(Labels.SESSION) or labels.get(Labels.SCOPE_KEY, ""))
    after = journal.last_note(call_id)
    since = _read_up_to.get(call_id, 0)
    lines = read_lines(client, attrs["Id"], after, since=max(0, since - 2))
    owner = {
        "session": session,
        "tenant": str(labels.get(Labels.TENANT, "")),
        "agent": str(labels.get(Labels.AGENT, "")),
    }
    journal_lines(journal, call_id, owner, lines, after=after, gaps=True)
    if lines:
        remember(_read_up_to, call_id, int(float(lines[-1].get("ts", 0.0))))
    return len(lines)


# proxy -> the time of the last line collected here: the next read asks the engine only for what
# came after (with a little overlap; numbers keep lines from being journaled twice). Bounded: a
# proxy forgotten is read from its start again, and the journal's last note skips what it has.
_read_up_to: OrderedDict[str, int] = OrderedDict()


async def collect(journal: Journal | None, client: Any, sandbox_name: str) -> int:
    """:func:`collect_sync` off the event loop; a failure is logged, never raised (logs are a side job)."""
    if journal is None:
        return 0
    try:
        return await anyio.to_thread.run_sync(collect_sync, journal, client, sandbox_name)
    except Exception as exc:
        logger.bind(sandbox=sandbox_name, error=str(exc)).warning("egress_log_collect_failed")
        return 0


def collect_instance(journal: Journal, client: Any, instance: str) -> int:
    """Collect every live proxy of one orchestrator instance (what `sandbox logs` does first)."""
    filters = {"label": [f"{Labels.KIND}={egress.PROXY_KIND}", f"{Labels.INSTANCE}={instance}"]}
    total = 0
    for proxy in client.api.containers(all=True, filters=filters):
        sandbox_name = str((proxy.get("Labels") or {}).get(egress.SANDBOX_LABEL, ""))
        if sandbox_name:
            total += collect_sync(journal, client, sandbox_name)
    return total


def read_lines(client: Any, proxy: str, after: int, since: int = 0) -> list[dict[str, Any]]:
    """The proxy's request lines numbered above `after` (oldest first); blocking."""
    try:
        raw = client.api.logs(proxy, stdout=True, stderr=False, since=since or None)
    except docker.errors.NotFound:
        return []
    return parse_lines(raw, after)


class DockerEgressLogs:
    """The Docker backend's egress capability (`Backend.egress`, runtime/protocol.py)."""

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend

    async def collect(self, journal: Journal | None, sandbox_name: str) -> int:
        """:func:`collect` through the backend's client."""
        return await collect(journal, self._backend.client, sandbox_name)

    async def sweep(self, instance: str) -> list[str]:
        """Egress proxies and networks whose sandbox is gone, removed."""
        return await self._backend.sweep_egress(instance)
