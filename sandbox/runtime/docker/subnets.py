"""Small subnets for the networks this orchestrator makes (egress edges, browsers), from a pool.

Left to itself, Docker gives every new bridge network a /16 or /20 of its default pools: about
30 egress or browser sandboxes exhaust them for every user of the engine. Each network made here
takes a /29 instead (8 addresses: network, gateway, broadcast and five hosts; a sandbox and its
proxy need two) from `sandbox.egress.subnet_pool`, 10.213.0.0/16 unless configured (8,192 such
subnets, outside Docker's default pools 172.17.0.0/12 and 192.168.0.0/16).

Nothing is booked outside the engine: a subnet is in use while a network on the engine holds it
(whoever made it), so removing the network releases it and a crash leaks nothing. Two makers may
pick the same free subnet at once: the engine refuses the second ("overlaps"), which then tries
the next one.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import docker.errors
from docker.types import IPAMConfig, IPAMPool

from sandbox._log import logger
from sandbox.errors import SandboxUnavailable

DEFAULT_POOL = "10.213.0.0/16"
PREFIX = 29
LOW_FRACTION = 0.1  # a pool with less than this share free is reported (audit) and logged
MAX_TRIES = 8
_LOCK = threading.Lock()  # one allocation at a time in this process (others race at the engine)
T = TypeVar("T")


@dataclass(frozen=True)
class PoolUse:
    """How much of a pool is taken."""

    pool: str
    total: int  # /29 subnets in the pool
    used: int  # of them overlapped by a network on the engine

    @property
    def free(self) -> int:
        """Subnets still free."""
        return self.total - self.used

    @property
    def low(self) -> bool:
        """Whether less than LOW_FRACTION of the pool is free."""
        return self.free < max(1, int(self.total * LOW_FRACTION))


def engine_subnets(client: Any) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every subnet a network on the engine holds (any owner)."""
    subnets = []
    for network in client.api.networks():
        for config in (network.get("IPAM") or {}).get("Config") or []:
            try:
                subnets.append(ipaddress.ip_network(str(config.get("Subnet", "")), strict=False))
            except ValueError:
                continue
    return subnets


def _candidates(pool: ipaddress.IPv4Network | ipaddress.IPv6Network) -> Iterator[Any]:
    if pool.prefixlen > PREFIX:
        yield pool  # a pool smaller than one subnet is that one subnet
        return
    yield from pool.subnets(new_prefix=PREFIX)


def _free(pool_text: str, taken: list[Any]) -> Iterator[Any]:
    pool = ipaddress.ip_network(pool_text, strict=False)
    clash = [net for net in taken if net.version == pool.version and net.overlaps(pool)]
    for subnet in _candidates(pool):
        if not any(subnet.overlaps(net) for net in clash):
            yield subnet


def usage(client: Any, pool_text: str) -> PoolUse:
    """How much of `pool_text` the engine's networks take."""
    pool = ipaddress.ip_network(pool_text, strict=False)
    taken = [net for net in engine_subnets(client) if net.version == pool.version and net.overlaps(pool)]
    total = used = 0
    for subnet in _candidates(pool):
        total += 1
        used += any(subnet.overlaps(net) for net in taken)
    return PoolUse(str(pool), total, used)


def create_network(client: Any, pool_text: str, make: Callable[[Any], T]) -> T:
    """Call `make(ipam)` with the IPAM config of a free subnet of the pool; the next one when the
    engine says another maker took it meanwhile. Blocking.

    Raises:
        SandboxUnavailable: the pool is exhausted (the message says how to widen it).
    """
    refused: list[Any] = []  # overlap refusals: a network made meanwhile, or a route of the host's own
    with _LOCK:
        for _ in range(MAX_TRIES):
            subnet = next(_free(pool_text, engine_subnets(client) + refused), None)
            if subnet is None:
                raise SandboxUnavailable(
                    f"the address pool for sandbox networks {pool_text} is exhausted (every /{PREFIX} in it is "
                    "taken): remove idle sandboxes (`sandbox prune`) or widen sandbox.egress.subnet_pool",
                    pool=pool_text,
                )
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))])
            try:
                made = make(ipam)
            except docker.errors.APIError as exc:
                if "overlap" not in str(exc).lower():
                    raise
                # another process took it between the listing and the create, or the host routes
                # it (the engine checks routes too, which no network listing shows): the next one
                refused.append(subnet)
                continue
            use = usage(client, pool_text)
            if use.low:  # said before it runs out (audit reports it too: SBX-N005)
                logger.bind(pool=pool_text, free=use.free, total=use.total).warning("subnet_pool_low")
            return made
        raise SandboxUnavailable(f"no free subnet of {pool_text} was taken in {MAX_TRIES} tries", pool=pool_text)


def age_s(created: Any) -> float:
    """Seconds since a container's (epoch) or a network's (RFC 3339) `Created`; 0 when unknown."""
    if isinstance(created, int | float):
        return time.time() - float(created)
    if isinstance(created, str) and created:
        try:
            return time.time() - datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00").timestamp()
        except ValueError:
            return 0.0
    return 0.0
