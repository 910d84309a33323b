"""The host firewall rules against this host's real iptables (root only: CI runs as root), with a
fault made to happen: the tables busy with another writer (iptables' exit status 4) for one call.
Rules are put on a bridge name no interface has, so no packet of this host is affected."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from sandbox.runtime.docker import hostfirewall

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


def busy_once(monkeypatch: pytest.MonkeyPatch, verb: str) -> list[list[str]]:
    """The first iptables call with `verb` answers 4 (busy) without running; the rest run."""
    real = subprocess.run
    seen: list[list[str]] = []

    def run(cmd: list[str], **kwargs: object) -> object:
        if verb in cmd and not seen:
            seen.append(cmd)
            return subprocess.CompletedProcess(cmd, hostfirewall.BUSY, b"", b"Resource temporarily unavailable")
        return real(cmd, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", run)  # hostfirewall calls subprocess.run
    return seen


def test_a_removal_refused_while_the_tables_are_busy_is_tried_again(
    bridge: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hostfirewall.drop_from_bridge(bridge)
    assert len(tagged(bridge)) == 2
    seen = busy_once(monkeypatch, "-D")
    hostfirewall.remove_rules(bridge)
    assert seen and tagged(bridge) == []


def test_an_insert_refused_while_the_tables_are_busy_is_tried_again(
    bridge: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = busy_once(monkeypatch, "-I")
    assert hostfirewall.drop_from_bridge(bridge)
    assert seen and hostfirewall.rules_present(bridge)
    rules = tagged(bridge)  # the ACCEPT of replies still comes before the DROP
    assert len(rules) == 2 and "ACCEPT" in rules[0] and "DROP" in rules[1]
    hostfirewall.remove_rules(bridge)
    assert tagged(bridge) == []


def test_any_other_failure_is_final_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure that is not "busy" (no permission, a bad rule) is not tried again: nothing waits."""
    calls: list[list[str]] = []

    def refuse(cmd: list[str], **kwargs: object) -> object:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, b"", b"Permission denied (you must be root)")

    monkeypatch.setattr(subprocess, "run", refuse)
    assert hostfirewall.drop_from_bridge("sbxnone") is False
    assert len(calls) <= 4, calls  # -C, -D of each rule, one -I: no retries
