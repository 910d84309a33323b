"""The speed gate: a short interleaved run of the hot paths against their baselines, failing when
a ratio passes its committed threshold (bench/gate_thresholds.json). `.ci/run` runs it after the
tests, so every change is checked for speed.

Each round takes one sample of every operation in turn (the tool, then its raw docker SDK
baseline on the same container), so a busy engine or a noisy neighbour weighs on both alike:
- exec `true` through the whole pipeline vs `exec_run(["true"])`;
- read and write of 4 KiB through the tools vs `get_archive` / `put_archive`;
- the HTTP service's overhead: a `read` through `POST /v1/sessions/{key}/calls` on `sandbox
  serve` in its own process (loopback) minus the same call through the library, in ms: `http`
  through httpx (as the Python client sends it), `service` through a lean HTTP/1.1 client
  (bench/_http11.py), which is what the service itself adds;
- a new session's first `exec true` from the warm pool (refilled between rounds, outside the
  timing) vs a raw cold `containers.run(image, "true", remove=True)`.

The thresholds are today's ratios with a margin for this noisy 2-core machine (about 2x): a gate
against regressions, not the goals of issue 29, which the other benches report.

Run: python bench/gate.py [--rounds N]   (needs the engine and the images; exit 1 on a failure)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
import docker
import httpx
from _http11 import Http11
from _stats import pct
from tools import tar_of

from sandbox import Orchestrator, load_config_text
from tests.service_helpers import TOKEN_A, serve_process, sha

THRESHOLDS = Path(__file__).with_name("gate_thresholds.json")
CONTENT = "x" * 4095 + "\n"


async def _ms(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


async def _ms_sync(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


async def measure(rounds: int, tmp: Path) -> dict[str, tuple[list[float], list[float]]]:
    """(ours, baseline) samples in ms per operation, interleaved round by round."""
    ws = tmp / "ws"
    ws.mkdir()
    os.chown(ws, 1000, 1000)
    text = (
        f"state_dir: {tmp}/state\ninstance: gate{os.getpid()}\n"
        f"tenants: [{{id: acme, tokens: [{{name: gate, sha256: {sha(TOKEN_A)}}}]}}]\n"
        "agents: {defaults: {sandbox: {mode: all, scope: agent, workspace_access: rw}}, "
        f"list: [{{id: a, tenant: acme, workspace: '{ws}'}}, "
        "{id: p, tenant: acme, sandbox: {scope: session, workspace_access: none, pool: {size: 1}}}]}\n"
    )
    config = load_config_text(text)
    (tmp / "sandbox.yaml").write_text(text)
    client = docker.from_env()
    names = ("exec", "read", "write", "http", "service", "pool")
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
    # the service in a process of its own, as it runs: its event loop is not this one's
    with serve_process(tmp / "sandbox.yaml") as (url, _proc):
        try:
            await _rounds(config, client, url, rounds, samples)
        finally:
            client.close()
    return samples


async def _rounds(
    config: Any, client: Any, url: str, rounds: int, samples: dict[str, tuple[list[float], list[float]]]
) -> None:
    if True:
        async with Orchestrator(config) as orch:
            session = orch.session("agent:a:gate")
            await session.call("write", {"path": "f.txt", "content": CONTENT})
            box = await session.sandbox()
            assert box is not None
            container = client.containers.get(box.id)
            box_image = container.image.id
            archive = tar_of("f.txt", CONTENT.encode())
            headers = {"Authorization": f"Bearer {TOKEN_A}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:

                async def ok(name: str, args: dict[str, Any]) -> None:
                    result = await session.call(name, args)
                    assert result.ok, result.error

                lean = Http11(url, headers)

                async def over_lean_http() -> None:
                    status, body = lean.request(
                        "POST", "/v1/sessions/agent:a:gate/calls", {"tool": "read", "args": {"path": "f.txt"}}
                    )
                    assert status == 200 and json.loads(body)["ok"], body

                async def over_http() -> None:
                    answer = await http.post(
                        "/v1/sessions/agent:a:gate/calls", json={"tool": "read", "args": {"path": "f.txt"}}
                    )
                    assert answer.status_code == 200 and answer.json()["ok"], answer.text

                pairs: dict[str, tuple[Callable[[], Awaitable[float]], Callable[[], Awaitable[float]]]] = {
                    "exec": (
                        lambda: _ms(lambda: ok("exec", {"command": "true"})),
                        lambda: _ms_sync(lambda: container.exec_run(["true"])),
                    ),
                    "read": (
                        lambda: _ms(lambda: ok("read", {"path": "f.txt"})),
                        lambda: _ms_sync(lambda: b"".join(container.get_archive("/workspace/f.txt")[0])),
                    ),
                    "write": (
                        lambda: _ms(lambda: ok("write", {"path": "f.txt", "content": CONTENT})),
                        lambda: _ms_sync(lambda: container.put_archive("/workspace", archive)),
                    ),
                    "http": (lambda: _ms(over_http), lambda: _ms(lambda: ok("read", {"path": "f.txt"}))),
                    "service": (lambda: _ms(over_lean_http), lambda: _ms(lambda: ok("read", {"path": "f.txt"}))),
                    "pool": (
                        lambda: pooled_first_call(orch),
                        lambda: _ms_sync(lambda: client.containers.run(box_image, ["true"], remove=True)),
                    ),
                }
                for round_ in range(rounds + 3):  # three warm-up rounds, not kept
                    for name, (ours, baseline) in pairs.items():
                        if round_ % 2:  # who goes first alternates: the one after a heavy step pays for its tail
                            theirs, mine = await baseline(), await ours()
                        else:
                            mine, theirs = await ours(), await baseline()
                        if round_ >= 3:
                            samples[name][0].append(mine)
                            samples[name][1].append(theirs)
                lean.close()
            for info in await orch.manager.list():
                await orch.backend.remove(info.id)


_pooled = iter(range(1_000_000))
# measured as the ms a call over HTTP adds to the same call in the library: through httpx (what
# the Python client uses) and through a lean HTTP/1.1 client (what the service itself adds)
ADDED_MS = frozenset({"http", "service"})
ATTEMPTS = 3
NOISY_SPELL_WAIT_S = 60.0


async def pooled_first_call(orch: Orchestrator) -> float:
    """A new session's first call, its pool member ready (filled, and closed after: untimed)."""
    await orch.fill_pools()
    session = orch.session(f"agent:p:gate-pool-{next(_pooled)}")
    took = await _ms(lambda: session.call("exec", {"command": "true"}))
    await session.close()
    return took


def verdicts(
    samples: dict[str, tuple[list[float], list[float]]], limits: dict[str, float]
) -> list[tuple[str, float, float, float, float, bool]]:
    """(name, ours p50, baseline p50, measure, limit, passed) per operation: a ratio of p50s,
    or for `http` the difference in ms."""
    rows = []
    for name, (ours, baseline) in samples.items():
        mine, theirs = pct(ours, 50), pct(baseline, 50)
        value = mine - theirs if name in ADDED_MS else mine / theirs
        rows.append((name, mine, theirs, value, limits[name], value <= limits[name]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    limits = json.loads(THRESHOLDS.read_text())["limits"]
    best: dict[str, tuple[str, float, float, float, float, bool]] = {}
    for attempt in range(1, ATTEMPTS + 1):
        # a row fails only when it fails in every run: a regression holds in each, while a noisy
        # spell of this shared machine (one on 2026-12-07 doubled our exec for 20 minutes with no
        # change to the code) rarely outlasts three; the last run waits for it a minute first
        with tempfile.TemporaryDirectory() as tmp:
            samples = anyio.run(measure, args.rounds, Path(tmp))
        for row in verdicts(samples, limits):
            if row[0] not in best or row[3] < best[row[0]][3]:
                best[row[0]] = row
        if all(row[5] for row in best.values()) or attempt == ATTEMPTS:
            break
        over = ", ".join(name for name, row in best.items() if not row[5])
        print(f"speed gate: {over} over a limit in run {attempt}; measuring again")
        if attempt == ATTEMPTS - 1:
            time.sleep(NOISY_SPELL_WAIT_S)
    rows = list(best.values())
    print(
        f"speed gate: {args.rounds} interleaved rounds, p50 in ms ({time.strftime('%Y-%m-%d %H:%M')}, load "
        f"{os.getloadavg()[0]:.2f}){'' if attempt == 1 else f', each row its best of {attempt} runs'}"
    )
    print(f"{'operation':<8} {'ours':>8} {'baseline':>9} {'measure':>10} {'limit':>8}  verdict")
    for name, mine, theirs, value, limit, passed in rows:
        unit = " ms" if name in ADDED_MS else "x"
        print(
            f"{name:<8} {mine:>8.2f} {theirs:>9.2f} {value:>9.3f}{unit:<1} {limit:>7.3f}{unit:<1}  {'ok' if passed else 'FAILED'}"
        )
    failed = [row[0] for row in rows if not row[5]]
    if failed:
        print(f"speed gate failed: {', '.join(failed)} past the thresholds in {THRESHOLDS.name}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
