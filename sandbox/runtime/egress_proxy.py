"""What every engine knows of the egress proxy image (images/egress): its port, its addon and how
it is started. The proxy is the same on Docker (one per sandbox, runtime/docker/egress_make.py)
and on Kubernetes (one Deployment per policy in a tenant's namespace, runtime/kubernetes/tenant.py).
"""

from __future__ import annotations

from typing import Any

PROXY_PORT = 3128
ADDON = "/opt/egress/egress_addon.py"
PROXY_MEMORY = "512m"  # a busy proxy slows its own sandboxes, not its neighbours


def proxy_command(policy: dict[str, Any]) -> list[str]:
    """mitmdump with the addon; the body limit is mitmproxy's own (plain HTTP requests and responses)."""
    return [
        "mitmdump",
        "--quiet",
        "--listen-port",
        str(PROXY_PORT),
        "--set",
        "confdir=/tmp/mitmproxy",
        "--set",
        f"body_size_limit={policy['max_bytes']}",
        # a decrypted tunnel carries HTTP only: no raw TCP or websocket relay past the checks
        "--set",
        "rawtcp=false",
        "--set",
        "websocket=false",
        "-s",
        ADDON,
    ]
