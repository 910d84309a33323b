"""The installed hook plugins (entry point group `agent_sandbox.hooks`), found once per `sys.path`.

Finding entry points reads every installed distribution's metadata (about 13 ms with this
project's dependencies); the config's isolation check (config/isolation.py) and the
orchestrator's hook loader (engine/hooks.py) both ask, once per config loaded and per
orchestrator made. Both get the same answer from here, so the plugins the check looked at are
the plugins that are loaded. A plugin installed into a folder already on `sys.path` while the
process runs is found by the next process (as its modules would be).
"""

from __future__ import annotations

import functools
import sys
from importlib.metadata import EntryPoint, entry_points

HOOKS_GROUP = "agent_sandbox.hooks"


def hook_entry_points() -> tuple[EntryPoint, ...]:
    """The hook plugins installed for this process's `sys.path`."""
    return _found(tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _found(path: tuple[str, ...]) -> tuple[EntryPoint, ...]:  # `path` is the key: where they are found
    return tuple(entry_points(group=HOOKS_GROUP))
