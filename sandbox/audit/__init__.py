"""Audit: rules over the config, live containers and the engine; text, JSON and SARIF reports.

Import from the modules (`sandbox.audit.run` runs an audit, `sandbox.audit.findings` holds what
it reports): this package imports nothing, so `explain` and `doctor` can use one rule module
(`sandbox.audit.ownership`) without loading every rule, the policy resolver and the journal.
"""
