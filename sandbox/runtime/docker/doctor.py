"""`sandbox doctor`: is this host ready to run sandboxes? Each check says ok / warn / fail and the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import docker.errors

from sandbox.audit.ownership import write_problem
from sandbox.config.merge import agent_ids, effective_agent, probe_agent_id
from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.journal.retention import Retention
from sandbox.journal.store import Journal
from sandbox.runtime import link_folders
from sandbox.runtime.agent.exec_path import path_from_labels
from sandbox.runtime.checks import Check
from sandbox.runtime.docker import procfs
from sandbox.runtime.docker.create import SHIM_SHARDS, groups_shims
from sandbox.runtime.docker.errors import mapped
from sandbox.runtime.docker.images import ImageTarget, image_current, provenance
from sandbox.runtime.naming import Labels
from sandbox.runtime.spec import spec_from_config


def _cgroup_probe(client: Any, image: str) -> Check:
    # Start a throwaway container with small limits and read them back from inside.
    script = (
        "m=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes);"
        "p=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max);"
        "c=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us);"
        'echo "$m $p $c"'
    )
    try:
        out = client.containers.run(
            image,
            ["/bin/sh", "-c", script],
            remove=True,
            network_mode="none",
            mem_limit=64 * 1024 * 1024,
            memswap_limit=64 * 1024 * 1024,
            pids_limit=32,
            nano_cpus=500_000_000,
            user="1000:1000",
            cap_drop=["ALL"],
            labels={Labels.MANAGED: "probe"},
        ).decode()
    except docker.errors.DockerException as exc:
        return Check(
            "fail",
            "cgroup limits",
            f"probe container failed: {exc}",
            "check the engine's cgroup setup",
        )
    parts = out.split()
    if (
        len(parts) >= 3
        and parts[0] == str(64 * 1024 * 1024)
        and parts[1] == "32"
        and parts[2] in ("50000", "50000 100000")
    ):
        return Check(
            "ok",
            "cgroup limits",
            "memory, pids and cpu limits are enforced (read back inside a probe)",
        )
    if len(parts) >= 2 and parts[0] == str(64 * 1024 * 1024) and parts[1] == "32":
        return Check(
            "ok",
            "cgroup limits",
            f"memory and pids limits enforced; cpu reads {' '.join(parts[2:])}",
        )
    return Check(
        "fail",
        "cgroup limits",
        f"limits not enforced (read {out.strip()!r})",
        "run the engine with cgroup support (memory and pids controllers)",
    )


def _host_firewall_check() -> Check:
    """Egress and browser sandboxes need host firewall rules (root and iptables where the engine runs)."""
    if shutil.which("iptables") and os.geteuid() == 0:
        return Check("ok", "host firewall", "iptables and root: egress and browser sandboxes get their host rules")
    return Check(
        "warn",
        "host firewall",
        "no iptables or not root: egress sandboxes are refused (egress.require_host_firewall) and browser "
        "sandboxes could reach the host's services",
        "run the orchestrator as root where the engine runs, with iptables installed",
    )


def _browser_client_check(config: Config) -> Check | None:
    """The browser tool's CDP client (Playwright's node driver) runs here; None when no agent
    enables the browser."""
    if not any(effective_agent(config, a).sandbox.browser.enabled for a in agent_ids(config)):
        return None
    try:
        ran = subprocess.run(
            [sys.executable, "-m", "playwright", "--version"], capture_output=True, text=True, timeout=60, check=False
        )
        said = (ran.stdout or ran.stderr).strip().splitlines()
        detail = said[-1] if said else f"exit {ran.returncode}"
        ok = ran.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, detail = False, str(exc)
    if ok:
        return Check("ok", "browser client", f"Playwright's driver runs ({detail})")
    return Check(
        "fail",
        "browser client",
        f"Playwright's driver does not run: {detail}",
        "pip install 'agent-sandbox[browser]' (no browser download is needed); its node driver needs libatomic1",
    )


def _provenance_check(client: Any, target: ImageTarget) -> Check:
    """What the image was built from (base id and digest, apt pin, package list hash), from its labels."""
    try:
        found = provenance(client.images.get(target.tag).labels)
    except docker.errors.DockerException as exc:
        return Check("warn", f"image {target.name} provenance", f"cannot read labels: {exc}")
    if "packages-sha256" not in found:
        return Check(
            "warn",
            f"image {target.name} provenance",
            "no provenance labels (built before they were recorded)",
            "sandbox images build",
        )
    # unpinned is a fact to show, not a failure: a fresh machine builds unpinned
    return Check("ok", f"image {target.name} provenance", "; ".join(f"{k} {v}" for k, v in found.items()))


def _exec_path_check(client: Any, config: Config) -> Check:
    """How the default agent's sandboxes run commands: the resident agent, or docker exec (why)."""
    docker_cfg = effective_agent(config, probe_agent_id(config)).sandbox.docker
    try:
        labels = client.images.get(docker_cfg.image).labels
    except Exception as exc:  # a missing image is the image check's to report
        return Check("warn", "exec path", f"cannot read the labels of {docker_cfg.image}: {exc.__class__.__name__}")
    path = path_from_labels(labels, docker_cfg.agent)
    if path.kind == "agent":
        return Check("ok", "exec path", f"{docker_cfg.image}: {path.describe()}; {_link_words(path.link)}")
    return Check(
        "warn",
        "exec path",
        f"{docker_cfg.image}: {path.describe()}: every command pays a Docker exec round trip",
        "build the image from images/sandbox (or add the agent and its labels to yours)",
    )


def shim_check(api_version: str, config: Config) -> Check:
    """Whether a tenant's sandboxes share one containerd shim here (`docker.shim: tenant`)."""
    grouped = sorted({a for a in agent_ids(config) if effective_agent(config, a).sandbox.docker.shim == "tenant"})
    if not grouped:
        return Check("ok", "shims", "one containerd shim per sandbox (docker.shim: container)")
    if groups_shims(api_version):
        detail = f"{SHIM_SHARDS} containerd shims per tenant and runtime, never shared across tenants"
        return Check("ok", "shims", f"{detail} (API {api_version})")
    return Check(
        "ok",
        "shims",
        f"API {api_version} gives every sandbox its own containerd shim (about 2.3 MiB each); "
        "Docker Engine 24.0 or later shares one per tenant (scripts/docker-engine upgrades a Debian host)",
    )


def _link_words(link: bool) -> str:
    """What carries the agent's frames here (docs/resident-agent.md, the link beside the engine)."""
    if not link:
        return "its frames go over the engine's exec stream (the image's agent takes no FIFO link)"
    refused = link_folders.refused_here()
    if refused is not None:
        return f"its frames go over the engine's exec stream ({refused})"
    return (
        "its frames go over two FIFOs beside the engine where the engine can bind the state dir's "
        "agent-links folder, else over its exec stream"
    )


def workspace_checks(config: Config) -> list[Check]:
    """Each sandboxed agent's read-write workspace: can the sandbox user write it? (SBX-M008)"""
    checks = []
    for agent_id in agent_ids(config):
        agent = effective_agent(config, agent_id)
        if agent.sandbox.mode == "off" or agent.sandbox.workspace_access != "rw":
            continue
        try:
            spec = spec_from_config(config, agent, f"agent:{agent_id}:doctor", "doctor")
        except SandboxError:
            continue  # a refused workspace or bind: loading and `sandbox audit` say why
        workspace = spec.workspace.source  # a HostFolder: workspace_access is rw
        problem = write_problem(workspace, spec.user, agent.sandbox.docker.cap_add)
        if problem is None:
            checks.append(Check("ok", f"workspace {agent_id}", f"{workspace} (rw) is writable by {spec.user}"))
        else:
            checks.append(Check("warn", f"workspace {agent_id}", problem.detail, problem.fix))
    return checks


def journal_check(config: Config) -> Check:
    """The journal read in full (SQLite's integrity check: seconds at a million events), its size
    against `journal.retention`, and whether a prune can give space back. Never on a probe path."""
    path = config.state_dir / "journal.sqlite3"
    if not path.exists():
        return Check("ok", "journal", f"{path} does not exist yet (made on first use)")
    try:
        journal = Journal(path)
    except SandboxError as exc:
        return Check("fail", "journal", exc.message, "move the journal aside (see above); a new one is made")
    try:
        problems = journal.integrity_check()
        health = journal.health()
        mode = journal.auto_vacuum()
    except SandboxError as exc:
        return Check("fail", "journal", exc.message, "move the journal aside (see above); a new one is made")
    finally:
        journal.close()
    if problems:
        return Check(
            "fail",
            "journal",
            f"{path} is damaged: " + "; ".join(problems[:5]),
            f"stop the service and move {path.name} (with its -wal and -shm files) aside; a new one is made",
        )
    size = int(health["bytes"])
    bound = Retention.of(config.journal.retention).max_bytes
    detail = f"{path}: integrity ok, {size / 1024 / 1024:,.1f} MiB, last event id {health['last_event_id']}"
    if bound is not None and size > bound:
        return Check("warn", "journal", f"{detail}, over journal.retention.max_bytes", "sandbox journal prune")
    if mode != "incremental" and bound is not None:
        return Check(
            "warn",
            "journal",
            f"{detail}; made before retention: pruning reuses its space but cannot shrink the file",
            "sandbox journal prune --vacuum (once; it blocks writes while it runs)",
        )
    return Check("ok", "journal", detail)


def run_checks(client: Any, config: Config, targets: list[ImageTarget]) -> list[Check]:
    """All doctor checks, in order; never raises for a failing check."""
    checks: list[Check] = []
    try:
        with mapped("doctor"):
            version = client.version()
            info = client.info()
    except SandboxError as exc:
        return [
            Check(
                "fail",
                "engine",
                exc.message,
                "start the Docker engine (dockerd) or set DOCKER_HOST",
            ),
            *workspace_checks(config),
            journal_check(config),
        ]
    checks.append(
        Check(
            "ok",
            "engine",
            f"Docker {version.get('Version')} (API {version.get('ApiVersion')}), "
            f"{info.get('OperatingSystem')}, cgroup v{info.get('CgroupVersion', '?')}",
        )
    )
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    has_runsc = "runsc" in runtimes
    checks.append(
        Check(
            "ok",
            "runtimes",
            f"{', '.join(runtimes)}"
            + ("" if has_runsc else " (gVisor runsc not installed: optional; scripts/runsc installs and registers it)"),
        )
    )
    for target in targets:
        ok, detail = image_current(client, target)
        checks.append(
            Check(
                "ok" if ok else "fail",
                f"image {target.name}",
                detail,
                "" if ok else "sandbox images build",
            )
        )
        if ok:
            checks.append(_provenance_check(client, target))
    exec_target = targets[0]
    if image_current(client, exec_target)[0]:
        checks.append(_cgroup_probe(client, exec_target.tag))
        checks.append(Check(*procfs.probe(client, exec_target.tag, procfs.shared_runtimes(config))))
    checks.append(_exec_path_check(client, config))
    checks.append(shim_check(str(version.get("ApiVersion", "")), config))
    if info.get("SwapLimit") is False:
        checks.append(
            Check(
                "warn",
                "swap limit",
                "the engine cannot limit swap; memory_swap is not enforced",
                "enable swap accounting (cgroup v2, or swapaccount=1 on the kernel command line)",
            )
        )
    state = config.state_dir
    try:
        state.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=state, prefix=".doctor-"):
            pass
        checks.append(Check("ok", "state dir", f"{state} is writable"))
    except OSError as exc:
        checks.append(
            Check(
                "fail",
                "state dir",
                f"{state}: {exc.strerror}",
                "set state_dir to a writable folder",
            )
        )
    checks.append(journal_check(config))
    checks.append(_host_firewall_check())
    browser_client = _browser_client_check(config)
    if browser_client is not None:
        checks.append(browser_client)
    if os.geteuid() == 0:
        checks.append(
            Check(
                "ok",
                "privileges",
                "orchestrator runs as root; created workspace files are given to the sandbox user",
            )
        )
    return checks + workspace_checks(config)
