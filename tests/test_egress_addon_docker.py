"""The egress addon's own bookkeeping, run inside the real proxy image (its mitmproxy): what it
keeps per upstream connection must not grow with connections refused or failed, which
mitmproxy 8 never reports disconnected. No packet leaves: the container has no network."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
TunnelGate_NAME = "TunnelGate"

PROBE = r"""
import asyncio, gc, json, os, sys
from types import SimpleNamespace
sys.path.insert(0, "/opt/egress")
os.environ["EGRESS_POLICY"] = json.dumps({"allow": ["allowed.test"]})
import egress_addon
from egress_tunnel import Closed, TunnelGate

addon = egress_addon.Egress()

class Server:  # mitmproxy's Server is a plain object too: the addon may hold it only weakly
    def __init__(self, i, host):
        self.id, self.address, self.error, self.connected = f"s{i}", (host, 443), None, False

def data(i, host):
    return SimpleNamespace(server=Server(i, host), client=SimpleNamespace(id=f"c{i}", peername=("10.0.0.2", 40000)))

def tunnel_layer(server):  # the decision for the bytes after a CONNECT
    context = SimpleNamespace(
        layers=[object(), object()], server=server, client=SimpleNamespace(id="c"), options=SimpleNamespace()
    )
    nextlayer = SimpleNamespace(context=context, layer=None, data_client=lambda: b"")
    addon.next_layer(nextlayer)
    return type(nextlayer.layer).__name__

async def main():
    for i in range(500):  # refused by the allowlist: never opened, never disconnected
        await addon.server_connect(data(i, "blocked.test"))
    refused = len(addon.names)
    async def resolved(name, port):  # the verdict's DNS step, answered here (no network)
        return "10.0.0.9", None
    egress_addon._resolve_checked = resolved
    for i in range(5000):  # allowed, then failing upstream: mitmproxy drops the connection object
        await addon.server_connect(data(10_000 + i, "allowed.test"))
    gc.collect()
    failed = len(addon.names)
    held = [data(20_000 + i, "allowed.test") for i in range(5000)]  # open tunnels: all kept, no cap
    for one in held:
        await addon.server_connect(one)
    kept = len(addon.names)
    waiting = held[0].server  # a tunnel whose client waited before its first bytes
    known = tunnel_layer(waiting)
    unknown = tunnel_layer(Server(99_999, "10.0.0.9"))  # a server the addon never saw connect
    print(json.dumps({"refused": refused, "failed": failed, "kept": kept, "known": known, "unknown": unknown}))

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
    assert counts["refused"] == 0 and counts["failed"] == 0, counts
    # every open connection keeps its name, so a client that waits before its first bytes still
    # gets its tunnel checked against the name it asked for (no eviction to wait out)
    assert counts["kept"] == 5000 and counts["known"] == TunnelGate_NAME
    assert counts["unknown"] == "Closed"  # never the pinned address as the name (no SNI would pass)
