"""The durable journal of tool calls and approvals."""

from sandbox.journal.store import TERMINAL, Approval, Event, Journal

__all__ = ["TERMINAL", "Approval", "Event", "Journal"]
