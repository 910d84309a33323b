"""Small things of the service's edge: websocket upgrades stay out of the guarded protocol, a
metrics scraper's connection counts as a known client's, and deciding an approval counts toward
the tenant's read rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.websockets import WebSocket

from sandbox.api.app import create_app
from sandbox.api.serving import uvicorn_config
from tests.service_helpers import TOKEN_A, serve, serving, sha
from tests.test_service_hostile_reads import config

A = {"Authorization": f"Bearer {TOKEN_A}"}
SCRAPER = "sbx_metrics-scraper"


@pytest.mark.slow
@pytest.mark.anyio
async def test_an_upgraded_websocket_keeps_its_place_in_the_guard_until_it_closes(tmp_path: Path) -> None:
    """Previews serve websockets (api/preview_routes.py): uvicorn hands an upgraded connection to
    its websocket protocol, out of the guarded HTTP one. It stays counted while open (never closed
    as idle), and its place is given back when it closes, cleanly or not; a refused upgrade gives
    it back too. Without that, each websocket would leak a place until no tenant got in."""
    from websockets.asyncio.client import connect

    app = create_app(config(tmp_path, "{}"))

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            await websocket.send_text(text)

    app.add_api_websocket_route("/test-echo", echo)
    assert uvicorn_config(app, host="127.0.0.1", port=0).ws_per_message_deflate is False
    async with serving(app) as url:
        guard = app.state.connections
        ws_url = url.replace("http://", "ws://")

        async def settled(count: int) -> None:
            with anyio.fail_after(10):
                while guard.count() != count:
                    await anyio.sleep(0.02)

        for _ in range(3):
            async with connect(f"{ws_url}/test-echo") as ws:
                await ws.send("hi")
                assert await ws.recv() == "hi"
                assert guard.count() == 1
                assert [c.idle_for() for c in guard._open] == [-1.0]  # in use: never closed as idle
            await settled(0)
        abrupt = await connect(f"{ws_url}/test-echo")
        await settled(1)
        abrupt.transport.abort()  # no close frame: the socket just goes
        await settled(0)
        await abrupt.close()
        with pytest.raises(Exception, match="403"):  # no such websocket route: refused at the handshake
            await connect(f"{ws_url}/v1/none")
        await settled(0)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_metrics_scrapers_connection_counts_as_a_known_clients(tmp_path: Path) -> None:
    """A request with a metrics token marks its connection authenticated (it stayed a stranger's,
    the first to be closed when the unauthenticated bounds are reached); a wrong token does not."""
    app = create_app(config(tmp_path, f"{{metrics_tokens: [{{name: prom, sha256: {sha(SCRAPER)}}}]}}"))
    async with serving(app) as url:
        guard = app.state.connections
        async with httpx.AsyncClient(base_url=url) as wrong:
            assert (await wrong.get("/metrics", headers={"Authorization": "Bearer nope"})).status_code == 401
            assert [c.authenticated for c in guard._open] == [False]
        async with httpx.AsyncClient(base_url=url) as scraper:
            r = await scraper.get("/metrics", headers={"Authorization": f"Bearer {SCRAPER}"})
            assert r.status_code == 200
            assert [c.authenticated for c in guard._open] == [True]


@pytest.mark.slow
def test_deciding_approvals_counts_toward_the_read_rate(tmp_path: Path) -> None:
    """POST /v1/approvals/{id}/{verdict} reads the pending approvals: it counts toward
    service.read_requests_per_minute like the listing (it was unlimited)."""
    with serve(config(tmp_path, "{read_requests_per_minute: 3}")) as url:
        codes: list[Any] = [httpx.post(f"{url}/v1/approvals/none-{i}/approve", headers=A).status_code for i in range(4)]
    assert codes == [404, 404, 404, 429]
