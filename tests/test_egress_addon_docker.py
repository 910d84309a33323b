"""The egress addon's own bookkeeping, run inside the real proxy image (its mitmproxy): what it
keeps per upstream connection must not grow with connections refused or failed, which
mitmproxy 8 never reports disconnected. No packet leaves: the container has no network."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]

PROBE = r"""
import asyncio, json, os, sys
from types import SimpleNamespace
sys.path.insert(0, "/opt/egress")
os.environ["EGRESS_POLICY"] = json.dumps({"allow": ["allowed.test"]})
import egress_addon

addon = egress_addon.Egress()

def data(i, host):
    return SimpleNamespace(
        server=SimpleNamespace(id=f"s{i}", address=(host, 443), error=None),
        client=SimpleNamespace(id=f"c{i}", peername=("10.0.0.2", 40000 + i % 1000)),
    )

async def main():
    for i in range(500):  # refused by the allowlist: never opened, never disconnected
        await addon.server_connect(data(i, "blocked.test"))
    refused = len(addon.names)
    async def resolved(name, port):  # the verdict's DNS step, answered here (no network)
        return "10.0.0.9", None
    egress_addon._resolve_checked = resolved
    for i in range(egress_addon.MAX_NAMES + 500):  # allowed, then failing upstream (no hook either)
        await addon.server_connect(data(10_000 + i, "allowed.test"))
    print(json.dumps({"refused": refused, "allowed": len(addon.names), "cap": egress_addon.MAX_NAMES}))

asyncio.run(main())
"""


def test_refused_and_failed_connections_leave_no_names_behind(docker_client: Any) -> None:
    out = docker_client.containers.run(
        "sandbox-egress:latest",
        ["python3", "-c", PROBE],
        entrypoint=[],
        network_mode="none",
        remove=True,
        labels={TEST_LABEL: RUN_ID},
        environment={"EGRESS_LOG": "/dev/null"},
    )
    import json

    counts = json.loads(out.decode().strip().splitlines()[-1])
    assert counts["refused"] == 0, counts
    assert counts["allowed"] == counts["cap"]
