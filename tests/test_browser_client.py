"""The browser tool's CDP client on the orchestrator's host: doctor says whether Playwright's
driver runs, and a driver that cannot start is a SANDBOX_UNAVAILABLE the model can read, not an
INTERNAL error (seen in the service image before it had libatomic1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import load_config_text
from sandbox.errors import ErrorCode, SandboxError


def browser_config(tmp_path: Path, enabled: bool) -> Any:
    return load_config_text(
        f"state_dir: {tmp_path}\nagents: {{defaults: {{sandbox: {{mode: all, browser: {{enabled: {str(enabled).lower()}}}}}}}}}\n"
    )


@pytest.mark.slow
def test_doctor_checks_the_browser_client_only_where_a_browser_is_enabled(tmp_path: Path) -> None:
    from sandbox.runtime.docker import doctor

    assert doctor._browser_client_check(browser_config(tmp_path, False)) is None
    check = doctor._browser_client_check(browser_config(tmp_path, True))
    assert check is not None and check.status == "ok" and "Version" in check.detail, check


def test_doctor_fails_when_the_driver_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that cannot load its libraries (a python whose playwright exits 127 with the
    loader's words, the fault seen in the service image) is a failing check with the fix."""
    from sandbox.runtime.docker import doctor

    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'node: error while loading shared libraries: libatomic.so.1: cannot open shared object file' >&2\n"
        "exit 127\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    check = doctor._browser_client_check(browser_config(tmp_path, True))
    assert check is not None and check.status == "fail"
    assert "libatomic.so.1" in check.detail and "agent-sandbox[browser]" in check.fix


@pytest.mark.slow
def test_a_driver_that_cannot_start_is_sandbox_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import playwright.async_api

    from sandbox.tools.handlers import browser

    class Broken:
        async def start(self) -> Any:
            raise Exception("Connection closed while reading from the driver")  # what Playwright raises

    monkeypatch.setattr(playwright.async_api, "async_playwright", lambda: Broken())

    async def main() -> None:
        with pytest.raises(SandboxError) as err:
            await browser._browser("http://127.0.0.1:9/")
        assert err.value.code is ErrorCode.SANDBOX_UNAVAILABLE
        assert "Playwright's driver" in err.value.message and "reading from the driver" in err.value.message

    anyio.run(main)
