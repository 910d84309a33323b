"""`network: egress` as attack surface, against servers this module starts and nothing else.

A test network holds an allowlisted web server (`allowed.test`) and a canary (`canary.test`, also
listening on UDP 53) that must never hear from the sandbox. The proxy pins `evil.test` to the
canary's private address and `linklocal.test` to a link-local address, as a hostile DNS answer
would. Each refusal is shown by the proxy's verdict and by the canary having received nothing.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import anyio
import anyio.to_thread
import pytest
import yaml

from sandbox import Orchestrator
from sandbox.runtime.docker import egress
from tests.cli_helpers import run_cli
from tests.egress_lab import Lab, egress_config
from tests.test_browser_isolation_docker import Canary

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("images")]


async def _sh(session: Any, command: str) -> dict[str, Any]:
    result = await session.call("exec", {"command": command, "timeout_s": 30})
    assert result.error is None or result.error.code == "TIMEOUT", result.error
    return dict(result.output)


async def test_allowlisted_host_works_and_everything_else_is_refused(make_config: Any, lab: Lab) -> None:
    before = len(lab.canary_heard())
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-egress")
        ok = await _sh(session, "curl -sS -m 10 http://allowed.test:8000/")
        assert ok.get("output") == "hello from egress-web", ok
        off_list = await _sh(session, "curl -sS -m 10 -w ' %{http_code}' http://canary.test:8000/")
        assert off_list["output"].endswith(" 403"), off_list
        assert "canary.test is not on the egress allowlist" in off_list["output"]
        # a name on the list whose DNS answer points inward (at the canary's private address)
        inward = await _sh(session, "curl -sS -m 10 -w ' %{http_code}' http://evil.test:8000/")
        assert inward["output"].endswith(" 502"), inward
        assert "resolves to a refused address" in inward["output"] and "private" in inward["output"]
        # the same through a CONNECT tunnel
        tunnel = await _sh(session, "curl -sS -m 10 -p http://evil.test:8000/ ; echo rc=$?")
        assert "rc=56" in tunnel["output"], tunnel  # CONNECT tunnel failed
        # an IP literal, and a Host header naming another host than the target
        literal = await _sh(session, f"curl -sS -m 10 -w ' %{{http_code}}' http://{lab.canary_ip}:8000/")
        assert literal["output"].endswith(" 403"), literal
        fronted = await _sh(
            session, "curl -sS -m 10 -w ' %{http_code}' -H 'Host: canary.test' http://allowed.test:8000/"
        )
        assert fronted["output"].endswith(" 403") and "not the request target" in fronted["output"], fronted
        userinfo = await _sh(
            session, "curl -sS -m 10 -w ' %{http_code}' -H 'Host: allowed.test:@canary.test' http://allowed.test:8000/"
        )
        assert userinfo["output"].endswith(" 403") and "malformed" in userinfo["output"], userinfo
        # a redirect from the allowed host to a link-local address (where cloud metadata lives)
        redirect = await _sh(
            session,
            "curl -sS -m 10 -L -w ' %{http_code}' 'http://allowed.test:8000/redirect?to=http://linklocal.test:8000/x'",
        )
        assert redirect["output"].endswith(" 502") and "link-local" in redirect["output"], redirect
        # around the proxy: there is no route, whatever the address
        direct = await _sh(session, f"curl -sS -m 5 --noproxy '*' http://{lab.canary_ip}:8000/; echo rc=$?")
        assert "rc=0" not in direct["output"], direct
        # a port off the list
        port = await _sh(session, "curl -sS -m 10 -w ' %{http_code}' http://allowed.test:9999/")
        assert port["output"].endswith(" 403") and "port 9999" in port["output"], port
        await session.close()
        events = orch.journal.events(session=session.key)
    assert lab.canary_heard()[before:] == []
    # one journal line per request, with the proxy's verdict (what `sandbox logs` shows)
    lines = [e.data for e in events if e.stage == "egress"]
    seen = {(line["host"], line["verdict"]) for line in lines}
    assert ("allowed.test", "allowed") in seen and ("canary.test", "refused") in seen, lines
    assert ("evil.test", "refused") in seen and ("linklocal.test", "refused") in seen, lines
    assert all(line["tenant"] == "default" and line["agent"] == "main" for line in lines)
    ok_line = next(line for line in lines if line["host"] == "allowed.test" and line["verdict"] == "allowed")
    assert ok_line["bytes_down"] == len("hello from egress-web") and ok_line["status"] == 200


# speaks to the proxy by hand: CONNECT, then what the test gives (a ClientHello in one or two
# writes, plain HTTP); prints what came back
TUNNEL_CLIENT = r"""
import os, socket, ssl, sys, time
mode, sni = sys.argv[1], sys.argv[2]
host, port = os.environ["HTTPS_PROXY"].split("//")[1].split(":")
s = socket.create_connection((host, int(port)), timeout=15)
s.sendall(b"CONNECT allowed.test:8443 HTTP/1.1\r\nHost: allowed.test:8443\r\n\r\n")
print("connect:", s.recv(200).split(b"\r\n")[0].decode())
if mode == "plain":
    s.sendall(b"GET /fronted HTTP/1.1\r\nHost: canary.test\r\n\r\n")
    print("answer:", s.recv(200)[:40]); sys.exit()
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
inner, outer = ssl.MemoryBIO(), ssl.MemoryBIO()
obj = ctx.wrap_bio(inner, outer, server_hostname=sni or None)
try:
    obj.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = bytearray(outer.read())
if mode == "version":  # a record version mitmproxy's TLS check does not know
    hello[1:3] = b"\x03\x04"
if mode == "split":  # the ClientHello in two writes
    s.sendall(hello[:20]); time.sleep(0.5); s.sendall(hello[20:])
else:
    s.sendall(hello)
try:
    reply = s.recv(5)
    print("reply:", "TLS" if reply[:1] == b"\x16" else ("closed" if not reply else repr(reply)))
except OSError as exc:
    print("reply: closed", type(exc).__name__)
"""


async def test_a_tunnel_passes_only_tls_naming_its_connect_host(make_config: Any, lab: Lab) -> None:
    before = len(lab.canary_heard())
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-sni")
        ok = await _sh(session, "curl -sS -k -m 10 https://allowed.test:8443/")
        assert ok["output"] == "hello from egress-web", ok  # HTTPS through a tunnel works
        script = TUNNEL_CLIENT.replace("'", "'\\''")
        outcomes = {}
        cases = [
            ("whole", "canary.test"),
            ("split", "canary.test"),
            ("version", "canary.test"),
            ("whole", ""),
            ("plain", "-"),
            ("split", "allowed.test"),
        ]
        for mode, sni in cases:
            out = await _sh(session, f"python3 -c '{script}' {mode} '{sni}'")
            assert "connect: HTTP/1.1 200" in out["output"], out
            outcomes[(mode, sni)] = out["output"]
        events = orch.journal.events(session=session.key)
        await session.close()
    # domain fronting: the SNI names another host, in one write, in two, behind an odd version, or none
    for key in cases[:4]:
        assert "reply: closed" in outcomes[key], (key, outcomes[key])
    assert "answer: b''" in outcomes[("plain", "-")], outcomes  # plain HTTP inside a tunnel
    assert "reply: TLS" in outcomes[("split", "allowed.test")], outcomes  # a split hello naming its host passes
    reasons = [e.data["reason"] for e in events if e.stage == "egress" and e.data["verdict"] == "refused"]
    assert sum("TLS SNI canary.test differs from the CONNECT host allowed.test" in r for r in reasons) == 2, reasons
    assert any("malformed" in r for r in reasons) and any("names no host" in r for r in reasons), reasons
    assert any("only TLS passes a tunnel" in r for r in reasons), reasons
    assert lab.canary_heard()[before:] == []
    assert not any("TLS-SNI canary.test" in line for line in lab.web.logs().decode().splitlines())


async def test_size_and_time_caps_cut_requests_and_tunnels(make_config: Any, lab: Lab) -> None:
    config = egress_config(make_config, lab, max_bytes="10k", max_duration_s=2)
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-caps")
        small = await _sh(session, "curl -sS -m 10 http://allowed.test:8000/big?n=1000 | wc -c")
        assert small["output"].strip() == "1000", small
        big = await _sh(session, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://allowed.test:8000/big?n=100000")
        assert not big["output"].endswith("200"), big  # mitmproxy's body limit: the response never arrives whole
        tunnel = await _sh(session, "curl -sS -k -m 10 https://allowed.test:8443/big?n=100000 | wc -c")
        assert int(tunnel["output"].strip().splitlines()[-1]) < 100000, tunnel
        slow = await _sh(session, "curl -sS -k -m 10 https://allowed.test:8443/slow?s=5; echo rc=$?")
        assert "rc=0" not in slow["output"], slow
        slow_plain = await _sh(session, "curl -sS -m 10 http://allowed.test:8000/slow?s=5; echo rc=$?")
        assert "rc=0" not in slow_plain["output"], slow_plain  # plain HTTP: its connection is closed
        # headers count and are capped; an upgrade would leave the caps behind: refused
        big_header = "X-Big: $(head -c 70000 /dev/zero | tr '\\0' a)"
        headers = await _sh(
            session, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' -H \"{big_header}\" http://allowed.test:8000/"
        )
        assert headers["output"].endswith("431"), headers
        upgrade = await _sh(
            session,
            "curl -sS -m 10 -w ' %{http_code}' -H 'Connection: Upgrade' -H 'Upgrade: echo' "
            "http://allowed.test:8000/upgrade",
        )
        assert "upgraded" not in upgrade["output"] and not upgrade["output"].endswith(" 101"), upgrade
        # after the close, which collects the proxy's last lines: on a loaded machine the proxy
        # wrote the upgrade's refusal after curl had its answer and the call's collection ran
        await session.close()
        events = orch.journal.events(session=session.key)
    cuts = [e.data["reason"] for e in events if e.stage == "egress" and e.data["verdict"] == "cut"]
    assert any("more than 10240 bytes" in r for r in cuts), cuts
    assert any("open longer than 2 s" in r for r in cuts), cuts
    assert any("connection open longer than 2 s" in r for r in cuts), cuts
    refusals = [e.data["reason"] for e in events if e.stage == "egress" and e.data["verdict"] == "refused"]
    assert any("upgrades are not relayed" in r for r in refusals), refusals


async def test_the_tenant_floor_narrows_the_agent_allowlist(make_config: Any, lab: Lab) -> None:
    config = egress_config(make_config, lab)
    data = config.model_dump(mode="json")
    data["tenants"] = [{"id": "default", "egress": {"allow": ["evil.test"]}}]
    floored = make_config(yaml.safe_dump(data))
    async with Orchestrator(floored) as orch:
        session = orch.session(agent="main", key="s-floor")
        out = await _sh(session, "curl -sS -m 10 -w ' %{http_code}' http://allowed.test:8000/")
        assert out["output"].endswith(" 403") and "not on the tenant's egress allowlist" in out["output"], out
        await session.close()


async def test_dns_gets_nothing_out(make_config: Any, lab: Lab) -> None:
    before = len(lab.canary_heard())
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-dns")
        await _sh(session, "true")
        spec = orch.manager.spec_for(session.agent, session.key)
        proxy_ip = egress_ip(orch, spec.name)
        script = f"""
import socket, struct
def gateway():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<L", int(f[2], 16)))
    return None
targets = [t for t in ("{proxy_ip}", gateway(), "{lab.canary_ip}") if t]
for t in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
    try:
        s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x06exfilt\\x04test\\x00\\x00\\x01\\x00\\x01", (t, 53))
        print(t, "answered", s.recvfrom(512)[0][:4])
    except OSError as e:
        print(t, "nothing", type(e).__name__)
"""
        out = await _sh(session, f"timeout 4 getent hosts canary.test; echo getent=$?; python3 -c '{script}'")
        assert "getent=0" not in out["output"], out  # names do not resolve inside
        assert "answered" not in out["output"], out
        assert out["output"].count("nothing") >= 2, out
        # what the sandbox's resolver cannot answer goes to the proxy (no DNS there), never the host's
        client: Any = getattr(orch.backend, "client")  # noqa: B009 - the docker backend's
        assert client.api.inspect_container(spec.name)["HostConfig"]["Dns"] == [proxy_ip]
        await session.close()
    assert lab.canary_heard()[before:] == []


async def test_proxy_and_network_live_and_die_with_the_sandbox(make_config: Any, lab: Lab, docker_client: Any) -> None:
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-life")
        await _sh(session, "true")
        spec = orch.manager.spec_for(session.agent, session.key)
        edge = egress.names(spec.name)
        proxy = docker_client.containers.get(edge.proxy)
        assert proxy.attrs["HostConfig"]["ReadonlyRootfs"] is True
        assert proxy.attrs["HostConfig"]["CapDrop"] == ["ALL"]
        net = docker_client.networks.get(edge.network)
        assert net.attrs["Internal"] is True
        assert set(net.attrs["Containers"]) == {proxy.id, docker_client.containers.get(spec.name).id}
        # the proxy dies: the next use remakes the sandbox with a new one
        proxy.remove(force=True)
        orch.manager._entries.clear()  # skip the 30 s revalidation wait
        again = await _sh(session, "curl -sS -m 10 http://allowed.test:8000/")
        assert again["output"] == "hello from egress-web"
        await session.close()
        assert not docker_client.containers.list(all=True, filters={"name": edge.proxy})
        assert not docker_client.networks.list(names=[edge.network])


def egress_ip(orch: Any, sandbox_name: str) -> str:
    attrs = orch.backend.client.api.inspect_container(egress.names(sandbox_name).proxy)
    return str(attrs["NetworkSettings"]["Networks"][egress.names(sandbox_name).network]["IPAddress"])


async def test_a_proxy_that_cannot_start_leaves_nothing_behind(make_config: Any, lab: Lab, docker_client: Any) -> None:
    config = egress_config(make_config, lab, image="sandbox-egress-missing:none")
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-noimage")
        result = await session.call("exec", {"command": "true"})
        assert result.error is not None and result.error.code == "SANDBOX_UNAVAILABLE", result
        assert "sandbox images build" in result.error.message
        spec = orch.manager.spec_for(session.agent, session.key)
        edge = egress.names(spec.name)
        assert not docker_client.containers.list(all=True, filters={"name": spec.name})
        assert not docker_client.containers.list(all=True, filters={"name": edge.proxy})
        assert not docker_client.networks.list(names=[edge.network])


async def test_an_orphaned_proxy_is_swept(make_config: Any, lab: Lab, docker_client: Any) -> None:
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-orphan")
        await _sh(session, "true")
        spec = orch.manager.spec_for(session.agent, session.key)
        edge = egress.names(spec.name)
        # the sandbox vanishes behind the orchestrator's back (a crash between the two removals)
        docker_client.api.remove_container(spec.name, force=True)
        assert docker_client.containers.list(all=True, filters={"name": edge.proxy})
        removed = await orch.manager.cleanup_orphans()
        assert edge.proxy in removed
        assert not docker_client.containers.list(all=True, filters={"name": edge.proxy})
        assert not docker_client.networks.list(names=[edge.network])


async def test_sandbox_logs_collects_what_the_proxy_saw(make_config: Any, lab: Lab, tmp_path: Any) -> None:
    config = egress_config(make_config, lab)
    config_file = tmp_path / "egress.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-logs")
        # a request made after the call returned: only `sandbox logs` can bring its line in
        started = await session.call(
            "exec", {"command": "sleep 1; curl -s http://canary.test:8000/", "background": True}
        )
        assert started.ok, started.error
        await anyio.sleep(4)
        done = await anyio.to_thread.run_sync(lambda: run_cli("logs", "--session", session.key, config=config_file))
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stdout.splitlines() if " egress " in line]
        assert any('"verdict": "refused"' in line and "canary.test" in line for line in lines), done.stdout
        await session.close()


async def test_the_host_is_out_of_reach_through_the_gateway(make_config: Any, lab: Lab, docker_client: Any) -> None:
    host_canary = Canary()  # listens on every host address, the egress bridge's gateway too
    try:
        async with Orchestrator(egress_config(make_config, lab)) as orch:
            session = orch.session(agent="main", key="s-gw")
            out = await _sh(
                session, f"python3 -c '{await gateway_probe(docker_client, orch, session, host_canary.port)}'"
            )
            assert "refused" in out["output"] and "connected" not in out["output"], out
            await session.close()
    finally:
        host_canary.close()
    assert host_canary.accepted == 0


GATEWAY_PROBE = """
import socket
try:
    socket.create_connection(("GW", PORT), timeout=3); print("connected to GW")
except OSError as exc:
    print("refused GW", type(exc).__name__)
"""


async def gateway_probe(docker_client: Any, orch: Orchestrator, session: Any, port: int) -> str:
    """A script that connects to the host's side of the session's egress bridge. Its address is
    read from the host: since Engine 26 a sandbox on an internal network has no default route to
    name it, but the address stays on its link, one ARP away."""
    assert (await _sh(session, "true"))["exit_code"] == 0  # the sandbox and its network exist
    network = egress.names(orch.manager.spec_for(session.agent, session.key).name).network
    gateway = docker_client.networks.get(network).attrs["IPAM"]["Config"][0]["Gateway"]
    assert gateway, network
    return GATEWAY_PROBE.replace("GW", gateway).replace("PORT", str(port))


async def test_bridge_rules_removed_behind_a_live_sandbox_are_put_back(
    make_config: Any, lab: Lab, docker_client: Any
) -> None:
    """Whatever removes an egress bridge's host rules while its sandbox lives (a race, an
    operator's flush), the next orchestrator to adopt the sandbox puts them back before using it:
    the sandbox still cannot reach the host through its gateway, and the canary hears nothing."""
    from sandbox.runtime.docker import hostfirewall

    host_canary = Canary()
    config = egress_config(make_config, lab)
    try:
        async with Orchestrator(config) as orch:
            session = orch.session(agent="main", key="s-gw-lost")
            assert (await _sh(session, "true"))["exit_code"] == 0
            bridge = egress.names(orch.manager.spec_for(session.agent, session.key).name).bridge
        assert hostfirewall.rules_present(bridge)
        hostfirewall.remove_rules(bridge)  # the fault: the rules are gone, the sandbox lives on
        assert not hostfirewall.rules_present(bridge)
        async with Orchestrator(config) as orch:
            session = orch.session(agent="main", key="s-gw-lost")
            out = await _sh(
                session, f"python3 -c '{await gateway_probe(docker_client, orch, session, host_canary.port)}'"
            )
            assert "refused" in out["output"] and "connected" not in out["output"], out
            assert hostfirewall.rules_present(bridge)
            await session.close()
    finally:
        host_canary.close()
    assert host_canary.accepted == 0


async def test_no_egress_sandbox_without_the_host_firewall(
    make_config: Any, lab: Lab, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.runtime.docker import hostfirewall

    monkeypatch.setattr(hostfirewall, "drop_from_bridge", lambda bridge: False)  # the fault: no iptables
    async with Orchestrator(egress_config(make_config, lab)) as orch:
        session = orch.session(agent="main", key="s-nofw")
        result = await session.call("exec", {"command": "true"})
        assert result.error is not None and result.error.code == "SANDBOX_UNAVAILABLE", result
        assert "require_host_firewall" in result.error.message
        edge = egress.names(orch.manager.spec_for(session.agent, session.key).name)
        assert not docker_client.containers.list(all=True, filters={"name": edge.proxy})
        assert not docker_client.networks.list(names=[edge.network])
    # said explicitly, it runs (and says so in the log)
    async with Orchestrator(egress_config(make_config, lab, require_host_firewall=False)) as orch:
        session = orch.session(agent="main", key="s-nofw2")
        assert (await session.call("exec", {"command": "true"})).ok
        await session.close()


async def test_web_fetch_goes_through_the_proxy_and_rechecks_every_redirect(make_config: Any, lab: Lab) -> None:
    before = len(lab.canary_heard())
    config = egress_config(make_config, lab, tools={"sandbox": {"tools": {"also_allow": ["web_fetch"]}}})
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-fetch")
        assert "web_fetch" in {t.name for t in session.tools()}
        page = await session.call("web_fetch", {"url": "http://allowed.test:8000/page"})
        assert page.ok, page.error
        out = page.output
        assert out["status"] == 200 and out["untrusted"] is True and out["redirects"] == []
        assert "Egress page" in out["content"] and "Ignore previous instructions." in out["content"]
        assert "evil()" not in out["content"]  # the script is not text
        assert out["content"].startswith("<<<EXTERNAL CONTENT from http://allowed.test:8000/page: untrusted")
        # a redirect within the allowlist is followed, and said
        moved = await session.call("web_fetch", {"url": "http://allowed.test:8000/redirect?to=/page"})
        assert moved.ok and moved.output["redirects"] == ["http://allowed.test:8000/page"], moved
        # refusals the model can act on
        off_list = await session.call("web_fetch", {"url": "http://canary.test:8000/"})
        assert off_list.error is not None, off_list.output
        assert off_list.error.code == "PERMISSION_DENIED" and "not on the egress allowlist" in off_list.error.message
        inward = await session.call(
            "web_fetch", {"url": "http://allowed.test:8000/redirect?to=http://linklocal.test:8000/meta"}
        )
        assert inward.error.code == "PERMISSION_DENIED" and "link-local" in inward.error.message, inward.error
        private = await session.call("web_fetch", {"url": "https://evil.test:8443/"})
        assert private.error.code == "PERMISSION_DENIED", private.error  # refused at CONNECT
        scheme = await session.call("web_fetch", {"url": "http://allowed.test:8000/redirect?to=file:///etc/passwd"})
        assert scheme.error.code == "INVALID_ARGUMENTS" and "redirect target" in scheme.error.message
        loop = await session.call("web_fetch", {"url": "http://allowed.test:8000/loop?n=0"})
        assert loop.error.code == "INVALID_ARGUMENTS" and "more than 5 times" in loop.error.message
        # braces and brackets are the URL's own: one request, not a list of URLs
        globbed = await session.call("web_fetch", {"url": "http://allowed.test:8000/x{a,b}[1-3]"})
        assert globbed.ok, globbed.error
        fetched = [line for line in lab.web.logs().decode().splitlines() if line.startswith("HTTP /x")]
        assert len(fetched) == 1, fetched
        cut = await session.call("web_fetch", {"url": "http://allowed.test:8000/big?n=5000", "max_chars": 100})
        assert cut.ok and cut.output["truncated"] is True and "[cut: 4900 more characters" in cut.output["content"]
        await session.close()
    assert lab.canary_heard()[before:] == []


async def test_a_secret_reaches_its_hosts_only_and_never_the_sandbox(
    make_config: Any, lab: Lab, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "s3cr3t-value-0123456789"
    monkeypatch.setenv("SBX_TEST_EGRESS_SECRET", value)
    upstream_ca = tmp_path / "upstream-ca.pem"
    upstream_ca.write_text(lab.web_cert)  # the proxy verifies the test server (a self-signed certificate)
    config = egress_config(
        make_config,
        lab,
        allow=["allowed.test", "api.test", "evil.test", "linklocal.test"],
        upstream_ca=str(upstream_ca),
        secrets={"API_TOKEN": {"value_from": "env:SBX_TEST_EGRESS_SECRET", "hosts": ["api.test"]}},
    )
    before = len(lab.web_heard())
    async with Orchestrator(config) as orch:
        session = orch.session(agent="main", key="s-secret")
        seen = await _sh(session, "printenv API_TOKEN; env | grep -c s3cr3t; true")
        placeholder = seen["output"].splitlines()[0]
        assert placeholder.startswith("sbx-secret-api-token-") and value not in seen["output"], seen
        assert seen["output"].splitlines()[1] == "0"  # the value is nowhere in the sandbox's environment
        # to its host, over TLS the sandbox verifies (its bundle trusts this proxy's CA): substituted
        named = await _sh(session, 'curl -sS -m 10 -H "Authorization: Bearer $API_TOKEN" https://api.test:8443/headers')
        assert named["output"] == "ok", named
        added = await _sh(session, "curl -sS -m 10 https://api.test:8443/headers")  # the header is put in
        assert added["output"] == "ok", added
        # to another host, and to its host in clear text: the placeholder goes out unchanged
        other = await _sh(
            session, 'curl -sS -k -m 10 -H "Authorization: Bearer $API_TOKEN" https://allowed.test:8443/headers'
        )
        assert other["output"] == "ok", other
        clear = await _sh(session, 'curl -sS -m 10 -H "Authorization: Bearer $API_TOKEN" http://api.test:8000/headers')
        assert clear["output"] == "ok", clear
        # a server that echoes the header gets the value, the sandbox its placeholder back
        echo = await _sh(session, "curl -sS -m 10 -D - https://api.test:8443/echo")
        assert value not in echo["output"] and f"Bearer {placeholder}" in echo["output"], echo
        assert f"X-Echo: Bearer {placeholder}" in echo["output"], echo
        # the placeholder outside its header, an absolute URL naming another host, TRACE: refused
        for attack in (
            'curl -sS -m 10 -w " %{http_code}" -H "X-Key: $API_TOKEN" https://api.test:8443/headers',
            'curl -sS -m 10 -w " %{http_code}" "https://api.test:8443/headers?t=$API_TOKEN"',
            'curl -sS -m 10 -w " %{http_code}" --request-target https://allowed.test:8443/headers https://api.test:8443/',
            'curl -sS -m 10 -w " %{http_code}" -X TRACE https://api.test:8443/headers',
        ):
            refused = await _sh(session, attack)
            assert refused["output"].endswith(" 403") and "egress refused" in refused["output"], (attack, refused)
        events = orch.journal.events(session=session.key)
        await session.close()
    heard = lab.web_heard()[before:]
    assert heard[0] == f"AUTH Bearer {value} X-KEY None" and heard[1] == f"AUTH Bearer {value} X-KEY None", heard
    assert heard[2] == f"AUTH Bearer {placeholder} X-KEY None", heard  # allowed.test: not its host
    assert heard[3] == f"AUTH Bearer {placeholder} X-KEY None", heard  # clear text: never substituted
    assert len(heard) == 4, heard  # the refused requests never reached the server
    lines = [e.data for e in events if e.stage == "egress"]
    assert sum(line.get("injected") == "API_TOKEN" for line in lines) == 3, lines  # two to /headers, one to /echo
    # the value never reaches the journal, whatever recorded the calls
    assert all(value not in json.dumps(e.data) for e in events)


def host_firewall_listing() -> str:
    """INPUT and our chain as iptables lists them (what an assertion shows when the host was reached)."""
    from sandbox.runtime.docker import hostfirewall

    shown = []
    for chain in ("INPUT", hostfirewall.CHAIN):
        listed = subprocess.run(["iptables", "-w", "5", "-S", chain], capture_output=True, text=True, check=False)
        shown.append(f"$ iptables -S {chain}\n{listed.stdout}{listed.stderr}")
    return "\n".join(shown)


async def test_the_proxy_refuses_the_host_even_when_told_it_may(make_config: Any, lab: Lab, docker_client: Any) -> None:
    """The host's own addresses (a public one the private-address check cannot know, played here
    by the upstream gateway, exempted on purpose) are refused by the proxy itself: the
    orchestrator hands it the host's addresses, and allow_private cannot open them. The proxy's
    verdict says so; the host's canary hears nothing."""
    gateway = docker_client.networks.get(lab.network).attrs["IPAM"]["Config"][0]["Gateway"]
    host_canary = Canary()
    out: dict[str, Any] = {}
    try:
        config = egress_config(
            make_config,
            lab,
            allow=["hostgw.test"],
            ports=[host_canary.port],
            allow_private=[f"{gateway}/32"],
            extra_hosts=[f"hostgw.test:{gateway}"],
        )
        async with Orchestrator(config) as orch:
            session = orch.session(agent="main", key="s-hostgw")
            out = await _sh(session, f"curl -sS -m 5 -w ' %{{http_code}}' http://hostgw.test:{host_canary.port}/; echo")
            proxy = egress.names(orch.manager.spec_for(session.agent, session.key).name).proxy
            env = dict(item.split("=", 1) for item in docker_client.api.inspect_container(proxy)["Config"]["Env"])
            await session.close()
            events = orch.journal.events(session=session.key)
    finally:
        host_canary.close()
    # first: whether the host was reached at all (a failure below then says how the refusal looked)
    assert host_canary.accepted == 0, f"the host's canary was reached: {out}\n{host_firewall_listing()}"
    assert out["output"].rstrip().endswith(" 502"), out
    assert "address of the host" in out["output"], out
    lines = [e.data for e in events if e.stage == "egress" and e.data.get("host") == "hostgw.test"]
    assert lines and all(line["verdict"] == "refused" for line in lines), lines
    assert "address of the host" in lines[0]["reason"], lines
    assert gateway in json.loads(env["EGRESS_POLICY"])["host_addresses"]


async def test_the_host_firewall_drops_what_the_proxy_opens_towards_the_host(
    make_config: Any, lab: Lab, docker_client: Any
) -> None:
    """The firewall on its own, past the proxy's address check: a connection the proxy
    container's own process opens to the host (the upstream gateway) is dropped by the host rules;
    the canary hears nothing. On failure the message holds the host's rules as they were."""
    gateway = docker_client.networks.get(lab.network).attrs["IPAM"]["Config"][0]["Gateway"]
    host_canary = Canary()
    probe = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({gateway!r}, {host_canary.port}), timeout=3); print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n"
    )
    output, rules = "", ""
    try:
        async with Orchestrator(egress_config(make_config, lab)) as orch:
            session = orch.session(agent="main", key="s-proxyfw")
            assert (await _sh(session, "true"))["exit_code"] == 0
            proxy = docker_client.containers.get(
                egress.names(orch.manager.spec_for(session.agent, session.key).name).proxy
            )
            done = await anyio.to_thread.run_sync(lambda: proxy.exec_run(["python3", "-c", probe]))
            output = done.output.decode(errors="replace")
            rules = host_firewall_listing()
            await session.close()
    finally:
        host_canary.close()
    assert host_canary.accepted == 0, f"the proxy reached the host: {output}\n{rules}"
    assert "refused" in output and "connected" not in output, f"{output}\n{rules}"
