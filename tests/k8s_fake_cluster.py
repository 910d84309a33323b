"""A fake Kubernetes API whose Pods are real containers on the local Docker engine.

No API server can run here, so the Kubernetes backend is tested against this: the core/v1
routes the backend calls (Pods, claims, Services: create, read, list with equality label
selectors, delete, merge patch with a resourceVersion precondition, watch), the `pods/exec`
websocket of tests/k8s_exec_server.py with each command run in the Pod's container by
`docker exec -i`, and a kubelet that makes each Pod a container from
its spec (image, command, user, read-only root, dropped capabilities, no new privileges, no
network, memory and cpu limits, memory emptyDirs as tmpfs, env, working directory, claims and
configMap volumes as host folders, subPath mounts: tests/k8s_fake_init.py). What it does not
do, and a real cluster must prove (scripts/k8s-e2e): admission, NetworkPolicy, claims backed by
storage, scheduling (nodeName, affinity), activeDeadlineSeconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from tests import k8s_fake_agent_sandbox as fake_agent_sandbox
from tests import k8s_fake_changes as fake_changes
from tests import k8s_fake_init as fake_init
from tests import k8s_fake_portforward as fake_portforward
from tests.k8s_exec_server import ExecServer
from tests.k8s_fake_changes import status, string_data

KINDS = ("pods", "persistentvolumeclaims", "services", "secrets", "configmaps", *fake_agent_sandbox.KINDS)
VERBS = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}
_QUANTITY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def _waiting(reason: str, message: str) -> dict[str, Any]:
    """A container status that waits for `reason` (the kubelet cannot start it)."""
    return {"name": "sandbox", "ready": False, "state": {"waiting": {"reason": reason, "message": message}}}


def _bytes(quantity: str) -> int:
    for suffix, factor in _QUANTITY.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


@dataclass
class FakeCluster(ExecServer):
    """`async with FakeCluster(docker_client=..., run_label=...) as cluster: cluster.url`."""

    docker_client: Any = None
    run_label: tuple[str, str] = ("io.agent-sandbox.test-run", "fake-k8s")
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, ns, name)
    namespaces: set[str] = field(default_factory=set)  # those an operator prepared
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path), in order
    # what `sandbox doctor` asks: namespaces' labels (restricted at v1.33 unless set), what the
    # token may not do (verb, resource, subresource), the cluster's runtime and storage classes
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    runtime_classes: set[str] = field(default_factory=set)
    storage_classes: set[str] = field(default_factory=set)
    max_pods: int | None = None  # a ResourceQuota's `pods`, per namespace
    # every change as the watch streams it: (resourceVersion, type, kind, namespace, a copy)
    events: list[tuple[int, str, str, str, dict[str, Any]]] = field(default_factory=list)
    forbidden: set[tuple[str, str]] = field(default_factory=set)  # (verb, kind) the Role does not grant
    granted: set[tuple[str, str, str]] = field(default_factory=set)  # (verb, kind, name) it grants by name
    # the CNI: Pods join this Docker network when set (none by default: deny-all), and their
    # hostAliases go into their hosts file, as a kubelet writes them
    pod_network: str | None = None
    portforward_fault: str | None = None  # tests/k8s_fake_portforward.py
    hold_patches: int = 0  # the first N patches wait until N have arrived (a claim race, made sure)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _held: list[asyncio.Future[None]] = field(default_factory=list)
    _closing: bool = False
    _dirs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fk8s-")))  # emptyDirs of init steps

    def __post_init__(self) -> None:
        self.command_for = self._in_container

    def forward_command(self, namespace: str, pod: str, port: int) -> list[str]:
        """What relays a forwarded connection to `port` inside the Pod (its container's socat)."""
        return ["docker", "exec", "-i", self.container_name(namespace, pod), "socat", "-", f"TCP:127.0.0.1:{port}"]

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig of this fake (its address and the good token), for what connects by itself (the CLI)."""
        import yaml

        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "orchestrator", "user": {"token": self.token}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "orchestrator"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def api(self, token: str | None = None) -> Any:
        """An API connection to this fake (`runtime/kubernetes/api.py`), with the good token or `token`."""
        from kubernetes.aio import client

        from sandbox.runtime.kubernetes import api as k8s_api

        configuration = client.Configuration(
            host=self.url, api_key={"BearerToken": token or self.token}, api_key_prefix={"BearerToken": "Bearer"}
        )
        return k8s_api.from_configuration(configuration)

    def add_routes(self, app: web.Application) -> None:
        base = "/api/v1/namespaces/{ns}/{kind}"
        app.router.add_post(base, self._create)
        app.router.add_get(base, self._list)
        app.router.add_get(base + "/{name}", self._read)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/portforward", self._portforward)
        app.router.add_delete(base + "/{name}", self._delete)
        app.router.add_patch(base + "/{name}", self._patch)
        custom = "/apis/{group}/{version}/namespaces/{ns}/{kind}"
        app.router.add_post(custom, self._create)
        app.router.add_get(custom, self._list)
        app.router.add_get(custom + "/{name}", self._read)
        app.router.add_delete(custom + "/{name}", self._delete)
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)
        app.router.add_get("/api/v1/namespaces/{ns}", self._namespace)
        app.router.add_post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", self._access_review)
        app.router.add_get("/apis/node.k8s.io/v1/runtimeclasses/{name}", self._named(self.runtime_classes))
        app.router.add_get("/apis/storage.k8s.io/v1/storageclasses/{name}", self._named(self.storage_classes))

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"})

    async def _namespace(self, request: web.Request) -> web.Response:
        name = request.match_info["ns"]
        if name not in self.namespaces:
            return status(404, "NotFound", f'namespaces "{name}" not found')
        labels = self.namespace_labels.get(
            name,
            {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "v1.33"},
        )
        return web.json_response(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )

    async def _access_review(self, request: web.Request) -> web.Response:
        review = await request.json()
        asked = review["spec"]["resourceAttributes"]
        key = (asked.get("verb", ""), asked.get("resource", ""), asked.get("subresource", ""))
        allowed = request.headers.get("Authorization") == f"Bearer {self.token}" and key not in self.denied
        return web.json_response({**review, "status": {"allowed": allowed}}, status=201)

    def _named(self, names: set[str]) -> Any:
        async def read(request: web.Request) -> web.Response:
            name = request.match_info["name"]
            if name not in names:
                return status(404, "NotFound", f'"{name}" not found')
            return web.json_response({"metadata": {"name": name}})

        return read

    # -- objects ---------------------------------------------------------------------------

    def changed(self, kind: str, namespace: str, obj: dict[str, Any], what: str = "MODIFIED") -> None:
        """A new resourceVersion for `obj`, and an event for the watches (as the API server does on
        every write, a kubelet's status update included)."""
        version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(version)
        self.events.append((version, what, kind, namespace, copy.deepcopy(obj)))
        self._changed.set()
        self._changed = asyncio.Event()

    def writes(self) -> int:
        """How many writes (create, patch, delete) the API was asked for so far."""
        return sum(1 for method, _ in self.requests if method in ("POST", "PATCH", "PUT", "DELETE"))

    def container_name(self, namespace: str, pod: str) -> str:
        digest = hashlib.sha256(f"{namespace}/{pod}".encode()).hexdigest()[:16]
        return f"fk8s-{self.run_label[1]}-{digest}"

    def _in_container(self, pod: str, argv: list[str]) -> list[str]:
        namespace = next((ns for (kind, ns, name) in self.objects if kind == "pods" and name == pod), "")
        return ["docker", "exec", "-i", self.container_name(namespace, pod), *argv]

    def _check(self, request: web.Request) -> web.Response | None:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(403, "Forbidden", "the fake cluster knows no such token")
        if request.match_info["kind"] not in KINDS:
            return status(404, "NotFound", f"no resource {request.match_info['kind']}")
        named = "name" in request.match_info
        verb = VERBS.get(request.method) or ("get" if named else "watch" if "watch" in request.query else "list")
        by_name = (verb, request.match_info["kind"], request.match_info.get("name", ""))
        if (verb, request.match_info["kind"]) in self.forbidden and by_name not in self.granted:
            return status(403, "Forbidden", f"cannot {verb} resource {request.match_info['kind']}")
        if request.match_info["ns"] not in self.namespaces:
            return status(404, "NotFound", f'namespaces "{request.match_info["ns"]}" not found')
        return None

    async def _create(self, request: web.Request) -> web.Response:
        if (refused := self._check(request)) is not None:
            return refused
        kind, namespace = request.match_info["kind"], request.match_info["ns"]
        obj = await request.json()
        name = obj["metadata"]["name"]
        if (kind, namespace, name) in self.objects:
            return status(409, "AlreadyExists", f'{kind} "{name}" already exists')
        if kind == "pods" and self.max_pods is not None:
            used = sum(1 for (k, ns, _) in self.objects if k == "pods" and ns == namespace)
            if used >= self.max_pods:
                message = f'pods "{name}" is forbidden: exceeded quota: sbx-quota, requested: pods=1, used: pods={used}'
                return status(403, "Forbidden", message)
        obj = await self.add(kind, namespace, obj)
        if kind == "sandboxclaims":  # the agent-sandbox controller's part
            await fake_agent_sandbox.claimed(self, namespace, obj)
        return web.json_response(obj, status=201)

    async def add(self, kind: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object as the API server does (a Pod is started by the kubelet)."""
        obj = string_data(copy.deepcopy(obj))
        obj["metadata"]["namespace"] = namespace
        obj["metadata"]["creationTimestamp"] = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        self.objects[(kind, namespace, obj["metadata"]["name"])] = obj
        if kind == "pods":
            obj["status"] = {"phase": "Pending"}
        self.changed(kind, namespace, obj, "ADDED")
        if kind == "pods":
            await asyncio.to_thread(self._kubelet_start, namespace, obj)
            self.changed(kind, namespace, obj)
        return obj

    async def _read(self, request: web.Request) -> web.Response:
        if (refused := self._check(request)) is not None:
            return refused
        key = (request.match_info["kind"], request.match_info["ns"], request.match_info["name"])
        found = self.objects.get(key)
        if found is None:
            return status(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        return web.json_response(found)

    async def _log(self, request: web.Request) -> web.Response:
        """A Pod's log: its container's stdout (the kubelet's part), from `sinceSeconds` ago (whole
        seconds, as the kubelet counts them), the first `limitBytes` of it (the oldest)."""
        import docker.errors

        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return status(403, "Forbidden", "the fake cluster knows no such token")
        if ("get", "pods/log") in self.forbidden:
            return status(403, "Forbidden", "cannot get resource pods/log")
        namespace, name = request.match_info["ns"], request.match_info["name"]
        if ("pods", namespace, name) not in self.objects or self.docker_client is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        try:
            container = self.docker_client.containers.get(self.container_name(namespace, name))
            since = request.query.get("sinceSeconds")
            since_at = int(time.time()) - int(since) if since and since.isdigit() else None
            raw = await asyncio.to_thread(container.logs, stdout=True, stderr=False, since=since_at)
        except docker.errors.NotFound:
            return status(404, "NotFound", f'pods "{name}" has no container')
        limit = request.query.get("limitBytes")
        if limit and limit.isdigit():
            raw = raw[: int(limit)]
        return web.Response(body=raw, content_type="text/plain")

    async def _portforward(self, request: web.Request) -> web.StreamResponse:
        return await fake_portforward.portforward(self, request)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._check(request)) is not None:
            return refused
        kind, namespace = request.match_info["kind"], request.match_info["ns"]
        wanted = [tuple(term.split("=", 1)) for term in request.query.get("labelSelector", "").split(",") if term]

        def matches(obj: dict[str, Any]) -> bool:
            return all((obj["metadata"].get("labels") or {}).get(key) == value for key, value in wanted)

        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, kind, namespace, matches)
        items = [
            obj for (k, ns, _), obj in sorted(self.objects.items()) if k == kind and ns == namespace and matches(obj)
        ]
        version = str(self.events[-1][0] if self.events else 0)
        return web.json_response(
            {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}
        )

    async def _watch(self, request: web.Request, kind: str, namespace: str, matches: Any) -> web.StreamResponse:
        return await fake_changes.watch(self, request, kind, namespace, matches)

    async def _patch(self, request: web.Request) -> web.Response:
        if (refused := self._check(request)) is not None:
            return refused
        patch = await request.json()
        await fake_changes.held(self)
        key = (request.match_info["kind"], request.match_info["ns"], request.match_info["name"])
        return fake_changes.patched(self, key, patch)

    async def _delete(self, request: web.Request) -> web.Response:
        if (refused := self._check(request)) is not None:
            return refused
        key = (request.match_info["kind"], request.match_info["ns"], request.match_info["name"])
        found = self.objects.pop(key, None)
        if found is None:
            return status(404, "NotFound", f'{key[0]} "{key[2]}" not found')
        self.changed(key[0], key[1], found, "DELETED")
        if key[0] == "sandboxclaims":
            await fake_agent_sandbox.released(self, key[1], found)
        if key[0] == "pods":
            await asyncio.to_thread(self._kubelet_stop, key[1], key[2])
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    # -- the kubelet -----------------------------------------------------------------------

    def _kubelet_start(self, namespace: str, pod: dict[str, Any]) -> None:
        import docker.errors

        if self.docker_client is None:  # a cluster of objects only: the Pod says it runs, nothing does
            pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "sandbox", "ready": True}]}
            return

        spec = pod["spec"]
        container = spec["containers"][0]
        security = spec.get("securityContext") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        volumes = {v["name"]: v for v in spec.get("volumes") or []}

        def config_map(name: str) -> dict[str, Any] | None:
            return self.objects.get(("configmaps", namespace, name))

        try:
            dirs = fake_init.shared_dirs(pod, self._dirs, config_map)
            bound = fake_init.binds(container, dirs)
        except fake_init.VolumeError as exc:  # the kubelet cannot set the volumes up: the container waits
            pod["status"] = {
                "phase": "Pending",
                "containerStatuses": [_waiting("CreateContainerConfigError", str(exc))],
            }
            return
        failed = fake_init.run_init(self.docker_client, pod, dirs, self.run_label)
        if failed is not None:  # restartPolicy Never: the Pod fails
            pod["status"] = {"phase": "Failed", "initContainerStatuses": [failed]}
            return
        tmpfs: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume and "subPath" not in mount and mount["name"] not in dirs:
                size = _bytes(volume["emptyDir"].get("sizeLimit", "64Mi"))
                tmpfs[mount["mountPath"]] = f"rw,nosuid,nodev,size={size},mode=1777"
        try:
            made = self.docker_client.containers.create(
                container["image"],
                command=container.get("args"),  # args: the image's entrypoint stays, as on a kubelet
                name=self.container_name(namespace, pod["metadata"]["name"]),
                hostname=spec.get("hostname"),
                user=f"{security.get('runAsUser', 1000)}:{security.get('runAsGroup', 1000)}",
                working_dir=container.get("workingDir"),
                environment={e["name"]: e["value"] for e in container.get("env") or []},
                read_only=bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem")),
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                network_mode=self.pod_network or "none",
                extra_hosts={h: a["ip"] for a in spec.get("hostAliases") or [] for h in a["hostnames"]} or None,
                tmpfs=tmpfs,
                volumes=bound,
                mem_limit=_bytes(limits.get("memory", "1Gi")),
                nano_cpus=int(float(str(limits.get("cpu", "1000m")).rstrip("m")) * 1_000_000),
                pids_limit=256,
                labels={self.run_label[0]: self.run_label[1]},
                detach=True,
            )
            made.start()
            # an emptyDir is world-writable (0777) on a kubelet; Docker's tmpfs takes the image
            # folder's mode, so the fake kubelet sets it, as the volume setup would
            for path in tmpfs:
                made.exec_run(["chmod", "1777", path], user="0")
        except docker.errors.DockerException as exc:
            reason = "ErrImageNeverPull" if isinstance(exc, docker.errors.ImageNotFound) else "CreateContainerError"
            pod["status"] = {"phase": "Pending", "containerStatuses": [_waiting(reason, str(exc)[:200])]}
            return
        pod["status"] = {
            "phase": "Running",
            "containerStatuses": [{"name": "sandbox", "ready": True, "state": {"running": {}}}],
            "startTime": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        if self.pod_network:  # the CNI's address of the Pod
            made.reload()
            pod["status"]["podIP"] = made.attrs["NetworkSettings"]["Networks"][self.pod_network]["IPAddress"]

    async def stop_pod(self, namespace: str, name: str) -> None:
        """The kubelet's part of a Pod deleted (its container goes)."""
        await asyncio.to_thread(self._kubelet_stop, namespace, name)

    def _kubelet_stop(self, namespace: str, name: str) -> None:
        import docker.errors

        if self.docker_client is None:  # a cluster of objects only (its Pods were planted)
            return

        with contextlib.suppress(docker.errors.NotFound):
            self.docker_client.containers.get(self.container_name(namespace, name)).remove(force=True)
        fake_init.forget(f"{namespace}-{name}", self._dirs)

    def kill_container(self, namespace: str, name: str) -> None:
        """What a node does to a Pod it evicts: the container dies; the object says Failed."""
        self._kubelet_stop(namespace, name)
        pod = self.objects.get(("pods", namespace, name))
        if pod is not None:
            pod["status"] = {"phase": "Failed", "reason": "Evicted", "message": "the node evicted it"}
            self.changed("pods", namespace, pod)

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        shutil.rmtree(self._dirs, ignore_errors=True)
        for kind, namespace, name in list(self.objects):
            if kind == "pods":
                await asyncio.to_thread(self._kubelet_stop, namespace, name)
        await super().__aexit__(*exc)
