"""Host firewall rules that keep browser and egress sandboxes (and egress proxies) from opening
connections to the host.

A Docker network, even an internal one, routes to the host through its bridge's gateway
address, so a page could reach any service the host listens on. Our rules therefore drop new
connections arriving on a browser's or egress sandbox's bridge, and those an egress proxy opens
from its upstream address; replies to connections the host opened (CDP) are still accepted.
They live in a chain of their own (CHAIN) that INPUT jumps to first: a rule another tool puts
at the top of INPUT later (an ACCEPT of a firewall manager) would otherwise come before them, so
each check wants the jump to be INPUT's first rule and moves it back there if it is not. Rules
carry a comment naming the bridge or proxy so they can be removed with it. This needs root and
`iptables` (the same one Docker uses); where either is missing the browser starts anyway, the
endpoint says `host_firewall=False`, and a warning is logged.

The chain and its jump stay when their last rule goes (an empty chain passes everything on);
`iptables -D INPUT <the jump>; iptables -X AGENT-SANDBOX-INPUT` removes them by hand.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import time

from sandbox._log import logger

TAG = "agent-sandbox-browser"  # the name rules were first made with (browsers); kept for removal
CHAIN = "AGENT-SANDBOX-INPUT"  # where the rules live; INPUT's first rule jumps here
JUMP_NOTE = "agent-sandbox-input"  # the jump's comment (with a nonce, so an older jump can be removed by its spec)
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
        [CHAIN, "-i", bridge, *comment, "-j", "DROP"],
        [CHAIN, "-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *comment, "-j", "ACCEPT"],
    ]


def _listed(chain: str) -> list[str] | None:
    """The `-A` lines of `chain` (`iptables -S`), or None when it cannot be listed."""
    binary = _iptables()
    if binary is None:
        return None
    try:
        listed = subprocess.run([binary, "-w", "5", "-S", chain], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [line for line in listed.stdout.splitlines() if line.startswith(f"-A {chain} ")]


def _is_jump(line: str) -> bool:
    return line.startswith("-A INPUT ") and line.split()[-2:] == ["-j", CHAIN]


def jump_first() -> bool:
    """Whether INPUT's first rule jumps to our chain (so nothing in INPUT accepts before our rules)."""
    rules = _listed("INPUT") or []
    return bool(rules) and _is_jump(rules[0])


def guard_input() -> bool:
    """Make sure our chain exists and INPUT's first rule jumps to it; True when so.

    A jump that is not first is replaced: a new one goes in at the top before the old ones are
    removed (by their spec, each with a comment of its own), so the rules never stop applying.
    """
    if _listed(CHAIN) is None and not _run(["-N", CHAIN]) and _listed(CHAIN) is None:
        return False  # neither there nor made (made by another process meanwhile counts)
    rules = _listed("INPUT")
    if rules is None:
        return False
    if rules and _is_jump(rules[0]):
        return True
    note = f"{JUMP_NOTE}:{secrets.token_hex(4)}"
    if not _run(["-I", "INPUT", "1", "-m", "comment", "--comment", note, "-j", CHAIN]):
        return False
    for line in rules:
        if _is_jump(line):
            _run(["-D", *shlex.split(line)[1:]])
    return True


def drop_from_bridge(bridge: str) -> bool:
    """Make sure new connections from `bridge` to the host are dropped; True when the rules are in."""
    if not guard_input():
        return False
    if all(_run(["-C", *rule]) for rule in _rules(bridge)):
        return True
    remove_rules(bridge)  # a partial set: start over so the ACCEPT always comes before the DROP
    drop, accept = _rules(bridge)
    return _run(["-I", drop[0], "1", *drop[1:]]) and _run(["-I", accept[0], "1", *accept[1:]])


def remove_rules(bridge: str) -> None:
    """Remove the rules of a bridge (when its network is removed), also from INPUT itself, where
    versions before the chain put them."""
    for rule in _rules(bridge):
        while _run(["-D", *rule]):
            pass
        while _run(["-D", "INPUT", *rule[1:]]):
            pass


def rules_present(bridge: str) -> bool:
    """Whether both rules of a bridge are in place, in our chain, and INPUT jumps there first
    (for doctor, audit and adoption)."""
    return jump_first() and all(_run(["-C", *rule]) for rule in _rules(bridge))


def _source_rules(interface: str, source: str, tag: str) -> list[list[str]]:
    comment = ["-m", "comment", "--comment", f"{TAG}:{tag}"]
    return [
        [CHAIN, "-i", interface, "-s", source, *comment, "-j", "DROP"],
        [
            CHAIN,
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
    if not guard_input():
        return False
    # the old set (an adopted proxy's, maybe for another address) goes only once the new one is
    # in: a proxy being adopted is never without its rules; where the two are the same, the
    # removal takes the first copy of each and one stays
    old = _tagged(tag)
    drop, accept = _source_rules(interface, source, tag)
    comment = ["-m", "comment", "--comment", f"{TAG}:{tag}"]
    # name lookups stay possible (the engine may hand the host's own resolver to the proxy)
    dns = [
        [CHAIN, "-i", interface, "-s", source, "-p", proto, "--dport", "53", *comment, "-j", "ACCEPT"]
        for proto in ("udp", "tcp")
    ]
    made = all(_run(["-I", rule[0], "1", *rule[1:]]) for rule in (drop, accept, *dns))
    for line in old if made else []:  # a partial new set keeps the old one beside it
        _run(["-D", *shlex.split(line)[1:]])
    return made


def _tagged(tag: str) -> list[str]:
    """The rules carrying `tag`: in our chain, and in INPUT (made there by versions before the chain)."""
    marker = f"{TAG}:{tag}"
    return [
        line
        for chain in (CHAIN, "INPUT")
        for line in _listed(chain) or []
        if f'"{marker}"' in line or f" {marker} " in line
    ]


def remove_tagged(tag: str) -> None:
    """Remove every rule carrying `tag` (whatever interface and source it names) from our chain,
    and from INPUT where versions before the chain put them."""
    for line in _tagged(tag):
        _run(["-D", *shlex.split(line)[1:]])
