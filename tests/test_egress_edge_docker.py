"""The egress edge on the real engine: the proxy forwards nothing and has limits, each edge takes a
/29 of the configured pool and gives it back, concurrent makers of one edge all succeed, and no
network of this instance is left behind (removal, `recreate --browser`, `prune`), while networks
of another instance or without labels are never touched.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import docker.errors
import pytest
import yaml

from sandbox import Orchestrator
from sandbox.audit.run import run_audit
from sandbox.journal.owners import current_owner
from sandbox.runtime import lifecycle
from sandbox.runtime.docker import egress, subnets
from sandbox.runtime.naming import CREATOR_LABEL, Labels
from tests.conftest import RUN_ID, TEST_LABEL
from tests.egress_lab import Lab, egress_config

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


async def _sh(session: Any, command: str) -> dict[str, Any]:
    result = await session.call("exec", {"command": command, "timeout_s": 30})
    assert result.error is None, result.error
    return dict(result.output)


def _subnet(docker_client: Any, network: str) -> ipaddress.IPv4Network:
    attrs = docker_client.api.inspect_network(network)
    return ipaddress.IPv4Network(attrs["IPAM"]["Config"][0]["Subnet"])


async def test_the_proxy_forwards_nothing_and_is_limited(make_config: Any, lab: Lab, docker_client: Any) -> None:
    """ip_forward and IPv6 forwarding are 0 inside the proxy's namespace; CPU and memory are capped."""
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-fwd")
        await _sh(session, "true")
        proxy = docker_client.containers.get(egress.names(orch.manager.spec_for(session.agent, session.key).name).proxy)
        host = proxy.attrs["HostConfig"]
        assert host["NanoCpus"] == 1_000_000_000 and host["Memory"] == 512 * 1024 * 1024, host
        assert host["MemorySwap"] == 512 * 1024 * 1024 and host["PidsLimit"] == 128
        assert host["Sysctls"]["net.ipv4.ip_forward"] == "0", host["Sysctls"]
        inside = proxy.exec_run(
            ["cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"], user="1000"
        )
        assert inside.exit_code == 0 and inside.output.decode().split() == ["0", "0"], inside.output
        await session.close()


async def test_an_edge_takes_a_small_subnet_of_the_pool_and_gives_it_back(
    make_config: Any, lab: Lab, docker_client: Any
) -> None:
    """The edge's network is a /29 inside the configured pool; after the session it is gone and
    so is the subnet (no network of the edge is left)."""
    pool = "10.213.128.0/20"
    async with Orchestrator(egress_config(make_config, lab, subnet_pool=pool)) as orch:
        session = orch.session(agent="main", key="s-pool")
        assert (await _sh(session, "curl -sS -m 10 http://allowed.test:8000/"))["output"] == "hello from egress-web"
        edge = egress.names(orch.manager.spec_for(session.agent, session.key).name)
        subnet = _subnet(docker_client, edge.network)
        print(f"egress network {edge.network}: {subnet} ({subnet.num_addresses} addresses)")
        assert subnet.prefixlen == 29 and subnet.subnet_of(ipaddress.IPv4Network(pool)), subnet
        await session.close()
    assert not docker_client.networks.list(names=[edge.network])
    assert subnet not in subnets.engine_subnets(docker_client)


async def test_a_pool_that_runs_out_says_so_and_audit_reports_it(
    make_config: Any, lab: Lab, docker_client: Any
) -> None:
    """A pool of one /29: the first edge takes it, the second sandbox is refused with a clear
    message, and `audit` reports the pool as running low (SBX-N005)."""
    pool = "10.213.255.248/29"
    config = egress_config(make_config, lab, subnet_pool=pool)
    async with Orchestrator(config) as orch:
        first = orch.session(agent="main", key="s-one")
        await _sh(first, "true")
        second = await orch.session(agent="main", key="s-two").call("exec", {"command": "true"})
        assert second.error is not None and second.error.code == "SANDBOX_UNAVAILABLE", second
        assert "exhausted" in second.error.message and "subnet_pool" in second.error.message
        findings = await anyio.to_thread.run_sync(run_audit, config, docker_client)
        low = [f for f in findings.findings if f.rule == "SBX-N005"]
        assert low and pool in low[0].evidence and "1 of the 1" in low[0].evidence, low
        await first.close()


CONCURRENT = r"""
import sys, anyio
from sandbox import Orchestrator
from sandbox.config import load_config
async def main():
    async with Orchestrator(load_config(sys.argv[1])) as orch:
        result = await orch.session(agent="main", key="s-race").call("exec", {"command": "echo made"})
        print("RESULT", result.ok, result.error.message[:300] if result.error else "", flush=True)
anyio.run(main)
"""


async def test_four_first_calls_at_once_all_succeed(
    make_config: Any, lab: Lab, docker_client: Any, tmp_path: Path
) -> None:
    """Four processes make the first call of one new egress session at the same time: all four
    succeed (one makes the edge, the others adopt it), and one sandbox and one edge remain."""
    config = egress_config(make_config, lab)
    config_file = tmp_path / "race.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    script = tmp_path / "race.py"
    script.write_text(CONCURRENT)
    root = Path(__file__).resolve().parent.parent
    outputs: list[str] = []

    def one() -> None:
        done = subprocess.run(
            [sys.executable, str(script), str(config_file)], capture_output=True, text=True, timeout=240, cwd=root
        )
        outputs.append(done.stdout + done.stderr[-1500:])

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(anyio.to_thread.run_sync, one)
    results = [line for out in outputs for line in out.splitlines() if line.startswith("RESULT")]
    assert results == ["RESULT True "] * 4, outputs
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-race")
        name = orch.manager.spec_for(session.agent, session.key).name
        assert len(docker_client.containers.list(all=True, filters={"name": name})) == 1
        assert len(docker_client.networks.list(names=[egress.names(name).network])) == 1
        assert (await _sh(session, "curl -sS -m 10 http://allowed.test:8000/"))["output"] == "hello from egress-web"
        await session.close()
    assert not docker_client.networks.list(names=[egress.names(name).network])


BROWSER = """
tools: {sandbox: {tools: {also_allow: [browser]}}}
agents: {defaults: {sandbox: {mode: all, scope: session, browser: {enabled: true}}}}
"""


async def test_recreate_browser_leaves_no_network(make_config: Any, docker_client: Any) -> None:
    """`recreate --all --browser` removes each browser with its own network (a /29 of the pool)."""
    async with Orchestrator(make_config(BROWSER)) as orch:
        endpoint = await orch.session("agent:main:one").browser()
        subnet = _subnet(docker_client, endpoint.network)
        print(f"browser network {endpoint.network}: {subnet} ({subnet.num_addresses} addresses)")
        assert subnet.prefixlen == 29 and subnet.subnet_of(ipaddress.IPv4Network(subnets.DEFAULT_POOL))
        removed = await lifecycle.recreate(orch.manager, all_=True, browser=True)
        assert removed and not docker_client.networks.list(names=[endpoint.network]), removed


async def test_prune_sweeps_orphan_networks_of_this_instance_only(make_config: Any, docker_client: Any) -> None:
    """An unused browser network of this instance goes; one of another instance, and one without
    the instance's labels, stay."""
    config = make_config()
    instance = config.instance
    base = {TEST_LABEL: RUN_ID, Labels.KIND: "browser-net", CREATOR_LABEL: current_owner()}
    made = []
    for suffix, labels in (
        ("mine", {**base, Labels.INSTANCE: instance}),
        ("other", {**base, Labels.INSTANCE: f"{instance}x"}),
        ("plain", {TEST_LABEL: RUN_ID}),
    ):
        made.append(docker_client.networks.create(f"sbx-{RUN_ID}-orphan-{suffix}", internal=True, labels=labels))
    try:
        async with Orchestrator(config) as orch:
            pruned = await lifecycle.prune(orch.manager)
        left = {n.name for n in docker_client.networks.list(filters={"label": f"{TEST_LABEL}={RUN_ID}"})}
        assert (f"sbx-{RUN_ID}-orphan-mine", "orphan: its container is gone") in pruned, pruned
        assert f"sbx-{RUN_ID}-orphan-mine" not in left
        assert {f"sbx-{RUN_ID}-orphan-other", f"sbx-{RUN_ID}-orphan-plain"} <= left, left
    finally:
        for network in made:
            with contextlib.suppress(docker.errors.NotFound):  # the sweep under test removed it
                network.remove()
