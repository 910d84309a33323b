"""Benchmark: what the egress proxy adds to a small HTTP GET, against a direct GET on a bridge network.

Run: python bench/egress.py   (needs the engine and `sandbox images build`)

Everything talks only to a server this benchmark starts, on a network it creates. The same client
script (Python, a new connection per request, as curl or pip make them) runs twice in one run:
in a container on the server's bridge network (the baseline: direct, no proxy), and in an egress
sandbox whose requests go through its proxy, once as plain proxied HTTP and once through a
CONNECT tunnel (how HTTPS travels). The client measures inside its container, so docker exec
costs are not in the numbers. The first call of a new egress session (sandbox, network and proxy
made) is timed against a first call on `network: none`.
"""

from __future__ import annotations

import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import docker
import yaml
from _stats import table

from sandbox import Orchestrator, load_config_text

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
RUN = f"bench-egress-{secrets.token_hex(3)}"
# HTTP on 8000, HTTPS on 8443 (tunnels carry TLS only), a self-signed certificate for web.bench
SERVER = r"""
import http.server, ssl, subprocess, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        body = b"x" * 512
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=web.bench",
                "-keyout", "/tmp/k.pem", "-out", "/tmp/c.pem"], check=True, capture_output=True)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); tls.load_cert_chain("/tmp/c.pem", "/tmp/k.pem")
secure = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
secure.socket = tls.wrap_socket(secure.socket, server_side=True)
threading.Thread(target=secure.serve_forever, daemon=True).start()
print("listening", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""
# mode: direct | proxy (absolute-form GET to the proxy) | tls-direct | tunnel (CONNECT, then HTTPS
# inside); certificates are not verified (the server's is self-signed): the cost measured is the path
CLIENT = r"""
import http.client, json, os, ssl, sys, time
mode, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
proxy = os.environ.get("HTTP_PROXY", "http://x:0").split("//")[1]
phost, pport = proxy.split(":")
tls = ssl._create_unverified_context()
def once():
    if mode == "direct":
        c = http.client.HTTPConnection(host, 8000, timeout=10); c.request("GET", "/")
    elif mode == "proxy":
        c = http.client.HTTPConnection(phost, int(pport), timeout=10); c.request("GET", f"http://{host}:8000/")
    elif mode == "tls-direct":
        c = http.client.HTTPSConnection(host, 8443, timeout=10, context=tls); c.request("GET", "/")
    else:
        c = http.client.HTTPSConnection(phost, int(pport), timeout=10, context=tls)
        c.set_tunnel(host, 8443); c.request("GET", "/")
    r = c.getresponse(); body = r.read(); c.close()
    assert r.status == 200 and len(body) == 512, (r.status, len(body))
for _ in range(5):
    once()
out = []
for _ in range(n):
    t = time.perf_counter(); once(); out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def _samples(output: bytes | str) -> list[float]:
    text = output.decode() if isinstance(output, bytes) else output
    return [float(x) for x in json.loads(text.strip().splitlines()[-1])]


def config(tmp: str, network_name: str, server_ip: str, egress: bool, key: str) -> Any:
    sandbox: dict[str, Any] = {"mode": "all", "scope": "session", "workspace_root": f"{tmp}/ws"}
    if egress:
        sandbox["docker"] = {"network": "egress"}
        sandbox["egress"] = {
            "allow": ["web.bench"],
            "ports": [8000, 8443],
            "upstream_network": network_name,
            "allow_private": [f"{server_ip}/32"],  # the benchmark's own server
        }
    data = {
        "state_dir": f"{tmp}/state-{key}",
        "instance": f"be{secrets.token_hex(2)}",
        "agents": {"defaults": {"sandbox": sandbox}},
    }
    return load_config_text(yaml.safe_dump(data), source="bench.yaml")


async def in_sandbox(cfg: Any, key: str, modes: list[str]) -> tuple[float, dict[str, list[float]]]:
    """(first call ms, samples per mode) of an egress (or none) sandbox's client."""
    async with Orchestrator(cfg) as orch:
        session = orch.session(agent="main", key=key)
        try:
            start = time.perf_counter()
            first = await session.call("exec", {"command": "true"})
            first_ms = (time.perf_counter() - start) * 1000
            assert first.ok, first.error
            out: dict[str, list[float]] = {}
            for mode in modes:
                script = CLIENT.replace("'", "'\\''")
                result = await session.call(
                    "exec", {"command": f"python3 -c '{script}' {mode} web.bench {N}", "timeout_s": 600}
                )
                assert result.ok and result.output["exit_code"] == 0, result
                out[mode] = _samples(result.output["output"])
        finally:
            await session.close()  # its sandbox, proxy and network go, whatever happened
        return first_ms, out


def main() -> None:
    client = docker.from_env()
    network = client.networks.create(RUN, labels={"bench": RUN})
    server = client.containers.run(
        "sandbox-exec:latest", ["python3", "-u", "-c", SERVER], name=f"{RUN}-web", detach=True, network=RUN
    )
    client.api.disconnect_container_from_network(server.id, RUN)
    client.api.connect_container_to_network(server.id, RUN, aliases=["web.bench"])
    try:
        deadline = time.monotonic() + 20
        while b"listening" not in server.logs() and time.monotonic() < deadline:
            time.sleep(0.1)
        server.reload()
        server_ip = server.attrs["NetworkSettings"]["Networks"][RUN]["IPAddress"]
        # the baseline: the same client, direct, from a container on the server's bridge network
        direct_out = client.containers.run(
            "sandbox-exec:latest",
            ["python3", "-c", CLIENT, "direct", "web.bench", str(N)],
            network=RUN,
            remove=True,
        )
        direct = _samples(direct_out)
        tls_direct = _samples(
            client.containers.run(
                "sandbox-exec:latest",
                ["python3", "-c", CLIENT, "tls-direct", "web.bench", str(N)],
                network=RUN,
                remove=True,
            )
        )
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "ws").mkdir()
            first_none, _ = anyio.run(in_sandbox, config(tmp, RUN, server_ip, False, "n"), "b-none", [])
            first_egress, through = anyio.run(
                in_sandbox, config(tmp, RUN, server_ip, True, "e"), "b-egress", ["proxy", "tunnel"]
            )
        rows = [
            (f"GET direct, bridge network (base, n={N})", direct, None, ""),
            (f"GET through the egress proxy (n={N})", through["proxy"], direct, ""),
            (f"HTTPS GET direct (base, n={N})", tls_direct, None, ""),
            (f"HTTPS GET in a CONNECT tunnel (n={N})", through["tunnel"], tls_direct, ""),
        ]
        print(table("what the egress proxy adds to a small HTTP GET (512-byte body, new connection each)", rows))
        print(
            f"\nfirst call of a new session: network egress {first_egress:.0f} ms "
            f"(sandbox + internal network + proxy), network none {first_none:.0f} ms "
            f"(ratio {first_egress / first_none:.2f})"
        )
    finally:
        network.reload()
        for container_id in network.attrs.get("Containers") or {}:
            client.api.remove_container(container_id, force=True)
        network.remove()
        client.close()


if __name__ == "__main__":
    main()
