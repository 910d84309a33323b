"""sandbox.client against a `sandbox serve` process whose agent runs sandboxed on the real engine:
an exec in the container, the sandbox listed, and gone after close."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.client import Client
from tests.service_helpers import TOKEN_A, serve_process, sha

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]


def test_a_sandboxed_exec_through_the_client(tmp_path: Path, instance: str) -> None:
    """The exec runs in the session's container (not the host); the client lists the sandbox, then closes it."""
    config = tmp_path / "sandbox.yaml"
    config.write_text(f"""
state_dir: {tmp_path / "state"}
instance: {instance}
tenants:
  - {{id: acme, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
agents:
  defaults: {{sandbox: {{mode: all, scope: session}}}}
  list:
    - {{id: alpha, tenant: acme, default: true}}
""")
    with serve_process(config) as (url, _proc), Client(url, TOKEN_A, timeout=120) as client:
        session = client.session("agent:alpha:boxed")
        result = session.call(
            "exec", {"command": f"echo inside > marker.txt; test -e {tmp_path} && echo host || echo contained"}
        )
        assert result.ok and result.output["output"].strip() == "contained", result  # the host's folders are not there
        assert session.explain().sandboxed
        [box] = client.sandboxes()
        assert box.agent == "alpha" and box.scope == "session" and box.status == "running"
        assert session.call("read", {"path": "marker.txt"}).output["content"] == "inside\n"
        assert session.close() == ["agent:alpha:boxed"]
        assert client.sandboxes() == []
