"""Benchmark: what the HTTP service adds to a call (loopback only, bounded).

The same small call (`read` of a 12-byte file, host mode, journal on) through the library and
through `POST /v1/sessions/{key}/calls` on `sandbox serve` in its own process, then 50
concurrent HTTP clients, then 20 concurrent sandboxed `exec true` through HTTP and through the
library (needs the engine and the images; skipped with --no-docker).
Run: python bench/service.py [--no-docker]
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import httpx
from _stats import pct, table

from sandbox import Orchestrator, load_config_text

N = 300
CLIENTS, PER_CLIENT = 50, 20
EXECS = 20
TOKEN = "sbx_bench-token"
NOISY_TOKEN = "sbx_bench-noisy-token"  # a second tenant, held to 60 calls a minute
NOISY_CLIENTS = 20


def config_text(tmp: str) -> str:
    return (
        f"state_dir: {tmp}/state\ntools: {{profile: full}}\n"
        "tenants:\n"
        f"  - {{id: t, allow_unsandboxed: true, tokens: [{{name: b, sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}}}]}}\n"
        f"  - {{id: noisy, allow_unsandboxed: true, quotas: {{max_calls_per_minute: 60}}, "
        f"tokens: [{{name: n, sha256: {hashlib.sha256(NOISY_TOKEN.encode()).hexdigest()}}}]}}\n"
        "limits: {global_concurrency: 100, tenant_concurrency: 100, queue: {max_depth: 1000}}\n"
        "agents:\n"
        f"  list:\n"
        f"    - {{id: host, tenant: t, default: true, workspace: '{tmp}/ws', sandbox: {{mode: 'off'}}}}\n"
        f"    - {{id: boxed, tenant: t, workspace: '{tmp}/wb', sandbox: {{mode: all, scope: agent}}}}\n"
        f"    - {{id: loud, tenant: noisy, workspace: '{tmp}/wn', sandbox: {{mode: 'off'}}}}\n"
    )


def start(config_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`sandbox serve` in its own process (a server thread here would share the GIL with the clients)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--config", str(config_file), "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("the service did not start")


async def library(config: object, key: str, tool: str, args: dict[str, object], n: int) -> list[float]:
    out = []
    async with Orchestrator(config) as orch:  # type: ignore[arg-type]
        sess = orch.session(key)
        for _ in range(10):
            await sess.call(tool, args)
        for _ in range(n):
            t = time.perf_counter()
            await sess.call(tool, args)
            out.append((time.perf_counter() - t) * 1000)
    return out


async def library_burst(config: object, key: str, tool: str, args: dict[str, object], n: int) -> float:
    async with Orchestrator(config) as orch:  # type: ignore[arg-type]
        sess = orch.session(key)
        await sess.call(tool, args)
        start_t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(sess.call, tool, args)
        return (time.perf_counter() - start_t) * 1000


def http_floor(url: str, n: int) -> list[float]:
    """GET /healthz: what any request costs through this client and server (no auth, no engine)."""
    out = []
    with httpx.Client(timeout=30) as client:
        for _ in range(10):
            client.get(f"{url}/healthz")
        for _ in range(n):
            t = time.perf_counter()
            client.get(f"{url}/healthz")
            out.append((time.perf_counter() - t) * 1000)
    return out


def http_sequential(url: str, key: str, tool: str, args: dict[str, object], n: int) -> list[float]:
    out = []
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as client:
        body = {"tool": tool, "args": args}
        for _ in range(10):
            client.post(f"{url}/v1/sessions/{key}/calls", json=body)
        for _ in range(n):
            t = time.perf_counter()
            r = client.post(f"{url}/v1/sessions/{key}/calls", json=body)
            out.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200 and r.json()["ok"], r.text
    return out


async def http_clients(
    url: str, key: str, tool: str, args: dict[str, object], clients: int, each: int
) -> tuple[list[float], float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300, limits=limits) as client:

        async def one() -> None:
            for _ in range(each):
                t = time.perf_counter()
                r = await client.post(f"{url}/v1/sessions/{key}/calls", json={"tool": tool, "args": args})
                latencies.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200 and r.json()["ok"], r.text

        start_t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(clients):
                tg.start_soon(one)
        return latencies, (time.perf_counter() - start_t) * 1000


NOISE = """
import sys, anyio, httpx
url, token, clients = sys.argv[1], sys.argv[2], int(sys.argv[3])
codes = {}
async def main():
    async with httpx.AsyncClient(headers={"Authorization": "Bearer " + token}, timeout=60) as client:
        async def one():
            while True:
                r = await client.post(url + "/v1/sessions/agent:loud:x/calls", json={"tool": "read", "args": {"path": "none"}})
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
        with anyio.move_on_after(float(sys.argv[4])):
            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(one)
    print(codes.get(200, 0), codes.get(429, 0))
anyio.run(main)
"""


def beside_a_noisy_tenant(url: str, n: int, seconds: float) -> tuple[list[float], int, int]:
    """Tenant t's sequential calls while tenant `noisy` hammers past its quota from 20 clients in
    another process (a thread here would take the measuring client's GIL). Returns t's latencies
    and how many of noisy's requests were answered 200 and refused 429."""
    noise = subprocess.Popen(
        [sys.executable, "-c", NOISE, url, NOISY_TOKEN, str(NOISY_CLIENTS), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)  # the noisy tenant is past its quota before we measure
    measured = http_sequential(url, "agent:host:beside", "read", {"path": "note.txt"}, n)
    out = noise.communicate(timeout=seconds + 60)[0].split()
    if noise.returncode != 0 or len(out) != 2:
        raise RuntimeError(f"the noisy client failed: {out}")
    return measured, int(out[0]), int(out[1])


def main() -> None:
    docker = "--no-docker" not in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ws").mkdir()
        Path(tmp, "ws", "note.txt").write_text("hello bench\n")
        config = load_config_text(config_text(tmp))
        config_file = Path(tmp, "sandbox.yaml")
        config_file.write_text(config_text(tmp))
        server, url = start(config_file)
        try:
            read = {"path": "note.txt"}
            lib = anyio.run(library, config, "agent:host:b1", "read", read, N)
            http = http_sequential(url, "agent:host:b2", "read", read, N)
            many, wall = anyio.run(http_clients, url, "agent:host:b3", "read", read, CLIENTS, PER_CLIENT)
            floor = http_floor(url, N)
            # the noise outlasts the measurement (about 2 s of calls here)
            beside, noisy_ok, noisy_429 = beside_a_noisy_tenant(url, N, seconds=2.0 + N * pct(http, 90) / 1000 * 2)
            rows = [
                (f"GET /healthz: the HTTP floor (n={N})", floor, None, ""),
                (f"read through HTTP, sequential (n={N})", http, lib, "HTTP adds <= 2 ms p50"),
                (f"read through the library (baseline, n={N})", lib, None, ""),
                (f"read, {CLIENTS} concurrent HTTP clients x {PER_CLIENT}", many, lib, ""),
                (f"read through HTTP beside a tenant past its quota (n={N})", beside, http, "not slowed"),
            ]
            print(table("the service's cost per call (loopback)", rows))
            added = pct(http, 50) - pct(lib, 50)
            print(
                f"\nHTTP adds {added:.2f} ms at p50 (p99: HTTP {pct(http, 99):.2f} ms, library {pct(lib, 99):.2f} ms)"
            )
            print(
                f"beside tenant `noisy` ({NOISY_CLIENTS} clients, {noisy_ok} answered, {noisy_429} refused 429): "
                f"p50 {pct(beside, 50):.2f} ms against {pct(http, 50):.2f} ms alone "
                f"(ratio {pct(beside, 50) / pct(http, 50):.2f}; both tenants share this process's two cores)"
            )
            total = CLIENTS * PER_CLIENT
            print(
                f"{CLIENTS} clients: {total} calls in {wall:.0f} ms ({total / wall * 1000:,.0f} calls/s), p99 {pct(many, 99):.1f} ms"
            )
            if docker:
                exec_true = {"command": "true"}
                # both bursts run in a session that already ran a call (its user and agent exist)
                http_sequential(url, "agent:boxed:e1", "exec", exec_true, 1)
                _, exec_wall = anyio.run(http_clients, url, "agent:boxed:e1", "exec", exec_true, EXECS, 1)
                lib_wall = anyio.run(library_burst, config, "agent:boxed:e2", "exec", exec_true, EXECS)
                print(
                    f"{EXECS} concurrent sandboxed `exec true`: through HTTP {exec_wall:.0f} ms, "
                    f"through the library {lib_wall:.0f} ms (ratio {exec_wall / lib_wall:.2f})"
                )
        finally:
            server.terminate()
            server.wait(timeout=30)
            if docker:
                anyio.run(remove_sandboxes, config)


async def remove_sandboxes(config: object) -> None:
    """The bench's sandboxes go with it (agent scope: closing a session would leave them)."""
    async with Orchestrator(config) as orch:  # type: ignore[arg-type]
        for info in await orch.manager.list():
            await orch.manager.remove(info)


if __name__ == "__main__":
    main()
