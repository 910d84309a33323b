"""The egress verdicts, as pure functions: which host names and which addresses a sandbox may reach.

Runs inside the proxy container (imported by egress_addon.py) and in the project's unit tests
(loaded by path); it needs nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re

from egress_ranges import refusal as iana_refusal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# RFC 6598 shared address space (carrier-grade NAT): Python's is_global already says False, named
# here so a refusal can say what it is
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


# platform addresses that are public on paper and inward in effect: never reachable, whatever
# `allow_private` says (Azure's WireServer and platform DNS)
ALWAYS_REFUSED = ("168.63.129.16/32",)


def normal_host(host: str) -> str:
    """A host name as compared: lower case, no trailing dot, IPv6 without brackets, IDNA (punycode)."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if not name.isascii():
        # mitmproxy hands over Unicode names; one that is no valid IDNA stays as it is, matches
        # no (ASCII) pattern, and is refused
        with contextlib.suppress(UnicodeError):
            name = name.encode("idna").decode("ascii")
    return name


def valid_pattern(pattern: str) -> bool:
    """`*`, `name.example`, or `*.name.example` (every label a DNS label); IP literals too."""
    if pattern == "*":
        return True
    body = pattern[2:] if pattern.startswith("*.") else pattern
    if is_ip(body):
        return not pattern.startswith("*.")
    labels = body.split(".")
    return len(body) <= 253 and all(_LABEL.match(label) for label in labels)


def host_allowed(host: str, patterns: list[str]) -> bool:
    """Whether `host` matches a pattern: exact, `*.suffix` (subdomains only), or `*` (anything)."""
    name = normal_host(host)
    if not name:
        return False
    for pattern in patterns:
        pattern = normal_host(pattern)
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]) and not is_ip(name):
            return True
    return False


def is_ip(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 literal."""
    try:
        ipaddress.ip_address(normal_host(text))
    except ValueError:
        return False
    return True


def _embedded_v4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64): each is checked too."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _kind(ip: IPAddress) -> str | None:
    """Why one address is not a public unicast address, or None when it is."""
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local (cloud metadata lives here)"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "carrier-grade NAT (100.64.0.0/10)"
    if isinstance(ip, ipaddress.IPv6Address) and ip in ipaddress.ip_network("fc00::/7"):
        return "unique local (fc00::/7)"
    if ip.is_private:
        return "private"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def host_address_set(addresses: list[str]) -> frozenset[IPAddress]:
    """The host's addresses (policy `host_addresses`) as compared; an entry that is no address is skipped."""
    found: set[IPAddress] = set()
    for text in addresses:
        with contextlib.suppress(ValueError):
            found.add(ipaddress.ip_address(normal_host(str(text)).split("%", 1)[0]))
    return frozenset(found)


def address_refusal(
    address: str, exempt: list[str] | None = None, host: frozenset[IPAddress] = frozenset()
) -> str | None:
    """Why the proxy must not connect to `address`, or None when it may.

    Loopback, private, link-local (metadata), CGNAT, ULA, multicast and reserved addresses, and
    every block of IANA's special-purpose registries that is not globally reachable, are
    refused, also when an IPv6 address only wraps one. `exempt` networks (config
    `egress.allow_private`) are let through: an internal mirror, or a test network. The
    addresses of the host the proxy runs on (`host`, from the orchestrator) are refused whatever
    `exempt` says, public ones too: the host's own services are never an egress destination.
    """
    try:
        ip = ipaddress.ip_address(normal_host(address).split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    for net in ALWAYS_REFUSED:
        if ip in ipaddress.ip_network(net):
            return f"{ip} is a cloud platform address (never reachable)"
    for candidate in [ip, *_embedded_v4(ip)]:
        if candidate in host:
            shown = f"{candidate} inside {ip}" if candidate != ip else str(ip)
            return f"{shown} is an address of the host the proxy runs on (never reachable)"
    for net in exempt or []:
        try:
            if ip in ipaddress.ip_network(net, strict=False):
                return None
        except ValueError:
            return f"the exempt range {net!r} is not a network (refused: fail closed)"
    candidates = [ip, *_embedded_v4(ip)]
    # the named kinds first (they say what an inward address is), then IANA's registries: every
    # special-purpose block that is not globally reachable (egress_ranges.py)
    for check in (_kind, iana_refusal):
        for candidate in candidates:
            kind = check(candidate)
            if kind is not None:
                shown = f"{candidate} inside {ip}" if candidate != ip else str(ip)
                return f"{shown} is {kind}"
    return None
