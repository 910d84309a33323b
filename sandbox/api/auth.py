"""The bearer-token dependency every tenant route declares."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sandbox.api.bodies import mark_authenticated, unauthenticated
from sandbox.api.tenants import Caller, Tenants


async def current_caller(request: Request) -> Caller:
    """The tenant behind the request's bearer token; 401 otherwise. Only then may the request's
    body be read (api/bodies.py), and its connection counts as a tenant's (api/connections.py).

    Async although it blocks on nothing (hashing, a stat of the token file): a plain function
    would cost every request a trip through the thread pool."""
    tenants: Tenants = request.app.state.tenants
    found = tenants.from_authorization(request.headers.get("authorization"))
    if found is None:
        raise unauthenticated()
    mark_authenticated(request.scope)
    return found


# FastAPI reads route annotations by name from the module that defines the route
CallerDep = Annotated[Caller, Depends(current_caller)]
