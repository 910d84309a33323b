"""The egress proxies' request lines on a cluster, into the journal (`sandbox logs`, `GET /v1/logs`).

On Docker each sandbox has a proxy of its own, so every line of it is that sandbox's. On a
cluster one proxy Deployment serves every sandbox of its policy in a tenant's namespace, so a
line is attributed by the address of the client that sent it (the addon writes it in `client`):
a sandbox's lines are those from its Pod's address since that Pod started. An address is its
Pod's alone while the Pod lives, and lines are collected after each call and before the Pod is
deleted, so an address reused by a later Pod never takes an earlier Pod's lines (those are older
than the later Pod's start). A session Pod with a uid of its own has its own address and its
own lines, journaled under its sandbox's session as well.

Each proxy Pod is one pseudo call whose notes are its line numbers, so a line is journaled once,
for the first sandbox Pod it is attributed to, whoever collects it and however often: a line an
earlier Pod sent is journaled as that Pod's before the Pod goes, so a later Pod given the same
address cannot take it. Only a line sent within the second a later Pod started (the API gives
start times in whole seconds), by a Pod whose lines were never collected (its orchestrator
died with it), could be taken by that later Pod. Numbers skipped are other sandboxes' lines,
not losses. Reading needs `get` on `pods/log` (tenant.py grants it where the
tenant has proxies). Proxies are the operator's objects (`sandbox k8s render`): nothing to sweep.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sandbox._log import logger
from sandbox.journal.store import Journal
from sandbox.runtime.egress_lines import journal_lines, parse_lines
from sandbox.runtime.kubernetes.names import K8sAnnotations, K8sLabels, label_value
from sandbox.runtime.kubernetes.proxy_secret import PROXY_KIND
from sandbox.runtime.naming import short_hash

if TYPE_CHECKING:
    from sandbox.runtime.kubernetes.backend import KubernetesBackend

PROXY_CONTAINER = "proxy"  # the container's name in the proxy Deployment (tenant.py)
LOG_LIMIT_BYTES = 8 * 1024 * 1024  # one read of one proxy's log; a cut read is read again, larger
GROWTH = 4
REMEMBERED_PAIRS = 4096
MAX_READS = 3  # 8, 32, then 128 MiB at most; past that the lines are noted lost, never skipped silently
OVERLAP_S = 2  # each read starts a little before the last line seen (numbers drop what repeats)


def _epoch(stamp: object) -> float | None:
    """An RFC 3339 time of the API as seconds, None when absent or unreadable."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp() if stamp else None
    except ValueError:
        return None


class KubernetesEgressLogs:
    """The Kubernetes backend's egress capability (`Backend.egress`, runtime/protocol.py)."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self._backend = backend
        # (proxy Pod, sandbox Pod) -> when its lines were last read: the next read starts there
        self._read_at: dict[tuple[str, str], float] = {}

    async def collect(self, journal: Journal | None, sandbox_name: str) -> int:
        """Copy the lines the sandbox's Pods sent through their proxy into the journal; how many.
        A failure is logged, never raised (logs are a side job of a call)."""
        if journal is None:
            return 0
        try:
            return await self._collect(journal, sandbox_name)
        except Exception as exc:
            logger.bind(sandbox=sandbox_name, error=str(exc)).warning("egress_log_collect_failed")
            return 0

    async def sweep(self, instance: str) -> list[str]:
        """Nothing: a cluster's proxies are the operator's, one per policy, not one per sandbox."""
        return []

    async def _collect(self, journal: Journal, sandbox_name: str) -> int:
        backend = self._backend
        namespace = backend._namespace_of.get(sandbox_name)
        if namespace is None:
            return 0
        api = await backend.api()
        pod = await backend.found_pod(namespace, sandbox_name)
        if pod is None:
            return 0
        digest = ((pod.get("metadata") or {}).get("labels") or {}).get(K8sLabels.EGRESS)
        if not digest:
            return 0
        pods = [pod, *await api.list("pods", namespace, f"{K8sLabels.USER_OF}={label_value(sandbox_name)}")]
        selector = f"{K8sLabels.KIND}={PROXY_KIND},{K8sLabels.EGRESS}={digest}"
        total = 0
        for proxy in await api.list("pods", namespace, selector):
            clients = [c for p in pods if (c := self._client(journal, proxy, p)) is not None]
            if not clients:
                continue
            since = min(c.since for c in clients)
            name = str((proxy.get("metadata") or {}).get("name"))
            read_at = time.time()
            limit = LOG_LIMIT_BYTES
            for _ in range(MAX_READS):  # the API pages logs by whole seconds only: a cut read is read again, larger
                raw = await api.log(
                    namespace, name, PROXY_CONTAINER, since_s=int(read_at - since) + 1, limit_bytes=limit
                )
                if len(raw) < limit:
                    break
                limit *= GROWTH
            for client in clients:
                total += self._journal(journal, raw, client)
            position = read_at
            if len(raw) >= limit:  # still cut: what came after is not read; said, never silent
                position = max((float(line.get("ts", 0.0)) for line in parse_lines(raw, 0)), default=read_at)
                logger.bind(proxy=name, namespace=namespace, read=len(raw)).warning("egress_log_cut")
                why = f"the proxy's log after {position:.0f} was too large to read at once; lines may be missing"
                for client in clients:  # numbered below zero: never a line's own number
                    journal.append_note(
                        ts=time.time(), call_id=client.call_id, tool="egress", seq=-int(position), **client.owner,
                        data={"verdict": "lost", "reason": why},
                    )  # fmt: skip
            for client in clients:
                self._read_at.pop(client.pair, None)  # re-inserted last: the oldest pairs go first
                self._read_at[client.pair] = max(position, client.started)
            while len(self._read_at) > REMEMBERED_PAIRS:  # Pods come and go; a forgotten pair reads from its start
                del self._read_at[next(iter(self._read_at))]
        return total

    def _client(self, journal: Journal, proxy: dict[str, Any], pod: dict[str, Any]) -> _Client | None:
        """What to look for of one sandbox Pod in one proxy Pod's log (None: it has no address yet)."""
        status = pod.get("status") or {}
        address, started = status.get("podIP"), _epoch(status.get("startTime"))
        if not address or started is None:
            return None
        meta = pod.get("metadata") or {}
        proxy_meta = proxy.get("metadata") or {}
        proxy_id = str(proxy_meta.get("uid") or f"{proxy_meta.get('name')}|{proxy_meta.get('creationTimestamp')}")
        pod_id = str(meta.get("uid") or f"{meta.get('name')}|{meta.get('creationTimestamp')}")
        call_id = f"egress:k8s-{short_hash(proxy_id, 16)}"
        annotations = meta.get("annotations") or {}
        owner = {
            "session": str(annotations.get(K8sAnnotations.SESSION) or annotations.get(K8sAnnotations.SCOPE_KEY) or ""),
            "tenant": str(annotations.get(K8sAnnotations.TENANT, "")),
            "agent": str((meta.get("labels") or {}).get(K8sLabels.AGENT, "")),
        }
        since = max(self._read_at.get((proxy_id, pod_id), started), started) - OVERLAP_S
        return _Client(call_id, (proxy_id, pod_id), str(address), started, since, owner)

    def _journal(self, journal: Journal, raw: bytes, client: _Client) -> int:
        """The Pod's lines in what was read, each journaled unless the proxy's number is there already."""
        lines = [
            line
            for line in parse_lines(raw, 0)
            if line.get("client") == client.address and float(line.get("ts", 0.0)) >= client.started
        ]
        journal_lines(journal, client.call_id, client.owner, lines, after=0, gaps=False)
        return len(lines)


@dataclass(frozen=True)
class _Client:
    """One sandbox Pod as a client of one proxy Pod."""

    call_id: str  # the proxy Pod's pseudo call
    pair: tuple[str, str]  # (proxy Pod, sandbox Pod)
    address: str
    started: float
    since: float  # where to start reading the proxy's log
    owner: dict[str, str]
