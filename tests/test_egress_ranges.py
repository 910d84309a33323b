"""IANA's special-purpose registries as the proxy's address check reads them (pure: addresses are
parsed, never contacted).

Every registry row that is not globally reachable is refused, at its edges and anywhere inside;
the check is never looser than Python's own tables or netaddr's (when installed), nor than the
IPv6 address space file netaddr ships; and the image's copy of the table is the package's.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.runtime import netranges

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _load_rules() -> ModuleType:
    sys.path.insert(0, str(ROOT / "images/egress"))
    spec = importlib.util.spec_from_file_location("egress_rules", ROOT / "images/egress/egress_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rules = _load_rules()
NOT_REACHABLE = [block for block, _, reachable in netranges.special_blocks() if reachable != "True"]


def test_the_image_carries_the_same_table() -> None:
    """The proxy's copy is byte for byte the package's module (one source of truth)."""
    assert (ROOT / "images/egress/egress_ranges.py").read_bytes() == (
        ROOT / "sandbox/runtime/netranges.py"
    ).read_bytes()


def test_the_registries_parse_and_hold_what_the_issue_named() -> None:
    """Both registries are read (dozens of rows, each a network and a verdict of True/False/N/A)."""
    rows = netranges.special_blocks()
    assert len([r for r in rows if r[0].version == 4]) >= 25 and len([r for r in rows if r[0].version == 6]) >= 24
    assert {r[2] for r in rows} == {"True", "False", "N/A"}


@pytest.mark.parametrize(
    "address", ["fec0::1", "3fff::1", "3fff:fff:ffff::1", "2001:20::1", "192.88.99.1", "192.88.99.2"]
)
def test_addresses_that_passed_before_are_refused(address: str) -> None:
    """Site-local fec0::/10, documentation 3fff::/20, ORCHIDv2 (inside 2001::/23) and the 6to4 relay
    anycast: all passed the old check; IANA lists none of them as globally reachable."""
    assert rules.address_refusal(address) is not None, address


@pytest.mark.parametrize("block", NOT_REACHABLE, ids=str)
def test_every_block_not_globally_reachable_is_refused_at_both_ends(
    block: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> None:
    """The first, last and middle address of each row whose Globally Reachable is not True."""
    middle = block.network_address + (block.num_addresses // 2)
    for address in (block.network_address, block.broadcast_address, middle):
        assert rules.address_refusal(str(address)) is not None, (block, address)


@SETTINGS
@given(st.sampled_from(NOT_REACHABLE).flatmap(lambda block: st.ip_addresses(network=str(block))))
def test_any_address_of_such_a_block_is_refused(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    """Anywhere inside, not only at the edges."""
    assert rules.address_refusal(str(address)) is not None, address


def _python_tables() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    tables = []
    for constants in (ipaddress._IPv4Constants, ipaddress._IPv6Constants):  # type: ignore[attr-defined]
        for name in ("_private_networks", "_reserved_networks", "_linklocal_network", "_loopback_network"):
            value = getattr(constants, name, None)
            if value is None:
                continue
            tables.extend(value if isinstance(value, list) else [value])
    return tables


@pytest.mark.parametrize("block", _python_tables(), ids=str)
def test_never_looser_than_pythons_tables(block: ipaddress.IPv4Network | ipaddress.IPv6Network) -> None:
    """Every network Python's ipaddress calls private, reserved, link-local or loopback is refused."""
    assert rules.address_refusal(str(block.network_address)) is not None, block


@SETTINGS
@given(st.ip_addresses())
def test_an_address_that_passes_is_global_unicast_in_every_table(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    """What passes is global for Python too, not multicast, and (IPv6) inside 2000::/3."""
    if rules.address_refusal(str(address)) is None:
        assert address.is_global and not address.is_multicast
        assert netranges.refusal(address) is None
        if address.version == 6:
            assert address in ipaddress.ip_network("2000::/3")


def test_never_looser_than_netaddr() -> None:
    """netaddr's tables (its not-globally-reachable lists, and IANA's IPv6 address space file it
    ships): each block that is not global unicast is refused."""
    netaddr = pytest.importorskip("netaddr")
    ip_module = sys.modules["netaddr.ip"]
    for name in ("IPV4_NOT_GLOBALLY_REACHABLE", "IPV6_NOT_GLOBALLY_REACHABLE"):
        for net in getattr(ip_module, name, []):
            assert rules.address_refusal(str(net.network)) is not None, net
    space = Path(netaddr.__file__).parent / "ip" / "ipv6-address-space.xml"
    ns = {"i": "http://www.iana.org/assignments"}
    checked = 0
    for record in ET.parse(space).getroot().iter("{http://www.iana.org/assignments}record"):
        prefix = record.findtext("i:prefix", namespaces=ns)
        designation = record.findtext("i:description", namespaces=ns) or ""
        if not prefix or "Global Unicast" in designation:
            continue
        network = ipaddress.ip_network(prefix.strip())
        assert rules.address_refusal(str(network.network_address + 1)) is not None, (prefix, designation)
        checked += 1
    assert checked >= 15


def test_audit_names_the_special_space_an_exemption_opens(tmp_path: Path) -> None:
    """SBX-N004 says which IANA blocks `allow_private` lets the proxy reach (the same table)."""
    from sandbox.audit.egress_rules import egress_findings
    from sandbox.config import effective_agent, load_config_text

    text = (
        f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{docker: {{network: egress}}, "
        "egress: {allow: [a.example], allow_private: [10.1.0.0/16, 100.64.0.0/10]}}}}\n"
    )
    found = {
        f.rule: f.evidence for f in egress_findings(effective_agent(load_config_text(text, source="t"), "main"), "t")
    }
    assert "Private-Use" in found["SBX-N004"] and "Shared Address Space" in found["SBX-N004"], found
