"""The addresses of the host an egress proxy runs on, which the proxy refuses to connect to.

The host firewall drops what a proxy opens towards the host (`hostfirewall.drop_from_source`);
this list is the second, independent wall: the proxy itself refuses any address in it, whatever
`allow_private` exempts. It holds the gateways of the engine's bridge networks (each is an
address of the engine's host: the upstream network's first, whatever its driver) and the
addresses of every interface this process sees (the host's own, public ones included, where
the orchestrator runs on the engine's host: not in a container of its own network namespace, not
against a remote engine). It is a snapshot taken when the proxy is made: an address the host gets
later is left to the firewall.

Interfaces are read over rtnetlink (RTM_GETADDR, what `ip addr` asks), falling back to
/proc/net/fib_trie and /proc/net/if_inet6 where netlink is refused; standard library only.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any

from sandbox._log import logger

NETLINK_ROUTE = 0
RTM_NEWADDR, RTM_GETADDR = 20, 22
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL = 1, 2
NETLINK_TIMEOUT_S = 2.0
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefix length, flags, scope, interface index
_ATTR = struct.Struct("=HH")  # rtattr: length, type


def host_addresses(client: Any, upstream: str) -> list[str]:
    """The gateways of `upstream` and of the engine's bridge networks, and this host's interface
    addresses: sorted, each once. Best effort: what cannot be read is left out (and logged)."""
    found = set(gateways(client, upstream))
    try:
        found.update(interface_addresses())
    except OSError as exc:
        logger.bind(error=str(exc)).warning("host_addresses_unreadable")
    return sorted(found, key=lambda a: (":" in a, ipaddress.ip_address(a)))


def gateways(client: Any, upstream: str) -> list[str]:
    """Gateway addresses of the upstream network and of every bridge network of the engine."""
    found: list[str] = []
    try:
        networks = list(client.api.networks())
    except Exception as exc:  # the engine's answer is a nicety here, never a reason to fail
        logger.bind(error=str(exc)).warning("host_gateways_unreadable")
        networks = []
    named = [n for n in networks if upstream in (n.get("Name"), n.get("Id"))]
    if not named:
        try:
            named = [client.api.inspect_network(upstream)]
        except Exception as exc:
            logger.bind(network=upstream, error=str(exc)).warning("host_gateways_unreadable")
    for network in named + [n for n in networks if n.get("Driver") == "bridge"]:
        found.extend(network_gateways(network))
    return list(dict.fromkeys(found))


def network_gateways(network: dict[str, Any]) -> list[str]:
    """A network's gateways from its IPAM config. The default `bridge` network names none there
    (its gateway is the bridge's own address, `--bip`): this host's addresses on the bridge
    interface stand in, else the subnet's first address (the engine's choice without `--bip`)."""
    found: list[str] = []
    bridge = str((network.get("Options") or {}).get("com.docker.network.bridge.name") or "")
    for config in (network.get("IPAM") or {}).get("Config") or []:
        gateway = str(config.get("Gateway") or "").split("/", 1)[0]
        if gateway and _address(gateway):
            found.append(_address(gateway))
            continue
        try:
            subnet = ipaddress.ip_network(str(config.get("Subnet") or ""), strict=False)
        except ValueError:
            continue
        try:
            on_bridge = [a for a in interface_addresses(bridge) if ipaddress.ip_address(a) in subnet] if bridge else []
        except OSError:
            on_bridge = []
        found.extend(on_bridge or [str(next(subnet.hosts(), subnet.network_address))])
    return found


def interface_addresses(interface: str = "") -> list[str]:
    """Every address of this network namespace's interfaces (or of one interface), IPv4 and IPv6.

    Raises:
        OSError: neither netlink nor /proc could be read.
    """
    try:
        pairs = _netlink_addresses()
    except OSError:
        pairs = _proc_addresses()
    return list(dict.fromkeys(address for name, address in pairs if not interface or name == interface))


def _netlink_addresses() -> list[tuple[str, str]]:
    """(interface name, address) of every address, from one RTM_GETADDR dump."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(NETLINK_TIMEOUT_S)
        sock.bind((0, 0))
        request = _HEADER.pack(_HEADER.size + _IFADDR.size, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
        sock.send(request + _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
        found: list[tuple[str, str]] = []
        while True:
            data = sock.recv(65536)
            if not data:
                raise OSError("netlink closed the dump early")
            done, pairs = parse_netlink(data)
            found.extend(pairs)
            if done:
                return found


def parse_netlink(data: bytes) -> tuple[bool, list[tuple[str, str]]]:
    """(the dump ended, the (interface, address) pairs) of one netlink read.

    Raises:
        OSError: the kernel answered with an error.
    """
    found: list[tuple[str, str]] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _flags, _seq, _port = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise OSError("netlink message truncated")
        if kind == NLMSG_DONE:
            return True, found
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
            raise OSError(-code, "netlink refused the address dump")
        if kind == RTM_NEWADDR:
            found.extend(_address_message(data[offset + _HEADER.size : offset + length]))
        offset += (length + 3) & ~3
    return False, found


def _address_message(body: bytes) -> list[tuple[str, str]]:
    family, _prefix, _flags, _scope, index = _IFADDR.unpack_from(body)
    size = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
    if size is None:
        return []
    attrs: dict[int, bytes] = {}
    offset = _IFADDR.size
    while offset + _ATTR.size <= len(body):
        length, kind = _ATTR.unpack_from(body, offset)
        if length < _ATTR.size:
            break
        attrs[kind] = body[offset + _ATTR.size : offset + length]
        offset += (length + 3) & ~3
    # IFA_LOCAL is the address itself; IFA_ADDRESS the peer's on a point-to-point link (IPv4)
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if raw is None or len(raw) != size:
        return []
    try:
        name = socket.if_indextoname(index)
    except OSError:
        name = ""
    return [(name, str(ipaddress.ip_address(raw)))]


def _proc_addresses() -> list[tuple[str, str]]:
    """The fallback: IPv4 from the kernel's local routes, IPv6 from if_inet6 (interface names for IPv6 only)."""
    pairs: list[tuple[str, str]] = []
    read_any = False
    for path, parse in (("/proc/net/fib_trie", parse_fib_trie), ("/proc/net/if_inet6", parse_if_inet6)):
        try:
            with open(path) as handle:
                text = handle.read()
        except OSError:
            continue
        read_any = True
        pairs.extend(parse(text))
    if not read_any:
        raise OSError("neither netlink nor /proc/net lists this host's addresses")
    return pairs


def parse_fib_trie(text: str) -> list[tuple[str, str]]:
    """IPv4 addresses of this host: the /32 LOCAL leaves of /proc/net/fib_trie (no interface names there)."""
    found: list[tuple[str, str]] = []
    leaf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            leaf = stripped[3:].strip()
        elif stripped.startswith("/32 ") and stripped.split()[-1] == "LOCAL" and _address(leaf):
            found.append(("", _address(leaf)))
    return list(dict.fromkeys(found))


def parse_if_inet6(text: str) -> list[tuple[str, str]]:
    """IPv6 addresses of this host from /proc/net/if_inet6 (address, index, prefix, scope, flags, name)."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and len(fields[0]) == 32:
            try:
                found.append((fields[5], str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))))
            except ValueError:
                continue
    return found


def _address(text: str) -> str:
    """`text` as a normal address, or "" when it is none."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return ""
