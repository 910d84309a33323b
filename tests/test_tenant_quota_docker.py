"""tenants[].quotas.max_workspace_bytes against the real engine: one tenant's sessions share one
disk budget, a command that passes it is stopped, the file tools refuse to grow past it, and
another tenant's budget is its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox import Orchestrator
from sandbox.errors import ErrorCode

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]

CONFIG = """
tenants:
  - {id: acme, quotas: {max_workspace_bytes: 24m}}
  - {id: globex, quotas: {max_workspace_bytes: 24m}}
agents:
  defaults: {sandbox: {mode: all, scope: session, workspace_quota: 1g}}
  list:
    - {id: coder, tenant: acme}
    - {id: other, tenant: globex}
"""

FILL_16M = "head -c 16777216 /dev/zero > big && echo wrote"
# 1 MiB every 50 ms: the measurement (every second, the tenant's through a 2 s cache) stops it early
FILL_SLOWLY = "for i in $(seq 200); do head -c 1048576 /dev/zero > f$i; sleep 0.05; done; echo done"


async def test_sessions_of_a_tenant_share_its_disk_budget(make_config: Any) -> None:
    config = make_config(CONFIG)
    async with Orchestrator(config) as orch:
        first = orch.session("agent:coder:one")
        second = orch.session("agent:coder:two")
        outsider = orch.session("agent:other:one")
        wrote = await first.call("exec", {"command": FILL_16M})
        assert wrote.ok and wrote.output["exit_code"] == 0, wrote

        # the second session's own workspace is empty, but the tenant holds 16 of 24 MiB
        stopped = await second.call("exec", {"command": FILL_SLOWLY, "timeout_s": 120})
        assert stopped.error is not None and stopped.error.code == ErrorCode.QUOTA_EXCEEDED, stopped
        assert "tenants[0].quotas.max_workspace_bytes" in stopped.error.message
        assert "tenant 'acme'" in stopped.error.message

        refused = await second.call("write", {"path": "more.txt", "content": "x" * 9_000_000})
        assert refused.error is not None and refused.error.code == ErrorCode.QUOTA_EXCEEDED, refused
        listing = await second.call("exec", {"command": "ls more.txt 2>&1; true"})
        assert "No such file" in listing.output["output"]

        # another tenant's budget is its own: the same 16 MiB fits there
        theirs = await outsider.call("exec", {"command": FILL_16M})
        assert theirs.ok and theirs.output["exit_code"] == 0, theirs

        # freeing space in one session makes room in the other
        assert (await first.call("exec", {"command": "rm -f big"})).ok
        assert (await second.call("exec", {"command": "rm -f f*"})).ok
        again = await second.call("write", {"path": "more.txt", "content": "x" * 9_000_000})
        assert again.ok, again


async def test_saved_outputs_stay_within_the_tenant_and_the_workspace_quota(make_config: Any, tmp_path: Any) -> None:
    """A long output of a session whose workspace is read-only is not kept (nowhere the tenant can
    read it); a cut output copied into a workspace counts toward its quota, and past it the call
    still succeeds with a warning."""
    from sandbox.runtime.output import capture_folder

    ws = tmp_path / "ro-ws"
    ws.mkdir()
    config = make_config(
        f"""
tenants: [{{id: acme}}, {{id: globex}}]
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: reader, tenant: acme, workspace: "{ws}", sandbox: {{workspace_access: ro}}}}
    - {{id: tight, tenant: globex, sandbox: {{workspace_quota: 100k}}}}
"""
    )
    async with Orchestrator(config) as orch:
        long = await orch.session("agent:reader:s").call("exec", {"command": "head -c 3000000 /dev/zero | tr '\\0' x"})
        # a read-only workspace keeps no full output, and nothing of it stays in the state dir
        assert long.ok and long.truncated and long.full_output_path is None, long
        assert "read-only" in long.output["note"], long.output
        assert not any(capture_folder(config.state_dir, "acme").glob("*"))
        cut = await orch.session("agent:tight:s").call("exec", {"command": "head -c 200000 /dev/zero | tr '\\0' y"})
        assert cut.ok and cut.truncated and cut.full_output_path is None, cut
        assert any("could not be saved" in w and "quota" in w for w in cut.warnings), cut.warnings
        spec = orch.manager.spec_for(orch.session("agent:tight:s").agent, "agent:tight:s")
        assert not (Path(spec.workspace.source) / ".sandbox" / "outputs" / f"{cut.call_id}.txt").exists()
