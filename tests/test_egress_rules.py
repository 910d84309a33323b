"""The egress proxy's verdicts as attacks: which hosts and addresses a sandbox may reach (pure, fast).

`images/egress/egress_rules.py` runs inside the proxy container, not in the `sandbox` package; it
is loaded here by path, so the functions tested are the ones the proxy imports. Addresses are only
parsed, never contacted. The config side (`egress.*`, `tenants[].egress`) is checked through the
loader, as a user's file would be.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.config import effective_agent, load_config_text
from sandbox.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _load_rules() -> ModuleType:
    # the proxy's modules import each other by name, as in the image's /opt/egress
    sys.path.insert(0, str(ROOT / "images/egress"))
    spec = importlib.util.spec_from_file_location("egress_rules", ROOT / "images/egress/egress_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rules = _load_rules()
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source="cfg.yaml", base_dir=Path("/tmp"))
    return info.value.problems


# --- addresses -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.255", "carrier-grade NAT"),
        ("fc00::1", "unique local"),
        ("fd00:ec2::254", "unique local"),  # AWS's IPv6 metadata address
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),  # Linux connects 0.0.0.0 to the local host
        ("::", "unspecified"),
        ("0.1.2.3", ""),  # "this network"
        ("240.0.0.1", ""),  # reserved 240.0.0.0/4
        ("255.255.255.255", ""),  # broadcast
        ("192.0.2.1", ""),  # documentation
    ],
)
def test_inward_addresses_are_refused(address: str, kind: str) -> None:
    """Every address that is not public unicast is refused, and the reason says what it is."""
    reason = rules.address_refusal(address)
    assert reason is not None
    assert kind in reason


@pytest.mark.parametrize(
    "address",
    [
        "::ffff:10.0.0.1",  # IPv4-mapped
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:0a00:0001::",  # 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2001:0000:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
        "::127.0.0.1",  # IPv4-compatible (deprecated)
    ],
)
def test_ipv6_wrappers_of_inward_ipv4_are_refused(address: str) -> None:
    """An IPv6 address that only carries a private IPv4 one is refused like the IPv4 address."""
    assert rules.address_refusal(address) is not None


def test_sixtofour_is_refused_and_says_what_it_carries() -> None:
    """6to4 names the inward IPv4 address it wraps; around a public one it is still refused (IANA
    lists 2002::/16 as not globally reachable: a relay would take the packet anywhere)."""
    reason = rules.address_refusal("2002:0a00:0001::")
    assert reason is not None and "10.0.0.1 inside" in reason
    reason = rules.address_refusal("2002:0808:0808::")
    assert reason is not None and "6to4" in reason


@pytest.mark.parametrize(
    "address",
    ["fe80::1%eth0", "fe80::1%1", "[::1]", "[fe80::1%eth0]", " 127.0.0.1 ", "127.0.0.1.", "[::ffff:10.0.0.1]"],
)
def test_spellings_do_not_hide_an_address(address: str) -> None:
    """Zone ids, brackets, whitespace and a trailing dot are stripped before the verdict."""
    assert rules.address_refusal(address) is not None


@pytest.mark.parametrize(
    "text", ["", "not an ip", "999.1.1.1", "10.0.0.1:80", "::g", "%eth0", "[]", "1.2.3", "0x7f000001", "2130706433"]
)
def test_garbage_gets_a_reason_not_an_exception(text: str) -> None:
    """Text that is no address is refused with a reason; decimal and hex spellings of 127.0.0.1 too."""
    reason = rules.address_refusal(text)
    assert reason is not None and "not an IP address" in reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "[2606:4700:4700::1111]"])
def test_public_addresses_are_allowed(address: str) -> None:
    """Public unicast addresses pass (parsed only, never contacted)."""
    assert rules.address_refusal(address) is None


def test_exempt_ranges_let_exactly_their_addresses_through() -> None:
    """`egress.allow_private` opens its own range and nothing next to it."""
    exempt = ["10.1.2.3/32", "172.20.0.0/16", "fd12:3456::/64"]
    for inside in ["10.1.2.3", "172.20.0.0", "172.20.255.255", "fd12:3456::1", "fd12:3456::ffff:ffff:ffff:ffff"]:
        assert rules.address_refusal(inside, exempt) is None, inside
    for beside in ["10.1.2.2", "10.1.2.4", "172.19.255.255", "172.21.0.0", "fd12:3456:0:1::1", "127.0.0.1"]:
        assert rules.address_refusal(beside, exempt) is not None, beside
    # no exemption, no door: the same addresses are refused without it
    assert rules.address_refusal("10.1.2.3") is not None
    assert rules.address_refusal("10.1.2.3", []) is not None


@pytest.mark.parametrize("exempt", ["10.0.0.0/99", "300.0.0.0/8"])
def test_bad_exempt_range_fails_closed(exempt: str) -> None:
    """An exemption that is no network must refuse (fail closed), not raise out of the verdict."""
    assert rules.address_refusal("10.0.0.1", [exempt]) is not None


@pytest.mark.parametrize("cidr", ["10.0.0.0/99", "300.0.0.0/8"])
def test_config_refuses_an_allow_private_entry_that_is_no_network(cidr: str) -> None:
    """A bad `egress.allow_private` entry is a config error, not a proxy that breaks at its first connection."""
    found = problems(f'agents: {{defaults: {{sandbox: {{egress: {{allow_private: ["{cidr}"]}}}}}}}}')
    assert any("agents.defaults.sandbox.egress.allow_private[0]" in p for p in found)


# --- host names ------------------------------------------------------------------------------


def test_exact_host_names() -> None:
    """An exact pattern matches its name in any case, with or without a trailing dot, and nothing else."""
    allow = ["pypi.org"]
    for host in ["pypi.org", "PyPI.ORG", "pypi.org.", "PYPI.org."]:
        assert rules.host_allowed(host, allow), host
    for host in ["files.pypi.org", "pypi.org.evil.net", "evilpypi.org", "pypi.or", "ypi.org"]:
        assert not rules.host_allowed(host, allow), host
    # the pattern side is normalised as well
    assert rules.host_allowed("pypi.org", ["PYPI.ORG."])


def test_wildcard_matches_subdomains_only() -> None:
    """`*.example.com` is every subdomain, never the apex, a look-alike or a name that merely contains it."""
    allow = ["*.example.com"]
    for host in ["a.example.com", "a.b.example.com", "A.EXAMPLE.COM.", "x-y.example.com"]:
        assert rules.host_allowed(host, allow), host
    for host in ["example.com", "evilexample.com", "example.com.evil.net", "a.example.com.evil.net", "example.co"]:
        assert not rules.host_allowed(host, allow), host


def test_star_matches_everything() -> None:
    """`*` lets every named host through (audit flags it); the address check still applies later."""
    for host in ["pypi.org", "a.b.c", "10.0.0.1", "::1"]:
        assert rules.host_allowed(host, ["*"]), host


def test_ip_literal_is_not_matched_by_a_wildcard() -> None:
    """`*.0.0.1` must not reach 10.0.0.1: wildcards match names, an IP is allowed only when listed."""
    assert not rules.host_allowed("10.0.0.1", ["*.0.0.1"])
    assert not rules.host_allowed("127.0.0.1", ["*.0.1"])
    assert rules.host_allowed("10.0.0.1", ["10.0.0.1"])
    assert rules.host_allowed("[2606:4700:4700::1111]", ["2606:4700:4700::1111"])


@pytest.mark.parametrize("host", ["", " ", ".", "[]", ".."])
def test_empty_host_is_never_allowed(host: str) -> None:
    """No name, no match: not even `*`, and not an empty pattern."""
    assert not rules.host_allowed(host, ["*", "", ".", "*.example.com"])


def test_pattern_validity() -> None:
    """`valid_pattern` takes names, `*.` names, `*` and IP literals; a wildcard IP or a bare `*.` is no pattern."""
    for good in ["*", "pypi.org", "*.pythonhosted.org", "10.0.0.1", "::1", "localhost"]:
        assert rules.valid_pattern(good), good
    for bad in ["*.", "*.10.0.0.1", "bad host!", "-a.com", "a-.com", "a..com", "*.*.com", "a" * 64 + ".com", ""]:
        assert not rules.valid_pattern(bad), bad


# --- properties ------------------------------------------------------------------------------


@SETTINGS
@given(st.ip_addresses(v=4))
def test_ipv4_never_looser_than_global_unicast(address: ipaddress.IPv4Address) -> None:
    """An IPv4 address that passes is one Python calls global and not multicast (IANA's registry,
    which the proxy follows, refuses more: 192.88.99.0/24 and the whole of 192.0.0.0/24)."""
    if rules.address_refusal(str(address)) is None:
        assert address.is_global and not address.is_multicast


@SETTINGS
@given(st.ip_addresses(v=6))
def test_ipv6_never_looser_than_global_unicast(address: ipaddress.IPv6Address) -> None:
    """An IPv6 address that passes is global and not multicast.

    Only one way: the function is stricter, refusing public-looking wrappers (6to4) of inward IPv4.
    """
    if rules.address_refusal(str(address)) is None:
        assert address.is_global and not address.is_multicast


INWARD_V4 = st.one_of(
    [
        st.ip_addresses(network=net)
        for net in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10"]
    ]
)


@SETTINGS
@given(INWARD_V4, st.sampled_from(["mapped", "6to4", "nat64"]))
def test_wrapped_inward_ipv4_is_refused(address: ipaddress.IPv4Address, wrapper: str) -> None:
    """Any private, loopback, link-local or CGNAT IPv4 address is refused inside any IPv6 wrapper."""
    bits = int(address)
    wrapped = {
        "mapped": ipaddress.IPv6Address(0xFFFF << 32 | bits),
        "6to4": ipaddress.IPv6Address(0x2002 << 112 | bits << 80),
        "nat64": ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | bits),
    }[wrapper]
    assert rules.address_refusal(str(address)) is not None
    assert rules.address_refusal(str(wrapped)) is not None, wrapped


# labels start with a letter, so no generated name is an IP literal
LABEL = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
NAME = st.lists(LABEL, min_size=1, max_size=3).map(".".join)


@st.composite
def host_and_suffix(draw: Any) -> tuple[str, str]:
    suffix = draw(NAME)
    prefix = draw(NAME)
    # the interesting hosts: a subdomain, the apex, a look-alike glued on, the suffix in the middle, anything
    host = draw(
        st.sampled_from(
            [f"{prefix}.{suffix}", suffix, f"{prefix}{suffix}", f"{suffix}.{prefix}", prefix, f"{prefix}-{suffix}"]
        )
    )
    return host, suffix


def _spell(draw: Any, name: str) -> str:
    """The same name as a client might send it: any case, maybe a trailing dot."""
    name = "".join(c.upper() if draw(st.booleans()) else c for c in name)
    return name + "." if draw(st.booleans()) else name


@pytest.mark.slow
@SETTINGS
@given(host_and_suffix(), st.data())
def test_wildcard_matches_iff_dot_suffix(case: tuple[str, str], data: st.DataObject) -> None:
    """`*.suffix` matches a host exactly when the host ends with `.suffix`, however either is spelled."""
    host, suffix = case
    sent = _spell(data.draw, host)
    pattern = "*." + _spell(data.draw, suffix)
    assert rules.host_allowed(sent, [pattern]) == host.endswith("." + suffix)


@SETTINGS
@given(NAME, NAME)
def test_exact_pattern_matches_only_itself(host: str, pattern: str) -> None:
    """An exact pattern matches one name; `*` matches every non-empty one."""
    assert rules.host_allowed(host, [pattern]) == (host == pattern)
    assert rules.host_allowed(host, ["*"])


# --- config ----------------------------------------------------------------------------------


def test_bad_host_pattern_names_its_key_path() -> None:
    """A host that is no name, `*.name` or IP is refused where it stands."""
    found = problems('agents: {defaults: {sandbox: {egress: {allow: ["bad host!"]}}}}')
    assert len(found) == 1
    assert found[0].startswith("cfg.yaml:1:")
    assert "agents.defaults.sandbox.egress.allow[0]" in found[0] and "'bad host!'" in found[0]


def test_bad_tenant_host_pattern_names_its_key_path() -> None:
    """The tenant's floor is held to the same patterns."""
    (found,) = problems('tenants: [{id: default, egress: {allow: ["*."]}}]')
    assert "tenants[0].egress.allow[0]" in found


@pytest.mark.parametrize("upstream", ["host", "none", "sandbox-browser", "sandbox-browser-abc123"])
def test_upstream_network_cannot_be_host_none_or_browser(upstream: str) -> None:
    """The proxy reaches out through a bridge: `host` would give it the host's loopback, `none` no way
    out, the browser network a path into the browser sandboxes."""
    found = problems(f"agents: {{defaults: {{sandbox: {{egress: {{upstream_network: {upstream}}}}}}}}}")
    assert len(found) == 1
    assert "agents.defaults.sandbox.egress.upstream_network" in found[0] and repr(upstream) in found[0]


def test_upstream_network_checked_per_agent() -> None:
    """An agent's own sandbox settings are checked too, located by its index."""
    (found,) = problems("agents: {list: [{id: a}, {id: b, sandbox: {egress: {upstream_network: host}}}]}")
    assert "agents.list[1].sandbox.egress.upstream_network" in found


def test_valid_egress_config_loads() -> None:
    """`network: egress` with an allowlist, ports, caps and an exempt range loads as written."""
    config = load_config_text(
        "agents:\n"
        "  defaults:\n"
        "    sandbox:\n"
        "      mode: all\n"
        "      docker: {network: egress}\n"
        "      egress:\n"
        "        allow: [pypi.org, '*.pythonhosted.org', 'GitHub.com.', 10.0.0.5]\n"
        "        ports: [443]\n"
        "        max_bytes: 64m\n"
        "        upstream_network: my-bridge\n"
        "        allow_private: [10.0.0.5/32]\n",
        base_dir=Path("/tmp"),
    )
    sandbox = config.agents.defaults.sandbox
    assert sandbox.docker.network == "egress"
    assert sandbox.egress.allow == ["pypi.org", "*.pythonhosted.org", "GitHub.com.", "10.0.0.5"]
    assert sandbox.egress.ports == [443] and sandbox.egress.upstream_network == "my-bridge"
    # every pattern the config accepts here is one the proxy understands
    assert all(rules.valid_pattern(rules.normal_host(p)) for p in sandbox.egress.allow)


def test_tenant_egress_floor_reaches_the_effective_agent() -> None:
    """`tenants[].egress.allow` is carried to each of the tenant's agents as `egress_floor`; others get None."""
    config = load_config_text(
        "tenants:\n"
        "  - {id: t1, egress: {allow: [pypi.org, '*.pythonhosted.org']}}\n"
        "  - {id: t2}\n"
        "agents:\n"
        "  defaults: {sandbox: {mode: all, docker: {network: egress}, egress: {allow: ['*']}}}\n"
        "  list: [{id: a, tenant: t1}, {id: b, tenant: t2}]\n",
        base_dir=Path("/tmp"),
    )
    a = effective_agent(config, "a")
    assert a.egress_floor == ("pypi.org", "*.pythonhosted.org")
    assert a.sandbox.egress.allow == ["*"]  # the agent's own list stays its own; the floor narrows it
    assert effective_agent(config, "b").egress_floor is None


def test_an_egress_sandbox_gets_no_dns_setting() -> None:
    """Names resolve at the proxy: a `docker.dns` beside `network: egress` is refused at load."""
    found = problems("agents: {defaults: {sandbox: {docker: {network: egress, dns: [10.0.0.2]}}}}")
    assert any("agents.defaults.sandbox.docker.dns" in p and "resolve at its proxy" in p for p in found), found


def test_cloud_platform_addresses_stay_refused_whatever_the_exemptions() -> None:
    """Azure's WireServer is public on paper: refused, even when an exemption covers it."""
    assert rules.address_refusal("168.63.129.16") is not None
    assert rules.address_refusal("168.63.129.16", ["168.63.0.0/16", "0.0.0.0/0"]) is not None


def test_unicode_names_compare_as_punycode() -> None:
    """mitmproxy hands over Unicode host names; the allowlist is ASCII (IDNA)."""
    assert rules.host_allowed("bücher.example", ["xn--bcher-kva.example"])
    assert not rules.host_allowed("bücher.example", ["bucher.example"])
