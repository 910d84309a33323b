"""Tools that run only where their session can run them: offered there, and nowhere else.

A tool with a handler can still be impossible for one session: `web_fetch` fetches through the
session's egress proxy, so a session without one (not sandboxed, or `network: none`) is not
offered it, and `explain` says why.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.policy.resolver import ResolvedPolicy
    from sandbox.tools.registry import ToolRegistry


def unavailable(tool: str, policy: ResolvedPolicy, providers: frozenset[str] = frozenset()) -> str | None:
    """Why a provided tool cannot run in this session; None when it can.

    `providers`: tools the application made possible by giving their provider (web_search).
    """
    if tool == "web_search" and tool not in providers:
        return "web_search needs a search provider; none is configured (Orchestrator(search_provider=...))"
    if tool == "web_fetch":
        if not policy.sandbox.sandboxed:
            return "web_fetch runs in the session's sandbox, through its egress proxy; this session is not sandboxed"
        if policy.agent.sandbox.docker.network != "egress":
            return (
                f"web_fetch fetches through the sandbox's egress proxy; set {policy.agent.key_path}.sandbox.docker."
                "network: egress and list the hosts in sandbox.egress.allow"
            )
    if tool == "browser":
        if not policy.sandbox.sandboxed:
            return "the browser runs in a browser sandbox of the session's; this session is not sandboxed"
        if not policy.agent.sandbox.browser.enabled:
            return f"the browser sandbox is off; set {policy.agent.key_path}.sandbox.browser.enabled: true"
        if not _playwright_installed():
            return "the browser tool speaks CDP through Playwright: pip install 'agent-sandbox[browser]'"
    return None


def _playwright_installed() -> bool:
    return importlib.util.find_spec("playwright") is not None


def offered(registry: ToolRegistry, policy: ResolvedPolicy, providers: frozenset[str] = frozenset()) -> set[str]:
    """The tools a model in this session is offered: allowed, provided, and able to run here."""
    runnable = registry.runnable()
    return {t for t in policy.allowed if t in runnable and unavailable(t, policy, providers) is None}
