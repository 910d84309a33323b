"""Pydantic models of the whole YAML config.

Keys are snake_case; the loader renames OpenClaw's camelCase spellings before validation, so
these models only ever see snake_case. Models are frozen: a loaded config never changes, which
is what lets the policy resolver cache on it.
"""

from __future__ import annotations

import builtins
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandbox.config.base import ConfigPath, StrictModel
from sandbox.config.kubernetes import KubernetesSection
from sandbox.config.state import StateSection


def _check_tool_pattern(value: str, info: ValidationInfo) -> str:
    # imported here: the policy package imports the config models
    from sandbox.policy.groups import BUILTIN_TOOLS, check_pattern

    extra = tuple((info.context or {}).get("extra_tools", ()))
    problem = check_pattern(value, BUILTIN_TOOLS + extra)
    if problem:
        raise ValueError(problem)
    return value


def _check_protected(value: str) -> str:
    from sandbox.config.protected import pattern_parts  # light, but only a config with protected paths needs it

    if pattern_parts(value) is None:
        raise ValueError(f"{value!r} is not a path below the workspace (no empty, '.' or '..' parts)")
    return value


ToolPattern = Annotated[str, AfterValidator(_check_tool_pattern)]
ProtectedPattern = Annotated[str, AfterValidator(_check_protected)]
Profile = Literal["minimal", "coding", "messaging", "full"]


class ToolLists(StrictModel):
    """allow / also_allow / deny lists; an absent or empty `allow` restricts nothing."""

    allow: list[ToolPattern] | None = None
    also_allow: list[ToolPattern] | None = None
    deny: list[ToolPattern] | None = None


class ProfiledToolLists(ToolLists):
    """Tool lists with an optional base profile."""

    profile: Profile | None = None


class SandboxToolsSection(StrictModel):
    """`tools.sandbox`: the extra layer applied only when a session is sandboxed."""

    tools: ToolLists = ToolLists()


class SubagentsSection(StrictModel):
    """`tools.subagents`: the layer applied to sessions spawned by another session."""

    tools: ToolLists = ToolLists()
    max_spawn_depth: int = Field(1, ge=1, le=8)
    # open children one session may have at a time (sessions_spawn)
    max_children: int = Field(5, ge=1, le=100)
    # how a child sees its parent's workspace, at /parent: none, read-only, or (only when set) rw
    parent_workspace: Literal["none", "ro", "rw"] = "ro"
    # `session`: every child gets its own container and scratch workspace; `inherit`: the child
    # agent's own scope rules (agent scope shares the agent's container and workspace)
    sandbox_scope: Literal["session", "inherit"] = "session"
    # other agents (same tenant) a session may spawn children of; its own agent always
    allow_agents: list[str] = []
    # sessions_list/history/send see: `tree` itself and its descendants (an agent's main session
    # sees all of its agent's sessions); `agent` every session of the same agent and tenant
    visibility: Literal["tree", "agent"] = "tree"


class FsSection(StrictModel):
    """File-tool safety settings."""

    workspace_only: bool = True
    # read-only for the file tools and mounted read-only over a rw workspace; `**` spans dirs
    protected_paths: list[ProtectedPattern] = [
        ".git/hooks",
        ".git/config",
        ".git/config.worktree",
        ".git/modules/**/hooks",
        ".git/modules/**/config",
        ".git/modules/**/config.worktree",
        ".git/worktrees/**/config.worktree",
    ]
    deny_patterns: list[str] = [".env", "*.pem", "*.key"]
    max_read_bytes: int = Field(10 * 1024 * 1024, gt=0)
    # checked before anything is written, for write, edit and apply_patch alike
    max_write_bytes: int = Field(16 * 1024 * 1024, gt=0)


class ExecSection(StrictModel):
    """Timeouts for `exec`, in seconds."""

    default_timeout_s: float = Field(60.0, gt=0)
    max_timeout_s: float = Field(1800.0, gt=0)
    # output past this is not kept: the command is stopped (QUOTA_EXCEEDED) with a marker
    max_output_bytes: int = Field(256 * 1024 * 1024, gt=0)
    # standard input written to a background process in one `process write`
    max_stdin_bytes: int = Field(64 * 1024, gt=0, le=1024 * 1024)


class LoopDetectionSection(StrictModel):
    """Loop detection (off by default)."""

    enabled: bool = False
    window: int = Field(30, ge=2)
    warn_threshold: int = Field(10, ge=1)
    critical_threshold: int = Field(20, ge=1)
    global_circuit_breaker: int = Field(30, ge=1)


class ApprovalsSection(StrictModel):
    """Tools that suspend until a human approves them."""

    require: list[ToolPattern] = []
    timeout_s: float = Field(300.0, gt=0)
    by_agent: dict[str, list[ToolPattern]] = {}
    by_sender: dict[str, list[ToolPattern]] = {}


class ProviderPolicy(ProfiledToolLists):
    """One entry of `tools.by_provider` (key `provider` or `provider/model`)."""


class ToolsConfig(ProfiledToolLists):
    """The top-level `tools` section."""

    by_provider: dict[str, ProviderPolicy] = {}
    sandbox: SandboxToolsSection = SandboxToolsSection()
    subagents: SubagentsSection = SubagentsSection()
    fs: FsSection = FsSection()
    exec: ExecSection = ExecSection()
    loop_detection: LoopDetectionSection = LoopDetectionSection()
    approvals: ApprovalsSection = ApprovalsSection()


class AgentToolsConfig(ProfiledToolLists):
    """An agent's own tool layer; its `sandbox.tools` overrides the global one list by list."""

    sandbox: SandboxToolsSection | None = None


class UlimitConfig(StrictModel):
    """A soft/hard ulimit pair."""

    soft: int = Field(ge=0)
    hard: int = Field(ge=0)


# YAML 1.1 reads a bare `off` as false: take that spelling too
AgentPath = Annotated[Literal["auto", "off"], BeforeValidator(lambda v: "off" if v is False else v)]


class DockerConfig(StrictModel):
    """How the sandbox container is made. Every default is the hardened choice."""

    image: str = "sandbox-exec:latest"
    network: str = "none"
    read_only_root: bool = True
    user: str | None = None
    cap_drop: list[str] = ["ALL"]
    cap_add: list[str] = []
    no_new_privileges: bool = True
    init: bool = True
    pids_limit: int = Field(256, ge=16)
    memory: str = Field("1g", pattern=r"^\d+[bkmgBKMG]?$")
    memory_swap: str | None = Field(None, pattern=r"^\d+[bkmgBKMG]?$")
    cpus: float = Field(1.0, gt=0)
    tmpfs: dict[str, str] = {
        "/tmp": "rw,nosuid,nodev,size=256m",
        "/var/tmp": "rw,nosuid,nodev,size=64m",
        "/run": "rw,nosuid,nodev,size=16m",
    }
    env: dict[str, str] = {"LANG": "C.UTF-8"}
    setup_command: str | None = None
    setup_as_root: bool = False
    binds: list[str] = []
    runtime: str | None = None
    # `auto`: commands go through the resident agent when the image has one (a persistent
    # stream, no Docker round trip per command); `off`: always plain docker exec
    agent: AgentPath = "auto"
    dns: list[str] = []
    extra_hosts: list[str] = []
    ulimits: dict[str, UlimitConfig] = {}
    seccomp_profile: str | None = "strict"
    apparmor_profile: str | None = None
    allowed_bind_roots: list[ConfigPath] | None = None
    dangerously_allow_system_paths: bool = False
    dangerously_allow_credential_paths: bool = False
    dangerously_allow_sockets: bool = False
    # Docker's own health check of the sandbox: 0 (the default) runs none, since the resident
    # agent answers every call and a dead one is found and replaced (docs/security.md, CIS
    # 5.27); N runs the image's check (the agent's --health, an exec) every N seconds: 1,000
    # sandboxes at 60 s are 17 execs a second
    health_interval_s: int = Field(0, ge=0, le=86400)
    # containerd's shim (one process per container by default, about 2.3 MiB each): `tenant`
    # runs one shim for all of a tenant's sandboxes on one runtime (the OCI annotation
    # io.containerd.runc.v2.group; honoured by Docker Engine 24.0 and later, ignored before);
    # `container`, one each. Never shared across tenants: a shim that dies takes its group
    shim: Literal["tenant", "container"] = "tenant"

    @field_validator("health_interval_s")
    @classmethod
    def _health_floor(cls, value: int) -> int:
        if 0 < value < 30:
            raise ValueError(f"0 (no Docker health check) or at least 30 seconds (got {value})")
        return value


class BrowserConfig(StrictModel):
    """The browser sandbox (own image, own network)."""

    enabled: bool = False
    image: str = "sandbox-browser:latest"
    network: str = "sandbox-browser"
    cdp_port: int = Field(9222, ge=1, le=65535)
    startup_timeout_s: float = Field(30.0, gt=0)
    # the browser tool's `evaluate` (page JavaScript chosen by the model) only when set
    allow_evaluate: bool = False


def _network(value: str) -> str:
    """An address range as `ipaddress` reads it (a bad one would make the proxy refuse everything)."""
    import ipaddress  # only a config with egress ranges needs it (start-up stays lean)

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise ValueError(f"expected an address range like 10.1.2.0/24 ({exc})") from None
    return value


# `pypi.org`, `*.pythonhosted.org` (subdomains only), `*` (everything: audit flags it), or an IP
EgressHost = Annotated[
    str,
    Field(
        pattern=r"^(\*|(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?|[0-9a-fA-F:.]+)$",
        max_length=253,
    ),
]
# an address range for `egress.allow_private`
Cidr = Annotated[str, Field(pattern=r"^[0-9a-fA-F:.]+(/[0-9]{1,3})?$"), AfterValidator(_network)]


SecretHost = Annotated[
    str,
    Field(
        pattern=r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$",
        max_length=253,
    ),
]


class EgressSecret(StrictModel):
    """A secret the egress proxy puts into requests to its hosts; the sandbox sees a placeholder."""

    value_from: str = Field(pattern=r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
    # exact names: a wildcard would decrypt, and hand the secret to, every host it matches
    hosts: list[SecretHost] = Field(min_length=1)
    header: str = Field("Authorization", pattern=r"^[A-Za-z0-9-]{1,64}$")
    format: str = Field("Bearer {}", pattern=r"^[^{}]*\{\}[^{}]*$", max_length=256)


SecretName = Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,63}$")]


class EgressConfig(StrictModel):
    """`network: egress`: the sandbox reaches only these hosts, through a proxy of its own."""

    allow: list[EgressHost] = []
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = [80, 443]
    # bytes one request or tunnel may carry (both ways), and how long a tunnel may stay open
    max_bytes: str = Field("256m", pattern=r"^\d+[bkmgBKMG]?$")
    max_duration_s: float = Field(300.0, gt=0)
    image: str = "sandbox-egress:latest"
    # the network the proxy reaches out through (Docker's default bridge unless told)
    upstream_network: str = "bridge"
    # ranges exempt from the private-address refusal (an internal mirror); audit flags them
    allow_private: list[Cidr] = []
    # `name:address` pinned in the proxy's /etc/hosts (a mirror without DNS)
    extra_hosts: list[str] = []
    # no egress sandbox without the host firewall rules that keep it off the host's services
    require_host_firewall: bool = True
    # NAME -> a secret: the sandbox's $NAME is a placeholder, the proxy puts the value in for its hosts
    secrets: dict[SecretName, EgressSecret] = {}
    # a PEM file of CAs the proxy trusts upstream besides the system's (an internal mirror's)
    upstream_ca: ConfigPath | None = None
    # where each egress or browser network takes its /29 (runtime/docker/subnets.py): not Docker's pools
    subnet_pool: Cidr = "10.213.0.0/16"


class TenantEgress(StrictModel):
    """A tenant's egress floor: every host an agent of the tenant reaches must be on this list too."""

    allow: list[EgressHost] | None = None


class PoolConfig(StrictModel):
    """The warm pool: sandboxes started ahead of their session (session scope only)."""

    size: int = Field(0, ge=0, le=64)  # started, unclaimed sandboxes kept per agent; 0: no pool


def _unique_ports(ports: list[int]) -> list[int]:
    if len(set(ports)) != len(ports):
        raise ValueError(f"each port once (got {ports})")
    return sorted(ports)


class PreviewConfig(StrictModel):
    """Preview URLs (docs/preview.md): ports on the sandbox's own loopback that the service may
    show, through the sandbox's resident agent (the sandbox needs no network); none: no previews."""

    ports: Annotated[list[Annotated[int, Field(ge=1, le=65535)]], AfterValidator(_unique_ports)] = Field(
        default_factory=list, max_length=16
    )
    link_ttl_s: int = Field(3600, ge=60, le=7 * 86400)  # how long a signed link works, at most
    max_connections: int = Field(16, ge=1, le=64)  # open at once per session, through one replica


class PruneConfig(StrictModel):
    """When idle or old sandboxes are removed; 0 disables a rule."""

    idle_hours: float = Field(24.0, ge=0)
    max_age_days: float = Field(7.0, ge=0)


Mode = Literal["off", "non-main", "all"]
Scope = Literal["session", "agent", "shared"]
WorkspaceAccess = Literal["none", "ro", "rw"]
# YAML 1.1 reads a bare on/off as a boolean: take both spellings
SessionUsers = Annotated[
    Literal["auto", "on", "off"],
    BeforeValidator(lambda v: {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v),
]


class SandboxConfig(StrictModel):
    """Whether and how an agent's sessions are sandboxed."""

    mode: Mode = "non-main"
    scope: Scope = "agent"
    workspace_access: WorkspaceAccess = "none"
    workspace_root: ConfigPath | None = None
    # where a `none` workspace lives: a host folder under workspace_root, or a Docker volume that
    # only the sandbox's resident agent reaches (what a remote engine needs)
    workspace_store: Literal["host", "volume"] = "host"
    # bytes a writable workspace may hold (measured); 0 disables the quota
    workspace_quota: str = Field("1g", pattern=r"^\d+[bkmgBKMG]?$")
    # a uid of its own for each session in an agent- or shared-scope container (see docs/security.md)
    session_users: SessionUsers = "auto"
    docker: DockerConfig = DockerConfig()
    browser: BrowserConfig = BrowserConfig()
    egress: EgressConfig = EgressConfig()
    prune: PruneConfig = PruneConfig()
    pool: PoolConfig = PoolConfig()
    preview: PreviewConfig = PreviewConfig()
    # seconds a sandbox nobody used stays running before the service pauses it (the cgroup
    # freezer: it costs no CPU; the next call thaws it); 0 never pauses. Docker only
    idle_pause_s: float = Field(0.0, ge=0)
    # not paused while it runs anything besides its keep-alive and resident agent (a background
    # process the session started); off: such processes are frozen with it
    idle_pause_keeps_processes: bool = False


class AgentConfig(StrictModel):
    """One entry of `agents.list`."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    default: bool = False
    tenant: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    workspace: ConfigPath | None = None
    tools: AgentToolsConfig = AgentToolsConfig()
    sandbox: SandboxConfig = SandboxConfig()


class AgentDefaults(StrictModel):
    """`agents.defaults`: what every agent starts from."""

    workspace: ConfigPath | None = None
    sandbox: SandboxConfig = SandboxConfig()


class AgentsSection(StrictModel):
    """The `agents` section."""

    defaults: AgentDefaults = AgentDefaults()
    list: builtins.list[AgentConfig] = []


class QueueConfig(StrictModel):
    """The wait queue in front of the concurrency limits."""

    max_depth: int = Field(100, ge=0)
    max_wait_s: float = Field(30.0, gt=0)


class TimeoutsConfig(StrictModel):
    """Per-tool timeouts (seconds), always clamped to [min_s, max_s]."""

    min_s: float = Field(1.0, gt=0)
    max_s: float = Field(3600.0, gt=0)
    tools: dict[str, float] = {}


class LimitsConfig(StrictModel):
    """Concurrency limits: global -> category -> tool."""

    global_concurrency: int = Field(10, ge=1)
    tenant_concurrency: int | None = Field(None, ge=1)  # default: half of global_concurrency
    categories: dict[str, int] = {"file": 5, "network": 3, "exec": 2}
    tools: dict[str, int] = {}
    queue: QueueConfig = QueueConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()


class ResultsConfig(StrictModel):
    """How tool output is shaped for the model."""

    max_chars: int = Field(50_000, ge=100)


class FilesystemPermissions(StrictModel):
    """Path globs (inside the sandbox) a skill may read or write."""

    read: list[str] = []
    write: list[str] = []


class SkillPermissions(StrictModel):
    """What a skill declares it needs, and (under `skills.allowed`) what policy grants."""

    filesystem: FilesystemPermissions = FilesystemPermissions()
    network: list[str] = []  # domains


class SkillsConfig(StrictModel):
    """Where SKILL.md tools are found, and the most any skill may be granted."""

    dirs: list[ConfigPath] = []
    allowed: SkillPermissions = SkillPermissions(
        filesystem=FilesystemPermissions(read=["/workspace/**"], write=["/workspace/**"]), network=[]
    )


SYSTEM_STATE_DIR = Path("/var/lib/agent-sandbox")


def default_state_dir() -> Path:
    """The orchestrator's state dir: $XDG_STATE_HOME/agent-sandbox, else ~/.local/state/agent-sandbox,
    and for root (without XDG_STATE_HOME) /var/lib/agent-sandbox: root's home is a system path no
    sandbox may mount, and scratch workspaces live in the state dir."""
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "agent-sandbox"
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    return Path(os.path.expanduser("~/.local/state")) / "agent-sandbox"


class RuntimeSection(StrictModel):
    """Which backend runs sandboxes: `docker` (the default), `kubernetes` (Pods on a cluster,
    `runtime.kubernetes`), or `host` (no isolation: development)."""

    backend: Literal["docker", "kubernetes", "host"] = "docker"
    kubernetes: KubernetesSection = KubernetesSection()


class TenantToken(StrictModel):
    """One API token of a tenant: its name and the SHA-256 of the token (never the token)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class TenantQuotas(StrictModel):
    """What one tenant may use at a time (0: no limit)."""

    max_sandboxes: int = Field(0, ge=0)
    max_sessions: int = Field(0, ge=0)
    max_concurrent_calls: int = Field(0, ge=0)
    max_calls_per_minute: int = Field(0, ge=0)
    max_workspace_bytes: str = Field("0", pattern=r"^\d+[bkmgBKMG]?$")


class TenantConfig(StrictModel):
    """`tenants[]`: who may use the service, and the floor every one of its agents stands on."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    tokens: list[TenantToken] = []
    # the tenant floor: narrows every agent of this tenant; nothing below can widen it
    tools: ToolLists = ToolLists()
    quotas: TenantQuotas = TenantQuotas()
    egress: TenantEgress = TenantEgress()
    # the API reaches unsandboxed sessions (mode off, or a main session under non-main) only if set
    allow_unsandboxed: bool = False


class ServiceSection(StrictModel):
    """`service:`: settings of `sandbox serve` that belong to no tenant."""

    # who may read /metrics (it names every tenant): tokens stored hashed, never a tenant's;
    # none configured: /metrics needs no token (keep it off the tenants' network then)
    metrics_tokens: list[TenantToken] = []
    # who may open the approvals console at /ui (api/console/): operators of every tenant, with
    # tokens of their own (stored hashed), never a tenant's; none configured: no console
    operator_tokens: list[TenantToken] = []
    console_session_hours: float = Field(8.0, gt=0, le=168)  # an operator's login lasts this long
    # the key preview links are signed with (docs/preview.md): at least 32 random bytes; unset, a
    # key is made once in the state dir. Replicas on one state store need this one file
    preview_key_file: ConfigPath | None = None
    # the edge (api/connections.py, api/limits.py): what one client or tenant may hold open
    head_timeout_s: float = Field(5.0, gt=0, le=300)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)  # from a complete head to the body's last byte
    max_connections: int = Field(1024, ge=8)  # clipped below the process's file-descriptor limit
    max_connections_per_address: int = Field(256, ge=1)
    max_unauthenticated_connections: int = Field(128, ge=1)
    max_unauthenticated_per_address: int = Field(32, ge=1)
    max_event_streams_per_tenant: int = Field(8, ge=1)
    max_mcp_sessions_per_tenant: int = Field(16, ge=1)
    mcp_session_idle_s: float = Field(600.0, gt=0)
    # MCP over HTTP without sessions (behind a load balancer with no sticky sessions): every
    # request stands alone, on any replica; its sandbox session is X-Sandbox-Session's, or
    # `mcp-default` (docs/service.md, "MCP behind a load balancer")
    mcp_stateless: bool = False
    read_requests_per_minute: int = Field(600, ge=1)
    # on SIGTERM, durable calls still running are handed to the next orchestrator instead of
    # killed (engine/handover.py): only where the next start shares this state dir (docs/calls.md)
    handover: bool = False


def _journal_size(value: object) -> object:
    # `2GiB`, `2GB`, `2G` and `2g` are one size, kept in the other size keys' form (`2g`)
    text = str(value).strip().replace(" ", "") if isinstance(value, str | int) else value
    if not isinstance(text, str):
        return value
    for suffix in ("ib", "b"):
        if len(text) > len(suffix) + 1 and text.lower().endswith(suffix) and text[-len(suffix) - 1].isalpha():
            text = text[: -len(suffix)]
            break
    if re.fullmatch(r"\d+[bkmgBKMG]?", text) is None:
        raise ValueError(f"a size such as 2g, 500m or 2GiB, or 0 for no bound (got {value!r})")
    return text.lower()


def _journal_age(value: object) -> object:
    text = str(value).strip() if isinstance(value, str | int) else value
    if not isinstance(text, str) or re.fullmatch(r"0|\d+[smhdw]", text) is None:
        raise ValueError(f"an age such as 30d, 12h or 2w (units s m h d w), or 0 for no bound (got {value!r})")
    return text


def _idempotency_age(value: object) -> object:
    text = _journal_age(value)
    if text == "0":
        raise ValueError("an age such as 24h or 7d: keys must expire, so the call records stay bounded (got 0)")
    return text


class RetentionConfig(StrictModel):
    """`journal.retention`: how much history the journal keeps (`0` disables a bound).

    Enforced by `sandbox serve` every `check_every_s` and by `sandbox journal prune`; open calls
    and pending approvals are always kept.
    """

    # events older than this go: a number and a unit, s m h d or w (`30d`, `12h`)
    max_age: Annotated[str, BeforeValidator(_journal_age)] = "30d"
    # the journal file is kept under this size, oldest events first (`2g`, `2GiB`, `500m`)
    max_bytes: Annotated[str, BeforeValidator(_journal_size)] = "2g"
    check_every_s: float = Field(300.0, gt=0)


class JournalSection(StrictModel):
    """`journal:`: the SQLite journal of every call in the state dir."""

    retention: RetentionConfig = RetentionConfig()
    # how long a call's record and its idempotency key are kept (a repeat within it returns the
    # same call; after it, the key runs a new one): an age such as 24h or 7d (docs/calls.md)
    idempotency_ttl: Annotated[str, BeforeValidator(_idempotency_age)] = "24h"


class Config(StrictModel):
    """The whole configuration file."""

    version: Literal[1] = 1
    instance: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,15}$")
    state_dir: ConfigPath = Field(default_factory=default_state_dir)
    tools: ToolsConfig = ToolsConfig()
    tenants: list[TenantConfig] = []
    agents: AgentsSection = AgentsSection()
    limits: LimitsConfig = LimitsConfig()
    results: ResultsConfig = ResultsConfig()
    skills: SkillsConfig = SkillsConfig()
    runtime: RuntimeSection = RuntimeSection()
    service: ServiceSection = ServiceSection()
    journal: JournalSection = JournalSection()
    state: StateSection = StateSection()
    # the file this config was read from (the loader says; never a key of the file itself)
    _source_file: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _remember_source(self, info: ValidationInfo) -> Config:
        source = (info.context or {}).get("config_file")
        if isinstance(source, str | Path) and os.path.isfile(source):
            self._source_file = Path(os.path.realpath(source))
        return self

    @property
    def source_file(self) -> Path | None:
        """The config file this was loaded from (None for text): a control file sandboxes must not reach."""
        return self._source_file
