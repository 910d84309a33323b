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


@pytest.mark.slow
def test_image_builds_take_turns_across_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two builders started together (test workers on a fresh machine, the demo beside the tests)
    take turns: while one process holds the build lock, another's build waits for it, so they
    never race for apt's lock or debootstrap the base twice."""
    import os
    import subprocess
    import sys
    import threading

    from sandbox.runtime.docker import images

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom sandbox.runtime.docker.images import _build_lock\n"
            "with _build_lock():\n    print('held', flush=True)\n    sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        got = threading.Event()

        def build() -> None:
            with images._build_lock():
                got.set()

        waiter = threading.Thread(target=build, daemon=True)
        waiter.start()
        assert not got.wait(1.0), "a second build went ahead while the first held the lock"
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert got.wait(30), "the second build never went ahead once the first was done"
        waiter.join(5)


def test_the_build_lock_lives_only_in_a_folder_of_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link planted where the lock folder goes (another user's trick in a shared /tmp) is
    refused, never followed."""
    from sandbox.errors import SandboxUnavailable
    from sandbox.runtime.docker import images

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "agent-sandbox").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(SandboxUnavailable, match="not a folder of this user's own"):
        images.lock_dir()
    assert list(elsewhere.iterdir()) == []
