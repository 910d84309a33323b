"""What an event row weighs on disk: the fair share's unit (journal/size_prune.py).

A tenant chooses much of what its rows hold (the size of a call's output, its session key, its
tool name), so a row is weighed the way SQLite lays it out, not by its data alone: the record
(every column) in the table's b-tree, where a row takes its share of a page (a record of a bit
over half a page takes a page of its own) or spills into overflow pages, plus its seven index
entries (the text columns each index holds, a rowid and a header each, in pages about 70% full).
"""

from __future__ import annotations

import sqlite3


def _bytes_of(*columns: str) -> str:
    """SQL: the bytes of these text columns (NULL as none)."""
    return " + ".join(f"length(CAST(COALESCE({column}, '') AS BLOB))" for column in columns)


# the record's bytes, in SQL over an events row: every text column, plus its header and the two
# reals (18 bytes, about: a reviewer measured 40 as 22 too many, which doubled the weight of rows
# just under half a page)
PAYLOAD = _bytes_of("data", "trace_id", "call_id", "session", "tenant", "agent", "tool", "stage") + " + 18"
# the key bytes of the seven index entries: events_call, events_trace, events_session,
# events_tenant, events_ts, events_tenant_session and events_tenant_trace (schema.py)
INDEX_KEYS = _bytes_of("trace_id", "trace_id", "call_id", "session", "session", "tenant", "tenant", "tenant") + " + 8"
INDEXES = 7
# a call record's bytes (the `calls` table: every column) and the key bytes of its three indexes
# (the primary key, calls_key and calls_created)
CALL_PAYLOAD = (
    _bytes_of("call_id", "tenant", "session", "agent", "tool", "idem_key", "fingerprint", "state", "result", "reason")
    + " + 30"
)
CALL_INDEX_KEYS = _bytes_of("call_id", "tenant", "idem_key") + " + 8"
CALL_INDEXES = 3
INDEX_ENTRY_OVERHEAD = 12  # a rowid, a header and a cell pointer per index entry
FUNCTION = "sbx_row_weight"  # the SQL function that weighs a row (registered by register())


def row_weight(payload: int, index_keys: int, page_size: int, indexes: int = INDEXES) -> int:
    """The bytes a row of `payload` record bytes takes, with `indexes` index entries holding
    `index_keys` key bytes in all."""
    usable = page_size
    max_local = usable - 35  # SQLite's table b-tree leaf: the largest record kept on its page
    min_local = (usable - 12) * 32 // 255 - 23
    if payload <= max_local:
        table = usable / ((usable - 8) // (payload + 4))  # rows of this size that fit on a page
    else:  # the first part stays on a page of the table, the rest fills overflow pages
        local = min_local + (payload - min_local) % (usable - 4)
        local = min_local if local > max_local else local
        table = usable / ((usable - 8) // (local + 4)) + -(-(payload - local) // (usable - 4)) * usable
    index = (index_keys + indexes * INDEX_ENTRY_OVERHEAD) * 10 / 7
    return int(table + index)


def register(db: sqlite3.Connection, page_size: int) -> None:
    """Make `sbx_row_weight(payload, index_keys, indexes)` callable on `db` (for the usage scan)."""
    db.create_function(
        FUNCTION,
        3,
        lambda payload, keys, indexes: row_weight(int(payload), int(keys), page_size, int(indexes)),
        deterministic=True,
    )
