"""Tool policy: groups and wildcards, the layered resolver with provenance, explain rendering."""

from sandbox.policy.explain import explain_data, explain_text
from sandbox.policy.layers import Decision, Layer
from sandbox.policy.resolver import Identity, PolicyResolver, ResolvedPolicy, SandboxStatus
from sandbox.policy.sessions import SessionKey, parse_session_key

__all__ = [
    "Decision",
    "Identity",
    "Layer",
    "PolicyResolver",
    "ResolvedPolicy",
    "SandboxStatus",
    "SessionKey",
    "explain_data",
    "explain_text",
    "parse_session_key",
]
