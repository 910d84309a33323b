"""`sandbox doctor` with `runtime.backend: kubernetes`: can this orchestrator run sandboxes on the
cluster its config names? Each check says ok / warn / fail and the fix."""

from __future__ import annotations

from typing import Any

from sandbox.config.models import Config
from sandbox.errors import SandboxError
from sandbox.runtime.checks import Check
from sandbox.runtime.kubernetes.api import Api, connect
from sandbox.runtime.kubernetes.names import namespace_for

# what the backend does in a tenant's namespace, as (verb, resource, subresource)
NEEDED = (("create", "pods", ""), ("delete", "pods", ""), ("get", "pods", "exec"), ("create", "pods", "exec"))


async def run_checks(config: Config, api: Api | None = None) -> list[Check]:
    """Every check, in order; the API connection is made from `runtime.kubernetes` (and closed)
    unless given."""
    if api is not None:
        return await _checks(config, api)
    try:
        made = await connect(config.runtime.kubernetes)
    except SandboxError as exc:
        return [Check("fail", "api", exc.message, "point runtime.kubernetes at a reachable cluster")]
    try:
        return await _checks(config, made)
    finally:
        await made.close()


async def _checks(config: Config, api: Api) -> list[Check]:
    cfg = config.runtime.kubernetes
    try:
        status, version = await api.call("VersionApi", "reading the version", "get_code")
    except SandboxError as exc:
        return [Check("fail", "api", exc.message, "point runtime.kubernetes at a reachable cluster")]
    if status != 200:
        return [Check("fail", "api", f"the API answered {status} to /version", "check the credentials")]
    checks = [Check("ok", "api", f"{api.url}: Kubernetes {(version or {}).get('gitVersion', '?')}")]
    tenants = sorted({t.id for t in config.tenants} or {"default"})
    for tenant in tenants:
        namespace = namespace_for(cfg, tenant)
        checks.append(await _namespace(api, namespace, cfg.pss_version))
        checks.append(await _can_i(api, namespace))
    if cfg.runtime_class_name:
        checks.append(await _exists(api, "NodeV1Api", "read_runtime_class", cfg.runtime_class_name, "runtime class"))
    for key, klass in (("storage_class", cfg.storage_class), ("shared_storage_class", cfg.shared_storage_class)):
        if klass:
            checks.append(await _exists(api, "StorageV1Api", "read_storage_class", klass, key.replace("_", " ")))
    checks.append(
        Check(
            "warn",
            "pid limit",
            "Kubernetes has no PID limit per Pod (KEP-6063 is alpha): a fork bomb in a sandbox is bounded "
            "only by the node's podPidsLimit",
            "set the kubelet's podPidsLimit (e.g. 1024) on the nodes that run sandboxes",
        )
    )
    return checks


async def _namespace(api: Api, namespace: str, pss_version: str) -> Check:
    status, body = await api.call("CoreV1Api", f"reading namespace {namespace}", "read_namespace", namespace)
    fix = "apply what `sandbox k8s render` prints"
    if status == 404:
        return Check("fail", "namespace", f"{namespace} does not exist", fix)
    if status != 200:
        return Check("warn", "namespace", f"{namespace}: cannot be read ({status}); its labels are unchecked", fix)
    labels: dict[str, Any] = ((body or {}).get("metadata") or {}).get("labels") or {}
    enforce = labels.get("pod-security.kubernetes.io/enforce")
    version = labels.get("pod-security.kubernetes.io/enforce-version")
    if enforce != "restricted":
        return Check(
            "fail", "namespace", f"{namespace} enforces Pod Security {enforce or 'nothing'}, not restricted", fix
        )
    if version != pss_version:
        return Check(
            "warn", "namespace", f"{namespace} enforces restricted at {version}, the config pins {pss_version}", fix
        )
    return Check("ok", "namespace", f"{namespace}: Pod Security restricted enforced at {version}")


async def _can_i(api: Api, namespace: str) -> Check:
    # the official client (the k8s extra) loads with the first call: rendering needs none of it
    from kubernetes.aio import client

    refused = []
    for verb, resource, sub in NEEDED:
        attributes: dict[str, str] = {"namespace": namespace, "verb": verb, "resource": resource}
        if sub:
            attributes["subresource"] = sub
        review = client.V1SelfSubjectAccessReview.model_validate(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes},
            }
        )
        status, body = await api.call("AuthorizationV1Api", "asking can-i", "create_self_subject_access_review", review)
        if status >= 300 or not ((body or {}).get("status") or {}).get("allowed"):
            refused.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    if refused:
        return Check(
            "fail",
            "can-i",
            f"in {namespace} this identity may not: {', '.join(refused)}",
            "apply the Role and RoleBinding `sandbox k8s render` prints (its --orchestrator names this identity)",
        )
    return Check("ok", "can-i", f"in {namespace}: create and delete pods, get and create pods/exec")


async def _exists(api: Api, api_class: str, method: str, name: str, what: str) -> Check:
    status, _ = await api.call(api_class, f"reading {what} {name}", method, name)
    if status == 200:
        return Check("ok", what, f"{name} exists")
    return Check(
        "fail", what, f"{name} is not on this cluster ({status})", f"install it, or change runtime.kubernetes's {what}"
    )
