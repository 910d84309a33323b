"""The durable journal of tool calls and approvals.

Names load on first use (PEP 562): a module that needs only a small part of this package (the
owners' ids, the file rules) does not pay for the store, its SQLite and its models.
"""

import typing as _typing

from sandbox._lazy import lazy_names as _lazy_names

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


if not _typing.TYPE_CHECKING:  # type checkers see the imports above: a misspelt name stays an error
    __getattr__ = _lazy_names(__name__, _HOMES, globals())
