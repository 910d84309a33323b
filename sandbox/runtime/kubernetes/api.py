"""The few API calls the backend makes, on the official client (`kubernetes.aio`), in wire form.

Objects go out as the dicts pod.py and tenant.py render, validated first by the client's own
models (unknown fields are an error here, and `fieldValidation=Strict` makes the API server
refuse them too), and come back as the server's JSON: what `sandbox k8s pod` prints is what is
sent. Errors become SandboxUnavailable with what the operator can do (403: the Role).
"""

from __future__ import annotations

import builtins
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sandbox.config.kubernetes import KubernetesSection
from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable

# kind -> (the client's model, its methods' stem on CoreV1Api)
_KINDS = {
    "pods": ("V1Pod", "pod"),
    "persistentvolumeclaims": ("V1PersistentVolumeClaim", "persistent_volume_claim"),
    "services": ("V1Service", "service"),
    "secrets": ("V1Secret", "secret"),  # written only (the proxy's, kubernetes/proxy_secret.py)
    "configmaps": ("V1ConfigMap", "config_map"),  # created only (skills' folders, kubernetes/skill_pod.py)
}


@dataclass
class Api:
    """One API server connection: the typed client, and what the exec websocket needs of it."""

    client: Any  # kubernetes.aio.client.ApiClient
    url: str
    ssl: ssl.SSLContext | bool

    async def headers(self) -> dict[str, str]:
        """The credentials' header for a request made now (a token that is refreshed, as an exec
        plugin's or a projected service account token is, is read again each time)."""
        configuration = self.client.configuration
        token = await configuration.get_api_key_with_prefix("BearerToken")
        if not token:
            return {}
        return {"Authorization": token if token.startswith("Bearer ") else f"Bearer {token}"}

    async def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any] | None]:
        """A core/v1 call; a refusal the caller cannot act on is SandboxUnavailable naming the fix."""
        status, body = await self.call("CoreV1Api", what, method, *args, **kwargs)
        message = str((body or {}).get("message", ""))
        if status == 403 and "exceeded quota" in message:
            raise SandboxError(
                ErrorCode.QUOTA_EXCEEDED,
                f"the namespace's ResourceQuota is used up ({what}): {message}",
            )
        if status == 403:
            raise SandboxUnavailable(
                f"the Kubernetes API refused {what} (403 Forbidden: {message}); the orchestrator's service "
                "account needs the Role `sandbox k8s render` prints in that namespace"
            )
        if status >= 500 or status in (400, 401, 422):
            raise SandboxUnavailable(f"the Kubernetes API refused {what} ({status}): {message}")
        return status, body

    async def call(
        self, api: str, what: str, method: str, *args: Any, **kwargs: Any
    ) -> tuple[int, dict[str, Any] | None]:
        """One call of the client's `api` class (`CoreV1Api`, `VersionApi`, ...): (status, the
        body when it is a JSON object). Only an unreachable server raises (SandboxUnavailable)."""
        # the official client (the k8s extra) loads with the first call: rendering needs none of it
        from kubernetes.aio import client

        fn = getattr(getattr(client, api)(self.client), f"{method}_without_preload_content")
        try:
            response = await fn(*args, **kwargs)
        except (OSError, TimeoutError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API at {self.url} cannot be reached ({what}): {exc}") from exc
        try:
            raw = await response.read()
        except (OSError, TimeoutError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API at {self.url} cut its answer ({what}): {exc}") from exc
        finally:
            response.release()  # the connection goes back to the pool, whatever happened
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return int(response.status), body if isinstance(body, dict) else None

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        stem = _KINDS[kind][1]
        what = f"reading {kind} {namespace}/{name}"
        status, body = await self._call(what, f"read_namespaced_{stem}", name, namespace)
        return None if status == 404 else body

    async def log(self, namespace: str, pod: str, container: str, *, since_s: int, limit_bytes: int) -> bytes:
        """A container's log of the last `since_s` seconds, at most `limit_bytes` (b"" when the
        Pod is gone). Only an unreachable server, or a refusal, raises (SandboxUnavailable)."""
        # the official client (the k8s extra) loads with the first call: rendering needs none of it
        from kubernetes.aio import client

        what = f"reading the log of pod {namespace}/{pod}"
        try:
            response = await client.CoreV1Api(self.client).read_namespaced_pod_log_without_preload_content(
                pod, namespace, container=container, since_seconds=max(since_s, 1), limit_bytes=limit_bytes
            )
            try:
                raw = await response.read()
            finally:
                response.release()
        except (OSError, TimeoutError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API at {self.url} cannot be reached ({what}): {exc}") from exc
        if response.status == 404:
            return b""
        if response.status >= 300:
            raise SandboxUnavailable(f"the Kubernetes API refused {what} ({response.status})")
        return bytes(raw)

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Objects of a kind matching a label selector."""
        return (await self.list_versioned(kind, namespace, label_selector))[0]

    async def list_versioned(
        self, kind: str, namespace: str, label_selector: str
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Objects of a kind matching a label selector, and the list's resourceVersion (where a
        watch of what changes after it starts)."""
        stem = _KINDS[kind][1]
        status, body = await self._call(
            f"listing {kind} in {namespace}", f"list_namespaced_{stem}", namespace, label_selector=label_selector
        )
        if status == 404:
            return [], ""
        version = str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")
        return list((body or {}).get("items") or []), version

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """A JSON merge patch (RFC 7386). With `metadata.resourceVersion` in it, the server applies
        it only to that version of the object (409 Conflict otherwise): False when the object
        changed (or went) since it was read, True when the patch is applied."""
        stem = _KINDS[kind][1]
        what = f"patching {kind} {namespace}/{name}"
        status, answer = await self._call(
            what, f"patch_namespaced_{stem}", name, namespace, patch, _content_type="application/merge-patch+json"
        )
        if status in (404, 409):
            return False
        if status >= 300:
            raise SandboxUnavailable(f"{what}: {status} {(answer or {}).get('message', '')}")
        return True

    async def watch(
        self, kind: str, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The changes to matching objects after `resource_version`, as (type, object), until the
        server ends the watch (after `timeout_s`) or it expires (410: the caller lists again)."""
        # the official client (the k8s extra) loads with the first call: rendering needs none of it
        from kubernetes.aio import client

        stem = _KINDS[kind][1]
        fn = getattr(client.CoreV1Api(self.client), f"list_namespaced_{stem}_without_preload_content")
        try:
            response = await fn(
                namespace,
                label_selector=label_selector,
                watch=True,
                resource_version=resource_version or None,
                timeout_seconds=timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API at {self.url} cannot be reached (watch): {exc}") from exc
        try:
            if response.status != 200:
                return
            async for line in response.content:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and isinstance(event.get("object"), dict):
                    yield str(event.get("type")), event["object"]
        except (OSError, TimeoutError) as exc:
            raise SandboxUnavailable(f"the Kubernetes API at {self.url} cut a watch: {exc}") from exc
        finally:
            response.release()

    async def create(self, kind: str, namespace: str, obj: dict[str, Any], *, exists_ok: bool = False) -> bool:
        """Create an object (its fields checked by the client's model and, strictly, by the server);
        False when one of its name exists already and `exists_ok`."""
        # the official client (the k8s extra) loads with the first call: rendering needs none of it
        from kubernetes.aio import client

        model_name, stem = _KINDS[kind]
        body = getattr(client, model_name).model_validate(obj)
        what = f"creating {kind} {namespace}/{obj['metadata']['name']}"
        status, answer = await self._call(what, f"create_namespaced_{stem}", namespace, body, field_validation="Strict")
        if status == 409 and exists_ok:
            return False
        if status == 404:
            raise SandboxUnavailable(
                f"{what}: the namespace {namespace} does not exist; apply what `sandbox k8s render` prints"
            )
        if status >= 300:
            raise SandboxUnavailable(f"{what}: {status} {(answer or {}).get('message', '')}")
        return True

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete an object with a one-second grace, never 0: 0 is a force delete that removes the
        Pod object before its kubelet confirmed its processes are dead. One already gone is not an
        error; a Pod is gone only when its object is (callers wait for that)."""
        stem = _KINDS[kind][1]
        await self._call(
            f"deleting {kind} {namespace}/{name}", f"delete_namespaced_{stem}", name, namespace, grace_period_seconds=1
        )

    async def custom(self, method: str, api_version: str, plural: str, namespace: str, *args: Any) -> tuple[int, Any]:
        """One call on a namespaced custom object (`method`: create, get, delete), e.g.
        kubernetes-sigs/agent-sandbox's: (status, body). A refusal the caller cannot act on is
        SandboxUnavailable, as for core objects."""
        group, version = api_version.split("/")
        what = f"{method} {plural} in {namespace}"
        extra = {"field_validation": "Strict"} if method == "create" else {}
        status, body = await self.call(
            "CustomObjectsApi",
            what,
            f"{method}_namespaced_custom_object",
            group,
            version,
            namespace,
            plural,
            *args,
            **extra,
        )
        if status == 403 or status >= 500 or status in (400, 401, 422):
            message = str((body or {}).get("message", ""))
            raise SandboxUnavailable(f"the Kubernetes API refused {what} ({status}): {message}")
        return status, body

    async def close(self) -> None:
        """Close the client's connections."""
        await self.client.close()


async def connect(cfg: KubernetesSection) -> Api:
    """An API connection from `runtime.kubernetes`: the Pod's service account (`in_cluster`), or
    a kubeconfig (`kubeconfig`, else $KUBECONFIG, else ~/.kube/config) and its `context`.

    Raises:
        SandboxUnavailable: the client is not installed, or no usable config was found.
    """
    try:
        # the official client (the k8s extra) loads with the first call: rendering needs none of it
        from kubernetes.aio import client, config
    except ImportError as exc:
        raise SandboxUnavailable(
            "runtime.backend kubernetes needs the official client: pip install 'agent-sandbox[k8s]'"
        ) from exc
    configuration = client.Configuration()
    try:
        if cfg.in_cluster:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(cfg.kubeconfig) if cfg.kubeconfig else None,
                context=cfg.context,
                client_configuration=configuration,
            )
    except Exception as exc:  # the loader raises ConfigException, FileNotFoundError, ...
        where = "the Pod's service account" if cfg.in_cluster else f"kubeconfig {cfg.kubeconfig or '(default)'}"
        raise SandboxUnavailable(f"runtime.kubernetes: {where} cannot be used: {exc}") from exc
    return from_configuration(configuration)


def from_configuration(configuration: Any) -> Api:
    """An Api over a client Configuration (tests make one for a local server)."""
    # the official client (the k8s extra) loads with the first call: rendering needs none of it
    from kubernetes.aio import client

    context: ssl.SSLContext | bool = True
    if str(configuration.host).startswith("https://"):
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert) if configuration.verify_ssl else False
        if isinstance(context, ssl.SSLContext) and configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return Api(client.ApiClient(configuration), str(configuration.host), context)
