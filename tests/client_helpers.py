"""A `sandbox serve` process for the client's tests: three tenants, agents with sandboxing off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.service_helpers import TOKEN_A, TOKEN_B, serve_process, sha

TOKEN_L = "sbx_client-limited-token"


def service_yaml(tmp: Path, *, state: str = "state") -> str:
    """The config: acme (alpha, writes need approval), globex (beta), limited (2 calls a minute)."""
    return f"""
state_dir: {tmp / state}
tools: {{profile: full, approvals: {{require: [write], timeout_s: 60}}}}
tenants:
  - {{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}
  - {{id: globex, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_B)}}}]}}
  - {{id: limited, allow_unsandboxed: true, quotas: {{max_calls_per_minute: 2}}, tokens: [{{name: ci, sha256: {sha(TOKEN_L)}}}]}}
agents:
  defaults: {{sandbox: {{mode: 'off'}}}}
  list:
    - {{id: alpha, tenant: acme, workspace: "{tmp / "wa"}"}}
    - {{id: beta, tenant: globex, workspace: "{tmp / "wb"}"}}
    - {{id: delta, tenant: limited, workspace: "{tmp / "wd"}"}}
"""


@contextmanager
def client_service(tmp: Path) -> Iterator[str]:
    """`sandbox serve` over service_yaml in its own process on loopback; yields its base URL."""
    for folder in ("wa", "wb", "wd"):
        (tmp / folder).mkdir(exist_ok=True)
    path = tmp / "sandbox.yaml"
    path.write_text(service_yaml(tmp))
    with serve_process(path) as (url, _proc):
        yield url
