"""browser: drive the session's browser sandbox over CDP (Playwright's connect_over_cdp).

The browser runs in its own sandbox (runtime/docker/browser.py): one per session or agent according to
scope, never shared across tenants, on a network of its own; with `network: egress` its every
request goes through an egress proxy with the agent's allowlist. Playwright only speaks CDP to
it (no browser is downloaded). What a page says is untrusted external content, marked as such;
`evaluate` (JavaScript the model chose) runs only where `sandbox.browser.allow_evaluate` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit

from sandbox.errors import ErrorCode, SandboxError
from sandbox.tools.builtin import BrowserArgs
from sandbox.tools.context import ToolContext
from sandbox.tools.handlers.web import DEFAULT_MAX_CHARS, MARK_CLOSE, MARK_OPEN, check_url

NAVIGATE_TIMEOUT_MS = 30_000
ACTION_TIMEOUT_MS = 10_000
MAX_EVALUATE_CHARS = 20_000
SCREENSHOT_DIR = ".sandbox/screenshots"

# one Playwright driver per event loop (its node process is bound to the loop that started it),
# and one CDP connection per browser sandbox
_drivers: dict[int, tuple[asyncio.AbstractEventLoop, Any, dict[str, Any]]] = {}


async def _browser(cdp_url: str) -> Any:
    """A CDP connection to the browser at `cdp_url` (made once per event loop, remade when lost)."""
    from playwright.async_api import async_playwright  # loads only when the browser tool runs

    loop = asyncio.get_running_loop()
    entry = _drivers.get(id(loop))
    if entry is None or entry[0] is not loop:
        try:
            driver = await async_playwright().start()
        except Exception as exc:  # its node driver cannot run here: the host's problem, said plainly
            raise SandboxError(
                ErrorCode.SANDBOX_UNAVAILABLE,
                f"the browser tool's CDP client (Playwright's driver) could not start on the orchestrator's "
                f"host: {exc}; `sandbox doctor` checks it",
            ) from exc
        entry = (loop, driver, {})
        _drivers[id(loop)] = entry
    connections = entry[2]
    browser = connections.get(cdp_url)
    if browser is None or not browser.is_connected():
        browser = await entry[1].chromium.connect_over_cdp(cdp_url, timeout=NAVIGATE_TIMEOUT_MS)
        connections[cdp_url] = browser
    return browser


async def close_drivers() -> None:
    """Stop this event loop's Playwright driver (an orchestrator calls it when it closes)."""
    entry = _drivers.pop(id(asyncio.get_running_loop()), None)
    if entry is None:
        return
    for browser in entry[2].values():
        with contextlib.suppress(Exception):  # gone already
            await browser.close()  # a CDP connection: disconnects, the browser sandbox stays
    await entry[1].stop()


async def _page(ctx: ToolContext) -> Any:
    if ctx.browser is None:
        raise SandboxError(
            ErrorCode.SANDBOX_UNAVAILABLE, "the browser tool needs a sandboxed session on the docker backend"
        )
    browser = await _browser(await ctx.browser.cdp_url())
    context = browser.contexts[0] if browser.contexts else await browser.new_context()
    pages = [p for p in context.pages if not p.is_closed()]
    return pages[-1] if pages else await context.new_page()


def _untrusted(url: str, text: str, limit: int) -> tuple[str, bool]:
    cut = len(text) > limit
    if cut:
        text = f"{text[:limit]}\n…[cut: {len(text) - limit} more characters]"
    return f"{MARK_OPEN.format(url=url)}\n{text}\n{MARK_CLOSE}", cut


async def _navigate(page: Any, url: str) -> dict[str, Any]:
    from playwright.async_api import Error as PlaywrightError  # an optional extra: only when the tool runs

    check_url(url)
    try:
        response = await page.goto(url, timeout=NAVIGATE_TIMEOUT_MS, wait_until="load")
    except PlaywrightError as exc:
        message = str(exc).splitlines()[0][:300]
        if "ERR_TUNNEL_CONNECTION_FAILED" in message or "ERR_PROXY" in message:
            raise SandboxError(
                ErrorCode.PERMISSION_DENIED,
                f"egress refused {url}: the host is not on this agent's egress allowlist, or it resolves to a "
                "refused address (`sandbox logs` has the proxy's reason)",
                url=url,
            ) from None
        if "Timeout" in message:
            raise SandboxError(ErrorCode.TIMEOUT, f"loading {url} took longer than 30 s") from None
        raise SandboxError(ErrorCode.NETWORK_ERROR, f"loading {url} failed: {message}", retryable=True) from None
    # the proxy's verdict header is its own only in plain HTTP (it strips servers'; in an https
    # tunnel a header would be the server's)
    plain = urlsplit(url).scheme == "http"
    if plain and response is not None and (await response.header_value("x-egress-verdict")) == "refused":
        body = (await response.text()).strip().removeprefix("egress refused: ")
        raise SandboxError(ErrorCode.PERMISSION_DENIED, f"egress refused {url}: {body[:500]}", url=url)
    return {"url": page.url, "status": response.status if response else None, "title": await page.title()}


async def browser_tool(ctx: ToolContext, args: BrowserArgs) -> Any:
    """One browser action in the session's browser sandbox."""
    from playwright.async_api import Error as PlaywrightError  # an optional extra: only when the tool runs

    page = await _page(ctx)
    try:
        if args.action == "navigate":
            if not args.url:
                raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "navigate needs url")
            return await _navigate(page, args.url)
        if args.action == "content":
            from inscriptis import get_text  # the HTML parser loads only when a page needs it

            text, cut = _untrusted(page.url, str(get_text(await page.content())).strip(), DEFAULT_MAX_CHARS)
            return {"url": page.url, "title": await page.title(), "untrusted": True, "truncated": cut, "content": text}
        if args.action == "screenshot":
            png = await page.screenshot(type="png", timeout=NAVIGATE_TIMEOUT_MS)
            where = ctx.files.locate(f"{SCREENSHOT_DIR}/{ctx.call_id}.png")
            ctx.files.check_writable(where)
            await ctx.files.write(where, png)
            return {"path": where.display, "bytes": len(png), "url": page.url}
        if args.action in ("click", "type"):
            if not args.selector:
                raise SandboxError(ErrorCode.INVALID_ARGUMENTS, f"{args.action} needs selector")
            if args.action == "click":
                await page.click(args.selector, timeout=ACTION_TIMEOUT_MS)
            else:
                await page.fill(args.selector, args.text or "", timeout=ACTION_TIMEOUT_MS)
            return {"url": page.url, "title": await page.title()}
        if args.action == "evaluate":
            if not ctx.agent.sandbox.browser.allow_evaluate:
                raise SandboxError(
                    ErrorCode.PERMISSION_DENIED,
                    f"evaluate is off; set {ctx.agent.key_path}.sandbox.browser.allow_evaluate: true to allow it",
                )
            if not args.script:
                raise SandboxError(ErrorCode.INVALID_ARGUMENTS, "evaluate needs script")
            value = await page.evaluate(args.script)
            shown = json.dumps(value, default=str)[:MAX_EVALUATE_CHARS]
            return {"url": page.url, "untrusted": True, "result": shown}
        # close: this browser's pages go; the browser sandbox stays for the session
        for other in list(page.context.pages):
            await other.close()
        return {"closed": True}
    except PlaywrightError as exc:
        message = str(exc).splitlines()[0][:300]
        code = ErrorCode.TIMEOUT if "Timeout" in message else ErrorCode.NETWORK_ERROR
        raise SandboxError(code, f"browser {args.action} failed: {message}") from None
