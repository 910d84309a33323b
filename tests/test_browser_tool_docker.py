"""The browser tool against a real browser sandbox, through its egress proxy, on the egress test
network (servers this test module starts): it navigates a local page, reads it, types and clicks,
takes a screenshot the test opens, and cannot reach a host off the list."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox import Orchestrator
from sandbox.runtime.docker import egress
from tests.egress_lab import Lab, egress_config

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


def _browser_config(make_config: Any, lab: Lab, *, evaluate: bool = False) -> Any:
    config = egress_config(make_config, lab, tools={"sandbox": {"tools": {"also_allow": ["browser"]}}})
    data = config.model_dump(mode="json")
    data["agents"]["defaults"]["sandbox"]["browser"] = {"enabled": True, "allow_evaluate": evaluate}
    return make_config(yaml.safe_dump(data))


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature and that its image data inflates."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    chunks, offset = b"", 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset : offset + 8])
        if kind == b"IDAT":
            chunks += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    assert len(zlib.decompress(chunks)) > 0
    return width, height


async def test_the_browser_tool_drives_a_local_page_through_the_proxy(
    make_config: Any, lab: Lab, docker_client: Any
) -> None:
    before = len(lab.canary_heard())
    async with Orchestrator(_browser_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-browser")
        assert "browser" in {t.name for t in session.tools()}
        went = await session.call("browser", {"action": "navigate", "url": "http://allowed.test:8000/page"})
        assert went.ok, went.error
        assert went.output["status"] == 200 and went.output["title"] == "t"
        read = await session.call("browser", {"action": "content"})
        assert read.ok and read.output["untrusted"] is True
        assert "Egress page" in read.output["content"] and "evil()" not in read.output["content"]
        shot = await session.call("browser", {"action": "screenshot"})
        assert shot.ok, shot.error
        spec = orch.manager.spec_for(session.agent, session.key)
        png = Path(spec.workspace.source, shot.output["path"].removeprefix("/workspace/")).read_bytes()
        width, height = _png_size(png)
        assert width > 100 and height > 100
        # typing and clicking run the page's own script
        assert (await session.call("browser", {"action": "navigate", "url": "http://allowed.test:8000/form"})).ok
        assert (await session.call("browser", {"action": "type", "selector": "#q", "text": "typed here"})).ok
        clicked = await session.call("browser", {"action": "click", "selector": "#b"})
        assert clicked.ok and clicked.output["title"] == "typed here", clicked
        # evaluate is off unless the config says so
        evaluated = await session.call("browser", {"action": "evaluate", "script": "1 + 1"})
        assert evaluated.error.code == "PERMISSION_DENIED" and "allow_evaluate" in evaluated.error.message
        # hosts off the list, and a name that resolves inward, are refused at the proxy
        off_list = await session.call("browser", {"action": "navigate", "url": "http://canary.test:8000/"})
        assert off_list.error.code == "PERMISSION_DENIED", off_list
        tunnel = await session.call("browser", {"action": "navigate", "url": "https://evil.test:8443/"})
        assert tunnel.error.code == "PERMISSION_DENIED", tunnel
        # the browser sits on its own egress network only, beside its own proxy
        browsers = docker_client.containers.list(filters={"label": "io.agent-sandbox.kind=browser"})
        mine = [c for c in browsers if c.labels.get("io.agent-sandbox.instance") == orch.manager.instance]
        assert len(mine) == 1
        networks = set(mine[0].attrs["NetworkSettings"]["Networks"])
        assert networks == {egress.names(mine[0].name).network}
        closed = await session.call("browser", {"action": "close"})
        assert closed.ok
        await session.close()
        # the session's browser, its proxy and its network went with it
        assert not docker_client.containers.list(all=True, filters={"name": mine[0].name})
        assert not docker_client.containers.list(all=True, filters={"name": egress.names(mine[0].name).proxy})
        assert not docker_client.networks.list(names=[egress.names(mine[0].name).network])
    assert lab.canary_heard()[before:] == []


async def test_evaluate_runs_when_the_config_allows_it(make_config: Any, lab: Lab) -> None:
    async with Orchestrator(_browser_config(make_config, lab, evaluate=True)) as orch:
        session = orch.session(agent="main", key="s-eval")
        assert (await session.call("browser", {"action": "navigate", "url": "http://allowed.test:8000/page"})).ok
        evaluated = await session.call("browser", {"action": "evaluate", "script": "document.title + '!'"})
        assert evaluated.ok and evaluated.output["result"] == '"t!"', evaluated
        await session.close()
