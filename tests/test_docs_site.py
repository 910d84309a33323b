"""The reference site builds with `mkdocs build --strict` (every page in the nav, no broken link
or anchor), its generated tables hold what the code has (every config key, every HTTP route,
every CLI command), and README stays the short front page it is meant to be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # a real build of the site: seconds


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    before = sorted(p.name for p in ROOT.iterdir())
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert "WARNING" not in built.stderr, built.stderr[-4000:]
    assert sorted(p.name for p in ROOT.iterdir()) == before  # nothing written into the checkout
    return out


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_every_config_key_of_the_models_is_in_the_generated_table(site: Path) -> None:
    from sandbox.config.models import Config

    page = _page(site, "config")
    for key in Config.model_fields:
        assert f"<code>{key}</code>" in page, key
    for deep in ("agents.defaults.sandbox.browser.cdp_port", "tenants[].quotas.max_sandboxes", "state.url"):
        assert f"<code>{deep}</code>" in page, deep


def test_every_route_of_the_openapi_document_is_in_the_generated_table(site: Path) -> None:
    from sandbox.api.app import create_app
    from sandbox.config.models import Config

    config = Config.model_validate({"tenants": [{"id": "t", "tokens": [{"name": "n", "sha256": "0" * 64}]}]})
    page = _page(site, "service")
    for path in create_app(config).openapi()["paths"]:
        assert f"<code>{path}</code>" in page, path


def test_every_cli_command_is_in_the_generated_reference(site: Path) -> None:
    import click

    from sandbox.cli import main

    page = _page(site, "cli")
    context = click.Context(main)
    for name in main.list_commands(context):
        assert f"sandbox {name}" in page, name


def test_the_home_page_is_the_readme_with_its_links_made_relative(site: Path) -> None:
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "The two commands" in home and 'href="getting-started/"' in home and 'href="docs/' not in home


def test_readme_is_the_front_page_under_300_lines() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    assert "scripts/demo" in readme and "scripts/test" in readme  # the two commands
    for linked in ("docs/getting-started.md", "docs/config.md", "docs/security.md", "docs/service.md"):
        assert f"]({linked})" in readme and (ROOT / linked).is_file(), linked
