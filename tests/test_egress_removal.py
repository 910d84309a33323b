"""An egress edge's removal takes each set of host rules away only with what it guards: a network
a container is still on keeps its bridge's rules (without them that container reaches the host)."""

from __future__ import annotations

import docker.errors
import pytest

from sandbox.runtime.docker import egress, hostfirewall


class StillAttached:
    """The engine's answers when the sandbox is still on its network: the proxy goes, the network stays."""

    class api:
        @staticmethod
        def remove_container(name: str, force: bool) -> None:
            raise docker.errors.NotFound("no such container")

        @staticmethod
        def remove_network(name: str) -> None:
            raise docker.errors.APIError("error while removing network: network has active endpoints")


class Gone(StillAttached):
    class api(StillAttached.api):
        @staticmethod
        def remove_network(name: str) -> None:
            return None


def watch_rules(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    removed: list[str] = []
    monkeypatch.setattr(hostfirewall, "remove_rules", lambda bridge: removed.append(f"bridge {bridge}"))
    monkeypatch.setattr(hostfirewall, "remove_tagged", lambda tag: removed.append(f"proxy {tag}"))
    monkeypatch.setattr(egress, "NETWORK_REMOVE_WAIT_S", 0)
    return removed


def test_a_network_still_in_use_keeps_its_bridge_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The removal fails (a container is still on the network): the bridge's rules stay, the
    gone proxy's go."""
    removed = watch_rules(monkeypatch)
    edge = egress.names("sbx-x-exec-agent-main-abc")
    with pytest.raises(docker.errors.APIError):
        egress.remove_edge(StillAttached(), "sbx-x-exec-agent-main-abc")
    assert removed == [f"proxy {edge.proxy}"]


def test_a_removed_network_takes_its_rules_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    removed = watch_rules(monkeypatch)
    edge = egress.names("sbx-x-exec-agent-main-abc")
    assert egress.remove_edge(Gone(), "sbx-x-exec-agent-main-abc")
    assert removed == [f"bridge {edge.bridge}", f"proxy {edge.proxy}"]
