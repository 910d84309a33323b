"""Rules over the engine itself: user namespaces, rootless, and runc versions with known escapes."""

from __future__ import annotations

import re
from typing import Any

from sandbox.audit.findings import Finding

# (fixed upstream version, CVE, what it allows). Debian backports fixes without changing the
# upstream version, so a Debian revision known to carry the fix is listed as fixed too.
# Version keys are (major, minor, patch, 0 for a release candidate else 1, rc number).
RUNC_CVES: tuple[tuple[tuple[int, ...], str, str, str], ...] = (
    ((1, 0, 0, 0, 7), "1.0.0-rc7", "CVE-2019-5736", "a container process can overwrite the host runc binary"),
    ((1, 0, 0, 0, 95), "1.0.0-rc95", "CVE-2021-30465", "a symlink-exchange race mounts a host path into a container"),
    ((1, 1, 12, 1, 0), "1.1.12", "CVE-2024-21626", "a leaked file descriptor gives a container the host filesystem"),
)
DEBIAN_FIXED = {"CVE-2024-21626": ("1.1.5+ds1-1+deb12u1",)}


def _version(text: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-rc\.?(\d+))?", text)
    if not match:
        return (0, 0, 0, 0, 0)
    major, minor, patch, rc = match.groups()
    return (int(major), int(minor), int(patch or 0), 0 if rc else 1, int(rc or 0))


def audit_engine(info: dict[str, Any]) -> list[Finding]:
    """Findings about the engine from `docker info`."""
    out: list[Finding] = []
    options = " ".join(info.get("SecurityOptions") or [])
    if "userns" not in options and "rootless" not in options:
        out.append(
            Finding(
                "SBX-E001",
                "info",
                "engine without user namespaces or rootless mode",
                f"SecurityOptions: {options or 'none'}",
                "consider userns-remap or rootless Docker: root in a container is then not root on the host",
                "engine",
                "2.8",
            )
        )
    runc = str((info.get("RuncCommit") or {}).get("ID") or "")
    version_text = str(info.get("_runc_version") or "")
    if version_text:
        version = _version(version_text)
        for fixed, fixed_text, cve, what in RUNC_CVES:
            if version < fixed and not {version_text, runc} & set(DEBIAN_FIXED.get(cve, ())):
                out.append(
                    Finding(
                        "SBX-E002",
                        "high",
                        f"runc has a known container escape ({cve})",
                        f"runc {version_text} (commit {runc or '?'}): {what}",
                        f"upgrade runc to {fixed_text} or later",
                        "engine",
                        "1.2",
                    )
                )
    return out
