"""What `explain` says about the container a sandboxed session maps to."""

from __future__ import annotations

from typing import Any

from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.runtime.naming import instance_id
from sandbox.runtime.spec import create_kwargs, spec_from_config


def container_facts(config: Config, policy: ResolvedPolicy) -> dict[str, Any]:
    """The container's name, hardening and mounts (from config), and whether it exists now."""
    try:
        spec = spec_from_config(
            config, policy.agent, policy.session.raw, instance_id(config.state_dir, config.instance)
        )
        kwargs = create_kwargs(spec)  # refuses mounts that hold a socket, like creation does
    except SandboxError as exc:
        return {"error": exc.message}
    docker = spec.docker
    facts: dict[str, Any] = {
        "name": spec.name,
        "scope_key": spec.scope_key,
        "image": spec.image,
        "user": spec.user,
        "hardening": {
            "network": kwargs["network_mode"],
            "cap_drop": kwargs["cap_drop"],
            "cap_add": kwargs.get("cap_add", []),
            "security_opt": kwargs["security_opt"],
            "read_only_root": kwargs["read_only"],
            "tmpfs": kwargs["tmpfs"],
            "pids_limit": kwargs["pids_limit"],
            "memory": docker.memory,
            "cpus": docker.cpus,
            "init": kwargs["init"],
            "runtime": docker.runtime or "runc (engine default)",
        },
        "mounts": [
            {
                "host": m.source,
                "container": m.target,
                "mode": "ro" if m.read_only else "rw",
                "from": m.origin,
            }
            for m in spec.engine_mounts
        ],
        "escape_hatches": [
            k
            for k in (
                "dangerously_allow_system_paths",
                "dangerously_allow_credential_paths",
                "dangerously_allow_sockets",
            )
            if getattr(docker, k)
        ],
        "state": _live_state(spec.name),
    }
    return facts


def _live_state(name: str) -> str:
    try:
        import docker
        import docker.errors

        client = docker.from_env(timeout=3)
        try:
            return str(client.api.inspect_container(name)["State"]["Status"])
        except docker.errors.NotFound:
            return "not created yet (created on first use)"
        finally:
            client.close()
    except Exception as exc:
        return f"unknown (engine unreachable: {exc.__class__.__name__})"


def container_text(facts: dict[str, Any]) -> str:
    """The human rendering of :func:`container_facts`."""
    if "error" in facts:
        return f"container  cannot be made: {facts['error']}"
    h = facts["hardening"]
    lines = [
        f"container  {facts['name']} ({facts['state']})",
        f"           image {facts['image']}, user {facts['user']}, network {h['network']}, runtime {h['runtime']}",
        f"           cap_drop {h['cap_drop']}, {', '.join(h['security_opt'])}, "
        f"{'read-only root' if h['read_only_root'] else 'WRITABLE root'}",
        f"           pids {h['pids_limit']}, memory {h['memory']}, cpus {h['cpus']:g}, init {h['init']}",
    ]
    lines += [f"mount      {m['host']} -> {m['container']} ({m['mode']})  [{m['from']}]" for m in facts["mounts"]]
    if facts["escape_hatches"]:
        lines.append(f"WARNING    escape hatches on: {', '.join(facts['escape_hatches'])}")
    return "\n".join(lines)
