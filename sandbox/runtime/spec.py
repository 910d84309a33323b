"""From config and identity to a complete, hardened container spec (pure: no engine needed)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandbox.config.binds import CONTAINER_WORKDIR, PARENT_MOUNT, BindSpec, check_source, validate_binds
from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config, DockerConfig
from sandbox.errors import BindRefused
from sandbox.fs.quota import parse_size
from sandbox.runtime.naming import (
    MOUNT_LAYOUT_VERSION,
    SCHEMA_VERSION,
    Labels,
    container_name,
    scope_key,
    scratch_dir_name,
    short_hash,
    tenant_dir_name,
    tenant_scope,
)
from sandbox.runtime.protected import ProtectedMount, protected_mounts
from sandbox.runtime.seccomp import seccomp_identity
from sandbox.runtime.session_users import uses_session_users
from sandbox.runtime.workspace_ref import HostFolder, Remote, Volume, WorkspaceRef

DEFAULT_UID_GID = "1000:1000"
SKILLS_MOUNT = "/opt/skills"


@dataclass(frozen=True)
class Mount:
    """One bind mount as the container sees it; `origin` says which config key made it."""

    source: str  # a host path, or a volume's name (`volume`)
    target: str
    read_only: bool
    origin: str
    volume: bool = False  # the engine mounts a volume (the workspace's, a `Volume`), not a host folder
    # (st_dev, st_ino) of the source when it was checked: the mount must show that very folder
    # (a skill's declared path, runtime/skill_spec.py: a link planted later would mount another)
    identity: tuple[int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to create (or recognise) one sandbox container."""

    name: str
    kind: str
    instance: str
    tenant: str
    agent: str
    scope: str
    scope_key: str
    session: str
    image: str
    user: str
    workspace_access: str
    workspace: WorkspaceRef  # what is mounted at /workspace: a host folder or a volume
    mounts: tuple[Mount, ...]  # what the tools see: the workspace, binds, skills
    docker: DockerConfig
    hashed: dict[str, Any] = field(hash=False, compare=False)
    # read-only protected paths over a writable workspace, and the parents they pin
    protected: tuple[ProtectedMount, ...] = ()
    # each session runs as a uid of its own (group: the sandbox user's), see runtime/session_users
    session_users: bool = False
    for_engine: bool = False  # mounts already include the protected ones (see engine_spec)
    # `network: egress`: the proxy's policy (runtime/docker/egress.py), None for every other network
    egress: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    # where this host keeps the agents' FIFO folders (runtime/agent/fifo_link.py); the backend
    # decides whether its engine can mount them
    agent_links: str = field(default="", hash=False, compare=False)
    pool_member: bool = False  # made for the warm pool, before any session (runtime/docker/pool.py)

    @property
    def identity(self) -> str:
        """Tenant, scope key and config hash: a container is handed out only to this identity."""
        return f"{tenant_scope(self.tenant, self.scope_key)}|{self.config_hash}"

    @property
    def engine_mounts(self) -> tuple[Mount, ...]:
        """Every mount the container really gets: :attr:`mounts`, then the protected paths."""
        if self.for_engine:
            return self.mounts
        workspace = self.workspace.source
        extra = tuple(
            Mount(
                f"{workspace.rstrip('/')}/{p.rel}",
                f"{CONTAINER_WORKDIR}/{p.rel}",
                p.read_only,
                p.origin,
            )
            for p in self.protected
        )
        return self.mounts + extra

    def engine_spec(self) -> SandboxSpec:
        """This spec with :attr:`engine_mounts` as its mounts: what the engine is asked to make."""
        return dataclasses.replace(self, mounts=self.engine_mounts, for_engine=True)

    @property
    def scratch_folder(self) -> Path | None:
        """The host folder of a `none` workspace (the orchestrator's scratch); None for a volume or
        the agent's own workspace."""
        return self.workspace.host_path if self.workspace_access == "none" else None

    @property
    def pool_key(self) -> str | None:
        """What a warm-pool container must match to be handed to this spec's session: the config
        hash without what names the session (its scratch folder), plus tenant, agent and
        instance. None when such sandboxes are not pooled (not session scope, an egress edge, a
        parent's view)."""
        if self.kind != "exec" or self.scope != "session" or self.egress is not None or self.hashed.get("parent_view"):
            return None
        if isinstance(self.workspace, Volume):
            return None  # a volume cannot be renamed to a session's name
        hashed = dict(self.hashed)
        # a scratch workspace names its session (a host folder, or a cluster Pod's own emptyDir)
        if self.workspace_access == "none":
            hashed["mounts"] = [["<scratch>", *hashed["mounts"][0][1:]], *hashed["mounts"][1:]]
        text = json.dumps([hashed, self.tenant, self.agent, self.instance], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def as_pool_member(self) -> SandboxSpec:
        """This spec as a pool member: a pool name, pool labels (see :meth:`labels`)."""
        return dataclasses.replace(self, name=f"sbx-{self.instance}-pool-{uuid.uuid4().hex[:16]}", pool_member=True)

    @functools.cached_property
    def config_hash(self) -> str:
        """Hash of every setting that, when it changes, requires a new container (computed once
        per spec: `identity` is asked several times per call, and `hashed` is never changed in
        place; a changed spec is a new one, `dataclasses.replace`)."""
        return hashlib.sha256(json.dumps(self.hashed, sort_keys=True).encode()).hexdigest()[:16]

    def labels(self) -> dict[str, str]:
        """The labels the container is created with (a pool member's name no session yet)."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        if self.pool_member:
            return {
                **dataclasses.replace(self, pool_member=False, scope="pool", scope_key="", session="").labels(),
                Labels.POOL: self.pool_key or "",
                Labels.POOL_SCRATCH: str(self.scratch_folder or ""),
            }
        return {
            Labels.MANAGED: "true",
            Labels.INSTANCE: self.instance,
            Labels.KIND: self.kind,
            Labels.TENANT: self.tenant,
            Labels.AGENT: self.agent,
            Labels.SCOPE: self.scope,
            Labels.SCOPE_KEY: self.scope_key,
            Labels.SESSION: self.session if self.scope == "session" else "",
            Labels.CONFIG_HASH: self.config_hash,
            Labels.CREATED_AT: now,
            Labels.LAST_USED: now,
            Labels.SCHEMA: SCHEMA_VERSION,
        }


EGRESS_NETWORK = "egress"
AGENT_LINKS_DIR = "agent-links"  # in the state dir: one folder per sandbox, its agents' FIFOs


def egress_policy(agent: EffectiveAgent) -> dict[str, Any]:
    """What the egress proxy of an agent's sandbox enforces (its $EGRESS_POLICY, minus identity)."""
    cfg = agent.sandbox.egress
    return {
        "allow": list(cfg.allow),
        "floor": list(agent.egress_floor) if agent.egress_floor is not None else None,
        "ports": sorted(set(cfg.ports)),
        "max_bytes": parse_size(cfg.max_bytes),
        "max_duration_s": cfg.max_duration_s,
        "allow_private": list(cfg.allow_private),
        "extra_hosts": list(cfg.extra_hosts),
        "image": cfg.image,
        "upstream_network": cfg.upstream_network,
        "require_host_firewall": cfg.require_host_firewall,
        # what each secret is and where it goes; never its value (that is read when the proxy is made)
        "secrets": [
            {
                "name": name,
                "value_from": secret.value_from,
                "hosts": list(secret.hosts),
                "header": secret.header,
                "format": secret.format,
            }
            for name, secret in sorted(cfg.secrets.items())
        ],
        "upstream_ca": str(cfg.upstream_ca) if cfg.upstream_ca else None,
        "subnet_pool": cfg.subnet_pool,
    }


def owner_user(path: Path) -> str:
    """Default container user: the owner of the workspace, unless that is root."""
    try:
        info = path.stat()
    except OSError:
        return DEFAULT_UID_GID
    if info.st_uid == 0:
        return DEFAULT_UID_GID
    return f"{info.st_uid}:{info.st_gid}"


def volume_name(instance: str, tenant: str, key: str) -> str:
    """The Docker volume of a scope key's workspace (`workspace_store: volume`)."""
    return f"sbx-{instance}-ws-{short_hash(tenant_scope(tenant, key), 24)}"


def scratch_workspace(agent: EffectiveAgent, key: str) -> Path:
    """The per-scope workspace used when workspace_access is none (a neutral, per-tenant name)."""
    root = agent.sandbox.workspace_root
    assert root is not None  # effective_agent always fills it
    return Path(os.path.realpath(root)) / tenant_dir_name(agent.tenant) / scratch_dir_name(agent.tenant, key)


def tenant_workspaces(config: Config, tenant: str) -> list[Path]:
    """Every host folder the sandboxes of `tenant`'s agents write their workspaces in: each `rw`
    workspace, and the tenant's folder of each scratch root. What
    `tenants[].quotas.max_workspace_bytes` measures (extra `docker.binds` are not workspaces)."""
    found: set[str] = set()
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        cfg = agent.sandbox
        if agent.tenant != tenant or cfg.mode == "off":
            continue
        if cfg.workspace_access == "rw":
            found.add(os.path.realpath(agent.workspace))
        elif cfg.workspace_access == "none" and cfg.workspace_root is not None:
            found.add(os.path.join(os.path.realpath(cfg.workspace_root), tenant_dir_name(tenant)))
    return [Path(p) for p in sorted(found)]


def _scratch_source(workspace: Path, docker: DockerConfig) -> str:
    """The bind rules, for a scratch workspace too; a link planted at its path refuses it."""
    real = check_source(str(workspace), docker, what="scratch workspace")
    if real != os.path.normpath(workspace):
        raise BindRefused(
            f"scratch workspace {str(workspace)!r} resolves to {real!r}: something planted a link there",
            rule="scratch-link",
            path=str(workspace),
            fix="remove the link; scratch workspaces are made by the orchestrator, never through a link",
        )
    return real


def build_spec(
    agent: EffectiveAgent,
    session: str,
    instance: str,
    image_id: str | None = None,
    skill_dirs: Sequence[Path] = (),
    protected_paths: Sequence[str] = (),
    remote: bool = False,
) -> SandboxSpec:
    """The exec-sandbox spec for a session of `agent`.

    Args:
        agent: the merged agent config.
        session: the full session key.
        instance: this orchestrator's instance id.
        image_id: the resolved image id (part of the drift hash) when known.
        skill_dirs: folders of SKILL.md tools, mounted read-only.
        protected_paths: `tools.fs.protected_paths`, mounted read-only over a rw workspace.
        remote: the backend keeps workspaces where it runs sandboxes (`runtime.backend:
            kubernetes`): the workspace is a `Remote` reference, never a folder of this host.

    Raises:
        BindRefused: a bind or the workspace breaks a bind rule (checked again at create time).
    """
    cfg = agent.sandbox
    docker = cfg.docker
    key = scope_key(cfg.scope, agent.id, session)
    protected: list[ProtectedMount] = []
    workspace: WorkspaceRef
    if remote:
        workspace = Remote(volume_name(instance, agent.tenant, key if cfg.workspace_access == "none" else agent.id))
        ws_origin = f"{agent.key_path}.sandbox.workspace_access {cfg.workspace_access} (kept by the cluster)"
        if cfg.workspace_access == "rw":
            protected = protected_mounts(None, protected_paths)
    elif cfg.workspace_access == "none" and cfg.workspace_store == "volume":
        workspace = Volume(volume_name(instance, agent.tenant, key))
        ws_origin = f"{agent.key_path}.sandbox.workspace_store (volume {workspace.name}, workspace_access none)"
    elif cfg.workspace_access == "none":
        scratch = scratch_workspace(agent, key)
        ws_origin = f"{agent.key_path}.sandbox.workspace_root (scratch, workspace_access none)"
        workspace = HostFolder(Path(_scratch_source(scratch, docker)))
    else:
        ws_origin = f"{agent.key_path}.workspace (workspace_access {cfg.workspace_access})"
        workspace = HostFolder(Path(check_source(str(agent.workspace), docker, what="workspace")))
        if cfg.workspace_access == "rw":
            protected = protected_mounts(workspace.path, protected_paths)
    mounts = [
        Mount(
            workspace.source,
            CONTAINER_WORKDIR,
            cfg.workspace_access == "ro",
            ws_origin,
            volume=workspace.host_path is None,
        )
    ]
    if agent.parent_view is not None:
        # a spawned session sees its parent's workspace here (tools.subagents.parent_workspace)
        source, read_only = agent.parent_view
        mounts.append(Mount(source, PARENT_MOUNT, read_only, "sessions_spawn (tools.subagents.parent_workspace)"))
    binds: list[BindSpec] = validate_binds(docker.binds, docker)
    mounts += [Mount(b.source, b.target, b.read_only, f"docker.binds: {b.declared}") for b in binds]
    for index, folder in enumerate(skill_dirs):
        # skill handlers run in the sandbox; their code is mounted read-only
        source = check_source(str(folder), docker, what="skills dir")
        mounts.append(Mount(source, f"{SKILLS_MOUNT}/{index}", True, f"skills.dirs[{index}]"))
    ws_folder = workspace.host_path
    user = docker.user or (owner_user(ws_folder) if ws_folder is not None else "1000:1000")
    session_users = uses_session_users(cfg.session_users, cfg.scope, cfg.workspace_access, user)
    ulimits: dict[str, Any] = {name: limit.model_dump() for name, limit in docker.ulimits.items()}
    egress = egress_policy(agent) if docker.network == EGRESS_NETWORK else None
    hashed = {
        "image": image_id or docker.image,
        "mounts": [[m.source, m.target, m.read_only] for m in mounts],
        "protected": [[p.rel, p.kind] for p in protected],
        "env": docker.env,
        "limits": [docker.pids_limit, docker.memory, docker.memory_swap, docker.cpus, ulimits],
        "user": user,
        "network": docker.network,
        "runtime": docker.runtime,
        "setup": [docker.setup_command, docker.setup_as_root],
        "hardening": [
            docker.read_only_root,
            docker.cap_drop,
            docker.cap_add,
            docker.no_new_privileges,
            docker.init,
            docker.tmpfs,
            seccomp_identity(docker.seccomp_profile),
            docker.apparmor_profile,
        ],
        "dns": [docker.dns, docker.extra_hosts],
        "health": docker.health_interval_s,
        "shim": docker.shim,
        "egress": egress,
        "layout": MOUNT_LAYOUT_VERSION,
        "session_users": session_users,
        "parent_view": list(agent.parent_view) if agent.parent_view else None,
    }
    return SandboxSpec(
        name=container_name(instance, "exec", key, tenant=agent.tenant),
        kind="exec",
        instance=instance,
        tenant=agent.tenant,
        agent=agent.id if cfg.scope != "shared" else "*",
        scope=cfg.scope,
        scope_key=key,
        session=session,
        image=docker.image,
        user=user,
        workspace_access=cfg.workspace_access,
        workspace=workspace,
        mounts=tuple(mounts),
        docker=docker,
        hashed=hashed,
        protected=tuple(protected),
        session_users=session_users,
        egress=egress,
    )


def spec_from_config(
    config: Config, agent: EffectiveAgent, session: str, instance: str, image_id: str | None = None
) -> SandboxSpec:
    """:func:`build_spec` with the config-wide inputs (skills, protected paths, the state dir's
    folder of agent links) filled in."""
    spec = build_spec(
        agent,
        session,
        instance,
        image_id=image_id,
        skill_dirs=config.skills.dirs,
        protected_paths=config.tools.fs.protected_paths,
        remote=config.runtime.backend == "kubernetes",
    )
    return dataclasses.replace(spec, agent_links=str(config.state_dir / AGENT_LINKS_DIR))
