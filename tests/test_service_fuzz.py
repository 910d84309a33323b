"""A property-based fuzzer over the service's OpenAPI document (schemathesis) against a real server:
whatever a client sends, the service never answers 5xx, and a 2xx body matches the schema it
documents. Agents run in mode off (no containers); the token is valid, so requests reach the
handlers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from sandbox import load_config_text
from sandbox.api.app import create_app
from tests.service_helpers import TOKEN_A, serve, sha


def _config(tmp: Path) -> Any:
    (tmp / "wa").mkdir(exist_ok=True)
    return load_config_text(
        f"state_dir: {tmp / 'state'}\ntools: {{profile: coding}}\n"
        f"tenants: [{{id: acme, allow_unsandboxed: true, tokens: [{{name: ci, sha256: {sha(TOKEN_A)}}}]}}]\n"
        f"agents: {{defaults: {{sandbox: {{mode: 'off'}}}}, list: [{{id: alpha, tenant: acme, workspace: '{tmp / 'wa'}'}}]}}\n"
    )


# the document alone (no lifespan, nothing started) to generate the cases from
with tempfile.TemporaryDirectory() as _tmp:
    # the event stream never ends by design (tested on its own in test_service.py)
    schema = schemathesis.openapi.from_dict(create_app(_config(Path(_tmp))).openapi()).exclude(
        path="/v1/sessions/{key}/events"
    )


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve(_config(tmp_path_factory.mktemp("fuzz"))) as url:
        yield url


# a few examples per route in the quick loop, more in CI's thorough profile (bounded: each is a request)
EXAMPLES = 5 if settings.default.max_examples <= 15 else 50


@schema.parametrize()
@settings(max_examples=EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None)
def test_no_server_errors_and_documented_successes(case: Any, live_url: str) -> None:
    """No request gets a 5xx; every 2xx body matches the documented schema."""
    response = case.call(base_url=live_url, headers={"Authorization": f"Bearer {TOKEN_A}"}, timeout=30)
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
