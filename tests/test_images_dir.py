"""The image build contexts are found from the package's own place in a checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.runtime.docker.images import images_dir

ROOT = Path(__file__).resolve().parents[1]


def test_images_dir_is_the_checkouts_images_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without $SANDBOX_IMAGES_DIR, images/ is found beside the package, whatever folder images.py lives in."""
    monkeypatch.delenv("SANDBOX_IMAGES_DIR", raising=False)
    assert images_dir() == ROOT / "images"
    assert (images_dir() / "sandbox" / "Dockerfile").is_file()


def test_images_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$SANDBOX_IMAGES_DIR wins (an installed package has no checkout beside it)."""
    monkeypatch.setenv("SANDBOX_IMAGES_DIR", str(tmp_path))
    assert images_dir() == tmp_path
