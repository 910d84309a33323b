"""What counts as an idle sandbox's own process when deciding whether it works (docker/freeze.py):
exact command lines, so a process whose name merely contains an agent's or init's is work."""

from __future__ import annotations

import pytest

from sandbox.runtime.docker.freeze import _idle_process


@pytest.mark.parametrize(
    "args",
    [
        "/sbin/docker-init -- /usr/bin/tini -- sleep infinity",
        "/usr/bin/tini -- sleep infinity",
        "sleep infinity",
        "/usr/bin/python3 -I -S /usr/local/lib/sandbox-agent/agent.pyc",
        "/usr/bin/python3 -I -S /usr/local/lib/sandbox-agent/agent.pyc --link",
        "/usr/bin/python3 -I -S /usr/local/lib/sandbox-agent/agent.py",
        "python3 -I -S /opt/sandbox-agent/agent.py",
    ],
)
def test_the_sandbox_s_own_processes_are_idle(args: str) -> None:
    assert _idle_process(args)


@pytest.mark.parametrize(
    "args",
    [
        "python my_agent.py",
        "python3 /workspace/agent.py",
        "python3 /workspace/agent.pyc",
        "martini",
        "sleep infinity && make",
        "sh -c sleep infinity; curl x",
        "node /usr/local/lib/sandbox-agent/agent.py",
        "",
    ],
)
def test_anything_else_is_work(args: str) -> None:
    assert not _idle_process(args)
