"""The host's own addresses an egress proxy refuses (runtime/docker/hostaddrs.py), and the proxy's
verdict on them (images/egress/egress_rules.py, loaded by path as the proxy imports it): pure and
fast. The engine is a fake; the interfaces are this machine's own, read, never contacted."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import socket
import struct
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sandbox.runtime.docker import egress, hostaddrs

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "images/egress"))
    spec = importlib.util.spec_from_file_location(name, ROOT / f"images/egress/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rules = _load("egress_rules")

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 4
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 203.0.113.0/24 2 0 2
           |-- 203.0.113.0
              /24 link UNICAST
           |-- 203.0.113.7
              /32 host LOCAL
        |-- 203.0.113.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 4
     |-- 203.0.113.7
        /32 host LOCAL
     |-- 198.51.100.9
        /32 link UNICAST
"""

IF_INET6 = """fe800000000000000042b9fffe6c9b4e 05 40 20 80  docker0
00000000000000000000000000000001 01 80 10 80       lo
20010db8000000000000000000000005 04 40 00 80     eth0
garbage line
"""


def test_fib_trie_gives_the_local_ipv4_addresses_only() -> None:
    """/32 LOCAL leaves are the host's addresses; broadcast, unicast routes and the /8 loopback route are not."""
    assert [a for _, a in hostaddrs.parse_fib_trie(FIB_TRIE)] == ["127.0.0.1", "203.0.113.7"]


def test_if_inet6_gives_each_address_with_its_interface() -> None:
    assert hostaddrs.parse_if_inet6(IF_INET6) == [
        ("docker0", "fe80::42:b9ff:fe6c:9b4e"),
        ("lo", "::1"),
        ("eth0", "2001:db8::5"),
    ]


def _attr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _message(kind: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body


def test_netlink_answers_are_parsed_local_before_peer() -> None:
    """An IPv4 point-to-point address has IFA_LOCAL (ours) and IFA_ADDRESS (the peer's): ours is taken;
    IPv6 carries IFA_ADDRESS only; another family is skipped; DONE ends the dump."""
    ptp = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 1)
    ptp += _attr(hostaddrs.IFA_ADDRESS, bytes([198, 51, 100, 1])) + _attr(hostaddrs.IFA_LOCAL, bytes([203, 0, 113, 7]))
    v6 = struct.pack("=BBBBI", socket.AF_INET6, 64, 0, 0, 1)
    v6 += _attr(hostaddrs.IFA_ADDRESS, ipaddress.IPv6Address("2001:db8::5").packed)
    other = struct.pack("=BBBBI", 17, 0, 0, 0, 1) + _attr(hostaddrs.IFA_ADDRESS, b"\1\2\3\4\5\6")
    data = (
        _message(hostaddrs.RTM_NEWADDR, ptp)
        + _message(hostaddrs.RTM_NEWADDR, v6)
        + _message(hostaddrs.RTM_NEWADDR, other)
        + _message(hostaddrs.NLMSG_DONE, b"\0\0\0\0")
    )
    done, pairs = hostaddrs.parse_netlink(data)
    assert done and [a for _, a in pairs] == ["203.0.113.7", "2001:db8::5"]
    assert hostaddrs.parse_netlink(_message(hostaddrs.RTM_NEWADDR, v6)) == (False, pairs[1:])
    with pytest.raises(OSError):
        hostaddrs.parse_netlink(_message(hostaddrs.NLMSG_ERROR, struct.pack("=i", -1)))
    with pytest.raises(OSError):
        hostaddrs.parse_netlink(data[:-3])  # a message cut short


def test_this_hosts_addresses_agree_between_netlink_and_proc() -> None:
    """The two readers see the same addresses here (the fallback is no weaker than the first choice);
    read again while the engine adds or removes an interface between the two reads."""
    for _ in range(20):
        netlink = {a for _, a in hostaddrs._netlink_addresses()}
        proc = {a for _, a in hostaddrs._proc_addresses()}
        if netlink == proc:
            break
        time.sleep(0.1)
    assert "127.0.0.1" in netlink and netlink == proc
    assert "127.0.0.1" in hostaddrs.interface_addresses()
    assert hostaddrs.interface_addresses("lo")[0] == "127.0.0.1"


class FakeApi:
    def __init__(self, networks: list[dict[str, Any]]) -> None:
        self._networks = networks

    def networks(self) -> list[dict[str, Any]]:
        return self._networks

    def inspect_network(self, name: str) -> dict[str, Any]:
        raise LookupError(name)


class FakeClient:
    def __init__(self, networks: list[dict[str, Any]]) -> None:
        self.api = FakeApi(networks)


def _net(name: str, driver: str, subnet: str, gateway: str = "", bridge: str = "") -> dict[str, Any]:
    config = {"Subnet": subnet, **({"Gateway": gateway} if gateway else {})}
    return {
        "Name": name,
        "Id": f"id-{name}",
        "Driver": driver,
        "IPAM": {"Config": [config]},
        "Options": {"com.docker.network.bridge.name": bridge} if bridge else {},
    }


def test_gateways_of_the_upstream_and_of_every_bridge_network() -> None:
    """The upstream's gateway whatever its driver, every bridge network's; the default bridge
    (no gateway in its IPAM) by its interface's address here, else its subnet's first address."""
    client = FakeClient(
        [
            _net("bridge", "bridge", "10.77.0.0/16", bridge="sbx-no-such-if"),
            _net("lan", "macvlan", "192.0.2.0/24", gateway="192.0.2.254"),
            _net("lab", "bridge", "172.30.0.0/16", gateway="172.30.0.1"),
            _net("host", "host", ""),
        ]
    )
    assert hostaddrs.gateways(client, "lan") == ["192.0.2.254", "10.77.0.1", "172.30.0.1"]
    assert hostaddrs.gateways(client, "lab") == ["172.30.0.1", "10.77.0.1"]
    # a bridge whose interface is here: its real address, not a guess
    lo = _net("bridge", "bridge", "127.0.0.0/8", bridge="lo")
    assert hostaddrs.network_gateways(lo) == ["127.0.0.1"]


def test_an_engine_that_cannot_answer_leaves_the_interfaces() -> None:
    class Broken:
        class api:  # the SDK's attribute name
            @staticmethod
            def networks() -> list[dict[str, Any]]:
                raise ConnectionError("engine gone")

            @staticmethod
            def inspect_network(name: str) -> dict[str, Any]:
                raise ConnectionError("engine gone")

    found = hostaddrs.host_addresses(Broken(), "bridge")
    assert "127.0.0.1" in found and found == sorted(set(found), key=lambda a: (":" in a, ipaddress.ip_address(a)))


def test_the_host_is_refused_whatever_allow_private_says() -> None:
    """An address of the host is refused even inside an exempt range, also wrapped in IPv6; a
    public one too (which no other check knows); its neighbours keep their usual verdict."""
    host = rules.host_address_set(["172.30.0.1", "203.0.113.7", "2001:db8::5", "not an address", "fe80::1%eth0"])
    exempt = ["172.30.0.0/16"]
    reason = rules.address_refusal("172.30.0.1", exempt, host)
    assert reason is not None and "address of the host" in reason, reason
    assert rules.address_refusal("172.30.0.2", exempt, host) is None  # the rest of the exempt range
    assert "address of the host" in (rules.address_refusal("::ffff:172.30.0.1", exempt, host) or "")
    assert "address of the host" in (rules.address_refusal("203.0.113.7", [], host) or "")
    assert "address of the host" in (rules.address_refusal("[2001:db8::5]", ["2001:db8::/32"], host) or "")
    assert "address of the host" in (rules.address_refusal("fe80::1", ["fe80::/10"], host) or "")
    assert rules.address_refusal("8.8.8.8", [], host) is None
    assert rules.address_refusal("172.30.0.1", exempt) is None  # without the list, the exemption holds


def test_the_proxy_reads_the_host_addresses_from_its_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_POLICY", json.dumps({"host_addresses": ["172.30.0.1", "::1"]}))
    state = _load("egress_state")
    wanted = {ipaddress.ip_address("172.30.0.1"), ipaddress.ip_address("::1")}
    assert wanted == state.HOST


@pytest.mark.parametrize(
    ("env", "knows"),
    [
        ([f"EGRESS_POLICY={json.dumps({'host_addresses': ['10.0.0.1']})}"], True),
        ([f"EGRESS_POLICY={json.dumps({'host_addresses': []})}"], True),  # nothing found is still this version
        ([f"EGRESS_POLICY={json.dumps({'allow': ['x']})}"], False),  # made before the list
        (["EGRESS_POLICY={broken"], False),
        ([], False),
    ],
)
def test_a_proxy_without_the_host_list_is_not_reused(env: list[str], knows: bool) -> None:
    assert egress.knows_the_host({"Config": {"Env": env}}) is knows


def test_netlink_refused_falls_back_to_proc_and_nothing_readable_leaves_the_gateways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused() -> list[tuple[str, str]]:
        raise PermissionError("netlink refused (a seccomp profile)")

    monkeypatch.setattr(hostaddrs, "_netlink_addresses", refused)
    assert "127.0.0.1" in hostaddrs.interface_addresses()
    monkeypatch.setattr(hostaddrs, "_proc_addresses", refused)
    client = FakeClient([_net("lab", "bridge", "172.30.0.0/16", gateway="172.30.0.1")])
    assert hostaddrs.host_addresses(client, "lab") == ["172.30.0.1"]
