"""The live audit sees every spelling on the real engine: root as `-0`, an allow-all seccomp file,
another container's pid and ipc namespaces, a volume bound to /etc, bridge egress, env secrets,
and what each image was built from (issue 16 items 12, 13, 14, 16, 21)."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from sandbox.audit.findings import Finding
from sandbox.audit.run import run_audit
from sandbox.config import load_config_text
from sandbox.runtime.docker.doctor import run_checks
from sandbox.runtime.docker.images import BASE_IMAGE, ImageTarget, provenance
from tests.conftest import RUN_ID, TEST_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("images")]
IMAGE = "sandbox-exec:latest"
ALLOW_ALL = json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []})


@pytest.fixture
def make(docker_client: Any) -> Iterator[Any]:
    """Create (not start) a labelled container from the exec image; all are removed afterwards."""
    made: list[Any] = []

    def create(*command: str, **options: Any) -> Any:
        name = f"sbx-{RUN_ID}-spell-{secrets.token_hex(3)}"
        labels = {TEST_LABEL: RUN_ID}
        container = docker_client.containers.create(
            IMAGE, list(command) or ["sleep", "300"], name=name, labels=labels, **options
        )
        made.append(container)
        return container

    yield create
    for container in made:
        with contextlib.suppress(docker.errors.NotFound):  # removed by the test already
            container.remove(force=True)


def live_findings(docker_client: Any, tmp_path: Path, container: Any) -> list[Finding]:
    """Every finding of `audit --all-containers` about one container."""
    config = load_config_text(f"state_dir: {tmp_path}/state\ninstance: {RUN_ID}x\n")
    result = run_audit(config, docker_client, all_containers=True)
    return [f for f in result.findings if f.target.startswith(f"container {container.name}")]


@pytest.mark.parametrize("user", ["00", "+0", "-0", "0000:0000", "root", "0:0"])
def test_live_root_spellings_are_flagged(docker_client: Any, make: Any, tmp_path: Path, user: str) -> None:
    """A container created with `--user -0` (any root spelling) is flagged SBX-C027 by the live audit."""
    container = make(user=user)
    assert docker_client.api.inspect_container(container.id)["Config"]["User"] == user
    assert "SBX-C027" in [f.rule for f in live_findings(docker_client, tmp_path, container)]


def test_minus_zero_really_runs_as_uid_0(docker_client: Any, make: Any) -> None:
    """The attack: `-0` and `0000:0000` are uid 0 inside the container, which is why they are flagged."""
    for user in ("-0", "0000:0000"):
        container = make("id", "-u", user=user, network_mode="none")
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 0
        assert container.logs().decode().strip() == "0"


def test_live_allow_all_seccomp_is_flagged(docker_client: Any, make: Any, tmp_path: Path) -> None:
    """A container whose seccomp profile allows by default runs unfiltered and is flagged SBX-C005."""
    container = make("sh", "-c", "unshare -U true && echo unfiltered", security_opt=[f"seccomp={ALLOW_ALL}"])
    found = [f for f in live_findings(docker_client, tmp_path, container) if f.rule == "SBX-C005"]
    assert len(found) == 1 and "restricts no syscall" in found[0].evidence
    container.start()
    container.wait(timeout=60)
    # under the engine's default profile unshare is refused; under this one it is not
    assert "unfiltered" in container.logs().decode()


def test_pid_namespace_of_another_container_is_flagged(docker_client: Any, make: Any, tmp_path: Path) -> None:
    """A sandbox joined to another container's pid namespace reads its secrets from /proc: SBX-C010."""
    canary = f"canary-{secrets.token_hex(8)}"
    victim = make("sleep", "300", environment={"API_KEY": canary}, network_mode="none")
    victim.start()
    spy = make("sh", "-c", "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'", pid_mode=f"container:{victim.id}")
    spy.start()
    spy.wait(timeout=60)
    assert canary in spy.logs().decode()  # the attack works on this engine
    found = [f for f in live_findings(docker_client, tmp_path, spy) if f.rule == "SBX-C010"]
    assert len(found) == 1 and found[0].severity == "high" and victim.id in found[0].evidence


def test_ipc_namespace_of_another_container_is_flagged(docker_client: Any, make: Any, tmp_path: Path) -> None:
    """A sandbox joined to another container's ipc namespace (its shared memory) is flagged SBX-C011."""
    victim = make(ipc_mode="shareable", network_mode="none")
    victim.start()
    spy = make(ipc_mode=f"container:{victim.id}", network_mode="none")
    assert "SBX-C011" in [f.rule for f in live_findings(docker_client, tmp_path, spy)]


def test_volume_bound_to_etc_is_flagged(docker_client: Any, make: Any, tmp_path: Path) -> None:
    """A local volume whose driver options bind /etc gives the sandbox the host's /etc: SBX-M003."""
    volume = docker_client.volumes.create(
        name=f"{RUN_ID}-etc-{secrets.token_hex(3)}",
        driver="local",
        driver_opts={"type": "none", "o": "bind", "device": "/etc"},
        labels={TEST_LABEL: RUN_ID},
    )
    try:
        container = make("cat", "/data/hostname", volumes={volume.name: {"bind": "/data", "mode": "ro"}})
        container.start()
        container.wait(timeout=60)
        assert container.logs().decode().strip() == Path("/etc/hostname").read_text().strip()  # the host's file
        found = [f for f in live_findings(docker_client, tmp_path, container) if f.rule == "SBX-M003"]
        assert len(found) == 1 and f"volume {volume.name} (device /etc)" in found[0].evidence
        container.remove(force=True)
    finally:
        volume.remove(force=True)


def test_bridge_network_and_env_secret_are_flagged(docker_client: Any, make: Any, tmp_path: Path) -> None:
    """A sandbox on the default bridge (egress, the host gateway) with an API key in its env: C028 and C029."""
    secret = "sk-proj-" + secrets.token_hex(16)
    container = make(network_mode="bridge", environment={"OPENAI_API_KEY": secret, "LANG": "C.UTF-8"})
    found = {f.rule: f for f in live_findings(docker_client, tmp_path, container)}
    assert "SBX-C028" in found and "bridge" in found["SBX-C028"].evidence
    assert "SBX-C029" in found and "OPENAI_API_KEY" in found["SBX-C029"].evidence
    assert secret not in found["SBX-C029"].evidence


def test_built_images_carry_provenance_shown_by_doctor_and_audit(docker_client: Any, tmp_path: Path) -> None:
    """Built images record base id, apt pin and the package list hash; doctor and audit show them."""
    base = docker_client.images.get(BASE_IMAGE)
    for tag in ("sandbox-exec:latest", "sandbox-browser:latest"):
        found = provenance(docker_client.images.get(tag).labels)
        assert found["base-image-id"] == base.id and found["base-image"] == BASE_IMAGE
        assert len(found["packages-sha256"]) == 64 and int(found["packages-count"]) > 50
        assert found["apt-snapshot"].startswith("none") or found["apt-snapshot"][:2] == "20"
    config = load_config_text(f"state_dir: {tmp_path}/state\ninstance: {RUN_ID}y\n")
    checks = run_checks(docker_client, config, [ImageTarget("sandbox", "sandbox-exec:latest")])
    shown = [c for c in checks if c.name == "image sandbox provenance"]
    assert len(shown) == 1 and shown[0].status == "ok" and "packages-sha256" in shown[0].detail
    infos = [f for f in run_audit(config, docker_client).findings if f.rule == "SBX-I001"]
    assert infos and infos[0].severity == "info" and base.id in infos[0].evidence
