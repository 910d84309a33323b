"""Path parsing for file tools: no input leaves the root (pure, property-based)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.errors import ErrorCode, SandboxError
from sandbox.fs.paths import split_path

ROOTS = ("/workspace", "/srv/ws")


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../../etc/passwd", ErrorCode.PERMISSION_DENIED),
        ("a/../../b", ErrorCode.PERMISSION_DENIED),
        ("/etc/passwd", ErrorCode.PERMISSION_DENIED),
        ("/workspace/../etc/passwd", ErrorCode.PERMISSION_DENIED),
        ("/workspacex/file", ErrorCode.PERMISSION_DENIED),
        ("a\x00b", ErrorCode.INVALID_ARGUMENTS),
        ("a/" * 3000, ErrorCode.INVALID_ARGUMENTS),
        ("x" * 300, ErrorCode.INVALID_ARGUMENTS),
        ("\uff0e\uff0e/etc/passwd", ErrorCode.INVALID_ARGUMENTS),  # fullwidth dots
        ("..\u2215etc\u2215passwd", ErrorCode.INVALID_ARGUMENTS),  # division slash
        ("..\\..\\etc\\passwd", ErrorCode.INVALID_ARGUMENTS),
    ],
)
def test_traversal_and_malformed_paths_refused(path: str, code: ErrorCode) -> None:
    """Traversal, absolute paths outside, NUL, long paths and look-alikes are refused."""
    with pytest.raises(SandboxError) as info:
        split_path(path, ROOTS)
    assert info.value.code == code


def test_outside_message_does_not_reveal_existence() -> None:
    """The refusal for an outside path is the same whether or not it exists."""
    msgs = set()
    for path in ("/etc/passwd", "/etc/does-not-exist-at-all"):
        with pytest.raises(SandboxError) as info:
            split_path(path, ROOTS)
        msgs.add(info.value.message.replace(path, "P"))
    assert len(msgs) == 1


@pytest.mark.parametrize(
    ("path", "root", "rel"),
    [
        ("a/b.txt", "/workspace", "a/b.txt"),
        ("./a//b/./c", "/workspace", "a/b/c"),
        ("a/x/../b", "/workspace", "a/b"),
        ("/workspace/a", "/workspace", "a"),
        ("/srv/ws/z", "/srv/ws", "z"),
        ("/workspace", "/workspace", "."),
    ],
)
def test_paths_inside_resolve(path: str, root: str, rel: str) -> None:
    """Relative and absolute paths inside a root resolve to clean components."""
    got_root, parts = split_path(path, ROOTS)
    assert (got_root, parts.relative) == (root, rel)


@given(st.lists(st.sampled_from(["..", ".", "a", "b", "", "/", "workspace", "..."]), max_size=12).map("/".join))
def test_no_input_escapes(path: str) -> None:
    """Whatever the input, a result never contains `..` or empty components."""
    try:
        _, parts = split_path(path, ROOTS)
    except SandboxError as exc:
        assert exc.code in (ErrorCode.PERMISSION_DENIED, ErrorCode.INVALID_ARGUMENTS)
        return
    assert all(p not in ("", ".", "..") for p in parts.parts)


@given(st.text(max_size=60))
def test_arbitrary_text_never_crashes(path: str) -> None:
    """Arbitrary text either resolves inside or fails with a model-facing code."""
    try:
        _, parts = split_path(path, ROOTS)
    except SandboxError as exc:
        assert exc.code in (ErrorCode.PERMISSION_DENIED, ErrorCode.INVALID_ARGUMENTS)
        return
    assert ".." not in parts.parts
