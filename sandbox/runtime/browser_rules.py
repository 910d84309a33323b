"""What every engine's browser sandbox obeys: when it may start, and the proxy policy it gets."""

from __future__ import annotations

from typing import Any

from sandbox.config.merge import EffectiveAgent
from sandbox.errors import ErrorCode, SandboxError
from sandbox.runtime.spec import EGRESS_NETWORK, egress_policy


def require_browser(agent: EffectiveAgent, browser_allowed: bool) -> None:
    """Refuse a browser the policy or the config does not enable.

    Raises:
        SandboxError: PERMISSION_DENIED, naming what would enable it.
    """
    if not browser_allowed:
        raise SandboxError(ErrorCode.PERMISSION_DENIED, "the browser tool is not allowed for this session")
    if not agent.sandbox.browser.enabled:
        raise SandboxError(
            ErrorCode.PERMISSION_DENIED,
            f"the browser sandbox is disabled; set {agent.key_path}.sandbox.browser.enabled: true",
        )


def browser_egress_policy(agent: EffectiveAgent) -> dict[str, Any] | None:
    """The browser's proxy policy (None: no network): the allowlist, never the secrets. The
    browser does not trust a decrypting proxy, and a second copy of a value is one more place it
    could leak from."""
    if agent.sandbox.docker.network != EGRESS_NETWORK:
        return None
    return {**egress_policy(agent), "secrets": []}
