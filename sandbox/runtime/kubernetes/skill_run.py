"""A skill call's one-shot Pod (the `Sandbox.one_shot` capability on a cluster): its folder's
ConfigMap made once, the declared paths checked in the session's Pod, the Pod made for the call
(kubernetes/skill_pod.py), the handler run through the Pod's resident agent (no shell), and the
Pod deleted whatever happens, so a timeout ends everything the handler started.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from sandbox._log import logger
from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes import skill_pod
from sandbox.runtime.kubernetes.names import namespace_for
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult
from sandbox.runtime.skill_spec import MAX_OUTPUT, SkillCall, verified, verify_argv
from sandbox.runtime.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.runtime.kubernetes.backend import KubernetesBackend
    from sandbox.runtime.kubernetes.sandbox import KubernetesSandbox

CHECK_TIMEOUT_S = 15.0


class KubernetesOneShot:
    """One-shot Pods beside a session's Pod, in its namespace."""

    def __init__(self, backend: KubernetesBackend, session: KubernetesSandbox) -> None:
        self._backend = backend
        self._session = session

    async def _link_free(self, targets: list[str]) -> set[str]:
        """The declared paths that exist in the session's workspace with no link on the way."""
        if not targets:
            return set()
        argv = ["python3", "-I", "-S", "-c", skill_pod.LINK_FREE_SCRIPT, CONTAINER_WORKDIR, *targets]
        result = await self._session.run_argv(argv, timeout_s=CHECK_TIMEOUT_S)
        if result.exit_code != 0:
            raise SandboxUnavailable(
                f"cannot check the skill's declared paths in the sandbox Pod {self._session.id}: "
                f"{result.stderr.decode(errors='replace')[-300:]}"
            )
        return set(json.loads(result.stdout))

    async def run(
        self, session: SandboxSpec, call: SkillCall, argv: Sequence[str], env: Mapping[str, str], timeout_s: float
    ) -> ExecResult:
        """The call's Pod, `argv` run in it through its agent, the Pod deleted after."""
        from sandbox.runtime.kubernetes.sandbox import KubernetesSandbox

        backend, cfg = self._backend, self._backend.cfg
        api = await backend.api()
        namespace = namespace_for(cfg, session.tenant)
        files = await anyio.to_thread.run_sync(skill_pod.folder_files, call.folder)
        config_map = skill_pod.folder_config_map(namespace, session.tenant, call.skill, files)
        await api.create("configmaps", namespace, config_map, exists_ok=True)  # content-named: made once
        wanted = skill_pod.grants(session, call)
        present = await self._link_free([g.target for g in wanted])
        granted = [g for g in wanted if g.target in present]
        node = None
        if granted:
            found = await backend.found_pod(namespace, session.name)
            node = ((found or {}).get("spec") or {}).get("nodeName")
        proxy = await backend.proxies.proxy(namespace, session) if call.network and session.egress else None
        pod = skill_pod.skill_pod(
            session,
            call,
            cfg,
            namespace,
            folder=skill_pod.folder_volume(config_map, files),
            granted=granted,
            timeout_s=timeout_s,
            node=node,
            proxy=proxy,
        )
        name = pod["metadata"]["name"]
        spec_of_pod = _spec_of(session, call, name)
        backend.placed(name, namespace)
        try:
            await api.create("pods", namespace, pod)
            await backend.wait_running(namespace, name)
            link = await KubernetesSandbox(backend, name, spec_of_pod).agent_link()
            if any(g.sub_path for g in granted):  # before the handler: each mount is the folder recorded
                check = await link.run(verify_argv(file=skill_pod.GRANTS_FILE), timeout_s=CHECK_TIMEOUT_S)
                verified(check)
            return await link.run(
                list(argv),
                environment=dict(env),
                workdir=CONTAINER_WORKDIR,
                timeout_s=timeout_s,
                capture=OutputCapture(max_bytes=MAX_OUTPUT),
            )
        finally:
            with anyio.CancelScope(shield=True):
                backend.agents.forget(name)
                try:  # gone, not only deleted: nothing of the call outlives it
                    await backend.delete_and_wait(namespace, name)
                except Exception as exc:  # its activeDeadlineSeconds still ends it
                    logger.bind(pod=name, namespace=namespace).warning("k8s_skill_pod_not_deleted", error=str(exc))
                backend.placed(name, None)


def _spec_of(session: SandboxSpec, call: SkillCall, name: str) -> SandboxSpec:
    """The spec the skill Pod's agent link is opened with (its image and user are the session's)."""
    return dataclasses.replace(session, name=name, kind="skill", pool_member=False, session_users=False)
