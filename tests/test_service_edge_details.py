"""Small things of the service's edge: websocket upgrades stay out of the guarded protocol, a
metrics scraper's connection counts as a known client's, and deciding an approval counts toward
the tenant's read rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.api.app import create_app
from sandbox.api.serving import uvicorn_config
from tests.service_helpers import TOKEN_A, serve, serving, sha
from tests.test_service_hostile_reads import config

A = {"Authorization": f"Bearer {TOKEN_A}"}
SCRAPER = "sbx_metrics-scraper"


def test_websocket_upgrades_are_not_served(tmp_path: Path) -> None:
    """uvicorn hands an upgraded connection to its websocket protocol when a websocket library is
    installed: out of the guarded protocol and its bounds. The service serves no websocket."""
    app = create_app(config(tmp_path, "{}"))
    assert uvicorn_config(app, host="127.0.0.1", port=0).ws == "none"


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
