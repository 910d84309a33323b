"""Capabilities a backend may lack are typed parts of the protocol, asked for, never probed
(STYLE rule 17): the engine calls `Backend.browsers()`, `Backend.egress()`, `Backend.facts()`,
`Sandbox.agent_link()` and `Sandbox.volume_folder()`, and None means absent."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox import Orchestrator, load_config_text
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.store import Journal
from sandbox.runtime.docker.inspected import facts_from_container
from sandbox.runtime.host.backend import HostBackend
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.protocol import Backend, SandboxInfo
from sandbox.testing import FakeBackend


@dataclass
class _Egress:
    """What the manager handed the backend's egress capability."""

    collected: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)

    async def collect(self, journal: Journal | None, sandbox_name: str) -> int:
        self.collected.append(sandbox_name)
        return 3

    async def sweep(self, instance: str) -> list[str]:
        self.swept.append(instance)
        return ["proxy-gone"]


@dataclass
class _EgressBackend(FakeBackend):
    """A fake backend that offers egress logs (and has no `client`, which the manager once probed)."""

    logs: _Egress = field(default_factory=_Egress)

    def egress(self) -> _Egress:  # type: ignore[override]
        return self.logs


def _config(tmp_path: Path) -> object:
    text = f"state_dir: {tmp_path / 's'}\nagents: {{defaults: {{sandbox: {{mode: all}}}}}}"
    return load_config_text(text, source="t.yaml")


def test_backends_without_a_capability_say_none(tmp_path: Path) -> None:
    for backend in (FakeBackend(), HostBackend(tmp_path)):
        assert backend.browsers("i") is None
        assert backend.egress() is None


@pytest.mark.anyio
async def test_a_host_sandbox_has_no_container_facts(tmp_path: Path) -> None:
    """`Backend.facts` is None where there is no container to describe (the demo says so)."""
    backend: Backend = HostBackend(tmp_path)
    assert await backend.facts("sbx-anything") is None


def test_docker_facts_are_what_inspect_says() -> None:
    """A container's `docker inspect` becomes the neutral SandboxFacts, engine nulls as empty."""
    attrs = {
        "Name": "/sbx-i-exec-1",
        "Id": "0123456789abcdef",
        "Config": {"Image": "sandbox:latest", "User": "1000:1000"},
        "HostConfig": {
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": None,
            "ReadonlyRootfs": True,
            "PidsLimit": 256,
            "Memory": 2**30,
            "NanoCpus": 10**9,
            "Init": True,
        },
        "Mounts": [
            {"Type": "bind", "Source": "/srv/ws", "Destination": "/workspace", "RW": True},
            {"Type": "volume", "Source": "/var/lib/docker/volumes/v/_data", "Destination": "/data", "RW": False},
        ],
    }
    facts = facts_from_container(attrs)
    assert (facts.name, facts.id, facts.image, facts.user) == (
        "sbx-i-exec-1",
        attrs["Id"],
        "sandbox:latest",
        "1000:1000",
    )
    assert facts.cap_drop == ("ALL",) and facts.security_opt == () and facts.read_only_root
    assert (facts.pids_limit, facts.memory, facts.nano_cpus, facts.init) == (256, 2**30, 10**9, True)
    assert [(m.source, m.target, m.read_only, m.volume) for m in facts.mounts] == [
        ("/srv/ws", "/workspace", False, False),
        ("/var/lib/docker/volumes/v/_data", "/data", True, True),
    ]


@pytest.mark.anyio
async def test_the_manager_asks_the_backend_for_egress_logs(tmp_path: Path) -> None:
    backend = _EgressBackend()
    async with Orchestrator(_config(tmp_path), backend=backend) as orch:  # type: ignore[arg-type]
        manager = orch.manager
        manager.journal = orch.journal
        assert await manager.collect_egress("box-1") == (3 if orch.journal is not None else 0)
        assert "proxy-gone" in await manager.cleanup_orphans()
        assert backend.logs.swept == [manager.instance]


@pytest.mark.anyio
async def test_no_browsers_is_sandbox_unavailable_and_a_session_closes(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path), backend=FakeBackend()) as orch:  # type: ignore[arg-type]
        session = orch.session("agent:main:t")
        assert (await session.call("exec", {"command": "true"})).ok
        with pytest.raises(SandboxError) as info:
            await session.browser()
        assert info.value.code == ErrorCode.SANDBOX_UNAVAILABLE
        await session.close()


@pytest.mark.anyio
async def test_a_sandbox_without_an_agent_says_none(tmp_path: Path) -> None:
    async with Orchestrator(_config(tmp_path), backend=FakeBackend()) as orch:  # type: ignore[arg-type]
        box = await orch.session("agent:main:t").sandbox_required()
        assert await box.agent_link() is None
        assert await box.volume_folder() is None


class _Pool:
    """A warm pool that says every listed sandbox was claimed by session `s1`."""

    def wanted(self, spec: object) -> bool:
        return False  # sandboxes are made, not claimed

    def as_claimed(self, info: SandboxInfo) -> SandboxInfo:
        return dataclasses.replace(info, session="s1")


@dataclass
class _PoolBackend(FakeBackend):
    """A fake backend (not named "docker") that offers a warm pool."""

    made_for: list[object] = field(default_factory=list)

    def warm_pool(self, manager: object) -> _Pool:  # type: ignore[override]
        self.made_for.append(manager)
        return _Pool()


@pytest.mark.anyio
async def test_the_manager_takes_the_pool_the_backend_offers(tmp_path: Path) -> None:
    backend = _PoolBackend()
    async with Orchestrator(_config(tmp_path), backend=backend) as orch:  # type: ignore[arg-type]
        assert (await orch.session("agent:main:t").call("exec", {"command": "true"})).ok
        manager = orch.manager
        assert backend.made_for == [manager]
        listed = await manager.list()
        assert listed and all(info.session == "s1" for info in listed)
    assert SandboxManager(_config(tmp_path), FakeBackend()).pool is None  # type: ignore[arg-type]
