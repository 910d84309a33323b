"""Helpers shared by the container rules."""

from __future__ import annotations

from typing import Any

Doc = dict[str, Any]


def host_config(doc: Doc) -> dict[str, Any]:
    return dict(doc.get("HostConfig") or {})
