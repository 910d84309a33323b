"""Benchmark: policy resolution for 1,000 agents x 10 sessions from one config.

Run: python bench/policy.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from _stats import pct

from sandbox.config import load_config
from sandbox.policy import Identity, PolicyResolver

AGENTS, SESSIONS = 1000, 10


def make_config(folder: Path) -> Path:
    agents = []
    for i in range(AGENTS):
        tools: dict[str, object] = {}
        if i % 3 == 0:
            tools = {"allow": ["group:fs", "web_*", "session_status"], "deny": ["write"]}
        elif i % 3 == 1:
            tools = {"profile": "messaging", "also_allow": ["read"]}
        agents.append({"id": f"agent-{i}", "tools": tools, "sandbox": {"mode": "non-main", "scope": "session"}})
    config = {
        "state_dir": str(folder / "state"),
        "tools": {
            "profile": "full",
            "deny": ["gateway"],
            "by_provider": {"acme": {"deny": ["browser"]}, "acme/tiny": {"profile": "minimal"}},
            "sandbox": {"tools": {"also_allow": ["web_fetch"]}},
        },
        "agents": {"list": agents},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = make_config(Path(tmp))
        start = time.perf_counter()
        config = load_config(path)
        load_ms = (time.perf_counter() - start) * 1000
        resolver = PolicyResolver(config)
        identities = [
            Identity(f"agent-{a}", f"agent:agent-{a}:{'main' if s == 0 else f'chat-{s}'}", "acme" if s % 2 else None)
            for a in range(AGENTS)
            for s in range(SESSIONS)
        ]
        first = []
        for ident in identities:
            t = time.perf_counter()
            resolver.resolve(ident)
            first.append((time.perf_counter() - t) * 1e6)
        cached = []
        for _ in range(3):
            for ident in identities:
                t = time.perf_counter()
                resolver.resolve(ident)
                cached.append((time.perf_counter() - t) * 1e6)
    print(f"policy resolution: {AGENTS} agents x {SESSIONS} sessions = {len(identities)} identities\n")
    print(f"{'measure':<38} {'p50':>10} {'p90':>10} {'p99':>10}  goal")
    print(
        f"{'first resolution (compile), us':<38} {pct(first, 50):10.1f} {pct(first, 90):10.1f} {pct(first, 99):10.1f}  <= 500 us"
    )
    print(
        f"{'cached resolution, us':<38} {pct(cached, 50):10.2f} {pct(cached, 90):10.2f} {pct(cached, 99):10.2f}  <= 20 us"
    )
    print(f"{'load + validate config (1 run), ms':<38} {load_ms:10.1f}")
    print(f"\ncached / first at p50: {pct(cached, 50) / pct(first, 50):.3f}")


if __name__ == "__main__":
    main()
