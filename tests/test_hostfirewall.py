"""The host firewall rules against this host's real iptables (root only: CI runs as root), with a
fault made to happen: another writer of the tables makes one call fail. Rules are put on a bridge
name no interface has, so no packet of this host is affected."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from sandbox.runtime import hostfirewall

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("iptables") is None, reason="needs root and iptables (CI has both)"
)


def tagged(bridge: str) -> list[str]:
    listed = subprocess.run(["iptables", "-w", "5", "-S", "INPUT"], capture_output=True, text=True, check=True)
    return [line for line in listed.stdout.splitlines() if f"{hostfirewall.TAG}:{bridge}" in line]


@pytest.fixture
def bridge() -> Iterator[str]:
    name = f"sbxt{os.getpid() % 10**6}"
    yield name
    for line in tagged(name):  # whatever a failing test left
        subprocess.run(["iptables", "-w", "5", *shlex.split(line.replace("-A ", "-D ", 1))], check=False)


def test_a_removal_that_fails_once_is_checked_and_tried_again(bridge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hostfirewall.drop_from_bridge(bridge)
    assert len(tagged(bridge)) == 2
    real = hostfirewall._run
    failed: list[list[str]] = []

    def busy_once(args: list[str]) -> bool:
        if args[0] == "-D" and not failed:
            failed.append(args)
            return False  # the table was busy: the rule is still there
        return real(args)

    monkeypatch.setattr(hostfirewall, "_run", busy_once)
    hostfirewall.remove_rules(bridge)
    assert failed and tagged(bridge) == []


def test_an_insert_that_fails_once_is_tried_again(bridge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = hostfirewall._run
    failed: list[list[str]] = []

    def busy_once(args: list[str]) -> bool:
        if args[0] == "-I" and not failed:
            failed.append(args)
            return False
        return real(args)

    monkeypatch.setattr(hostfirewall, "_run", busy_once)
    assert hostfirewall.drop_from_bridge(bridge)
    assert failed and hostfirewall.rules_present(bridge)
    # the ACCEPT of replies still comes before the DROP
    rules = tagged(bridge)
    assert len(rules) == 2 and "ACCEPT" in rules[0] and "DROP" in rules[1]
    hostfirewall.remove_rules(bridge)
    assert tagged(bridge) == []
