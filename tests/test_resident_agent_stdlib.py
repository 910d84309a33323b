"""The resident agent's stand-ins for standard modules it no longer imports (docs/benchmarks.md,
density): its JSON on `_json`, its selector on `select.epoll`, its `suppress`. Each must behave as
the module it replaces, on hostile input too; and the agent must really not import them."""

from __future__ import annotations

import json
import math
import os
import runpy
import selectors
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.runtime.agent.frames import HEAD

AGENT = Path(__file__).resolve().parents[1] / "images/sandbox/sandbox_agent.py"
AGENT_MODULE: dict[str, Any] = runpy.run_path(str(AGENT), run_name="agent")
dumps, loads = AGENT_MODULE["dumps"], AGENT_MODULE["loads"]
Selector, EVENT_READ, EVENT_WRITE = AGENT_MODULE["Selector"], AGENT_MODULE["EVENT_READ"], AGENT_MODULE["EVENT_WRITE"]

# what an idle agent's memory was mostly spent on (1.9 MiB of 4.4 on 2026-12-08), and what a
# command's start pulled in behind our back (os.get_exec_path imports warnings)
NOT_IMPORTED = (
    "subprocess", "threading", "socket", "json", "re", "enum", "selectors", "contextlib",
    "collections", "functools", "signal", "warnings", "typing", "ctypes",
)  # fmt: skip

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_dumps_writes_what_json_dumps_writes(value: Any) -> None:
    assert dumps(value) == json.dumps(value, separators=(",", ":")).encode()
    assert loads(dumps(value)) == value


JSONISH = st.lists(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400", "1e308"])
    | st.text(alphabet='{}[]",:0123456789.eE+-truefalsnul \t\n\\u', max_size=6),
    max_size=10,
).map(lambda parts: "".join(parts).encode())


@given(st.binary(max_size=60) | JSONISH)
def test_loads_reads_what_json_loads_reads_and_refuses_the_rest(raw: bytes) -> None:
    try:
        expected: Any = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        expected = ValueError
    try:
        got: Any = loads(raw)
    except ValueError:
        got = ValueError
    if expected is not ValueError and contains_non_finite(expected):
        assert got is ValueError  # NaN, Infinity and 1e999 are no number the agent takes
    else:
        assert got == expected, raw


def contains_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(contains_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(contains_non_finite(v) for v in value.values())
    return False


@pytest.mark.parametrize(
    "raw", [b"", b"   ", b"{", b'{"t":1}x', b'{"t":1}{}', b"NaN", b"[-Infinity]", b"1e999", b"[-1E400]", b"\xff{}"]
)
def test_loads_refuses_broken_requests_with_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        loads(raw)


def test_dumps_refuses_what_is_not_json() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"t": "x", "id": 1, "what": object()})


def test_the_selector_reports_as_selectors_does() -> None:
    """Readable, writable, and a hang-up that wakes a reader, by descriptor and by socket object."""
    left, right = socket.socketpair()
    read_end, write_end = os.pipe()
    theirs, ours = selectors.EpollSelector(), Selector()
    try:
        for sel in (theirs, ours):
            sel.register(left, EVENT_READ | EVENT_WRITE, "sock")
            sel.register(read_end, EVENT_READ, "pipe")

        def ready(timeout: float | None) -> tuple[list[tuple[Any, int]], list[tuple[Any, int]]]:
            mine = sorted((data, events) for _fd, data, events in ours.select(timeout))
            return sorted((key.data, events) for key, events in theirs.select(timeout)), mine

        expected, got = ready(0)
        assert got == expected == [("sock", EVENT_WRITE)]
        right.send(b"x")
        os.write(write_end, b"y")
        expected, got = ready(1)
        assert got == expected == [("pipe", EVENT_READ), ("sock", EVENT_READ | EVENT_WRITE)]
        for sel in (theirs, ours):
            sel.modify(left, EVENT_READ, "sock, reading")
        os.read(read_end, 1)
        os.close(write_end)  # a hang-up: a reader wakes to read the end
        expected, got = ready(1)
        assert got == expected == [("pipe", EVENT_READ), ("sock, reading", EVENT_READ)]
        with pytest.raises(KeyError):
            ours.register(read_end, EVENT_READ, "again")
        with pytest.raises(ValueError):
            ours.register(right, 0, "nothing")
        os.close(read_end)
        ours.unregister(read_end)  # closed already: quietly dropped, as selectors does
        ours.unregister(left)
        assert ours.select(0) == []
    finally:
        theirs.close()
        left.close()
        right.close()


def test_suppress_is_contextlib_s() -> None:
    suppress = AGENT_MODULE["suppress"]
    with suppress(OSError):
        raise FileNotFoundError("a subclass is suppressed")
    with pytest.raises(KeyError), suppress(OSError):
        raise KeyError("another is not")


def test_the_agent_imports_none_of_them_even_once_it_ran_a_command() -> None:
    """Every module the agent imports, as the interpreter reports them (-X importtime), after it
    has answered a ping and started a command found on PATH."""
    run = json.dumps({"t": "run", "id": 1, "argv": ["true"], "env": {}}).encode()
    ping = json.dumps({"t": "ping", "id": 2}).encode()
    requests = b"".join(HEAD.pack(len(h), 0) + h for h in (run, ping))
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", str(AGENT)],
        input=requests, capture_output=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    assert {"_json", "select", "_signal"} <= imported  # the report is read right
    assert not imported & set(NOT_IMPORTED), sorted(imported & set(NOT_IMPORTED))
    assert b'"t":"started"' in done.stdout and b'"t":"pong"' in done.stdout  # it did run and answer
