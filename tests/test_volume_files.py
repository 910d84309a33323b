"""A volume workspace's files (runtime/agent/files.py), as the engine gets them: by name, not host-side."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sandbox.config.models import FsSection
from sandbox.engine import spill
from sandbox.fs.states import FileStates
from sandbox.fs.workspace import Root, WorkspaceFiles
from sandbox.runtime.agent.files import AgentFiles
from sandbox.runtime.backends import agent_files


async def _no_link() -> Any:
    raise AssertionError("nothing here asks the agent")


def test_a_volume_keeps_no_full_output_and_a_host_folder_does(tmp_path: Path) -> None:
    """runtime/backends.py hands the engine AgentFiles for a volume; it is not host-side, so spill keeps
    no full output there and says why, while a host folder's WorkspaceFiles keeps it."""
    roots = [Root("/workspace", tmp_path / "ws", read_only=False, label="workspace")]
    states, locks = FileStates(tmp_path / "states.json"), tmp_path / "locks"
    volume = agent_files(_no_link, roots, FsSection(), states, locks, None, group_shared=False)
    host = WorkspaceFiles(roots, FsSection(), states, locks)
    assert isinstance(volume, AgentFiles) and not volume.host_side and host.host_side
    why = spill.not_kept(SimpleNamespace(files=volume))  # type: ignore[arg-type]
    assert why is not None and "the workspace is a Docker volume, so the full output is not kept" in why
    assert spill.not_kept(SimpleNamespace(files=host)) is None  # type: ignore[arg-type]
