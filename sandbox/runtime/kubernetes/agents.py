"""Resident agents in Pods: started over `pods/exec` websockets (an AgentStarter, runtime/agent).

Exec cannot choose a user under Pod Security `restricted` (no `runAsUser` per exec), so a
session with a uid of its own gets a Pod of its own; asking this starter for another user is
refused, never run as the Pod's user instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import anyio

from sandbox.runtime.agent.fifo_link import wants_link
from sandbox.runtime.agent.link import AgentLink, AgentUnavailable
from sandbox.runtime.agent.transport import AgentTransport
from sandbox.runtime.kubernetes.exec_ws import ExecTransport, exec_url, open_exec
from sandbox.runtime.kubernetes.portforward import open_forward, portforward_url


class PodExecStarter:
    """Starts agents in the Pods of one namespace through the API server.

    Args:
        session: the HTTP session (its connector carries the cluster's TLS settings).
        api_url: the API server's base URL.
        namespace: the Pods' namespace, or what gives a Pod's namespace from its name.
        headers: the authorization headers of the orchestrator's identity, or what gives them
            afresh for each new stream (tokens that are refreshed).
        image_labels: what the sandbox images say of themselves (the agent's path), by image.
        heartbeat_s: websocket pings (`runtime.kubernetes.exec_heartbeat_s`).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api_url: str,
        namespace: str | Callable[[str], str],
        *,
        headers: Mapping[str, str] | Callable[[], Awaitable[Mapping[str, str]]] | None = None,
        image_labels: Mapping[str, Mapping[str, str]] | None = None,
        heartbeat_s: float = 30.0,
        ssl: Any = None,
    ) -> None:
        self._session = session
        self._api = api_url
        self._namespace = namespace
        self._headers = headers or {}
        self._labels = {image: dict(labels) for image, labels in (image_labels or {}).items()}
        self._heartbeat = heartbeat_s
        self._ssl = ssl

    async def image_labels(self, image: str) -> dict[str, str] | None:
        # a cluster pulls images itself: their labels are what the config said they carry
        labels = self._labels.get(image)
        return dict(labels) if labels is not None else None

    async def start(self, container_id: str, argv: list[str], user: str | None) -> ExecTransport:
        if user is not None:
            raise AgentUnavailable(
                f"exec cannot run as user {user!r} on Kubernetes (Pod Security restricted); "
                "a session with its own uid gets a Pod of its own"
            )
        if wants_link(argv):  # a Pod has no link folder: the agent keeps the exec stream
            argv = argv[:-1]
        namespace = self._namespace if isinstance(self._namespace, str) else self._namespace(container_id)
        url = exec_url(self._api, namespace, container_id, argv)
        headers = self._headers if isinstance(self._headers, Mapping) else await self._headers()
        return await open_exec(self._session, url, headers=headers, heartbeat_s=self._heartbeat, ssl=self._ssl)

    async def forward(self, pod: str, port: int) -> aiohttp.ClientWebSocketResponse:
        """One `pods/portforward` websocket to `port` of `pod` (kubernetes/portforward.py), with
        this starter's address, TLS and credentials."""
        namespace = self._namespace if isinstance(self._namespace, str) else self._namespace(pod)
        headers = self._headers if isinstance(self._headers, Mapping) else await self._headers()
        url = portforward_url(self._api, namespace, pod, port)
        return await open_forward(self._session, url, port, headers=headers, ssl=self._ssl)

    async def exec_once(self, container_id: str, argv: list[str], timeout_s: float) -> tuple[int | None, bytes]:
        """Run `argv` in the Pod on a `pods/exec` stream of its own, without the agent (what a
        kill falls back to when the agent's link is gone): (exit code, stdout). The exit code is
        None when the status never came (the stream cut, the time up).

        Raises:
            SandboxUnavailable: the exec was refused or could not be opened.
        """
        transport = await self.start(container_id, argv, None)
        out = bytearray()
        try:
            with anyio.move_on_after(timeout_s):
                await transport.close_stdin()  # v5; on v4 the command reads no stdin anyway
                while chunk := await transport.receive(1 << 16):
                    out += chunk[: max(0, (1 << 20) - len(out))]  # a kill's output is small: bounded
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ValueError, OSError, aiohttp.ClientError):
            return None, bytes(out)
        finally:
            transport.close()
        return transport.exit_code, bytes(out)

    async def kill(self, container_id: str, transport: AgentTransport) -> None:
        # the websocket's end closes the agent's stdin and it exits; a lying agent that stays is
        # killed with its Pod (the backend deletes a Pod whose agent will not answer)
        if isinstance(transport, ExecTransport):
            transport.close()


async def keep_alive(link: AgentLink, every_s: float) -> None:
    """Ping the agent every `every_s` seconds while its link lives: on a cluster the kubelet cuts
    a stream that carries nothing for its idle timeout (4 h by default, 5 min under CIS), and a
    ping is a frame each way. Returns when the link dies."""
    while link.dead is None:
        await anyio.sleep(every_s)
        with contextlib.suppress(AgentUnavailable):
            await link.ping()
