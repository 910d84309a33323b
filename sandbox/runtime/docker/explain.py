"""What `explain` says about the container a sandboxed session maps to."""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import quote

from sandbox.audit.ownership import write_problem
from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.config.merge import EffectiveAgent
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.policy.resolver import ResolvedPolicy
from sandbox.runtime import link_folders
from sandbox.runtime.agent.exec_path import path_from_labels
from sandbox.runtime.agent.fifo_link import INSIDE
from sandbox.runtime.docker.create import SHIM_GROUP, create_kwargs
from sandbox.runtime.naming import instance_id
from sandbox.runtime.seccomp import describe_security_opts
from sandbox.runtime.spec import SandboxSpec, spec_from_config


def container_facts(config: Config, policy: ResolvedPolicy, *, agent: EffectiveAgent | None = None) -> dict[str, Any]:
    """The container's name, hardening and mounts (from config), and whether it exists now.

    `agent`: the agent as this session runs it, when that differs from the policy's (a spawned
    session: its own sandbox, its parent's workspace at /parent).
    """
    try:
        spec = spec_from_config(
            config, agent or policy.agent, policy.session.raw, instance_id(config.state_dir, config.instance)
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
        "session_users": spec.session_users,
        "hardening": {
            "network": kwargs["network_mode"],
            "cap_drop": kwargs["cap_drop"],
            "cap_add": kwargs.get("cap_add", []),
            "security_opt": describe_security_opts(kwargs["security_opt"]),
            "read_only_root": kwargs["read_only"],
            "tmpfs": kwargs["tmpfs"],
            "pids_limit": kwargs["pids_limit"],
            "memory": docker.memory,
            "cpus": docker.cpus,
            "init": kwargs["init"],
            "runtime": docker.runtime or "runc (engine default)",
            # the group's id, or none: a shim of its own (engines before 24.0 give every one its own)
            "shim_group": kwargs.get("annotations", {}).get(SHIM_GROUP),
        },
        "egress": (
            {
                k: spec.egress[k]
                for k in ("allow", "floor", "ports", "max_bytes", "max_duration_s", "allow_private", "secrets")
            }
            if spec.egress is not None
            else None
        ),
        "mounts": [
            {
                "host": m.source,
                "container": m.target,
                "mode": "ro" if m.read_only else "rw",
                "from": m.origin,
            }
            for m in spec.engine_mounts
        ]
        + _link_mount(spec),
        "escape_hatches": [
            k
            for k in (
                "dangerously_allow_system_paths",
                "dangerously_allow_credential_paths",
                "dangerously_allow_sockets",
            )
            if getattr(docker, k)
        ],
        "unwritable": [
            {"host": p.path, "problem": p.detail, "fix": p.fix}
            for m in spec.engine_mounts
            # mounts below the workdir are the workspace's own pinned parents, checked with it
            if not m.read_only and not m.target.startswith(CONTAINER_WORKDIR + "/")
            if (p := write_problem(m.source, spec.user, kwargs.get("cap_add", []))) is not None
        ],
        "state": _live_state(spec.name),
        "exec_path": _exec_path(spec.image, docker.agent),
    }
    return facts


def _link_mount(spec: SandboxSpec) -> list[dict[str, str]]:
    """The agents' link folder an exec sandbox is made with (docs/resident-agent.md), unless this
    host makes none; the engine may still refuse it (then the sandbox is made without)."""
    if spec.kind != "exec" or not spec.agent_links or link_folders.refused_here() is not None:
        return []
    return [
        {
            "host": f"{spec.agent_links}/<32 hex, one per sandbox>",
            "container": INSIDE,
            "mode": "ro",
            "from": "the resident agents' FIFO link (0711: unlistable)",
        }
    ]


def _live_state(name: str) -> str:
    try:
        found = _engine_get("containers", name)
    except Exception as exc:
        return f"unknown (engine unreachable: {exc.__class__.__name__})"
    return str(found["State"]["Status"]) if found else "not created yet (created on first use)"


def _exec_path(image: str, mode: str) -> str:
    """How the sandbox's commands run: through the resident agent, or plain docker exec (why)."""
    if mode == "off":
        return path_from_labels(None, mode).describe()
    try:
        found = _engine_get("images", image)
    except Exception as exc:
        return f"unknown (engine unreachable: {exc.__class__.__name__})"
    if found is None:
        return f"unknown (image {image} is not built yet)"
    return path_from_labels((found.get("Config") or {}).get("Labels"), mode).describe()


def _engine_get(kind: str, name: str) -> dict[str, Any] | None:
    """`docker inspect` of a container or an image (`kind`), or None when there is none."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        return _get_over_socket(host.removeprefix("unix://"), f"/{kind}/{quote(name, safe='')}/json")
    return _get_with_sdk(kind, name)


def _get_over_socket(socket_path: str, path: str) -> dict[str, Any] | None:
    """The engine's JSON answer to GET `path`, or None on 404; asked with one HTTP request, because
    importing the docker SDK would cost `sandbox explain` more than everything else it does."""

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self.timeout)
            self.sock.connect(socket_path)

    conn = UnixConnection("localhost", timeout=3)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status == 404:
        return None
    if response.status != 200:
        raise ConnectionError(f"engine answered HTTP {response.status}")
    found: dict[str, Any] = json.loads(body)
    return found


def _get_with_sdk(kind: str, name: str) -> dict[str, Any] | None:
    """The same question of an engine behind tcp:// or ssh:// (what the SDK speaks)."""
    # the SDK only for an engine that only it speaks to: see _get_over_socket
    import docker
    import docker.errors

    client = docker.from_env(timeout=3)
    try:
        inspect = client.api.inspect_image if kind == "images" else client.api.inspect_container
        return dict(inspect(name))
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


def container_text(facts: dict[str, Any]) -> str:
    """The human rendering of :func:`container_facts`."""
    if "error" in facts:
        return f"container  cannot be made: {facts['error']}"
    h = facts["hardening"]
    lines = [
        f"container  {facts['name']} ({facts['state']})",
        f"           image {facts['image']}, user {facts['user']}"
        f"{' (each session: a uid of its own, this group)' if facts.get('session_users') else ''}, "
        f"network {h['network']}, runtime {h['runtime']}",
        f"           cap_drop {h['cap_drop']}, {', '.join(h['security_opt'])}, "
        f"{'read-only root' if h['read_only_root'] else 'WRITABLE root'}",
        f"           pids {h['pids_limit']}, memory {h['memory']}, cpus {h['cpus']:g}, init {h['init']}",
    ]
    if facts.get("egress"):
        e = facts["egress"]
        floor = f", tenant floor {e['floor']}" if e["floor"] is not None else ""
        lines.append(
            f"egress     through its own proxy to {e['allow'] or 'nothing'} on ports {e['ports']}{floor}"
            + (f"; private ranges exempt: {e['allow_private']}" if e["allow_private"] else "")
        )
        lines += [
            f"secret     ${x['name']} is a placeholder; the proxy puts the value ({x['value_from']}) into "
            f"{x['header']} of requests to {x['hosts']} (TLS decrypted for those hosts only)"
            for x in e["secrets"]
        ]
    lines.append(f"exec       {facts['exec_path']}")
    lines += [f"mount      {m['host']} -> {m['container']} ({m['mode']})  [{m['from']}]" for m in facts["mounts"]]
    if facts["escape_hatches"]:
        lines.append(f"WARNING    escape hatches on: {', '.join(facts['escape_hatches'])}")
    for u in facts["unwritable"]:
        lines += [f"WARNING    {u['problem']}", f"           fix: {u['fix']}"]
    return "\n".join(lines)
