"""Host firewall rules that keep browser and egress sandboxes (and egress proxies) from opening
connections to the host.

A Docker network, even an internal one, routes to the host through its bridge's gateway
address, so a page could reach any service the host listens on. The INPUT chain therefore
drops new connections arriving on a browser's bridge; replies to connections the host opened
(CDP) are still accepted. Rules carry a comment naming the bridge so they can be removed with
the network. This needs root and `iptables` (the same one Docker uses); where either is
missing the browser starts anyway, the endpoint says `host_firewall=False`, and a warning is
logged.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time

from sandbox._log import logger

TAG = "agent-sandbox-browser"  # the name rules were first made with (browsers); kept for removal
# iptables' exit status for a resource problem (the tables busy with another writer: the engine
# making or removing networks at the same moment, which a service in a container shares no lock
# with). Only that is tried again: any other failure is final at once, so nothing waits for it.
BUSY = 4
TRIES = 5
RETRY_S = 0.2


def _iptables() -> str | None:
    return shutil.which("iptables")


def _call(args: list[str]) -> int:
    """iptables' exit status for `args`, tried again while the tables are busy (-1: no iptables)."""
    binary = _iptables()
    if binary is None:
        return -1
    status = -1
    for attempt in range(TRIES):
        try:
            done = subprocess.run([binary, "-w", "5", *args], capture_output=True, timeout=15, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return -1
        status = done.returncode
        if status != BUSY:
            return status
        if attempt + 1 < TRIES:
            time.sleep(RETRY_S)
    logger.bind(args=" ".join(args)).warning("host_firewall_busy")
    return status


def _run(args: list[str]) -> bool:
    return _call(args) == 0


def _rules(bridge: str) -> list[list[str]]:
    comment = ["-m", "comment", "--comment", f"{TAG}:{bridge}"]
    return [
        ["INPUT", "-i", bridge, *comment, "-j", "DROP"],
        ["INPUT", "-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *comment, "-j", "ACCEPT"],
    ]


def drop_from_bridge(bridge: str) -> bool:
    """Make sure new connections from `bridge` to the host are dropped; True when the rules are in."""
    if rules_present(bridge):
        return True
    remove_rules(bridge)  # a partial set: start over so the ACCEPT always comes before the DROP
    drop, accept = _rules(bridge)
    return _run(["-I", drop[0], "1", *drop[1:]]) and _run(["-I", accept[0], "1", *accept[1:]])


def remove_rules(bridge: str) -> None:
    """Remove the rules of a bridge (when its network is removed)."""
    for rule in _rules(bridge):
        while _run(["-D", *rule]):
            pass


def rules_present(bridge: str) -> bool:
    """Whether both rules of a bridge are in place (for doctor and audit)."""
    return all(_run(["-C", *rule]) for rule in _rules(bridge))


def _source_rules(interface: str, source: str, tag: str) -> list[list[str]]:
    comment = ["-m", "comment", "--comment", f"{TAG}:{tag}"]
    return [
        ["INPUT", "-i", interface, "-s", source, *comment, "-j", "DROP"],
        [
            "INPUT",
            "-i",
            interface,
            "-s",
            source,
            "-m",
            "conntrack",
            "--ctstate",
            "ESTABLISHED,RELATED",
            *comment,
            "-j",
            "ACCEPT",
        ],
    ]


def drop_from_source(interface: str, source: str, tag: str) -> bool:
    """Drop new connections that `source` opens to the host through `interface` (an egress proxy
    on its upstream bridge: the host's own addresses, public ones included, stay out of its
    reach; what it forwards to the internet is not INPUT and passes). True when the rules are in."""
    remove_tagged(tag)
    drop, accept = _source_rules(interface, source, tag)
    comment = ["-m", "comment", "--comment", f"{TAG}:{tag}"]
    # name lookups stay possible (the engine may hand the host's own resolver to the proxy)
    dns = [
        ["INPUT", "-i", interface, "-s", source, "-p", proto, "--dport", "53", *comment, "-j", "ACCEPT"]
        for proto in ("udp", "tcp")
    ]
    return all(_run(["-I", rule[0], "1", *rule[1:]]) for rule in (drop, accept, *dns))


def remove_tagged(tag: str) -> None:
    """Remove every INPUT rule carrying `tag` (whatever interface and source it names)."""
    binary = _iptables()
    if binary is None:
        return
    try:
        listed = subprocess.run([binary, "-w", "5", "-S", "INPUT"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return
    marker = f"{TAG}:{tag}"
    for line in listed.stdout.splitlines():
        if line.startswith("-A INPUT ") and (f'"{marker}"' in line or f" {marker} " in line):
            args = shlex.split(line)
            _run(["-D", *args[1:]])
