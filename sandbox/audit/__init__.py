"""Audit: rules over the config, live containers and the engine; text, JSON and SARIF reports.

Names load on first use (PEP 562): `explain` and `doctor` use one rule module without paying
for every rule, the policy resolver and the journal.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from sandbox.audit.findings import Finding, at_or_above
    from sandbox.audit.run import AuditResult, mount_map, run_audit

__all__ = ["AuditResult", "Finding", "at_or_above", "mount_map", "run_audit"]

_HOMES = {
    "AuditResult": "sandbox.audit.run",
    "Finding": "sandbox.audit.findings",
    "at_or_above": "sandbox.audit.findings",
    "mount_map": "sandbox.audit.run",
    "run_audit": "sandbox.audit.run",
}


def __getattr__(name: str) -> _typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sandbox.audit' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value
