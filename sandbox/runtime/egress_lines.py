"""The egress proxy's request lines, read as untrusted input and written into the journal; the
same on every engine (Docker reads a proxy container's log, Kubernetes a proxy Pod's).

A proxy prints one JSON line per request (images/egress/egress_state.py: `emit`), numbered per
proxy incarnation. Each incarnation's lines are journaled as the numbered notes of one pseudo
call (`egress:...`), so a line is journaled once even when two processes collect at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.journal.store import Journal

TOOL = "egress"
MAX_LINE = 4096  # a longer log line is not one the addon wrote (it caps its fields)
LINE_FIELDS = frozenset(
    {
        "injected",
        "egress",
        "ts",
        "tenant",
        "agent",
        "scope",
        "session",
        "method",
        "host",
        "port",
        "status",
        "bytes_up",
        "bytes_down",
        "verdict",
        "reason",
        "client",
    }
)


def parse_lines(raw: bytes, after: int) -> list[dict[str, Any]]:
    """The request lines in a proxy's output numbered above `after` (oldest first).

    The proxy handles hostile traffic, so its output is read as untrusted: only lines that parse
    as the addon's JSON objects, within a size cap, with known fields of plain types.
    """
    out = []
    for line in raw.splitlines():
        if len(line) > MAX_LINE or not line.startswith(b'{"egress":'):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        seq = item.get("egress") if isinstance(item, dict) else None
        if not isinstance(seq, int) or seq <= after or "ready" in item:
            continue
        out.append({k: v for k, v in item.items() if k in LINE_FIELDS and isinstance(v, (str, int, float))})
    return out


def journal_lines(
    journal: Journal, call_id: str, owner: dict[str, str], lines: list[dict[str, Any]], *, after: int, gaps: bool
) -> None:
    """Write `lines` (numbered above `after`, oldest first) as notes of `call_id`, for `owner`
    (session, tenant, agent). With `gaps`, a number skipped is on record as lost: the proxy
    wrote lines that are gone (its log rotated under a flood). Without (a proxy serving many
    sandboxes, whose other lines are not this one's), skipped numbers are someone else's."""
    expected = after + 1
    for line in lines:
        seq = int(line["egress"])
        if gaps and seq > expected:
            journal.append_note(
                ts=float(line.get("ts", 0.0)),
                call_id=call_id,
                tool=TOOL,
                seq=expected,
                **owner,
                data={
                    "verdict": "lost",
                    "reason": f"proxy lines {expected}..{seq - 1} were not collected (rotated away)",
                },
            )
        journal.append_note(
            ts=float(line.get("ts", 0.0)),
            call_id=call_id,
            tool=TOOL,
            seq=seq,
            **owner,
            data={k: v for k, v in line.items() if k != "egress"},
        )
        expected = seq + 1
