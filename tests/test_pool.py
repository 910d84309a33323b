"""The warm pool's pure parts: what may share a pool, and the claim that only one process wins."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from sandbox.config import effective_agent, load_config_text
from sandbox.runtime.docker.pool import PoolClaims
from sandbox.runtime.spec import spec_from_config


def spec(tmp_path: Path, session: str, extra: str = "", agent: str = "main") -> Any:
    config = load_config_text(
        f"state_dir: {tmp_path}/state\n"
        f"agents: {{defaults: {{sandbox: {{mode: all, scope: session, pool: {{size: 2}}{extra}}}}}, "
        "list: [{id: main}, {id: other, tenant: globex}]}\n"
    )
    return spec_from_config(config, effective_agent(config, agent), f"agent:{agent}:{session}", "inst")


def test_sessions_of_one_agent_share_a_pool_key_and_nothing_else_does(tmp_path: Path) -> None:
    one, two = spec(tmp_path, "one"), spec(tmp_path, "two")
    assert one.pool_key == two.pool_key and one.config_hash != two.config_hash  # scratch paths differ
    assert spec(tmp_path, "one", ", docker: {memory: 2g}").pool_key != one.pool_key  # config drift
    assert spec(tmp_path, "one", agent="other").pool_key != one.pool_key  # another agent and tenant
    assert spec(tmp_path, "one", ", docker: {network: egress}").pool_key is None  # its own edge


def test_agent_and_shared_scopes_have_no_pool(tmp_path: Path) -> None:
    for scope in ("agent", "shared"):
        config = load_config_text(
            f"state_dir: {tmp_path}/state\nagents: {{defaults: {{sandbox: {{mode: all, scope: {scope}}}}}}}\n"
        )
        assert spec_from_config(config, effective_agent(config, "main"), "agent:main:x", "i").pool_key is None


def test_a_member_is_labelled_for_the_pool_and_names_no_session(tmp_path: Path) -> None:
    member = spec(tmp_path, "pool-123").as_pool_member()
    labels = member.labels()
    assert member.name.startswith("sbx-inst-pool-") and len(member.name) <= 63
    assert labels["io.agent-sandbox.pool"] == member.pool_key
    assert labels["io.agent-sandbox.scope"] == "pool" and labels["io.agent-sandbox.session"] == ""
    assert labels["io.agent-sandbox.pool-scratch"] == member.workspace.source == str(member.scratch_folder)


def _race(root: str, container_id: str, who: int, results: Any) -> None:
    claims = PoolClaims(Path(root))
    results.put((who, claims.take(container_id, spec(Path(root), f"s{who}"))))


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_of_many_processes_claiming_one_container_exactly_one_wins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")  # quick; the children only make a file
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), "abc123", i, results)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    outcomes = [results.get(timeout=10) for _ in procs]
    winners = [who for who, won in outcomes if won]
    assert len(winners) == 1
    claim = PoolClaims(tmp_path).get("abc123")
    assert claim is not None and claim.session == f"agent:main:s{winners[0]}"


def test_claim_records_are_files_of_container_ids_only(tmp_path: Path) -> None:
    claims = PoolClaims(tmp_path)
    for bad in ("../escape", "a/b", ""):
        try:
            claims.take(bad, spec(tmp_path, "x"))
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
    assert not (tmp_path / "escape").exists()


class _PoolingBackend:
    """Offers the Docker warm pool and nothing else (nothing is called on it here)."""

    name = "docker"

    def warm_pool(self, manager: Any) -> Any:
        from sandbox.runtime.docker.pool import WarmPool

        return WarmPool(manager, self)  # type: ignore[arg-type]


def test_pool_size_is_set_by_default_and_per_agent(tmp_path: Path) -> None:
    """`sandbox.pool` merges like every sandbox key: a default for all, an agent's own over it;
    only session-scoped, sandboxed agents are pooled."""
    from sandbox.runtime.docker.pool import WarmPool
    from sandbox.runtime.manager import SandboxManager

    config = load_config_text(
        f"state_dir: {tmp_path}/state\n"
        "agents:\n"
        "  defaults: {sandbox: {mode: all, scope: session, pool: {size: 3}}}\n"
        "  list:\n"
        "    - {id: coder}\n"
        "    - {id: quiet, sandbox: {pool: {size: 0}}}\n"
        "    - {id: wide, sandbox: {pool: {size: 5}}}\n"
        "    - {id: shared, sandbox: {scope: agent}}\n"
        "    - {id: host, sandbox: {mode: 'off'}}\n"
    )
    manager = SandboxManager(config, backend=_PoolingBackend())  # type: ignore[arg-type]
    assert isinstance(manager.pool, WarmPool)
    assert {a.id: a.sandbox.pool.size for a in manager.pool.pooled_agents()} == {"coder": 3, "wide": 5}


def test_workspace_volumes_are_per_tenant_and_scope_key() -> None:
    """The same session key in two tenants, or two keys in one, never name the same volume."""
    from sandbox.runtime.spec import volume_name

    names = {
        volume_name("inst", "acme", "agent:a:work"),
        volume_name("inst", "globex", "agent:a:work"),
        volume_name("inst", "acme", "agent:a:Work"),
        volume_name("other", "acme", "agent:a:work"),
    }
    assert len(names) == 4 and all(n.startswith(("sbx-inst-ws-", "sbx-other-ws-")) for n in names)
