"""An egress sandbox's way to its namespace's proxy on a cluster, as the backend needs it: the
proxy Service's address, the proxy's Secret (its policy with the secrets' values) and its CA.

The proxy itself (Deployment, Service, NetworkPolicies) is the operator's to apply
(`sandbox k8s render`, tenant.py); the backend only writes what holds values read where the
orchestrator runs (proxy_secret.py) and the CA every replica must agree on (proxy_ca.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable
from sandbox.runtime.kubernetes import api as k8s_api
from sandbox.runtime.kubernetes.names import policy_hash
from sandbox.runtime.kubernetes.pod import ProxyRef
from sandbox.runtime.kubernetes.proxy_ca import ca_secret, ca_secret_name, certificate_of, decrypts, new_ca
from sandbox.runtime.kubernetes.proxy_secret import proxy_secret, secret_name
from sandbox.runtime.spec import SandboxSpec


class ProxyEdges:
    """The proxies' parts the backend writes and reads, once per proxy and process.

    Args:
        api: the backend's API connection (made on first use).
    """

    def __init__(self, api: Callable[[], Awaitable[k8s_api.Api]]) -> None:
        self._api = api
        self._secrets_written: set[tuple[str, str]] = set()  # (namespace, policy hash)
        self._cas: dict[tuple[str, str], str] = {}  # (namespace, policy hash) -> its CA certificate

    async def proxy(self, namespace: str, spec: SandboxSpec) -> ProxyRef:
        """The namespace's proxy of `spec`'s egress policy: its Service's address, and its CA when
        it decrypts for secrets."""
        assert spec.egress is not None
        ca = await self.ca(namespace, spec.tenant, spec.egress) if decrypts(spec.egress) else ""
        return ProxyRef(await self.address(namespace, spec.tenant, spec.egress), ca)

    async def write_secret(self, namespace: str, tenant: str, policy: dict[str, Any]) -> None:
        """The Secret of the namespace's proxy for `policy` (its values read now), written once per
        proxy by this process: created, or patched whole when it exists; never read."""
        digest = policy_hash(policy)
        if (namespace, digest) in self._secrets_written:
            return
        secret = proxy_secret(tenant, namespace, digest, policy)
        api = await self._api()
        if not await api.create("secrets", namespace, secret, exists_ok=True):
            await api.patch("secrets", namespace, secret_name(digest), {"stringData": secret["stringData"]})
        self._secrets_written.add((namespace, digest))
        logger.bind(secret=secret_name(digest), namespace=namespace).info("k8s_proxy_secret_written")

    async def ca(self, namespace: str, tenant: str, policy: dict[str, Any]) -> str:
        """The CA certificate of the namespace's proxy for `policy`: read from its Secret when it
        exists (another replica or an earlier run made it), else made and created here; when two
        create at once, the loser reads the winner's. Kept per process: a CA never changes under
        a running proxy (rotation is deleting the Secret and restarting the proxy).

        Raises:
            SandboxUnavailable: the Secret holds no CA certificate (nothing is trusted blindly).
        """
        digest = policy_hash(policy)
        if (cached := self._cas.get((namespace, digest))) is not None:
            return cached
        api = await self._api()
        name = ca_secret_name(digest)
        found = await api.get("secrets", namespace, name)
        if found is None:
            key_and_cert, cert = await anyio.to_thread.run_sync(new_ca, namespace, digest)
            if await api.create(
                "secrets", namespace, ca_secret(tenant, namespace, digest, key_and_cert, cert), exists_ok=True
            ):
                logger.bind(secret=name, namespace=namespace).info("k8s_proxy_ca_created")
            else:  # another replica made it first: theirs is the one
                found = await api.get("secrets", namespace, name)
                if found is None:
                    raise SandboxUnavailable(
                        f"the egress proxy's CA Secret {namespace}/{name} vanished while it was read"
                    )
        if found is not None:
            cert = certificate_of(found, f"{namespace}/{name}")
        self._cas[(namespace, digest)] = cert
        return cert

    async def address(self, namespace: str, tenant: str, policy: dict[str, Any]) -> str:
        """The ClusterIP of the namespace's proxy Service for `policy`.

        Raises:
            SandboxUnavailable: there is none (the tenant's objects were not applied).
        """
        name = secret_name(policy_hash(policy))
        service = await (await self._api()).get("services", namespace, name)
        address = ((service or {}).get("spec") or {}).get("clusterIP")
        if not address or address == "None":
            raise SandboxUnavailable(
                f"the egress proxy Service {namespace}/{name} is missing: apply what "
                f"`sandbox k8s render --tenant {tenant}` prints"
            )
        return str(address)
