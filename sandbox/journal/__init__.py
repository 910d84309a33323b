"""The durable journal of tool calls and approvals."""

from sandbox.journal.queries import EventPage
from sandbox.journal.schema import TERMINAL
from sandbox.journal.store import Approval, Event, Journal

__all__ = ["TERMINAL", "Approval", "Event", "EventPage", "Journal"]
