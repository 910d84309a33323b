"""The progress relay's masking across chunk boundaries (api/progress_relay.py; the relay between
two real replicas over PostgreSQL is in test_shared_events.py)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from sandbox.api import progress_relay
from sandbox.api.progress_relay import CARRIED_CALLS, CARRY_MAX, ProgressRelay
from sandbox.engine.progress import ProgressBus, ProgressEvent

TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"


def event(kind: str, chunk: str | None = None, call: str = "c1") -> ProgressEvent:
    return ProgressEvent(kind, call, "t1", "exec", "agent:main:s", 0.1, {"chunk": chunk} if chunk is not None else {})  # type: ignore[arg-type]


def relayed(*events: ProgressEvent) -> list[dict[str, Any]]:
    relay = ProgressRelay(ProgressBus(), cast(Any, None))  # only the sending side's shaping runs
    for e in events:
        relay._local(e)
    return list(relay._waiting)


def test_a_secret_split_over_two_chunks_goes_out_masked_whole() -> None:
    """Masked chunk by chunk, `token ghp_abcdefghij` + `klmnop...` went out in two clear halves."""
    sent = relayed(
        event("output", f"export GITHUB_TOKEN={TOKEN[:14]}"),
        event("running"),  # a heartbeat between the two halves holds nothing back
        event("output", f"{TOKEN[14:]} done\n"),
        event("finished"),
    )
    wire = json.dumps(sent)
    assert TOKEN[:14] not in wire and TOKEN[14:] not in wire and "***" in wire
    chunks = "".join(item["detail"].get("chunk", "") for item in sent if item["kind"] == "output")
    assert chunks == "export GITHUB_TOKEN=*** done\n"
    assert [item["kind"] for item in sent] == ["running", "output", "finished"]  # the line, once ended


def test_a_long_token_split_over_two_chunks_goes_out_masked_whole() -> None:
    """A JWT of 1,500 characters (an OAuth provider's) split in its middle: neither half goes out."""
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJ" + "a" * 1400 + ".c2lnbmF0dXJlc2lnbmF0dXJl"
    sent = relayed(event("output", f"id_token {jwt[:700]}"), event("output", f"{jwt[700:]} ok\n"), event("finished"))
    wire = json.dumps(sent)
    assert jwt[600:700] not in wire and jwt[700:800] not in wire
    chunks = "".join(item["detail"].get("chunk", "") for item in sent if item["kind"] == "output")
    assert chunks == "id_token *** ok\n"


def test_a_held_word_goes_out_before_the_calls_end_and_calls_are_kept_apart() -> None:
    sent = relayed(
        event("output", "one two", call="a"),
        event("output", "other", call="b"),
        event("finished", call="a"),
        event("output", " words\n", call="b"),
    )
    by_call = [(item["call_id"], item["kind"], item["detail"].get("chunk")) for item in sent]
    assert by_call == [
        ("a", "output", "one two"),  # a line not ended: held whole, until the call's end
        ("a", "finished", None),
        ("b", "output", "other words\n"),
    ]


def test_a_secret_split_between_its_name_and_its_value_goes_out_masked() -> None:
    """A chunk that ends after `password: ` (or a flag, or `Bearer`) holds its line: the value in
    the next chunk is masked with its name, and a line longer than the hold keeps only its word."""
    for name, value in (
        ("password: ", "hunter2hunter2"),
        ("--password ", "S3cr3tPw"),
        ('{"api_key": ', '"S3cr3tPwX"}'),
    ):
        sent = relayed(event("output", f"ok\n{name}"), event("output", f"{value}\nnext\n"), event("finished"))
        chunks = [item["detail"].get("chunk") for item in sent if item["kind"] == "output"]
        assert value.strip('"}') not in json.dumps(sent) and "***" in "".join(chunks), name
        assert chunks[0] == "ok\n"
    relay = ProgressRelay(ProgressBus(), cast(Any, None))
    relay._local(event("output", "x " * (CARRY_MAX // 2 + 10) + "tail"))
    kept = str(relay._carry["c1"].detail["chunk"])  # as much of the line's end as fits, from a word
    assert len(relay._waiting) == 1 and kept.endswith(" x tail") and kept.startswith("x ") and len(kept) <= CARRY_MAX
    long_value = "a" * 3000 + " 'password': " + "'Hunter2Secret', 'x': 1}\n"
    cut = long_value.index("Hunter2")
    sent = relayed(event("output", long_value[:cut]), event("output", long_value[cut:]))
    assert "Hunter2Secret" not in json.dumps(sent)


def test_text_held_through_two_heartbeats_goes_out() -> None:
    """Output with no line's end (a prompt, a progress bar) is held through one heartbeat and goes
    out at the second; new output in between starts the wait again."""
    sent = relayed(event("output", "Continue? [y/N] "), event("running"))
    assert [item["kind"] for item in sent] == ["running"]
    sent = relayed(event("output", "Continue? [y/N] "), event("running"), event("running"))
    assert [(item["kind"], item["detail"].get("chunk")) for item in sent] == [
        ("running", None),
        ("output", "Continue? [y/N] "),
        ("running", None),
    ]
    sent = relayed(event("output", " 10%\r 20"), event("running"), event("output", "%"), event("running"))
    assert [item["detail"].get("chunk") for item in sent if item["kind"] == "output"] == [" 10%\r"]


def test_a_word_longer_than_the_hold_goes_out_as_it_is() -> None:
    """Output with no space in it (a long base64 line) is never held for good."""
    long_word = "x" * (CARRY_MAX + 10)
    sent = relayed(event("output", long_word))
    assert len(sent) == 1 and sent[0]["detail"]["chunk"].startswith("x" * 1_900)  # sent now (cut as relayed text is)


def test_a_flood_of_calls_holding_words_stays_bounded_and_loses_no_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twice the bound of calls each end a chunk inside a line of CARRY_MAX characters and never
    finish (a tenant's flood): at most the bound's lines are held, and each evicted one goes out
    whole, in order. (The bound is made 256 here, for the quick loop's sake; the real one holds
    at most 8 MiB of ASCII.)"""
    assert CARRIED_CALLS * CARRY_MAX <= 8 * 2**20
    monkeypatch.setattr(progress_relay, "CARRIED_CALLS", 256)
    bound = progress_relay.CARRIED_CALLS
    relay = ProgressRelay(ProgressBus(), cast(Any, None))
    calls = 2 * bound
    lines = [f"head {n:05d} " + "w" * (CARRY_MAX - 11) for n in range(calls)]
    for n, line in enumerate(lines):
        relay._local(event("output", line, call=f"c{n}"))
    held = relay._carry
    assert len(held) == bound
    assert sum(len(str(e.detail["chunk"])) for e in held.values()) <= bound * CARRY_MAX
    assert set(held) == {f"c{n}" for n in range(bound, calls)}  # the newest are held
    sent = [(item["call_id"], item["detail"]["chunk"]) for item in relay._waiting]
    assert sent == [(f"c{n}", lines[n][:2000] + f"... [{len(lines[n]) - 2000} more characters]") for n in range(bound)]
