"""The subnet pool allocator (runtime/docker/subnets.py), pure: the engine's network listing is a fake
(what other networks hold), and the engine's refusal of an overlap is made to happen once."""

from __future__ import annotations

import ipaddress
from typing import Any

import docker.errors
import pytest

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker import subnets


class Engine:
    """The networks an engine holds (their subnets), and a create that refuses overlaps."""

    def __init__(self, *taken: str) -> None:
        self.taken = list(taken)
        self.api = self
        self.refuse_next = 0

    def networks(self) -> list[dict[str, Any]]:
        return [{"IPAM": {"Config": [{"Subnet": s}]}} for s in self.taken]

    def create(self, ipam: Any) -> str:
        subnet = ipam["Config"][0]["Subnet"]
        if self.refuse_next or any(ipaddress.ip_network(subnet).overlaps(ipaddress.ip_network(t)) for t in self.taken):
            self.refuse_next = max(0, self.refuse_next - 1)
            self.taken.append(subnet)  # what another maker took meanwhile
            raise docker.errors.APIError("Pool overlaps with other one on this address space")
        self.taken.append(subnet)
        return str(subnet)


def test_takes_the_first_free_slash_29_around_other_networks() -> None:
    """Subnets other networks hold (wider ones too) are skipped; the pick is a /29 of the pool."""
    engine = Engine("10.213.0.0/29", "10.213.0.8/30", "172.17.0.0/16")
    made = subnets.create_network(engine, "10.213.0.0/16", engine.create)
    assert made == "10.213.0.16/29"


def test_an_overlap_refused_by_the_engine_moves_on() -> None:
    """Another process took the chosen subnet between the listing and the create: the next one."""
    engine = Engine()
    engine.refuse_next = 2
    assert subnets.create_network(engine, "10.213.0.0/16", engine.create) == "10.213.0.16/29"


def test_a_subnet_the_host_routes_is_refused_and_the_next_taken() -> None:
    """The engine refuses a subnet no network holds (a route of the host's own, which no listing
    shows): it is not chosen again, and the next free one is taken."""
    engine = Engine()
    routed = {"10.213.0.0/29", "10.213.0.8/29"}

    def create(ipam: Any) -> str:
        subnet = ipam["Config"][0]["Subnet"]
        if subnet in routed:
            raise docker.errors.APIError("networks have overlapping IPv4")
        return engine.create(ipam)

    assert subnets.create_network(engine, "10.213.0.0/16", create) == "10.213.0.16/29"


def test_an_exhausted_pool_is_a_clear_error_and_low() -> None:
    """Nothing free: SANDBOX_UNAVAILABLE naming the pool and the key; usage says low."""
    engine = Engine("10.213.255.0/25")
    with pytest.raises(SandboxUnavailable) as caught:
        subnets.create_network(engine, "10.213.255.0/26", engine.create)
    assert "10.213.255.0/26" in caught.value.message and "subnet_pool" in caught.value.message
    use = subnets.usage(engine, "10.213.255.0/26")
    assert (use.total, use.used, use.low) == (8, 8, True)
    assert not subnets.usage(Engine(), "10.213.0.0/16").low


def test_the_default_pool_is_outside_dockers_default_pools() -> None:
    """10.213.0.0/16 overlaps neither 172.17.0.0/12 nor 192.168.0.0/16."""
    pool = ipaddress.ip_network(subnets.DEFAULT_POOL)
    assert not pool.overlaps(ipaddress.ip_network("172.16.0.0/12"))
    assert not pool.overlaps(ipaddress.ip_network("192.168.0.0/16"))
    assert pool.num_addresses // 8 == 8192
