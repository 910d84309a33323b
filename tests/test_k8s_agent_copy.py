"""Images without the resident agent on a cluster: an init container of `agent_image` copies it into
an emptyDir the sandbox mounts read-only. The rendered Pods stay valid (strict schemas) and
restricted; a Pod whose copy step is not ours is not adopted; end to end (fake API, real
containers) a session runs in an image that has no agent of its own."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from sandbox.engine.orchestrator import Orchestrator
from sandbox.errors import ConfigError
from sandbox.runtime.kubernetes.agent_copy import AGENT_MOUNT, AGENT_PATH, agent_path
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.kubernetes.pod import sandbox_pod
from sandbox.runtime.kubernetes.pods_read import adoptable
from sandbox.runtime.kubernetes.pss import violations
from tests.conftest import RUN_ID, TEST_LABEL
from tests.k8s_fake_cluster import FakeCluster
from tests.k8s_helpers import every_object, k8s_config, one_agent_config, pod_objects, spec_of

COPY = "    agent_image: sandbox-exec:latest\n    images_without_agent: [sandbox-exec:latest]"


def _agent_steps(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"].get("initContainers") or [] if c["name"] == "agent"]


@pytest.mark.parametrize("version", ["1.33", "1.37"])
@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_pods_with_the_copy_step_pass_the_strict_schemas_and_restricted(tmp_path: Path, version: str) -> None:
    """Every Pod (and template) rendered with the copy step validates strictly and is restricted."""
    objects = every_object(k8s_config(tmp_path, COPY))
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert pods and all(_agent_steps(p) for p in pods)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    for obj in (o for o in objects if o["kind"] in ("Pod", "Deployment")):
        assert violations(obj, "restricted", f"v{version}") == [], obj["metadata"]["name"]


def test_the_agent_is_copied_first_and_mounted_read_only(tmp_path: Path) -> None:
    """The copy runs before the protect step, restricted like the sandbox, and the sandbox sees
    the agent only read-only; the starter looks for it there."""
    config = k8s_config(tmp_path, COPY)
    pod = pod_objects(config, "coder")[-1]  # rw workspace: the protect step too
    steps = pod["spec"]["initContainers"]
    assert [s["name"] for s in steps] == ["agent", "protect"]
    copy = steps[0]
    assert copy["command"] == ["/bin/cp", AGENT_PATH, f"{AGENT_MOUNT}/agent.py"]
    assert copy["securityContext"] == pod["spec"]["containers"][0]["securityContext"]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "agent")
    assert mount == {"name": "agent", "mountPath": AGENT_MOUNT, "readOnly": True}
    assert agent_path("sandbox-exec:latest", config.runtime.kubernetes) == f"{AGENT_MOUNT}/agent.py"
    assert agent_path("other:1", config.runtime.kubernetes) == AGENT_PATH
    assert _agent_steps(pod_objects(k8s_config(tmp_path), "coder")[-1]) == []  # not asked: not there


def test_images_without_agent_need_an_agent_image(tmp_path: Path) -> None:
    """A config naming images without the agent but no image to copy it from is a load error."""
    with pytest.raises(ConfigError, match="images_without_agent needs agent_image"):
        k8s_config(tmp_path, "    images_without_agent: [plain:1]")


@pytest.mark.parametrize(
    "change",
    [
        lambda step: step.update(image="evil:latest"),
        lambda step: step.update(command=["/bin/sh", "-c", "echo 'import os' > /opt/sandbox-agent/agent.py"]),
        lambda step: step["volumeMounts"].append({"name": "workspace", "mountPath": "/workspace"}),
    ],
)
def test_a_pod_whose_copy_step_is_not_ours_is_not_adopted(tmp_path: Path, change: Any) -> None:
    """An init step writes the agent the sandbox is driven by: a Pod planted under the name with
    another copy step is replaced, never handed the session's commands."""
    config = k8s_config(tmp_path, COPY)
    spec = spec_of(config, "scratch")
    expected = sandbox_pod(spec, config.runtime.kubernetes, "ns")
    live = sandbox_pod(spec, config.runtime.kubernetes, "ns")
    live["status"] = {"phase": "Running"}
    assert adoptable(live, spec, expected)
    change(_agent_steps(live)[0])
    assert not adoptable(live, spec, expected)


@pytest.fixture
def image_without_agent(docker_client: Any, images: None) -> Iterator[str]:
    """sandbox-exec without its agent (made here, removed after)."""
    tag = f"sbx-test-noagent:{RUN_ID.lower()}"
    dockerfile = f"FROM sandbox-exec:latest\nUSER 0\nRUN rm -rf {Path(AGENT_PATH).parent}\nUSER 1000:1000\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, labels={TEST_LABEL: RUN_ID})
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.mark.docker
@pytest.mark.anyio
async def test_a_session_runs_in_an_image_without_the_agent(
    tmp_path: Path, docker_client: Any, image_without_agent: str
) -> None:
    """The image has no agent (proven), the copy step gives it one read-only, and the session's
    commands and files go through it."""
    import docker.errors

    with pytest.raises(docker.errors.ContainerError):  # the image has no agent of its own
        docker_client.containers.run(image_without_agent, ["ls", AGENT_PATH], remove=True)
    sandbox = f'{{mode: all, scope: session, workspace_access: none, docker: {{image: "{image_without_agent}"}}}}'
    kubernetes = f"agent_image: sandbox-exec:latest, images_without_agent: [{image_without_agent}]"
    config = one_agent_config(tmp_path, f"{RUN_ID}c", sandbox, kubernetes)
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as cluster:
        cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
        async with Orchestrator(config, KubernetesBackend(config, api=cluster.api()), journal=False) as orch:
            session = orch.session(agent="main", key="agent:main:noagent")
            ran = await session.call("exec", {"command": f"echo ok; ls {AGENT_PATH} || echo no-own-agent"})
            assert ran.ok, ran.error
            assert "no-own-agent" in str(ran.output)
            wrote = await session.call("write", {"path": "a.txt", "content": "through the copied agent\n"})
            assert wrote.ok, wrote.error
            tamper = await session.call("exec", {"command": f"echo x > {AGENT_MOUNT}/agent.py || echo read-only"})
            assert "read-only" in str(tamper.output)
            await session.close()
