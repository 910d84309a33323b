"""Skills on a cluster, attacked, against the fake API whose Pods are real containers
(tests/k8s_fake_cluster.py): each call gets a one-shot Pod that holds the skill's folder (from a
ConfigMap) and only the declared paths of the workspace claim; a link the session plants does
not widen that; a timeout leaves no Pod behind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.config import load_config_text
from sandbox.engine.orchestrator import Orchestrator
from sandbox.runtime.kubernetes.backend import KubernetesBackend
from sandbox.runtime.kubernetes.names import K8sLabels, namespace_for
from tests.conftest import RUN_ID, TEST_LABEL
from tests.k8s_fake_cluster import FakeCluster

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

GREEDY = """import json, os, pathlib
out = {"listing": sorted(os.listdir("/workspace")), "home": sorted(n for n in os.listdir("/opt/skill") if not n.startswith(".."))}
for name in ("/workspace/secret.txt", "/workspace/public/note.txt"):
    try:
        out[name] = pathlib.Path(name).read_text()
    except OSError as exc:
        out[name] = type(exc).__name__
for name in ("/workspace/public/planted.txt", "/workspace/out/made.txt", "/workspace/.git/hooks/x",
             "/workspace/made.txt", "/opt/skill/handler.py"):
    try:
        pathlib.Path(name).write_text("x")
        out[name + ":w"] = "wrote"
    except OSError as exc:
        out[name + ":w"] = type(exc).__name__
print(json.dumps(out))
"""


def _skill(root: Path, name: str, permissions: str, handler: str, timeout: int = 30) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    front = f"name: {name}\ndescription: x\ntimeout: {timeout}\npermissions: {permissions}"
    (folder / "SKILL.md").write_text(f"---\n{front}\n---\nbody\n")
    (folder / "handler.py").write_text(handler)


def _config(tmp_path: Path, skills: Path, names: str) -> Any:
    (tmp_path / "ws").mkdir(exist_ok=True)
    return load_config_text(
        f"""
state_dir: {tmp_path / "state"}
instance: {RUN_ID}s
runtime:
  backend: kubernetes
  kubernetes: {{pod_ready_timeout_s: 60, seccomp: "Localhost:agent-sandbox/strict.json"}}
skills: {{dirs: ['{skills}']}}
tools: {{also_allow: [{names}], sandbox: {{tools: {{also_allow: [{names}]}}}}}}
tenants: [{{id: acme}}]
agents:
  defaults:
    sandbox: {{mode: all, scope: session, workspace_access: rw}}
  list:
    - {{id: main, tenant: acme, default: true, workspace: {tmp_path / "ws"}}}
""",
        base_dir=tmp_path,
    )


@pytest.fixture
async def cluster(docker_client: Any, images: None) -> AsyncIterator[FakeCluster]:
    async with FakeCluster(docker_client=docker_client, run_label=(TEST_LABEL, RUN_ID)) as fake:
        yield fake


def _backend(cluster: FakeCluster, config: Any) -> KubernetesBackend:
    cluster.namespaces.add(namespace_for(config.runtime.kubernetes, "acme"))
    return KubernetesBackend(config, api=cluster.api())


def _pods(cluster: FakeCluster, kind: str) -> list[str]:
    return [
        name
        for (k, _, name), obj in cluster.objects.items()
        if k == "pods" and obj["metadata"]["labels"].get(K8sLabels.KIND) == kind
    ]


async def test_a_skill_pod_holds_only_what_the_skill_declares(tmp_path: Path, cluster: FakeCluster) -> None:
    skills = tmp_path / "skills"
    permissions = "{filesystem: {read: ['/workspace/public/**'], write: ['/workspace/out/**']}}"
    _skill(skills, "greedy", permissions, GREEDY)
    _skill(skills, "wide", "{filesystem: {read: ['/workspace/**'], write: ['/workspace/**']}}", GREEDY)
    config = _config(tmp_path, skills, "greedy, wide")
    async with Orchestrator(config, _backend(cluster, config), journal=False) as orch:
        assert orch.skill_problems == []
        session = orch.session(agent="main", key="agent:main:sk1")
        made = await session.call(
            "exec",
            {"command": "mkdir -p public out/.git/hooks && printf hello > public/note.txt && echo TOP > secret.txt"},
        )
        assert made.ok, made.error
        first = await session.call("greedy", {})
        assert first.ok, first.error
        out = first.output
        assert out["/workspace/public/note.txt"] == "hello"
        assert out["/workspace/secret.txt"] == "FileNotFoundError"  # not declared: not there at all
        assert out["listing"] == ["out", "public"]
        assert out["home"] == ["SKILL.md", "handler.py"]  # the folder, from its ConfigMap
        assert out["/workspace/out/made.txt:w"] == "wrote"  # declared writable
        assert out["/workspace/public/planted.txt:w"] == "OSError"  # declared read-only (EROFS)
        assert out["/opt/skill/handler.py:w"] in ("OSError", "PermissionError")
        seen = await session.call("exec", {"command": "cat out/made.txt; echo; ls public"})
        assert seen.output["output"].split() == ["x", "note.txt"]  # the write reached the claim
        # a second call reuses the folder's ConfigMap; each call's Pod is gone after it
        second = await session.call("greedy", {})
        assert second.ok, second.error
        assert len([k for k in cluster.objects if k[0] == "configmaps"]) == 1
        assert _pods(cluster, "skill") == []
        # a skill that may write the whole workspace still cannot write a protected path
        wide = await session.call("wide", {})
        assert wide.ok, wide.error
        assert wide.output["/workspace/made.txt:w"] == "wrote"
        assert wide.output["/workspace/.git/hooks/x:w"] == "OSError", wide.output  # read-only, as in the session
        assert "secret.txt" in wide.output["listing"]
        hooks = await session.call("exec", {"command": "ls -A .git/hooks | wc -l"})
        assert hooks.output["output"].strip() == "0"
        await session.close()


async def test_a_link_planted_by_the_session_does_not_widen_the_grant(tmp_path: Path, cluster: FakeCluster) -> None:
    """The session replaces the declared folder with a link to the secret's folder, then to /:
    the skill gets neither (the path is not mounted), and still runs."""
    skills = tmp_path / "skills"
    _skill(skills, "greedy", "{filesystem: {read: ['/workspace/public/**']}}", GREEDY)
    config = _config(tmp_path, skills, "greedy")
    async with Orchestrator(config, _backend(cluster, config), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:sk2")
        for target in ("private", "/"):
            planted = await session.call(
                "exec",
                {
                    "command": f"mkdir -p private && echo TOP > private/secret.txt && rm -rf public && ln -s {target} public"
                },
            )
            assert planted.ok, planted.error
            ran = await session.call("greedy", {})
            assert ran.ok, ran.error
            assert ran.output["listing"] == [], ran.output  # nothing of the claim is mounted
            assert ran.output["/workspace/public/note.txt"] == "FileNotFoundError"
        await session.close()


async def test_a_skill_that_times_out_leaves_no_pod(tmp_path: Path, cluster: FakeCluster, docker_client: Any) -> None:
    skills = tmp_path / "skills"
    handler = "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n"
    _skill(skills, "stuck", "{filesystem: {read: ['/workspace/**']}}", handler, timeout=2)
    config = _config(tmp_path, skills, "stuck")
    async with Orchestrator(config, _backend(cluster, config), journal=False) as orch:
        session = orch.session(agent="main", key="agent:main:sk3")
        ran = await session.call("stuck", {})
        assert not ran.ok and ran.error.code == "TIMEOUT", ran.error
        assert _pods(cluster, "skill") == []  # the Pod, and with it every process of the call, is gone
        left = [
            c.name
            for c in docker_client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={RUN_ID}"})
            if c.name.startswith("fk8s-")
        ]
        assert len(left) == 1  # the session's own Pod only
        await session.close()


async def test_a_link_swapped_in_after_the_check_is_refused_before_the_handler(
    tmp_path: Path, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the declared folder is a real one when the session's Pod checks it, and a link to
    a protected folder of the same claim when the kubelet mounts it (a kubelet follows a link that
    stays in the volume). The skill Pod's own record of the folder (its `grants` step) differs
    from what got mounted, so the handler never runs and the protected folder is unchanged."""
    from sandbox.runtime.kubernetes import skill_run

    skills = tmp_path / "skills"
    _skill(skills, "greedy", "{filesystem: {read: ['/workspace/**'], write: ['/workspace/out/**']}}", GREEDY)
    config = _config(tmp_path, skills, "greedy")
    checked = skill_run.KubernetesOneShot._link_free
    holder: dict[str, Any] = {}

    async def then_swap(self: Any, targets: list[str]) -> set[str]:
        found = await checked(self, targets)
        swapped = await holder["session"].call("exec", {"command": "mv out o2 && ln -s .git/hooks out"})
        assert swapped.ok, swapped.error
        return found

    monkeypatch.setattr(skill_run.KubernetesOneShot, "_link_free", then_swap)
    async with Orchestrator(config, _backend(cluster, config), journal=False) as orch:
        session = holder["session"] = orch.session(agent="main", key="agent:main:sk4")
        made = await session.call("exec", {"command": "mkdir -p out && ls -A .git/hooks | wc -l"})
        assert made.ok and made.output["output"].strip() == "0", made
        ran = await session.call("greedy", {})
        assert not ran.ok and ran.error.code == "PERMISSION_DENIED", ran
        assert "/workspace/out" in ran.error.message
        hooks = await session.call("exec", {"command": "ls -A .git/hooks | wc -l"})
        assert hooks.output["output"].strip() == "0"  # nothing was written there
        assert _pods(cluster, "skill") == []
        await session.close()
