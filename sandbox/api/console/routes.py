"""The approvals console (`/ui`): server-rendered pages for operators, with a little plain
JavaScript (no build step) and a strict Content-Security-Policy.

Pages: pending approvals with their exact arguments (approve or deny with a reason, refreshed
every two seconds), sessions as trees with their lineage, a session's timeline, the sandboxes
with their mounts and audit findings, and the egress log. Who may open them: api/console/auth.py.
Off (404) unless `service.operator_tokens` names an operator.
"""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import parse_qs

import anyio
from fastapi import FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from sandbox._log import logger
from sandbox.api.approval_decisions import REASON_MAX, Verdict, decide_approval
from sandbox.api.console import views
from sandbox.api.console.auth import COOKIE, Operators, OperatorSession, check_csrf
from sandbox.config.models import Config
from sandbox.engine.orchestrator import Orchestrator
from sandbox.escape import escape

HERE = FilePath(__file__).parent
FORM_MAX_BYTES = 16 * 1024
# no inline script or style, nothing from elsewhere, no framing, forms only to this site
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make the browser send `Origin: null`
    "Cache-Control": "no-store",
}
PAGES = [("approvals", "Approvals"), ("sessions", "Sessions"), ("sandboxes", "Sandboxes"), ("egress", "Egress log")]


def add_console(app: FastAPI, config: Config, auditor: views.Auditor | None = None) -> None:
    """Register `/ui` on `app` when operators are configured."""
    operators = Operators(config.service)
    if not operators.enabled:
        return
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="console-static")

    def orch(request: Request) -> Orchestrator:
        found: Orchestrator = request.app.state.orch
        return found

    async def page(template: str, login: OperatorSession | None, status: int = 200, **data: Any) -> HTMLResponse:
        # rendered in a worker thread: a page may carry a tenant's megabytes (a command's arguments)
        found = env.get_template(template)
        html = await anyio.to_thread.run_sync(lambda: found.render(login=login, pages=PAGES, **data))
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def operator(request: Request) -> OperatorSession:
        found = operators.of(request)
        if found is None:
            raise HTTPException(303, "log in first", headers={"Location": "/ui/login", **HEADERS})
        return found

    async def form(request: Request, login: OperatorSession) -> dict[str, str]:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_MAX_BYTES:
                raise HTTPException(413, "the form is too large")
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        check_csrf(login, fields, request)
        return fields

    @app.get("/ui", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/approvals", status_code=303, headers=HEADERS)

    @app.get("/ui/login", include_in_schema=False)
    async def login_page(request: Request) -> HTMLResponse:
        return await page("login.html", operators.of(request))

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> JSONResponse:
        """The login page's script sends the operator token as a bearer header (never a form)."""
        sid, session = operators.login(request.headers.get("authorization"))
        answer = JSONResponse({"operator": session.operator}, headers=HEADERS)
        answer.set_cookie(
            COOKIE, sid, max_age=int(operators.lifetime_s), path="/ui", httponly=True, samesite="strict",
            # Secure over HTTPS, also when a proxy in front ended TLS (this only ever adds the flag)
            secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https",
        )  # fmt: skip
        return answer

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> RedirectResponse:
        login = operator(request)
        await form(request, login)
        operators.logout(request.cookies.get(COOKIE, ""))
        answer = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
        answer.delete_cookie(COOKIE, path="/ui")
        return answer

    @app.get("/ui/approvals", include_in_schema=False)
    async def approvals(request: Request) -> HTMLResponse:
        login = operator(request)
        pending = await views.pending_approvals(orch(request), config)
        return await page("approvals.html", login, current="approvals", approvals=pending, reason_max=REASON_MAX)

    @app.get("/ui/approvals/list", include_in_schema=False)
    async def approvals_fragment(request: Request) -> HTMLResponse:
        """The list alone, for the page's two-second refresh."""
        login = operator(request)
        pending = await views.pending_approvals(orch(request), config)
        return await page("_approval_list.html", login, approvals=pending, reason_max=REASON_MAX)

    @app.get("/ui/approvals/{approval_id}", include_in_schema=False)
    async def approval_page(request: Request, approval_id: Annotated[str, Path(max_length=64)]) -> HTMLResponse:
        """One pending approval with its arguments whole."""
        login = operator(request)
        found = await views.pending_approvals(orch(request), config, only=approval_id, cut=None)
        if not found:
            gone = "this approval is no longer pending"
            return await page("decided.html", login, status=404, current="approvals", message=gone)
        return await page("approval.html", login, current="approvals", approvals=found, reason_max=REASON_MAX)

    @app.post("/ui/approvals/{approval_id}/{verdict}", include_in_schema=False)
    async def decide(request: Request, approval_id: str, verdict: Verdict) -> Response:
        login = operator(request)
        fields = await form(request, login)
        # the operator's name is added after the typed reason is cut, so it is never cut away
        by = f"operator {login.operator}"
        typed = fields.get("reason", "").strip()[: REASON_MAX - len(by) - 3]
        reason = f"{typed} ({by})" if typed else f"by {by}"
        if not await views.is_pending(orch(request), approval_id):
            gone = "this approval is no longer pending"
            return await page("decided.html", login, status=409, current="approvals", message=gone)
        await decide_approval(orch(request), approval_id, verdict, reason)
        logger.bind(operator=login.operator, approval=approval_id, verdict=verdict).info("approval_decided_in_console")
        return RedirectResponse("/ui/approvals", status_code=303, headers=HEADERS)

    @app.get("/ui/sessions", include_in_schema=False)
    async def sessions(request: Request) -> HTMLResponse:
        login = operator(request)
        trees = await views.session_tree(orch(request), config)
        return await page("sessions.html", login, current="sessions", trees=trees)

    @app.get("/ui/timeline", include_in_schema=False)
    async def timeline(
        request: Request,
        session: Annotated[str, Query(max_length=256)],
        tenant: Annotated[str | None, Query(max_length=64)] = None,
    ) -> HTMLResponse:
        login = operator(request)
        store = getattr(request.app.state, "store", None)
        found = await views.recent_events(orch(request), store, session=session, tenant=tenant or None)
        shown = [views.shown_event(e) for e in found]
        return await page("timeline.html", login, current="sessions", session=escape(session), events=shown)

    audit = views.CachedAudit(auditor) if auditor is not None else None

    @app.get("/ui/sandboxes", include_in_schema=False)
    async def sandboxes(request: Request) -> HTMLResponse:
        login = operator(request)
        rows, note = await views.sandboxes(orch(request), audit)
        return await page("sandboxes.html", login, current="sandboxes", sandboxes=rows, note=note)

    @app.get("/ui/egress", include_in_schema=False)
    async def egress(request: Request) -> HTMLResponse:
        login = operator(request)
        store = getattr(request.app.state, "store", None)
        found = await views.recent_events(orch(request), store, tool="egress")
        return await page("egress.html", login, current="egress", events=[views.shown_event(e) for e in found])
