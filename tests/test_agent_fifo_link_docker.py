"""The agent's FIFO link in real sandboxes: each sandbox gets its own read-only, unlistable link
folder, its agents' frames bypass the engine's stream, nothing inside can plant or find a FIFO,
the folder goes with its sandbox (and prune sweeps a leftover one), an engine that cannot see the
folder costs only the link (the sandbox is made without it), and the audit knows the mount."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.audit.mount_rules import mounts as mount_findings
from sandbox.runtime import link_folders
from sandbox.runtime.agent import fifo_link
from sandbox.runtime.agent.fifo_link import INSIDE, FifoTransport, unwrapped
from sandbox.runtime.docker.agent_links import AgentLinkFolders
from sandbox.runtime.docker.agent_stream import DockerExecStream
from sandbox.runtime.naming import Labels
from tests.test_resident_agent_docker import config_for

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


async def linked_box(orch: Orchestrator, session: str) -> tuple[Any, Any]:
    """A session's sandbox after one command, and its agent's link."""
    sess = orch.session(session)
    result = await sess.call("exec", {"command": "true"})
    assert result.ok, result
    box: Any = await sess.sandbox()
    links = [link for (cid, _), link in box.backend.agents._links.items() if cid == box.id]
    return box, links[-1]  # the newest: this session's (with session users, one per session)


def on_the_stream(transport: Any) -> bool:
    """Whether an agent's frames go over the engine's exec stream (replayed or not), not FIFOs."""
    return not isinstance(transport, FifoTransport) and isinstance(unwrapped(transport), DockerExecStream)


def inspected(box: Any) -> dict[str, Any]:
    return dict(box.backend.client.api.inspect_container(box.id))


async def test_each_sandbox_gets_its_own_read_only_unlistable_folder_and_frames_bypass_the_engine(
    make_config: Any, tmp_path: Path
) -> None:
    async with Orchestrator(config_for(make_config)) as orch:
        box_a, link_a = await linked_box(orch, "agent:a:one")
        assert isinstance(link_a.transport, FifoTransport)
        doc = inspected(box_a)
        folder = doc["Config"]["Labels"][Labels.AGENT_LINK]
        (mount,) = [m for m in doc["Mounts"] if m["Destination"] == INSIDE]
        assert mount["Source"] == folder and mount["RW"] is False
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o711 and os.listdir(folder) == []

        sess = orch.session("agent:a:one")
        attack = (
            f"ls {INSIDE} 2>&1; touch {INSIDE}/x 2>&1; mkfifo {INSIDE}/y.up 2>&1; ln -s /etc {INSIDE}/z 2>&1; echo done"
        )
        out = (await sess.call("exec", {"command": attack})).output["output"]
        assert "Permission denied" in out and out.count("Read-only file system") == 3 and "done" in out, out
        assert os.listdir(folder) == []  # nothing planted

        # another tenant's sandbox: a folder of its own, never the first one's
        config_b = config_for(make_config, extra=", scope: session")
        async with Orchestrator(config_b) as orch_b:
            box_b, link_b = await linked_box(orch_b, "agent:a:two")
            assert isinstance(link_b.transport, FifoTransport)
            folder_b = inspected(box_b)["Config"]["Labels"][Labels.AGENT_LINK]
            assert folder_b != folder
            assert [m["Source"] for m in inspected(box_b)["Mounts"] if m["Destination"] == INSIDE] == [folder_b]
            await orch_b.manager.remove((await orch_b.manager.list())[0])
        assert not os.path.exists(folder_b)  # removed with its sandbox

        # the audit knows the mount: no finding for it as made; a listable folder is one
        assert mount_findings(doc, "t") == []
        os.chmod(folder, 0o755)
        try:
            (finding,) = mount_findings(doc, "t")
            assert finding.rule == "SBX-M009" and "755" in finding.evidence
        finally:
            os.chmod(folder, 0o711)


async def test_a_session_user_cannot_open_another_sessions_fifos_even_by_name(
    make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions with uids of their own in one sandbox. Each agent's FIFOs are its uid's, mode
    0600, and unlinked once open; here they are left in place (the unlink is skipped) and their
    names handed to the other session, which still cannot open them, nor the agent's fds."""
    kept: list[Path] = []
    monkeypatch.setattr(fifo_link, "_unlink", lambda paths: kept.extend(paths))
    config = config_for(make_config, extra=", session_users: true")
    async with Orchestrator(config) as orch:
        _, first = await linked_box(orch, "agent:a:one")
        _, second = await linked_box(orch, "agent:a:two")
        assert second is not first and second.user != first.user
        assert isinstance(first.transport, FifoTransport) and isinstance(second.transport, FifoTransport)
        theirs = [p for p in kept if str(second.user).split(":")[0] == str(p.stat().st_uid)]
        assert len(theirs) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in theirs)
        names = " ".join(f"{INSIDE}/{p.name}" for p in theirs)
        probe = (
            f"for f in {names}; do (exec 3<>$f) 2>&1 | grep -c 'Permission denied'; done; "
            f"for fd in /proc/{second.agent_pid}/fd/*; do (exec 3<>$fd) 2>/dev/null && echo OPENED $fd; done; "
            "echo probed"
        )
        out = (await orch.session("agent:a:one").call("exec", {"command": probe})).output["output"]
        assert out.split() == ["1", "1", "probed"], out
        assert (await orch.session("agent:a:two").call("exec", {"command": "echo alive"})).output["output"] == "alive\n"


async def test_without_the_link_the_agent_keeps_the_stream(make_config: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(link_folders.OFF_ENV, "stream")
    async with Orchestrator(config_for(make_config)) as orch:
        box, link = await linked_box(orch, "agent:a:s")
        assert on_the_stream(link.transport)
        assert Labels.AGENT_LINK not in inspected(box)["Config"]["Labels"]
        assert not [m for m in inspected(box)["Mounts"] if m["Destination"] == INSIDE]
    # a sandbox made without a folder keeps the stream when a later process could link
    monkeypatch.delenv(link_folders.OFF_ENV)
    async with Orchestrator(config_for(make_config)) as orch:
        again, link = await linked_box(orch, "agent:a:s")
        assert again.id == box.id and on_the_stream(link.transport)


async def test_an_engine_that_cannot_see_the_folder_costs_only_the_link(
    make_config: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The folder exists here but not where the engine looks (compose's named volume, a remote
    engine): the bind is refused, the sandbox is made without it, and later ones get none."""
    elsewhere = tmp_path / "elsewhere" / "agent-links"

    async def not_on_the_engines_host(self: AgentLinkFolders, spec: Any) -> str:
        return str(elsewhere / "0123456789abcdef0123456789abcdef")  # never made

    monkeypatch.setattr(AgentLinkFolders, "new_folder", not_on_the_engines_host)
    async with Orchestrator(config_for(make_config)) as orch:
        box, link = await linked_box(orch, "agent:a:far")
        assert on_the_stream(link.transport)
        assert Labels.AGENT_LINK not in inspected(box)["Config"]["Labels"]
        assert box.backend.links.refusal == "the engine does not see this process's state dir at the same path"


async def test_prune_sweeps_a_leftover_folder_and_keeps_live_ones(make_config: Any, tmp_path: Path) -> None:
    config = config_for(make_config)
    async with Orchestrator(config) as orch:
        box, _ = await linked_box(orch, "agent:a:p")
        live = inspected(box)["Config"]["Labels"][Labels.AGENT_LINK]
        root = Path(live).parent
        old = link_folders.make(str(root))  # what a crash between mkdir and create leaves
        young = link_folders.make(str(root))  # what a creation in progress has made
        os.mkfifo(old / "left.up")
        past = time.time() - link_folders.SWEEP_AFTER_S - 60
        for path in (live, old):
            os.utime(path, (past, past))
        removed = await orch.manager.cleanup_orphans()
        assert str(old) in removed and not old.exists()
        assert os.path.isdir(live) and young.is_dir()
        assert (await orch.session("agent:a:p").call("exec", {"command": "echo still"})).output["output"] == "still\n"


async def test_garbage_on_a_linked_agents_stdout_reaches_no_frame(make_config: Any) -> None:
    """Once linked, the agent's stdout (the engine's stream) is only its life line: what the
    sandbox writes there is no frame, so the call that wrote it ends normally on the same agent."""
    async with Orchestrator(config_for(make_config)) as orch:
        sess = orch.session("agent:a:g")
        _, link = await linked_box(orch, "agent:a:g")
        assert isinstance(link.transport, FifoTransport)
        forged = 'printf \'\\000\\000\\000\\022\\000\\000\\000\\000{"t":"boom","id":1}\' > /proc/$PPID/fd/1'
        result = await sess.call("exec", {"command": f"{forged}; head -c 300000 /dev/zero > /proc/$PPID/fd/1; echo ok"})
        assert result.ok and result.output["output"] == "ok\n", result
        assert link.dead is None and (await sess.call("exec", {"command": "echo $PPID"})).output["output"] == (
            f"{link.agent_pid}\n"
        )


async def test_a_restarted_orchestrator_links_the_agents_of_a_sandbox_it_finds(make_config: Any) -> None:
    """The folder is read back from the container's mounts (not from a label, which an image can
    carry): a new process on the same state dir finds the sandbox and links its new agent."""
    async with Orchestrator(config_for(make_config)) as orch:
        box, link = await linked_box(orch, "agent:a:r")
        assert isinstance(link.transport, FifoTransport)
    async with Orchestrator(config_for(make_config)) as orch:
        again, link = await linked_box(orch, "agent:a:r")
        assert again.id == box.id and isinstance(link.transport, FifoTransport)
