"""Tenant tokens of the shared store, as every replica takes them (docs/state.md, "Tokens").

`sandbox tenants token create|revoke` with a PostgreSQL `state.url` writes the store; each
change sends NOTIFY, and each replica reloads the tokens at once. A replica loads them before it
serves its first request, reloads them every RELOAD_S besides (a lost notification costs at
most that), and after its listening connection is made again. While the store does not answer,
a replica keeps the tokens it last loaded: nothing can be made or revoked meanwhile either.
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from sandbox._log import logger
from sandbox.api.tenants import Tenants
from sandbox.errors import SandboxError
from sandbox.state.protocol import TokenStore

RELOAD_S = 30.0


async def keep_tokens_shared(
    tenants: Tenants, store: TokenStore, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Keep `tenants` holding the store's tokens until cancelled; started once they are loaded.

    Raises:
        SandboxError: SERVICE_UNAVAILABLE when the first load fails (the service does not start).
    """
    changed = [anyio.Event()]

    def on_change(_payload: str) -> None:
        changed[0].set()

    async with anyio.create_task_group() as group:
        await group.start(store.listen_tokens, on_change)  # listening before the first read: no change missed
        tenants.take_shared(await store.tokens())
        task_status.started()
        while True:
            with anyio.move_on_after(RELOAD_S):
                await changed[0].wait()
            changed[0] = anyio.Event()
            try:
                tenants.take_shared(await store.tokens())
            except SandboxError as exc:
                logger.bind(error=exc.message[:200]).warning("shared_tokens_not_reloaded")
