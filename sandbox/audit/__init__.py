"""Audit: rules over the config, live containers and the engine; text, JSON and SARIF reports."""

from sandbox.audit.findings import Finding, at_or_above
from sandbox.audit.run import AuditResult, mount_map, run_audit

__all__ = ["AuditResult", "Finding", "at_or_above", "mount_map", "run_audit"]
