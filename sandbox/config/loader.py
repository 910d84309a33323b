"""Load a config file into a validated :class:`Config`, or fail with located, precise errors."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandbox.config import keys, locate
from sandbox.config.binds import bind_problems, check_source
from sandbox.config.isolation import isolation_problems
from sandbox.config.locate import Loc, ParsedDocument, format_loc
from sandbox.config.merge import agent_ids, effective_agent
from sandbox.config.models import Config, DockerConfig, default_state_dir
from sandbox.config.state import ENV_VAR, parse_state_url
from sandbox.errors import BindRefused, ConfigError

_PROVIDER_KEY = re.compile(r"^[a-z0-9][a-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.:-]*)?$")


def load_config(path: str | Path) -> Config:
    """Read, normalise and validate a YAML or JSON config file.

    Args:
        path: the config file; relative paths inside it resolve against its folder.

    Raises:
        ConfigError: every problem found, each with `file:line:col`, key path and expectation.
    """
    file = Path(path).expanduser()
    try:
        parsed = locate.read(file)
    except FileNotFoundError as exc:
        raise ConfigError([f"{file}: config file not found"]) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{file}: cannot read config file: {exc}"]) from exc
    except locate.YamlSyntaxError as exc:
        raise ConfigError(exc.problems) from exc
    real = os.path.realpath(file)
    return validate(parsed, base_dir=file.resolve().parent, identity=(file.stem, f"file|{real}"))


def load_config_text(text: str, *, source: str = "<config>", base_dir: Path | None = None) -> Config:
    """Like :func:`load_config`, from text (tests, the HTTP service)."""
    try:
        parsed = locate.parse(text, source)
    except locate.YamlSyntaxError as exc:
        raise ConfigError(exc.problems) from exc
    base = base_dir or Path.cwd()
    # text has no path: the same text read against the same folder is the same config
    identity = (source.strip("<>") or "config", f"text|{os.path.realpath(base)}|{text}")
    return validate(parsed, base_dir=base, identity=identity)


def config_state_dir(name: str, identity: str) -> Path:
    """The default state dir of one config: `<user state dir>/configs/<name>-<hash of identity>`.

    Two configs that do not set `state_dir` get different state dirs, hence different instance
    ids, containers, scratch workspaces and journals; sharing them takes a `state_dir` (or an
    `instance`) set explicitly to the same value.
    """
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:24] or "config"
    return default_state_dir() / "configs" / f"{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def validate(parsed: ParsedDocument, *, base_dir: Path, identity: tuple[str, str] | None = None) -> Config:
    """Validate parsed data; see :func:`load_config`.

    Args:
        parsed: the parsed document.
        base_dir: where relative paths in it resolve.
        identity: (readable name, identity text) of the config; without `state_dir`, the
            state dir is :func:`config_state_dir` of it (else the user's shared state dir).
    """
    data = parsed.data if parsed.data is not None else {}
    if not isinstance(data, dict):
        raise ConfigError([f"{parsed.where(())}: the config must be a mapping of keys"])
    data, unknown = keys.normalize(data, Config)
    if identity is not None and "state_dir" not in data:
        data = {**data, "state_dir": str(config_state_dir(*identity))}
    problems = [_line(parsed, loc, message, value=False) for loc, message in unknown]
    try:
        context = {"base_dir": base_dir, "extra_tools": _skill_names(data, base_dir), "config_file": parsed.source}
        config = Config.model_validate(data, context=context)
    except ValidationError as exc:
        problems.extend(_line(parsed, _loc(err["loc"]), _describe(err)) for err in exc.errors())
        raise ConfigError(_in_file_order(problems)) from exc
    problems.extend(_line(parsed, loc, message) for loc, message in semantic_problems(config))
    problems.extend(_state_env_problems())
    if problems:
        raise ConfigError(_in_file_order(problems))
    return config


def _state_env_problems() -> list[tuple[tuple[int, int], str]]:
    """`SANDBOX_STATE_URL` overrides `state.url`: a malformed one is a load error like the key's."""
    env = os.environ.get(ENV_VAR)
    if not env:
        return []
    try:
        parse_state_url(env)
    except ValueError as exc:
        return [((0, 0), f"{ENV_VAR} (overrides state.url): {exc}")]
    return []


def _in_file_order(problems: list[tuple[tuple[int, int], str]]) -> list[str]:
    return [text for _, text in sorted(problems, key=lambda item: item[0])]


def _skill_names(data: dict[str, Any], base_dir: Path) -> tuple[str, ...]:
    """Names of the SKILL.md tools the config points at, so policies may name them."""
    dirs = (data.get("skills") or {}).get("dirs") if isinstance(data.get("skills"), dict) else None
    if not isinstance(dirs, list) or not dirs:
        return ()
    from sandbox.config.skill_files import skill_names  # only a config with skills pays for it

    paths = [base_dir / Path(str(d)).expanduser() for d in dirs if isinstance(d, str)]
    return tuple(skill_names(paths))


def _loc(raw: tuple[Any, ...]) -> Loc:
    # pydantic inserts the tag of a union member or a function name into loc; drop those
    return tuple(p for p in raw if isinstance(p, int) or not str(p).startswith("function-"))


def _describe(err: Any) -> str:
    kind = err["type"]
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "missing":
        return "required key is missing"
    if kind in {"value_error", "assertion_error"}:
        return message
    got = err.get("input")
    shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
    return f"{message[0].lower()}{message[1:]} (got {shown})"


def _line(parsed: ParsedDocument, loc: Loc, message: str, *, value: bool = True) -> tuple[tuple[int, int], str]:
    # unknown keys point at the key; bad values point at the value
    pos = parsed.position(loc, value=value)
    order = (pos.line, pos.column) if pos else (0, 0)
    return order, f"{parsed.where(loc, value=value)}: {format_loc(loc)}: {message}"


def semantic_problems(config: Config) -> list[tuple[Loc, str]]:
    """Cross-key rules that one field's type cannot say."""
    problems: list[tuple[Loc, str]] = []
    seen: dict[str, int] = {}
    for index, agent in enumerate(config.agents.list):
        if agent.id in seen:
            problems.append(
                (
                    ("agents", "list", index, "id"),
                    f"agent id {agent.id!r} repeats agents.list[{seen[agent.id]}]",
                )
            )
        seen.setdefault(agent.id, index)
    problems.extend(_default_agent_problems(config))
    problems.extend(_state_dir_problems(config))
    exec_cfg = config.tools.exec
    if exec_cfg.default_timeout_s > exec_cfg.max_timeout_s:
        problems.append((("tools", "exec", "default_timeout_s"), "must not exceed tools.exec.max_timeout_s"))
    loop = config.tools.loop_detection
    if not loop.warn_threshold < loop.critical_threshold <= loop.global_circuit_breaker:
        problems.append(
            (
                ("tools", "loop_detection"),
                "thresholds must satisfy warn_threshold < critical_threshold <= global_circuit_breaker",
            )
        )
    for key in config.tools.by_provider:
        if not _PROVIDER_KEY.match(key):
            problems.append(
                (
                    ("tools", "by_provider", key),
                    "expected `provider` or `provider/model` (lower-case provider)",
                )
            )
    known_agents = set(seen) or {"main"}
    for agent_id in config.tools.approvals.by_agent:
        if agent_id not in known_agents:
            problems.append(
                (
                    ("tools", "approvals", "by_agent", agent_id),
                    f"unknown agent {agent_id!r} (known: {', '.join(sorted(known_agents))})",
                )
            )
    problems.extend(_tenant_problems(config))
    problems.extend(_network_problems(config))
    problems.extend(_workspace_store_problems(config))
    problems.extend(_workspace_root_problems(config))
    problems.extend(bind_problems(config))
    problems.extend(isolation_problems(config))
    return problems


def _default_agent_problems(config: Config) -> list[tuple[Loc, str]]:
    """At most one `default: true` per tenant (each tenant's calls that name no agent run as it)."""
    problems: list[tuple[Loc, str]] = []
    first: dict[str, int] = {}
    for index, agent in enumerate(config.agents.list):
        if not agent.default:
            continue
        if agent.tenant in first:
            problems.append(
                (
                    ("agents", "list", index, "default"),
                    f"tenant {agent.tenant!r} already has a default agent "
                    f"(agents.list[{first[agent.tenant]}].default); only one agent per tenant may be `default: true`",
                )
            )
        first.setdefault(agent.tenant, index)
    return problems


def _state_dir_problems(config: Config) -> list[tuple[Loc, str]]:
    """The state dir is a folder, or can be made one: a file (or a file above it) is refused
    here rather than as an OSError deep inside the first command that writes there."""
    path = config.state_dir
    for place in (path, *path.parents):
        try:
            st = place.stat()
        except (FileNotFoundError, NotADirectoryError):  # not there, or below a file: look higher
            continue
        except PermissionError:  # not ours to look at: the first write says what is wrong
            return []
        except OSError as exc:
            return [(("state_dir",), f"{place} cannot be examined ({exc.strerror or exc}); expected a folder")]
        if stat.S_ISDIR(st.st_mode):
            return []
        what = "is" if place == path else f"is below {place}, which is"
        return [(("state_dir",), f"{path} {what} not a folder; expected a folder, or a path where one can be made")]
    return []


def _tenant_problems(config: Config) -> list[tuple[Loc, str]]:
    """With `tenants` declared, every agent belongs to one of them; ids and token hashes are unique."""
    if not config.tenants:
        return []
    problems: list[tuple[Loc, str]] = []
    ids = [t.id for t in config.tenants]
    seen: set[str] = set()
    for i, tid in enumerate(ids):
        if tid in seen:
            problems.append((("tenants", i, "id"), f"tenant {tid!r} is declared twice"))
        seen.add(tid)
    used: set[str] = set()
    for i, tenant in enumerate(config.tenants):
        for j, token in enumerate(tenant.tokens):
            if token.sha256 in used:  # one token must name one tenant
                problems.append((("tenants", i, "tokens", j, "sha256"), "this token hash is used twice"))
            used.add(token.sha256)
    for j, token in enumerate(config.service.metrics_tokens):
        if token.sha256 in used:  # a scraper's token is never a tenant's (/metrics names them all)
            problems.append((("service", "metrics_tokens", j, "sha256"), "this token hash is also a tenant's"))
    metrics = {t.sha256 for t in config.service.metrics_tokens}
    for j, token in enumerate(config.service.operator_tokens):
        # an operator decides every tenant's approvals: that power is never a tenant's or a scraper's
        if token.sha256 in used or token.sha256 in metrics:
            problems.append(
                (("service", "operator_tokens", j, "sha256"), "this token hash is also a tenant's or a metrics token")
            )
    for i, agent in enumerate(config.agents.list):
        if agent.tenant not in seen:
            problems.append(
                (
                    ("agents", "list", i, "tenant"),
                    f"agent {agent.id!r} belongs to tenant {agent.tenant!r}, which is not in tenants "
                    f"(declared: {', '.join(ids)})",
                )
            )
    if not config.agents.list and "default" not in seen:
        problems.append((("tenants",), "the implicit agent 'main' belongs to tenant 'default'; declare it"))
    return problems


def _workspace_root_problems(config: Config) -> list[tuple[Loc, str]]:
    """A workspace_root holds scratch workspaces only: never `/`, a system path, a home, a socket.

    The audit trusts what lies in a workspace_root; a root of `/` would make every mount on the
    engine look like the orchestrator's own. The escape hatches do not apply here: they are for
    binds a person chose, and a scratch root is never one.
    """
    out: list[tuple[Loc, str]] = []
    places: list[tuple[Loc, Path | None]] = [
        (("agents", "defaults", "sandbox", "workspace_root"), config.agents.defaults.sandbox.workspace_root)
    ]
    places += [
        (("agents", "list", i, "sandbox", "workspace_root"), a.sandbox.workspace_root)
        for i, a in enumerate(config.agents.list)
    ]
    for loc, root in places:
        if root is None:
            continue
        try:
            check_source(str(root), DockerConfig(), what="workspace_root")
        except BindRefused as exc:
            out.append((loc, f"{exc.message} [rule {exc.rule}]; fix: give scratch workspaces a folder of their own"))
    return out


def _workspace_store_problems(config: Config) -> list[tuple[Loc, str]]:
    """A volume holds a scratch workspace only: an agent's own folder is on the host by definition."""
    out: list[tuple[Loc, str]] = []
    for index, agent_id in enumerate(agent_ids(config)):
        sandbox = effective_agent(config, agent_id).sandbox
        if sandbox.workspace_store == "volume" and sandbox.workspace_access != "none":
            listed = (
                index < len(config.agents.list)
                and "workspace_store" in config.agents.list[index].sandbox.model_fields_set
            )
            loc: Loc = ("agents", "list", index, "sandbox") if listed else ("agents", "defaults", "sandbox")
            out.append(
                (
                    (*loc, "workspace_store"),
                    f"agent {agent_id!r}: `volume` holds a scratch workspace only; it needs workspace_access "
                    f"none (is {sandbox.workspace_access})",
                )
            )
    return out


def _network_problems(config: Config) -> list[tuple[Loc, str]]:
    """The exec sandbox is never attached to the browser's network; the egress proxy reaches out through a bridge."""
    out: list[tuple[Loc, str]] = []
    places: list[tuple[Loc, Any]] = [(("agents", "defaults", "sandbox"), config.agents.defaults.sandbox)]
    places += [(("agents", "list", i, "sandbox"), a.sandbox) for i, a in enumerate(config.agents.list)]
    for loc, sandbox in places:
        browser_net = sandbox.browser.network
        # each browser sandbox gets `<browser.network>-<hash>` of its own
        if sandbox.docker.network == browser_net or sandbox.docker.network.startswith(f"{browser_net}-"):
            out.append(
                (
                    (*loc, "docker", "network"),
                    f"{sandbox.docker.network!r} is the browser network; the exec sandbox is never attached to it",
                )
            )
        upstream = sandbox.egress.upstream_network
        if upstream in ("none", "host") or upstream == browser_net or upstream.startswith(f"{browser_net}-"):
            out.append(
                (
                    (*loc, "egress", "upstream_network"),
                    f"{upstream!r} cannot carry the egress proxy's traffic; expected a bridge network "
                    "(`bridge`, the default, or one of your own)",
                )
            )
        if sandbox.docker.network == "egress" and sandbox.docker.dns:
            out.append(
                (
                    (*loc, "docker", "dns"),
                    "an egress sandbox has no DNS of its own (names resolve at its proxy); remove docker.dns, "
                    "or pin names for the proxy with egress.extra_hosts",
                )
            )
        if sandbox.docker.network.startswith("sbx-egress-"):
            out.append(((*loc, "docker", "network"), "an egress network is made per sandbox; use `network: egress`"))
    return out
