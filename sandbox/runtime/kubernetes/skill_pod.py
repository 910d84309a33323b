"""What a skill call gets on a cluster: its folder as a ConfigMap, and a Pod of its own.

The skill's folder is on the orchestrator's side (`skills.dirs`), never on a node, so it travels
as a ConfigMap named after its content (one per skill version and namespace, made once, shared
by every call; only the orchestrator can write it) and is mounted read-only at /opt/skill. The
Pod has the session's hardening (the same renderer as a sandbox Pod, so the same Pod Security
checks hold), scratch at /workspace, and each path the skill declares as a `subPath` mount of
the session's workspace claim, read-only unless the skill declares it writable and the session
has it writable; protected paths stay read-only inside a writable grant. The Pod ends by itself
(`activeDeadlineSeconds`) if the orchestrator dies mid-call.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import posixpath
import stat
from pathlib import Path
from typing import Any

from sandbox.config.binds import CONTAINER_WORKDIR
from sandbox.config.kubernetes import KubernetesSection
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes.names import MANAGED_BY, K8sAnnotations, K8sLabels, label_value
from sandbox.runtime.kubernetes.pod import ProxyRef, sandbox_pod, workspace_claim_name
from sandbox.runtime.skill_spec import SKILL_HOME, SkillCall, declared_dirs, skill_spec_for, under_protected
from sandbox.runtime.spec import SandboxSpec

MAX_FOLDER_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, names and encoding included
MAX_FILES = 256
FOLDER_LAYOUT = b"skill-folder/1: keys f000.. in path order, items map them back\0"
LIFETIME_GRACE_S = 60  # the Pod outlives the call's timeout and its start by this, then ends itself
SKILL_VOLUME = "skill"
CLAIM_VOLUME = "claim"

# run in the session's Pod, as its user: which declared paths exist below the workspace without a
# link on the way (the kubelet would mount what a link points at, inside the claim)
LINK_FREE_SCRIPT = """
import json, os, stat, sys
root, found = sys.argv[1], []
for target in sys.argv[2:]:
    rel, here, ok = os.path.relpath(target, root), root, True
    for part in [] if rel == "." else rel.split("/"):
        here = os.path.join(here, part)
        try:
            ok = not stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:
            ok = False
        if not ok:
            break
    if ok:
        found.append(target)
print(json.dumps(found))
"""


# the `grants` init step of a skill Pod (no code of the session or the skill runs in it): the
# device and inode of each declared path of the claim, walked without following a link, written
# where the sandbox container reads them (read-only) to check its mounts before the handler runs
# (skill_spec.VERIFY_SCRIPT). A path the session swaps for a link after this walk mounts another
# folder, which that check refuses; one it swapped before is recorded as none, refused too.
RECORD_SCRIPT = """
import json, os, stat, sys
root, out, found = sys.argv[1], sys.argv[2], {}
for rel in sys.argv[3:]:
    here, ident = root, None
    for part in rel.split("/"):
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except OSError:
            st = None
        if st is None or stat.S_ISLNK(st.st_mode):
            ident = None
            break
        ident = [st.st_dev, st.st_ino]
    found["/workspace/" + rel] = ident
with open(out, "w") as f:
    json.dump(found, f)
"""
GRANTS_VOLUME = "grants"
GRANTS_DIR = "/run/skill-grants"  # in the grants step (written) and the sandbox (read-only)
GRANTS_FILE = f"{GRANTS_DIR}/identities.json"
CLAIM_VIEW = "/claim"  # the claim's root, read-only, in the grants step only


@dataclasses.dataclass(frozen=True)
class Grant:
    """One declared path of the workspace the skill's Pod mounts."""

    target: str  # in the Pod, under /workspace
    read_only: bool

    @property
    def sub_path(self) -> str:
        """The path inside the claim ("" for the whole claim)."""
        rel = posixpath.relpath(self.target, CONTAINER_WORKDIR)
        return "" if rel == "." else rel


def folder_files(folder: Path) -> dict[str, bytes]:
    """Each regular file of a skill's folder by its path inside it.

    Raises:
        SandboxUnavailable: the folder holds a link or a special file (refused, not followed), or is
            larger than a ConfigMap can carry.
    """
    found: dict[str, bytes] = {}
    total = 0
    for here, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(here) / name
            rel = path.relative_to(folder).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise SandboxUnavailable(
                    f"skill folder {folder}: {rel} is not a regular file (a link or a special file); on "
                    "kubernetes a skill's folder travels as a ConfigMap of its regular files only",
                )
            found[rel] = path.read_bytes()
            total += len(found[rel]) + len(rel)
            if total > MAX_FOLDER_BYTES or len(found) > MAX_FILES:
                raise SandboxUnavailable(
                    f"skill folder {folder} is larger than a ConfigMap carries on kubernetes (at most "
                    f"{MAX_FOLDER_BYTES // 1024} KiB in {MAX_FILES} files); package big dependencies into the image",
                )
    return found


def folder_config_map(namespace: str, tenant: str, skill: str, files: dict[str, bytes]) -> dict[str, Any]:
    """The ConfigMap of a skill's folder, named after its content (a changed skill gets a new one)."""
    digest = hashlib.sha256(FOLDER_LAYOUT)  # another layout of keys is another ConfigMap
    for rel, data in sorted(files.items()):
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    name = f"skill-{label_value(skill).replace('_', '-').replace('.', '-')[:40]}-{digest.hexdigest()[:16]}"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name.lower(),
            "namespace": namespace,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], K8sLabels.TENANT: label_value(tenant)},
            "annotations": {K8sAnnotations.TENANT: tenant},
        },
        # keys are indexes (a path's "/" is not allowed in a key); the volume's items put them back
        "binaryData": {f"f{i:03d}": base64.b64encode(files[rel]).decode() for i, rel in enumerate(sorted(files))},
        "immutable": True,
    }


def folder_volume(config_map: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """The ConfigMap as a read-only volume with each file back at its path."""
    items = [{"key": f"f{i:03d}", "path": rel} for i, rel in enumerate(sorted(files))]
    return {
        "name": SKILL_VOLUME,
        # read-only, and what was executable stays runnable (a helper script the handler starts)
        "configMap": {"name": config_map["metadata"]["name"], "items": items, "defaultMode": 0o555},
    }


def grants(session: SandboxSpec, call: SkillCall) -> list[Grant]:
    """The declared paths the session's claim holds, each read-only unless the skill declares it
    writable and the session's workspace is writable (a skill never gets more than its session)."""
    if workspace_claim_name(session) is None:  # scratch on the session Pod's emptyDir: not shareable
        return []
    writable = session.workspace_access == "rw"
    return [
        Grant(target, read_only=not (w and writable) or under_protected(session, target))
        for target, w in sorted(declared_dirs(call.read, call.write).items())
        if target == CONTAINER_WORKDIR or target.startswith(CONTAINER_WORKDIR + "/")
    ]


def skill_pod(
    session: SandboxSpec,
    call: SkillCall,
    cfg: KubernetesSection,
    namespace: str,
    *,
    folder: dict[str, Any],
    granted: list[Grant],
    timeout_s: float,
    node: str | None = None,
    proxy: ProxyRef | None = None,
) -> dict[str, Any]:
    """The Pod of one skill call (see the module's doc). `folder`: its ConfigMap volume; `granted`:
    the declared paths that exist link-free; `node`: the session Pod's node, where a
    ReadWriteOnce claim can be mounted a second time."""
    spec = skill_spec_for(session, call.skill, (), network=call.network, call_id=call.call_id)
    spec = dataclasses.replace(spec, workspace_access="none", session_users=False, pool_member=False)
    pod = sandbox_pod(spec, cfg, namespace, proxy=proxy)
    lifetime = int(timeout_s) + int(cfg.pod_ready_timeout_s) + LIFETIME_GRACE_S
    pod_spec = pod["spec"]
    pod_spec["activeDeadlineSeconds"] = lifetime
    container = pod_spec["containers"][0]
    container["args"] = ["sleep", str(lifetime)]
    pod_spec["volumes"].append(folder)
    container["volumeMounts"].append({"name": SKILL_VOLUME, "mountPath": SKILL_HOME, "readOnly": True})
    claim = workspace_claim_name(session)
    if granted and claim is not None:
        read_only = all(g.read_only for g in granted)
        pod_spec["volumes"].append(
            {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
        )
        if any(g.target == CONTAINER_WORKDIR for g in granted):  # the claim's root takes scratch's place
            scratch = next(m for m in container["volumeMounts"] if m["mountPath"] == CONTAINER_WORKDIR)
            container["volumeMounts"].remove(scratch)
            pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != scratch["name"]]
        for g in granted:
            mount = {"name": CLAIM_VOLUME, "mountPath": g.target, "readOnly": g.read_only}
            if g.sub_path:
                mount["subPath"] = g.sub_path
            container["volumeMounts"].append(mount)
            if g.read_only:
                continue
            for p in session.protected:  # read-only inside a writable grant, as in the session
                inner = posixpath.join(CONTAINER_WORKDIR, p.rel)
                if inner.startswith(g.target.rstrip("/") + "/"):
                    container["volumeMounts"].append(
                        {"name": CLAIM_VOLUME, "mountPath": inner, "subPath": p.rel, "readOnly": p.read_only}
                    )
        if any(g.sub_path for g in granted):
            _record_step(pod_spec, container, [g.sub_path for g in granted if g.sub_path])
        if node is not None and session.scope != "shared":  # ReadWriteOnce: the session's node only
            pod_spec["nodeName"] = node
    pod["metadata"]["annotations"][K8sAnnotations.SKILL] = call.skill
    return pod


def _record_step(pod_spec: dict[str, Any], container: dict[str, Any], rels: list[str]) -> None:
    """The `grants` init step (RECORD_SCRIPT) and its volume, mounted read-only in `container`."""
    pod_spec["volumes"].append({"name": GRANTS_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    container["volumeMounts"].append({"name": GRANTS_VOLUME, "mountPath": GRANTS_DIR, "readOnly": True})
    step = {
        "name": "grants",
        "image": container["image"],
        "imagePullPolicy": container["imagePullPolicy"],
        "command": ["python3", "-I", "-S", "-c", RECORD_SCRIPT, CLAIM_VIEW, GRANTS_FILE, *rels],
        "workingDir": "/",
        "resources": dict(container["resources"]),
        "securityContext": dict(container["securityContext"]),
        "volumeMounts": [
            {"name": CLAIM_VOLUME, "mountPath": CLAIM_VIEW, "readOnly": True},
            {"name": GRANTS_VOLUME, "mountPath": GRANTS_DIR},
        ],
    }
    pod_spec.setdefault("initContainers", []).append(step)
