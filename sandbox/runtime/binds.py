"""The bind names the runtime modules still import from here; the checks are sandbox/config/binds.py.

Kept only for spec.py (changed on another branch of issue 25): import from
`sandbox.config.binds` instead, and remove this module when none does.
"""

from __future__ import annotations

from sandbox.config.binds import CONTAINER_WORKDIR, PARENT_MOUNT, BindSpec, check_source, validate_binds

__all__ = ["CONTAINER_WORKDIR", "PARENT_MOUNT", "BindSpec", "check_source", "validate_binds"]
