"""The fake cluster's writes and watches (tests/k8s_fake_cluster.py): API errors as `Status`
objects, Secrets' `stringData`, merge patches with a `resourceVersion` precondition (409 on a
stale one), a gate that holds patches until several arrived (a race, made sure), and the watch
stream of what changed after a resourceVersion."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from tests.k8s_fake_cluster import FakeCluster


def string_data(obj: dict[str, Any]) -> dict[str, Any]:
    """`stringData` written into `data`, base64, as the API server does (it never returns it)."""
    if "stringData" in obj:
        written = {k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()}
        obj["data"] = {**(obj.get("data") or {}), **written}
    return obj


def status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
    return web.json_response(body, status=code)


async def watch(
    cluster: FakeCluster, request: web.Request, kind: str, namespace: str, matches: Any
) -> web.StreamResponse:
    """Events after `resourceVersion`, one JSON line each, until `timeoutSeconds`."""
    after = int(request.query.get("resourceVersion") or 0)
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(float(request.query.get("timeoutSeconds") or 30)):
            while True:
                waiter = cluster._changed
                for version, what, k, ns, obj in list(cluster.events):
                    if version > after and k == kind and ns == namespace and matches(obj):
                        await response.write(json.dumps({"type": what, "object": obj}).encode() + b"\n")
                    after = max(after, version)
                # woken by a change, or now and then to see whether the client left
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.wait(), 0.2)
                if request.transport is None or request.transport.is_closing() or cluster._closing:
                    break
    return response


async def held(cluster: FakeCluster) -> None:
    """With `hold_patches` N, the first N patches wait here until all N have arrived."""
    if cluster.hold_patches <= 0:
        return
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cluster._held.append(gate)
    if len(cluster._held) >= cluster.hold_patches:
        cluster.hold_patches = 0
        for waiting in cluster._held:
            if not waiting.done():
                waiting.set_result(None)
    await gate


def patched(cluster: FakeCluster, key: tuple[str, str, str], patch: dict[str, Any]) -> web.Response:
    """A merge patch of labels, annotations and a Secret's data; 409 when its resourceVersion is
    not the object's."""
    found = cluster.objects.get(key)
    if found is None:
        return status(404, "NotFound", f'{key[0]} "{key[2]}" not found')
    meta = patch.get("metadata") or {}
    if set(patch) - {"metadata", "stringData"} or set(meta) - {"labels", "annotations", "resourceVersion"}:
        return status(422, "Invalid", "the fake applies patches of labels, annotations and a Secret's data only")
    wanted = meta.get("resourceVersion")
    if wanted is not None and wanted != found["metadata"]["resourceVersion"]:
        message = (
            f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        return status(409, "Conflict", message)
    found["data"] = {**(found.get("data") or {}), **(string_data(patch).get("data") or {})}
    if not found["data"]:
        del found["data"]
    for part in ("labels", "annotations"):
        merged = {**(found["metadata"].get(part) or {}), **(meta.get(part) or {})}
        found["metadata"][part] = {k: v for k, v in merged.items() if v is not None}
    cluster.changed(key[0], key[1], found)
    return web.json_response(found)
