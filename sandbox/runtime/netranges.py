"""IANA's special-purpose address registries, and the verdict they give on one address.

The egress proxy refuses every address that IANA does not list as globally reachable: each block
of the IPv4 and IPv6 Special-Purpose Address Registries whose "Globally Reachable" is not True
(RFC 8190), IPv4 multicast (IANA's IPv4 address space), and in IPv6 everything outside the one
block IANA's IPv6 address space designates Global Unicast (2000::/3: the deprecated site-local
fec0::/10 and every other reserved block fall outside it). An address inside any block that is
not globally reachable is refused, even where a narrower block inside it says True (ORCHIDv2 and
the anycast services inside 2001::/23 and 192.0.0.0/24): no sandbox needs those, and the wider
block's verdict is the safe one.

The tables below are the registries' rows as IANA publishes them (address block, name, RFC,
globally reachable), not a hand-made selection: tests/test_egress_ranges.py checks every row and
checks the verdict against Python's and netaddr's own tables. To refresh them, compare with
iana-ipv4-special-registry-1.csv and iana-ipv6-special-registry-1.csv at IANA and edit the rows.

This file is the one source of truth; the egress proxy image carries a byte-identical copy
(images/egress/egress_ranges.py, kept equal by a test), since its build context holds only that
folder. It needs nothing but the standard library.
"""

from __future__ import annotations

import ipaddress
from functools import cache

# IANA IPv4 Special-Purpose Address Registry (last updated 2025-05): block | name | RFC | globally reachable
IPV4_SPECIAL = """
0.0.0.0/8 | "This network" | RFC791 | False
0.0.0.0/32 | "This host on this network" | RFC1122 | False
10.0.0.0/8 | Private-Use | RFC1918 | False
100.64.0.0/10 | Shared Address Space | RFC6598 | False
127.0.0.0/8 | Loopback | RFC1122 | False
169.254.0.0/16 | Link Local | RFC3927 | False
172.16.0.0/12 | Private-Use | RFC1918 | False
192.0.0.0/24 | IETF Protocol Assignments | RFC6890 | False
192.0.0.0/29 | IPv4 Service Continuity Prefix | RFC7335 | False
192.0.0.8/32 | IPv4 dummy address | RFC7600 | False
192.0.0.9/32 | Port Control Protocol Anycast | RFC7723 | True
192.0.0.10/32 | Traversal Using Relays around NAT Anycast | RFC8155 | True
192.0.0.170/32 | NAT64/DNS64 Discovery | RFC8880 | False
192.0.0.171/32 | NAT64/DNS64 Discovery | RFC8880 | False
192.0.2.0/24 | Documentation (TEST-NET-1) | RFC5737 | False
192.31.196.0/24 | AS112-v4 | RFC7535 | True
192.52.193.0/24 | AMT | RFC7450 | True
192.88.99.0/24 | Deprecated (6to4 Relay Anycast) | RFC7526 | N/A
192.88.99.2/32 | 6a44-relay anycast address | RFC6751 | N/A
192.168.0.0/16 | Private-Use | RFC1918 | False
192.175.48.0/24 | Direct Delegation AS112 Service | RFC7534 | True
198.18.0.0/15 | Benchmarking | RFC2544 | False
198.51.100.0/24 | Documentation (TEST-NET-2) | RFC5737 | False
203.0.113.0/24 | Documentation (TEST-NET-3) | RFC5737 | False
240.0.0.0/4 | Reserved | RFC1112 | False
255.255.255.255/32 | Limited Broadcast | RFC8190 | False
"""

# IANA IPv6 Special-Purpose Address Registry (last updated 2025-05)
IPV6_SPECIAL = """
::1/128 | Loopback Address | RFC4291 | False
::/128 | Unspecified Address | RFC4291 | False
::ffff:0:0/96 | IPv4-mapped Address | RFC4291 | False
64:ff9b::/96 | IPv4-IPv6 Translat. | RFC6052 | True
64:ff9b:1::/48 | IPv4-IPv6 Translat. | RFC8215 | False
100::/64 | Discard-Only Address Block | RFC6666 | False
100:0:0:1::/64 | Dummy IPv6 Prefix | RFC9780 | False
2001::/23 | IETF Protocol Assignments | RFC2928 | False
2001::/32 | TEREDO | RFC4380 | N/A
2001:1::1/128 | Port Control Protocol Anycast | RFC7723 | True
2001:1::2/128 | Traversal Using Relays around NAT Anycast | RFC8155 | True
2001:1::3/128 | DNS-SD Service Registration Protocol Anycast | RFC9665 | True
2001:2::/48 | Benchmarking | RFC5180 | False
2001:3::/32 | AMT | RFC7450 | True
2001:4:112::/48 | AS112-v6 | RFC7535 | True
2001:10::/28 | Deprecated (previously ORCHID) | RFC4843 | N/A
2001:20::/28 | ORCHIDv2 | RFC7343 | True
2001:30::/28 | Drone Remote ID Protocol Entity Tags (DETs) Prefix | RFC9374 | True
2001:db8::/32 | Documentation | RFC3849 | False
2002::/16 | 6to4 | RFC3056 | N/A
2620:4f:8000::/48 | Direct Delegation AS112 Service | RFC7534 | True
3fff::/20 | Documentation | RFC9637 | False
5f00::/16 | Segment Routing (SRv6) SIDs | RFC9602 | False
fc00::/7 | Unique-Local | RFC4193 | False
fe80::/10 | Link-Local Unicast | RFC4291 | False
"""

# IANA IPv4 Address Space: the one designation outside the special registry that is not unicast
IPV4_MULTICAST = ipaddress.IPv4Network("224.0.0.0/4")
# IANA Internet Protocol Version 6 Address Space: every block but this one is reserved, unique
# local, link-scoped (including fec0::/10, the deprecated site-local block) or multicast
IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _rows(table: str) -> tuple[tuple[Network, str, str], ...]:
    rows = []
    for line in table.strip().splitlines():
        block, name, _rfc, reachable = (part.strip() for part in line.split("|"))
        rows.append((ipaddress.ip_network(block), name.strip('"'), reachable))
    return tuple(rows)


@cache
def special_blocks() -> tuple[tuple[Network, str, str], ...]:
    """Every registry row: (block, name, globally reachable as written: True, False or N/A)."""
    return _rows(IPV4_SPECIAL) + _rows(IPV6_SPECIAL)


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why IANA's registries say `ip` is not globally reachable, or None when nothing does."""
    if isinstance(ip, ipaddress.IPv4Address) and ip in IPV4_MULTICAST:
        return "multicast (224.0.0.0/4)"
    if isinstance(ip, ipaddress.IPv6Address) and ip not in IPV6_GLOBAL_UNICAST:
        return "outside IANA's IPv6 global unicast space (2000::/3)"
    for block, name, reachable in special_blocks():
        if block.version == ip.version and ip in block and reachable != "True":
            return f"{name} ({block}, not globally reachable in IANA's special-purpose registry)"
    return None
