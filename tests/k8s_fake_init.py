"""The fake kubelet's volumes and init containers (tests/k8s_fake_cluster.py).

An emptyDir an init container mounts is a folder of this host (0777, as a kubelet makes it); a
claim is a folder of this host too, one per claim and namespace, shared by every Pod that
mounts it (setgid and group-writable, as fsGroup makes a volume). Each is bound into every
container that mounts it, read-only where the mount says so. A subPath mount of a claim binds
that path of its folder, made when missing and refused when a link is on the way (as the
kubelet's safe subpath handling does). A configMap volume is a folder of its items, read-only.
Init containers on those folders run, in order, before the Pod's container, as the Pod's user,
restricted like it."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


class VolumeError(Exception):
    """A volume the kubelet cannot set up (the Pod does not start: CreateContainerConfigError)."""


def _config_map_folder(folder: Path, volume: dict[str, Any], config_map: dict[str, Any] | None) -> None:
    if config_map is None:
        raise VolumeError(f'configmap "{volume["configMap"]["name"]}" not found')
    data = {k: base64.b64decode(v) for k, v in (config_map.get("binaryData") or {}).items()}
    data |= {k: v.encode() for k, v in (config_map.get("data") or {}).items()}
    items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
    # as a kubelet writes it (atomic_writer.go): the files in a timestamped folder, `..data` a link
    # to it, and each top-level name a link through `..data`
    (folder / "..2026_01_01_00_00_00.0").mkdir()
    os.symlink("..2026_01_01_00_00_00.0", folder / "..data")
    for top in sorted({Path(item["path"]).parts[0] for item in items}):
        os.symlink(f"..data/{top}", folder / top)
    for item in items:
        path = folder / "..data" / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[item["key"]])
        os.chmod(path, volume["configMap"].get("defaultMode", 0o644))
    for here, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(Path(here) / name, 0o555)
    os.chmod(folder, 0o555)


def shared_dirs(
    pod: dict[str, Any], root: Path, config_map: Callable[[str], dict[str, Any] | None] = lambda _: None
) -> dict[str, Path]:
    """Volume name -> its host folder: the claims, configMap volumes (`config_map` finds the
    ConfigMap of a name) and the emptyDirs an init container mounts.

    Raises:
        VolumeError: a configMap volume's ConfigMap does not exist.
    """
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    names = {m["name"] for c in spec.get("initContainers") or [] for m in c.get("volumeMounts") or []}
    found = {}
    for name, volume in sorted(volumes.items()):
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            folder = root / "claims" / pod["metadata"]["namespace"] / claim
            mode = 0o2777
        elif "emptyDir" in volume and name in names:
            folder = root / f"{pod['metadata']['namespace']}-{pod['metadata']['name']}" / name
            mode = 0o777
        elif "configMap" in volume:
            folder = root / f"{pod['metadata']['namespace']}-{pod['metadata']['name']}" / name
            folder.mkdir(parents=True, exist_ok=True)
            _config_map_folder(folder, volume, config_map(volume["configMap"]["name"]))
            found[name] = folder
            continue
        else:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, mode)
        found[name] = folder
    return found


def _sub_path(folder: Path, sub_path: str) -> Path:
    """`sub_path` of a volume's folder as a kubelet resolves it (pkg/volume/util/subpath): made
    when missing, links followed, refused when what it resolves to is outside the volume."""
    if Path(sub_path).is_absolute() or ".." in Path(sub_path).parts:
        raise VolumeError(f"subPath {sub_path!r} must be a relative path inside its volume")
    here = folder / sub_path
    if not here.exists() and not here.is_symlink():
        here.mkdir(parents=True)
        os.chmod(here, 0o2777)
    resolved = here.resolve()
    if resolved != folder.resolve() and folder.resolve() not in resolved.parents:
        raise VolumeError(f"subpath {str(resolved)!r} not within volume path {str(folder)!r}")
    return resolved


def binds(container: dict[str, Any], dirs: dict[str, Path]) -> dict[str, dict[str, str]]:
    """The container's mounts of those folders, as docker-py's `volumes`.

    Raises:
        VolumeError: a subPath with a link on the way, or leaving its volume.
    """
    found = {}
    for m in container.get("volumeMounts") or []:
        if m["name"] not in dirs:
            continue
        source = _sub_path(dirs[m["name"]], m["subPath"]) if m.get("subPath") else dirs[m["name"]]
        found[str(source)] = {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
    return found


def run_init(
    docker_client: Any, pod: dict[str, Any], dirs: dict[str, Path], run_label: tuple[str, str]
) -> dict[str, Any] | None:
    """Run the init containers that use only those folders; the status of the one that failed
    (None: all passed)."""
    security = pod["spec"].get("securityContext") or {}
    for init in pod["spec"].get("initContainers") or []:
        if any(m["name"] not in dirs for m in init.get("volumeMounts") or []):
            continue
        box = docker_client.containers.create(
            init["image"],
            entrypoint=init.get("command"),
            command=init.get("args"),
            user=f"{security.get('runAsUser', 1000)}:{security.get('runAsGroup', 1000)}",
            working_dir=init.get("workingDir"),
            environment={e["name"]: e["value"] for e in init.get("env") or []},
            read_only=bool((init.get("securityContext") or {}).get("readOnlyRootFilesystem")),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            network_mode="none",
            volumes=binds(init, dirs),
            labels={run_label[0]: run_label[1]},
        )
        try:
            box.start()
            code = box.wait(timeout=60)["StatusCode"]
            if code != 0:
                # as a kubelet reports it, with terminationMessagePolicy FallbackToLogsOnError
                message = box.logs().decode(errors="replace")[-2048:] if init.get("terminationMessagePolicy") else ""
                return {
                    "name": init["name"],
                    "state": {"terminated": {"exitCode": code, "reason": "Error", "message": message}},
                }
        finally:
            box.remove(force=True)
    return None


def forget(pod_key: str, root: Path) -> None:
    """The Pod's folders go with it."""
    shutil.rmtree(root / pod_key, ignore_errors=True)
