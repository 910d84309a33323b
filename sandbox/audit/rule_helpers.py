"""Helpers shared by the container rules."""

from __future__ import annotations

from typing import Any

from sandbox.audit.findings import Finding, Severity

Doc = dict[str, Any]


def finding(rule: str, sev: Severity, title: str, evidence: str, fix: str, target: str, cis: str = "") -> Finding:
    return Finding(rule, sev, title, evidence, fix, target, cis)


def host_config(doc: Doc) -> dict[str, Any]:
    return dict(doc.get("HostConfig") or {})
