"""The fake kubelet's volumes and init containers (tests/k8s_fake_cluster.py).

An emptyDir an init container mounts is a folder of this host (0777, as a kubelet makes it); a
claim is a folder of this host too, one per claim and namespace, shared by every Pod that
mounts it (setgid and group-writable, as fsGroup makes a volume). Each is bound into every
container that mounts it, read-only where the mount says so; subPath mounts are not made. Init
containers on those folders run, in order, before the Pod's container, as the Pod's user,
restricted like it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


def shared_dirs(pod: dict[str, Any], root: Path) -> dict[str, Path]:
    """Volume name -> its host folder, for the emptyDirs an init container mounts."""
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
        else:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, mode)
        found[name] = folder
    return found


def binds(container: dict[str, Any], dirs: dict[str, Path]) -> dict[str, dict[str, str]]:
    """The container's mounts of those folders, as docker-py's `volumes`."""
    return {
        str(dirs[m["name"]]): {"bind": m["mountPath"], "mode": "ro" if m.get("readOnly") else "rw"}
        for m in container.get("volumeMounts") or []
        if m["name"] in dirs and not m.get("subPath")
    }


def run_init(docker_client: Any, pod: dict[str, Any], dirs: dict[str, Path], run_label: tuple[str, str]) -> str | None:
    """Run the init containers that use only those folders; why one failed (None: all passed)."""
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
                return f"init container {init['name']} exited {code}: {box.logs().decode(errors='replace')[-300:]}"
        finally:
            box.remove(force=True)
    return None


def forget(pod_key: str, root: Path) -> None:
    """The Pod's folders go with it."""
    shutil.rmtree(root / pod_key, ignore_errors=True)
