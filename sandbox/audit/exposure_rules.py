"""Container rules about what a sandbox can reach or read without breaking out: a network with
egress (and the host's gateway), and secrets in its environment (every session sees them)."""

from __future__ import annotations

from sandbox.audit.findings import Finding
from sandbox.audit.rule_helpers import Doc, host_config
from sandbox.journal.redact import redact

# set by run.py from `docker network inspect` (the config side cannot know it)
INTERNAL_KEY = "_internal_networks"


def network_egress(doc: Doc, t: str) -> list[Finding]:
    """SBX-C028: a sandbox on the default bridge, or on a network that is not internal."""
    mode = str(host_config(doc).get("NetworkMode") or "")
    if mode in ("", "none", "host") or mode.startswith("container:"):
        return []  # none is the goal; host and container: are SBX-C008 and SBX-C009
    if mode in ("bridge", "default"):
        evidence = (
            f"NetworkMode is {mode}: the sandbox reaches the internet, and the host itself through its gateway "
            "(every service listening on the docker bridge address)"
        )
    else:
        internal = doc.get(INTERNAL_KEY)
        if internal is not None and mode in internal:
            return []  # an internal network (the browser's, the egress proxy's) has no route out
        known = "" if internal is None else " (not an internal network)"
        evidence = f"NetworkMode is {mode}{known}: the sandbox reaches whatever that network routes to"
    return [
        Finding(
            "SBX-C028",
            "medium",
            "sandbox has network egress",
            evidence,
            "use docker.network: none (the default), or an internal network whose only way out is a proxy",
            t,
            "5.9",
        )
    ]


def env_secrets(doc: Doc, t: str) -> list[Finding]:
    """SBX-C029: environment variables that look like secrets (named like one, or shaped like a token)."""
    names = []
    for item in (doc.get("Config") or {}).get("Env") or []:
        name, _, value = str(item).partition("=")
        # the journal's redaction decides what is a secret; the value itself is never reported
        if value and redact(value, key=name, max_text=None) != value:
            names.append(name)
    if not names:
        return []
    return [
        Finding(
            "SBX-C029",
            "high",
            "secrets in the sandbox environment",
            f"{', '.join(sorted(names))} look like secrets; every session of this sandbox (and every process "
            "in it) can read them",
            "remove them from docker.env; give a tool its secret at the edge (a proxy), not in the sandbox",
            t,
        )
    ]
