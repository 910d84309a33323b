"""The durable journal of tool calls and approvals.

Names load on first use (PEP 562): a module that needs only a small part of this package (the
owners' ids, the file rules) does not pay for the store, its SQLite and its models.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from sandbox.journal.queries import EventPage
    from sandbox.journal.schema import TERMINAL
    from sandbox.journal.store import Approval, Event, Journal

__all__ = ["TERMINAL", "Approval", "Event", "EventPage", "Journal"]

_HOMES = {
    "TERMINAL": "sandbox.journal.schema",
    "Approval": "sandbox.journal.store",
    "Event": "sandbox.journal.store",
    "EventPage": "sandbox.journal.queries",
    "Journal": "sandbox.journal.store",
}


def __getattr__(name: str) -> _typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sandbox.journal' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value
