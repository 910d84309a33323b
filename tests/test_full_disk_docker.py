"""A full state-dir disk with real sandboxes: calls in a live sandbox, and a session whose sandbox
must be made, are refused with a retryable code, and all works again once space is freed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from tests.test_full_disk import fill, intact_journal, small_disk

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]
__all__ = ["small_disk"]  # the fixture, used by name


async def test_sandboxed_calls_on_a_full_disk_are_retryable(make_config: Any, tmp_path: Path, small_disk: Path) -> None:
    """With the state dir's disk full (the workspaces elsewhere: a full workspace disk is
    QUOTA_EXCEEDED by design), a call in a live sandbox and the first call of a new session are
    SERVICE_UNAVAILABLE and retryable; freed, both sessions work and the journal is intact."""
    config = make_config(
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, workspace_root: {tmp_path / 'scratch'}}}}}}}",
        state=small_disk,
    )
    async with Orchestrator(config) as orch:
        live = orch.session("agent:main:live")
        assert (await live.call("exec", {"command": "echo up"})).ok
        filler = fill(small_disk)
        refused = [
            await live.call("exec", {"command": "echo again"}),
            await orch.session("agent:main:new").call("exec", {"command": "echo new"}),
        ]
        filler.unlink()
        freed = [
            await live.call("exec", {"command": "echo again"}),
            await orch.session("agent:main:new").call("exec", {"command": "echo new"}),
        ]
        await orch.session("agent:main:new").close()
        await live.close()
    for result in refused:
        assert result.error is not None and result.error.code == "SERVICE_UNAVAILABLE", result
        assert result.error.retryable
    assert [r.ok for r in freed] == [True, True], freed
    assert intact_journal(small_disk).count("finished") == 3
