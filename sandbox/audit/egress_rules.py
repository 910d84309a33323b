"""Config rules about `network: egress`: what each agent's proxy lets it reach, and the wide doors.

`network: bridge` and `host` are the container rules SBX-C028 and SBX-C008; these add what only
the egress config says: the allowlist itself (reported for every egress agent, so a security team
sees each sandbox's reach in one place), wildcards over everything or over a whole top-level
domain, and exemptions from the private-address refusal.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from sandbox.audit.findings import Finding
from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.runtime.docker import subnets
from sandbox.runtime.netranges import special_blocks
from sandbox.runtime.spec import EGRESS_NETWORK


def egress_findings(agent: EffectiveAgent, target: str) -> list[Finding]:
    """SBX-N001..N004 for one agent (nothing unless its network is egress)."""
    sandbox = agent.sandbox
    if sandbox.docker.network != EGRESS_NETWORK:
        return []
    cfg = sandbox.egress
    where = f"{agent.key_path}.sandbox.egress"
    floor = agent.egress_floor
    floor_text = f"; tenant {agent.tenant}'s floor: {list(floor)}" if floor is not None else ""
    out = [
        Finding(
            "SBX-N001",
            "info",
            "egress allowlist",
            f"through its proxy the sandbox reaches {cfg.allow or 'nothing'} on ports {sorted(set(cfg.ports))}"
            f"{floor_text}; caps {cfg.max_bytes} and {cfg.max_duration_s:g} s per request or tunnel"
            + "".join(
                f"; secret {name} ({secret.value_from}) goes to {list(secret.hosts)} in {secret.header}"
                for name, secret in sorted(cfg.secrets.items())
            ),
            "keep the list to the hosts the agent needs",
            target,
        )
    ]
    everything = "*" in cfg.allow and (floor is None or "*" in floor)
    if everything:
        out.append(
            Finding(
                "SBX-N002",
                "high",
                "egress allowlist allows every host",
                f"{where}.allow holds `*`" + ("" if floor is None else " and so does the tenant's floor"),
                "list the hosts the agent needs (pypi.org, *.pythonhosted.org, ...)",
                target,
            )
        )
    wide = sorted(p for p in cfg.allow if p.startswith("*.") and "." not in p[2:].rstrip("."))
    if wide:
        out.append(
            Finding(
                "SBX-N003",
                "medium",
                "egress wildcard over a whole top-level domain",
                f"{where}.allow holds {wide}: every site under it is reachable",
                "name the sites, or at least their registered domains",
                target,
            )
        )
    if cfg.allow_private:
        out.append(
            Finding(
                "SBX-N004",
                "medium",
                "egress may reach private addresses",
                f"{where}.allow_private exempts {cfg.allow_private} from the private-address refusal"
                f"{_special_names(cfg.allow_private)}: a name on the allowlist that resolves there reaches your "
                "internal network",
                "exempt only the exact address of the internal mirror (a /32), or remove the exemption",
                target,
            )
        )
    return out


def _special_names(ranges: list[str]) -> str:
    """The IANA special-purpose blocks (not globally reachable) the ranges overlap, as text."""
    hit = []
    for text in ranges:
        net = ipaddress.ip_network(text, strict=False)
        for block, name, reachable in special_blocks():
            if reachable != "True" and block.version == net.version and block.overlaps(net) and name not in hit:
                hit.append(name)
    return f" (IANA special-purpose space: {', '.join(hit)})" if hit else ""


def pool_findings(config: Config, client: Any) -> list[Finding]:
    """SBX-N005: an address pool for egress and browser networks that is running low (less than
    a tenth free), one finding per pool; nothing without an engine or when no agent uses one."""
    pools = set()
    for agent_id in agent_ids(config):
        sandbox = effective_agent(config, agent_id).sandbox
        if sandbox.docker.network == EGRESS_NETWORK or sandbox.browser.enabled:
            pools.add(sandbox.egress.subnet_pool)
    out = []
    for pool in sorted(pools):
        use = subnets.usage(client, pool)
        if use.low:
            out.append(
                Finding(
                    "SBX-N005",
                    "medium",
                    "the address pool for sandbox networks is running low",
                    f"{use.used} of the {use.total} /{subnets.PREFIX} subnets of {pool} are taken ({use.free} free): "
                    "each egress sandbox and each browser takes one, and none is made once it is exhausted",
                    "remove idle sandboxes (`sandbox prune`) or widen sandbox.egress.subnet_pool",
                    "engine",
                )
            )
    return out
