"""The state store: what replicas must agree on, SQLite by default, PostgreSQL when shared.

See docs/state.md; protocol.py is the contract, open.py picks the implementation.
"""

from sandbox.state.open import open_store
from sandbox.state.protocol import (
    ApprovalStore,
    QuotaLimits,
    QuotaStore,
    Refused,
    Reservation,
    StateStore,
)

__all__ = ["ApprovalStore", "QuotaLimits", "QuotaStore", "Refused", "Reservation", "StateStore", "open_store"]
