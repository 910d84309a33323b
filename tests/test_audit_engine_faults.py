"""The audit against an engine that misbehaves: faults reach the user as coded errors, not tracebacks."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest
import requests

from sandbox.audit.run import run_audit
from sandbox.errors import SandboxError


class FlakyEngine:
    """A docker client whose container disappears between listing and inspect (a real race)."""

    def __init__(self) -> None:
        self.api = self

    def info(self) -> dict[str, Any]:
        return {"SecurityOptions": ["name=seccomp"], "ServerVersion": "20.10"}

    def version(self) -> dict[str, Any]:
        return {"Components": []}

    def containers(self, **_: Any) -> list[dict[str, Any]]:
        return [{"Id": "gone-meanwhile"}]

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        raise docker.errors.NotFound(f"No such container: {container_id}")

    @property
    def images(self) -> Any:
        raise docker.errors.NotFound("no images here")


class DeadEngine(FlakyEngine):
    """An engine that stops answering mid-audit."""

    def containers(self, **_: Any) -> list[dict[str, Any]]:
        raise requests.exceptions.ConnectionError("connection refused")


def test_container_removed_between_list_and_inspect_is_skipped(make_config: Any) -> None:
    """A container gone between `list` and `inspect` is left out, not a traceback."""
    result = run_audit(make_config("{}"), FlakyEngine())
    assert all("gone-meanwhile" not in f.target for f in result.findings)


def test_engine_that_stops_answering_is_a_coded_error(make_config: Any) -> None:
    """A connection error mid-audit is SANDBOX_UNAVAILABLE (mapped), not a raw requests exception."""
    with pytest.raises(SandboxError) as info:
        run_audit(make_config("{}"), DeadEngine())
    assert info.value.code == "SANDBOX_UNAVAILABLE"
