"""Cross-agent isolation rules checked at load: who may share a container, whose paths may overlap.

A `scope: shared` container is one container for every agent that asks for it, so it is only
allowed when those agents' effective sandboxes are identical (and of one tenant). Workspaces
may not overlap across agents, and no workspace may hold a `workspace_root` or the state dir:
a sandbox writing there could plant links for the orchestrator (root) to follow, or rewrite its
state. The same comparisons serve `sandbox audit` for configs that never went through loading.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.config.binds import parse_bind
from sandbox.config.locate import Loc
from sandbox.config.merge import EffectiveAgent, agent_ids, effective_agent
from sandbox.config.models import Config
from sandbox.config.plugins import hook_entry_points
from sandbox.errors import BindRefused

# settings that change nothing in the container (who is sandboxed, when it is pruned)
_NOT_CONTAINER = frozenset({"mode", "scope", "prune"})


@dataclass(frozen=True)
class SharedMismatch:
    """Two agents that would share one `shared` container but whose sandboxes differ."""

    first: EffectiveAgent
    other: EffectiveAgent
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Overlap:
    """A workspace that holds (or is) another agent's workspace, a workspace_root or the state dir."""

    agent: EffectiveAgent
    other: str  # what it overlaps, for messages
    relation: str  # "is", "contains", "lies inside"
    other_agent: EffectiveAgent | None  # set when `other` is another agent's workspace
    kind: str  # "workspace", "workspace_root", "state_dir"


def sandbox_view(agent: EffectiveAgent) -> dict[str, Any]:
    """Everything of an agent that shapes its container (what must match to share one)."""
    view: dict[str, Any] = {
        "tenant": agent.tenant,
        "sandbox": agent.sandbox.model_dump(mode="json", exclude=set(_NOT_CONTAINER)),
    }
    if agent.sandbox.workspace_access != "none":
        view["workspace"] = os.path.realpath(agent.workspace)
    return view


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested mappings."""
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        path = f"{prefix}{key}"
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            out += differing_keys(left, right, path + ".")
        elif left != right:
            out.append(path)
    return out


def _agents(config: Config) -> list[EffectiveAgent]:
    return [effective_agent(config, agent_id) for agent_id in agent_ids(config)]


def shared_mismatches(config: Config) -> list[SharedMismatch]:
    """Agents in `scope: shared` whose effective sandbox differs from the first such agent's."""
    shared = [a for a in _agents(config) if a.sandbox.scope == "shared" and a.sandbox.mode != "off"]
    if len(shared) < 2:
        return []
    first, views = shared[0], [sandbox_view(a) for a in shared]
    return [
        SharedMismatch(first, agent, tuple(keys))
        for agent, view in zip(shared[1:], views[1:], strict=True)
        if (keys := differing_keys(views[0], view))
    ]


def _relation(path: str, other: str) -> str | None:
    if path == other:
        return "is"
    if other.startswith(path.rstrip("/") + "/"):
        return "contains"
    if path.startswith(other.rstrip("/") + "/"):
        return "lies inside"
    return None


def overlaps(config: Config) -> list[Overlap]:
    """Workspaces overlapping another agent's, or holding a workspace_root or the state dir."""
    agents = _agents(config)
    real = {a.id: os.path.realpath(a.workspace) for a in agents}
    state = os.path.realpath(config.state_dir)
    roots = sorted({os.path.realpath(str(a.sandbox.workspace_root)) for a in agents})
    out: list[Overlap] = []
    for index, agent in enumerate(agents):
        mine = real[agent.id]
        for other in agents[:index]:
            relation = _relation(mine, real[other.id])
            if relation:
                out.append(Overlap(agent, real[other.id], relation, other, "workspace"))
        holds_state = _relation(mine, state) in ("is", "contains")
        for kind, path in [("state_dir", state), *(("workspace_root", r) for r in roots)]:
            relation = _relation(mine, path)
            if kind == "workspace_root" and holds_state and _relation(state, path) in ("is", "contains"):
                continue  # already said: the state dir holds it
            # a workspace inside a workspace_root would sit among scratch workspaces (and in
            # some tenant's folder, counting toward its disk quota); inside the state dir is the
            # default place for workspaces
            refused = ("is", "contains", "lies inside") if kind == "workspace_root" else ("is", "contains")
            if relation is not None and relation in refused:
                out.append(Overlap(agent, path, relation, None, kind))
    return out


def _loc(agent: EffectiveAgent, *tail: str | int) -> Loc:
    return ("agents", "defaults", *tail) if agent.index is None else ("agents", "list", agent.index, *tail)


def _where_workspace(config: Config, agent: EffectiveAgent) -> str:
    own = agent.index is not None and config.agents.list[agent.index].workspace is not None
    source = "" if own or agent.index is None else ", from agents.defaults.workspace"
    return f"agent {agent.id!r} ({agent.key_path}{source})"


def isolation_problems(config: Config) -> Iterator[tuple[Loc, str]]:
    """Load-time problems: shared scope across differing sandboxes or tenants, overlapping paths,
    control files where a sandbox can write."""
    for m in shared_mismatches(config):
        why = " (tenants never share a container)" if "tenant" in m.keys else ""
        yield (
            _loc(m.other, "sandbox", "scope"),
            f"agents {m.first.id!r} ({m.first.key_path}) and {m.other.id!r} ({m.other.key_path}) both use "
            f"scope shared, i.e. one container, but their sandboxes differ in {', '.join(m.keys)}{why}; "
            "make these keys equal or give each agent its own container (scope agent)",
        )
    for o in overlaps(config):
        if o.kind == "workspace":
            assert o.other_agent is not None
            what = f"the workspace of {_where_workspace(config, o.other_agent)}"
        else:
            what = f"the {o.kind} {o.other}"
        yield (
            _loc(o.agent, "workspace"),
            f"the workspace {os.path.realpath(o.agent.workspace)} of {_where_workspace(config, o.agent)} "
            f"{o.relation} {what}; give every agent its own directory, outside the state_dir and every "
            "workspace_root (a sandbox writing there could reach what is not its own)",
        )
    yield from control_problems(config)


# -- control files: what the orchestrator reads or runs on the host ------------------------------


@dataclass(frozen=True)
class WritableRoot:
    """A host directory some agent's sandboxes can write (or, for a scratch root, write below)."""

    agent: EffectiveAgent
    path: str  # resolved
    how: str  # for messages: "workspace (workspace_access rw)", "docker.binds[0] (rw)", ...
    loc: Loc


@dataclass(frozen=True)
class ControlExposure:
    """A control file or folder that lies in (or holds) a directory a sandbox can write."""

    kind: str  # "skills dir", "config file", "state dir", "hook module", "orchestrator code"
    path: str
    root: WritableRoot
    relation: str  # "is", "lies inside", "contains"


def writable_roots(config: Config) -> list[WritableRoot]:
    """Every host directory a sandbox of some agent mounts read-write, and every scratch root."""
    out: list[WritableRoot] = []
    for agent in _agents(config):
        sandbox = agent.sandbox
        if sandbox.mode == "off":
            continue  # no sandbox: nothing runs confined, nothing confined writes
        if sandbox.workspace_access == "rw":
            out.append(
                WritableRoot(
                    agent,
                    os.path.realpath(agent.workspace),
                    "workspace (workspace_access rw)",
                    _loc(agent, "workspace"),
                )
            )
        elif sandbox.workspace_access == "none":
            root = os.path.realpath(str(sandbox.workspace_root))
            how = "scratch root (sandbox.workspace_root; each sandbox writes a folder in it)"
            out.append(WritableRoot(agent, root, how, _loc(agent, "sandbox", "workspace_root")))
        for index, text in enumerate(sandbox.docker.binds):
            try:
                source, _, mode = parse_bind(text)
            except BindRefused:
                continue  # malformed: the bind rules report it
            if mode == "rw":
                loc = _loc(agent, "sandbox", "docker", "binds", index)
                out.append(
                    WritableRoot(
                        agent, os.path.realpath(os.path.expanduser(source)), f"docker.binds[{index}] (rw)", loc
                    )
                )
    return out


def _hook_paths() -> list[str]:
    """Where the installed hook plugins' code lives (found without importing it)."""
    out = []
    for ep in hook_entry_points():
        try:
            spec = importlib.util.find_spec(ep.module.split(".", 1)[0])
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        out += list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    return [os.path.realpath(p) for p in out]


# the `sandbox` package's folder, found without importing the package (this is sandbox/config/isolation.py)
_PACKAGE_FOLDER = os.path.dirname(os.path.dirname(__file__))


def control_paths(config: Config) -> list[tuple[str, str]]:
    """(kind, resolved path) of everything the orchestrator reads or runs as itself on the host."""
    paths = [("skills dir", os.path.realpath(d)) for d in config.skills.dirs]
    if config.source_file is not None:
        paths.append(("config file", str(config.source_file)))
    paths.append(("state dir", os.path.realpath(config.state_dir)))
    paths += [("hook module", p) for p in _hook_paths()]
    paths.append(("orchestrator code", os.path.realpath(_PACKAGE_FOLDER)))
    if sys.prefix != sys.base_prefix:  # a virtualenv: its packages run as the orchestrator
        paths.append(("orchestrator code", os.path.realpath(sys.prefix)))
    return paths


# a folder whose contents the orchestrator runs is exposed when a writable root is inside it too
_FOLDERS_RUN = frozenset({"skills dir", "hook module", "orchestrator code"})


def control_exposures(config: Config) -> list[ControlExposure]:
    """Control files and folders a sandboxed session could rewrite (see :func:`control_problems`)."""
    out = []
    roots = writable_roots(config)
    for kind, path in control_paths(config):
        for root in roots:
            relation = _relation(root.path, path)  # root "contains" path, "is" it, or "lies inside" it
            if relation in ("is", "contains"):
                out.append(ControlExposure(kind, path, root, "lies inside" if relation == "contains" else "is"))
            elif relation == "lies inside" and kind in _FOLDERS_RUN:
                out.append(ControlExposure(kind, path, root, "contains"))
    return out


def control_problems(config: Config) -> Iterator[tuple[Loc, str]]:
    """Load-time refusals: a skills dir, the config file, the state dir, a hook's or the orchestrator's
    code where a sandbox can write (it would run, or be obeyed, on the host on the next call)."""
    for e in control_exposures(config):
        agent = e.root.agent
        yield (
            e.root.loc,
            f"the {e.kind} {e.path} {e.relation} the {e.root.how} {e.root.path} of agent {agent.id!r} "
            f"({agent.key_path}): its sandboxes can write there, and the orchestrator reads or runs the "
            f"{e.kind} on the host, so a sandboxed session could plant code or rewrite policy; move the "
            f"{e.kind} outside every writable workspace, rw bind and workspace_root, or make the agent's "
            "workspace_access ro (or none with a workspace_root elsewhere)",
        )
