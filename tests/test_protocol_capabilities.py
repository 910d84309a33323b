"""Capabilities a backend may lack are typed parts of the protocol, asked for, never probed
(STYLE rule 17): the engine calls `Backend.browsers()`, `Backend.egress()`,
`Sandbox.agent_link()` and `Sandbox.volume_folder()`, and None means absent."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox import Orchestrator, load_config_text
from sandbox.errors import ErrorCode, SandboxError
from sandbox.journal.store import Journal
from sandbox.runtime.host.backend import HostBackend
from sandbox.runtime.manager import SandboxManager
from sandbox.runtime.protocol import SandboxInfo
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
