"""Audit output: a human report grouped by target with mount tables, JSON, and SARIF 2.1.0."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

from sandbox.audit.findings import SEVERITY_ORDER, Finding

_SARIF_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}


def to_json(findings: list[Finding], mounts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The --json document."""
    return {
        "findings": [asdict(f) for f in findings],
        "mounts": mounts,
        "counts": {s: sum(f.severity == s for f in findings) for s in SEVERITY_ORDER},
    }


def to_text(findings: list[Finding], mounts: dict[str, list[dict[str, Any]]]) -> str:
    """The human report: per target, its mounts then its findings, most severe first."""
    by_target: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_target[f.target].append(f)
    lines: list[str] = []
    for target in sorted(set(by_target) | set(mounts)):
        lines.append(f"== {target}")
        rows = mounts.get(target, [])
        if rows:
            lines.append(f"   {'host path':<52} {'container path':<20} mode  verdict")
            for m in rows:
                lines.append(f"   {m['host']:<52} {m['container']:<20} {m['mode']:<5} {m['verdict']}")
        for f in sorted(by_target.get(target, []), key=lambda x: -SEVERITY_ORDER[x.severity]):
            cis = f" [CIS {f.cis}]" if f.cis else ""
            lines.append(f"   {f.severity.upper():<8} {f.rule} {f.title}{cis}")
            lines.append(f"            evidence: {f.evidence}")
            lines.append(f"            fix: {f.fix}")
        lines.append("")
    counts = ", ".join(
        f"{sum(f.severity == s for f in findings)} {s}"
        for s in sorted(SEVERITY_ORDER, key=lambda s: -SEVERITY_ORDER[s])
    )
    lines.append(f"{len(findings)} findings: {counts}")
    return "\n".join(lines)


def to_sarif(findings: list[Finding], version: str) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one rule per rule id and one result per finding."""
    rules: dict[str, dict[str, Any]] = {}
    for f in findings:
        rules.setdefault(
            f.rule,
            {
                "id": f.rule,
                "name": f.title.title().replace(" ", ""),
                "shortDescription": {"text": f.title},
                "help": {"text": f.fix},
                "properties": {
                    "security-severity": {
                        "critical": "9.5",
                        "high": "8.0",
                        "medium": "5.5",
                        "low": "3.0",
                        "info": "0.0",
                    }[f.severity],
                    "tags": ["security"] + ([f"CIS-{f.cis}"] if f.cis else []),
                },
            },
        )
    results = [
        {
            "ruleId": f.rule,
            "ruleIndex": list(rules).index(f.rule),
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f"{f.title}: {f.evidence}. Fix: {f.fix}"},
            "locations": [{"logicalLocations": [{"name": f.target, "kind": "resource"}]}],
        }
        for f in findings
    ]
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "agent-sandbox audit",
                        "version": version,
                        "informationUri": "https://example.invalid/agent-sandbox",
                        "rules": list(rules.values()),
                    }
                },
                "results": results,
            }
        ],
    }
