"""What an audit reports: findings with a stable rule id, a severity, evidence and a fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "high", "medium", "low", "info"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


@dataclass(frozen=True)
class Finding:
    """One broken rule on one target (an agent's configured sandbox, a live container, the engine)."""

    rule: str  # stable id, e.g. SBX-C001
    severity: Severity
    title: str
    evidence: str
    fix: str
    target: str  # "agent main (config)", "container sbx-...", "engine"
    cis: str = ""  # CIS Docker Benchmark control, when one applies


def at_or_above(findings: list[Finding], threshold: str) -> list[Finding]:
    """Findings whose severity is at least `threshold`."""
    floor = SEVERITY_ORDER[threshold]
    return [f for f in findings if SEVERITY_ORDER[f.severity] >= floor]
