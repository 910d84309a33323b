"""The PostgreSQL store's shared rows beyond calls, quotas and approvals: shipped events and
the progress broadcast, tenant tokens, session uids, pool claims, session records and loop
history, sandboxes being made. A mixin of :class:`~sandbox.state.postgres.store.PostgresStore` (its pool and its URL);
each method is one pooled connection over the SQL of its own module."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from sandbox.errors import SandboxError
from sandbox.journal.queries import Event, EventPage
from sandbox.state.postgres import approvals, engine_state, events, loops, quotas, tokens
from sandbox.state.postgres.listen import Wakeups
from sandbox.state.protocol import Refused, SharedPrune

if TYPE_CHECKING:
    from sandbox.config.state import StateUrl

BROADCAST_CHANNEL = "sbx_progress"  # the replicas' progress events (api/progress_relay.py)


class SharedRowsMixin:
    """Events, broadcasts, tokens, uids, pool claims, session records and loops (see the module)."""

    if TYPE_CHECKING:  # provided by PostgresStore
        url: StateUrl
        owner: str
        _unreleased_makes: set[str]  # makes whose release failed: retried (_retry_releases)
        _unclosed: list[tuple[str, list[str]]]  # sessions whose close failed: retried

        def _conn(self) -> AbstractAsyncContextManager[Any]: ...

    async def shipped_up_to(self, origin: str) -> int:
        """See :class:`~sandbox.state.protocol.EventStore`."""
        async with self._conn() as conn:
            return await events.shipped_up_to(conn, origin)

    async def add_events(self, origin: str, found: list[Event]) -> None:
        """See :class:`~sandbox.state.protocol.EventStore`."""
        async with self._conn() as conn:
            await events.add(conn, origin, found)

    async def events_page(
        self,
        *,
        tenant: str | None,
        session: str | None = None,
        trace_id: str | None = None,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 100,
        tool: str | None = None,
    ) -> EventPage:
        """See :class:`~sandbox.state.protocol.EventStore`."""
        async with self._conn() as conn:
            return await events.page(
                conn, tenant=tenant, session=session, trace_id=trace_id, since=since, until=until, cursor=cursor,
                limit=limit, tool=tool,
            )  # fmt: skip

    async def prune_events(self, *, max_age_s: float | None, max_bytes: int | None) -> SharedPrune:
        """Apply `journal.retention` to the shared events (one replica at a time; see events.py)."""
        async with self._conn() as conn:
            # the database's clock, not this replica's: one replica whose clock runs ahead would
            # otherwise delete every replica's rows that are younger than the retention
            now = await events.database_now(conn)
            report = await events.prune(conn, max_age_s=max_age_s, max_bytes=max_bytes, now=now)
            if max_age_s is not None and not report.skipped:  # loop history and records older than the log go too
                await loops.prune(conn, now - max_age_s)
                await engine_state.prune(conn, now - max_age_s)
                await approvals.prune(conn, now - max_age_s)
            return report

    async def broadcast(self, payloads: list[str]) -> None:
        """See :class:`~sandbox.state.protocol.EventStore`: one NOTIFY each, in one transaction."""
        async with self._conn() as conn, conn.transaction():
            for payload in payloads:
                await conn.execute("SELECT pg_notify(%s, %s)", (BROADCAST_CHANNEL, payload))

    async def listen_broadcasts(
        self, on_note: Callable[[str], None], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """See :class:`~sandbox.state.protocol.EventStore`: LISTEN on a connection of its own."""
        await Wakeups(self.url, BROADCAST_CHANNEL, on_note).run(task_status=task_status)

    async def add_token(self, tenant: str, name: str, sha256: str) -> None:
        """See :class:`~sandbox.state.protocol.TokenStore`."""
        async with self._conn() as conn:
            await tokens.add(conn, tenant, name, sha256)

    async def remove_token(self, tenant: str, name: str) -> bool:
        """See :class:`~sandbox.state.protocol.TokenStore`."""
        async with self._conn() as conn:
            return await tokens.remove(conn, tenant, name)

    async def tokens(self) -> list[dict[str, str]]:
        """See :class:`~sandbox.state.protocol.TokenStore`."""
        async with self._conn() as conn:
            return await tokens.every(conn)

    async def listen_tokens(
        self, on_change: Callable[[str], None], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """See :class:`~sandbox.state.protocol.TokenStore`."""
        await Wakeups(self.url, tokens.CHANNEL, on_change).run(task_status=task_status)

    async def session_uid(self, scope: str, session: str) -> tuple[int, str] | None:
        """See :class:`~sandbox.state.protocol.SessionUids`."""
        async with self._conn() as conn:
            return await engine_state.find(conn, scope, session)

    async def claim_uid(self, scope: str, uid: int, session: str, token: str) -> tuple[str, str] | None:
        """See :class:`~sandbox.state.protocol.SessionUids`."""
        async with self._conn() as conn:
            return await engine_state.claim(conn, scope, uid, session, token)

    async def claim_member(self, container_id: str, session: str) -> bool:
        """See :class:`~sandbox.state.protocol.SharedPoolClaims`."""
        async with self._conn() as conn:
            return await engine_state.claim_member(conn, container_id, session)

    async def take_sandbox(
        self, tenant: str, sandbox: str, limit: int, listed: Callable[[], Awaitable[set[str]]]
    ) -> str | Refused | None:
        """See :class:`~sandbox.state.protocol.SandboxMakes`.

        The make is recorded first (under the tenant's lock, engine_state.record_make), then the
        engine is listed with no transaction or connection held: a make released meanwhile has
        its sandbox in the list, and a make recorded after this one counts this one. One
        tenant's slow engine list holds nobody's lock.
        """
        async with self._conn() as conn:
            make_id, making = await engine_state.record_make(conn, self.owner, tenant, sandbox)
        try:
            live = await listed()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._drop_make(make_id)
            raise
        held = live | making
        if sandbox in live:
            await self._drop_make(make_id)
            return None
        if sandbox not in held and len(held) >= limit:
            await self._drop_make(make_id)
            return Refused("max_sandboxes", len(held), limit, 60)
        return make_id

    async def release_sandbox(self, make_id: str) -> None:
        """See :class:`~sandbox.state.protocol.SandboxMakes`; when the store does not answer, the
        release raises and is retried with each lease renewal until it lands."""
        try:
            async with self._conn() as conn:
                await engine_state.release_sandbox(conn, make_id)
        except SandboxError:
            self._unreleased_makes.add(make_id)
            raise
        self._unreleased_makes.discard(make_id)

    async def _drop_make(self, make_id: str) -> None:
        with contextlib.suppress(SandboxError):  # queued for the next renewal
            await self.release_sandbox(make_id)

    async def close_sessions(self, tenant: str, keys: list[str]) -> None:
        """See :class:`~sandbox.state.protocol.QuotaStore`; retried like a release when the
        store does not answer (a closed session must not keep its place)."""
        try:
            async with self._conn() as conn:
                await quotas.close_sessions(conn, tenant, keys)
        except SandboxError:
            self._unclosed.append((tenant, keys))
            raise

    async def _retry_releases(self) -> None:
        """What failed to go back while the store did not answer (each lease renewal)."""
        for make_id in list(self._unreleased_makes):
            await self._drop_make(make_id)
        unclosed, self._unclosed = self._unclosed, []
        for tenant, keys in unclosed:
            with contextlib.suppress(SandboxError):  # queued again
                await self.close_sessions(tenant, keys)

    async def session_record(self, tenant: str, session: str, kind: str, key: str) -> str | None:
        """See :class:`~sandbox.state.protocol.SessionRecords`."""
        async with self._conn() as conn:
            return await engine_state.record(conn, tenant, session, kind, key)

    async def session_records(self, tenant: str, session: str, kind: str) -> dict[str, str]:
        """See :class:`~sandbox.state.protocol.SessionRecords`."""
        async with self._conn() as conn:
            return await engine_state.records(conn, tenant, session, kind)

    async def put_session_record(
        self, tenant: str, session: str, kind: str, key: str, value: str | None, *, only_existing: bool = False
    ) -> None:
        """See :class:`~sandbox.state.protocol.SessionRecords`."""
        async with self._conn() as conn:
            await engine_state.put_record(conn, tenant, session, kind, key, value, only_existing=only_existing)

    async def loop_add(self, tenant: str, session: str, tool: str, args: str, result: str) -> None:
        """See :class:`~sandbox.state.protocol.SharedLoops`."""
        async with self._conn() as conn:
            await loops.add(conn, tenant, session, tool, args, result)

    async def loop_recent(self, tenant: str, session: str, window: int) -> tuple[bool, list[tuple[str, str, str]]]:
        """See :class:`~sandbox.state.protocol.SharedLoops`."""
        async with self._conn() as conn:
            return await loops.recent(conn, tenant, session, window)

    async def loop_trip(self, tenant: str, session: str) -> None:
        """See :class:`~sandbox.state.protocol.SharedLoops`."""
        async with self._conn() as conn:
            await loops.trip(conn, tenant, session)

    async def loop_reset(self, tenant: str, session: str) -> None:
        """See :class:`~sandbox.state.protocol.SharedLoops`."""
        async with self._conn() as conn:
            await loops.reset(conn, tenant, session)
