"""What an event row weighs on disk: the fair share's unit (journal/size_prune.py).

A tenant chooses much of what its rows hold (the size of a call's output, its session key, its
tool name), so a row is weighed the way SQLite lays it out, not by its data alone: the record
(every column) in the table's b-tree, where a row takes its share of a page (a record of a bit
over half a page takes a page of its own) or spills into overflow pages, plus its seven index
entries (the text columns each index holds, a rowid and a header each, in pages about 70% full).
"""

from __future__ import annotations

import sqlite3

# the record's bytes, in SQL over an events row: every text column, plus its header and the two
# reals (18 bytes, about: a reviewer measured 40 as 22 too many, which doubled the weight of rows
# just under half a page)
PAYLOAD = (
    "length(CAST(data AS BLOB)) + length(CAST(trace_id AS BLOB)) + length(CAST(call_id AS BLOB)) + "
    "length(CAST(session AS BLOB)) + length(CAST(tenant AS BLOB)) + length(CAST(agent AS BLOB)) + "
    "length(CAST(tool AS BLOB)) + length(CAST(stage AS BLOB)) + 18"
)
# a call record's bytes (the `calls` table: every column) and the key bytes of its three indexes
# (the primary key, calls_key and calls_created)
CALL_PAYLOAD = (
    "length(CAST(call_id AS BLOB)) + length(CAST(tenant AS BLOB)) + length(CAST(session AS BLOB)) + "
    "length(CAST(agent AS BLOB)) + length(CAST(tool AS BLOB)) + length(CAST(COALESCE(idem_key, '') AS BLOB)) + "
    "length(CAST(fingerprint AS BLOB)) + length(CAST(state AS BLOB)) + length(CAST(COALESCE(result, '') AS BLOB)) + "
    "length(CAST(reason AS BLOB)) + 30"
)
CALL_INDEX_KEYS = (
    "length(CAST(call_id AS BLOB)) + length(CAST(tenant AS BLOB)) + length(CAST(COALESCE(idem_key, '') AS BLOB)) + 8"
)
# the key bytes of the seven index entries: events_call, events_trace, events_session,
# events_tenant, events_ts, events_tenant_session and events_tenant_trace (schema.py)
INDEX_KEYS = (
    "2 * length(CAST(trace_id AS BLOB)) + length(CAST(call_id AS BLOB)) + 2 * length(CAST(session AS BLOB)) + "
    "3 * length(CAST(tenant AS BLOB)) + 8"
)
INDEX_ENTRY_OVERHEAD = 12  # a rowid, a header and a cell pointer per index entry
INDEXES = 7
FUNCTION = "sbx_row_weight"  # the SQL function that weighs a row (registered by register())


def row_weight(payload: int, index_keys: int, page_size: int) -> int:
    """The bytes a row of `payload` record bytes and `index_keys` index key bytes takes."""
    usable = page_size
    max_local = usable - 35  # SQLite's table b-tree leaf: the largest record kept on its page
    min_local = (usable - 12) * 32 // 255 - 23
    if payload <= max_local:
        table = usable / ((usable - 8) // (payload + 4))  # rows of this size that fit on a page
    else:  # the first part stays on a page of the table, the rest fills overflow pages
        local = min_local + (payload - min_local) % (usable - 4)
        local = min_local if local > max_local else local
        table = usable / ((usable - 8) // (local + 4)) + -(-(payload - local) // (usable - 4)) * usable
    index = (index_keys + INDEXES * INDEX_ENTRY_OVERHEAD) * 10 / 7
    return int(table + index)


def register(db: sqlite3.Connection, page_size: int) -> None:
    """Make `sbx_row_weight(payload, index_keys)` callable on `db` (for the usage scan)."""
    db.create_function(
        FUNCTION, 2, lambda payload, keys: row_weight(int(payload), int(keys), page_size), deterministic=True
    )
