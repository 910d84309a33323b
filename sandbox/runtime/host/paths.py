"""Moved to `sandbox.runtime.folders` (engine-neutral: Docker makes host folders too).

Kept only for `sandbox/testing.py`'s import until it names the new module; nothing else imports it.
"""

from __future__ import annotations

from sandbox.runtime.folders import prepare_workspace

__all__ = ["prepare_workspace"]
