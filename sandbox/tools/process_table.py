"""A session's table of background processes (ids, commands, how far each was polled): in the
session's state dir, or in the shared store where several replicas serve the session, so a
process started through one replica is polled, written to and killed through any other.

The process itself, its output and its exit status live in the sandbox; this table is only
what the process tool knows about them.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

from sandbox.state.protocol import SessionRecords

Entry = dict[str, Any]
KIND = "process"


class ProcessTable(Protocol):
    """One session's process records."""

    async def all(self) -> dict[str, Entry]:
        """Every record, by process id."""
        ...

    async def get(self, proc_id: str) -> Entry | None:
        """One record, or None."""
        ...

    async def put(self, proc_id: str, entry: Entry | None) -> None:
        """Record `entry` (None: forget the process)."""
        ...

    async def update(self, proc_id: str, entry: Entry) -> None:
        """Replace the record of a process still in the table (a forgotten one stays forgotten)."""
        ...


class FileProcessTable:
    """The table as `processes.json` in the session's state dir (one host)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "processes.json"

    def _load(self) -> dict[str, Entry]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}

    async def all(self) -> dict[str, Entry]:
        """See :class:`ProcessTable`."""
        return self._load()

    async def get(self, proc_id: str) -> Entry | None:
        """See :class:`ProcessTable`."""
        return self._load().get(proc_id)

    async def update(self, proc_id: str, entry: Entry) -> None:
        """See :class:`ProcessTable`."""
        if proc_id in self._load():
            await self.put(proc_id, entry)

    async def put(self, proc_id: str, entry: Entry | None) -> None:
        """See :class:`ProcessTable`: the file replaced whole (a new name, renamed over it)."""
        table = self._load()
        if entry is None:
            if table.pop(proc_id, None) is None:
                return
        else:
            table[proc_id] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.write_text(json.dumps(table, indent=1))
            tmp.replace(self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


class SharedProcessTable:
    """The table as rows of the shared store (several replicas serve one session)."""

    def __init__(self, store: SessionRecords, tenant: str, session: str) -> None:
        self.store = store
        self.tenant = tenant
        self.session = session

    async def all(self) -> dict[str, Entry]:
        """See :class:`ProcessTable`."""
        rows = await self.store.session_records(self.tenant, self.session, KIND)
        return {key: json.loads(value) for key, value in rows.items()}

    async def get(self, proc_id: str) -> Entry | None:
        """See :class:`ProcessTable`."""
        value = await self.store.session_record(self.tenant, self.session, KIND, proc_id)
        return None if value is None else dict(json.loads(value))

    async def put(self, proc_id: str, entry: Entry | None) -> None:
        """See :class:`ProcessTable`."""
        value = None if entry is None else json.dumps(entry)
        await self.store.put_session_record(self.tenant, self.session, KIND, proc_id, value)

    async def update(self, proc_id: str, entry: Entry) -> None:
        """See :class:`ProcessTable`: one UPDATE, so a record another replica removed meanwhile
        is not made again."""
        await self.store.put_session_record(
            self.tenant, self.session, KIND, proc_id, json.dumps(entry), only_existing=True
        )
