"""Patch parsing and in-memory application (pure)."""

from __future__ import annotations

import pytest

from sandbox.fs.patch import PatchError, apply_hunks, parse

CODEX = """*** Begin Patch
*** Add File: new.txt
+hello
+world
*** Update File: src/app.py
*** Move to: src/main.py
@@ def main():
-    print("hi")
+    print("hello")
*** Delete File: old.txt
*** End Patch
"""

UNIFIED = """--- a/src/app.py
+++ b/src/app.py
@@ -1,3 +1,3 @@
 def main():
-    print("hi")
+    print("hello")
     return 0
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+hello
+world
"""


def test_parse_codex_format() -> None:
    """Add, Update with Move to and an anchor, and Delete are all parsed."""
    ops = parse(CODEX)
    assert [(o.kind, o.path) for o in ops] == [
        ("add", "new.txt"),
        ("update", "src/app.py"),
        ("delete", "old.txt"),
    ]
    assert ops[0].content == "hello\nworld\n"
    assert ops[1].move_to == "src/main.py"
    assert ops[1].hunks[0].anchor == "def main():"


def test_apply_update_hunk() -> None:
    """A hunk replaces its old lines; the rest of the file is untouched."""
    ops = parse(CODEX)
    text = 'import os\n\ndef main():\n    print("hi")\n    return 0\n'
    assert (
        apply_hunks("src/app.py", text, ops[1].hunks) == 'import os\n\ndef main():\n    print("hello")\n    return 0\n'
    )


def test_parse_and_apply_unified_diff() -> None:
    """Unified diffs parse into update and add operations that apply."""
    ops = parse(UNIFIED)
    assert [(o.kind, o.path) for o in ops] == [("update", "src/app.py"), ("add", "new.txt")]
    assert ops[1].content == "hello\nworld\n"
    text = 'def main():\n    print("hi")\n    return 0\n'
    assert apply_hunks("src/app.py", text, ops[0].hunks) == 'def main():\n    print("hello")\n    return 0\n'


def test_failing_hunk_names_file_and_hunk() -> None:
    """A hunk that does not match names the file, the hunk number and its first lines."""
    ops = parse("*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+1\n@@\n-nine\n+9\n*** End Patch\n")
    with pytest.raises(PatchError, match=r"a.txt: hunk 2 does not apply: these lines were not found:\nnine"):
        apply_hunks("a.txt", "one\ntwo\n", ops[0].hunks)


def test_whitespace_tolerant_match() -> None:
    """Trailing whitespace differences still match."""
    ops = parse("*** Begin Patch\n*** Update File: a\n@@\n-x = 1\n+x = 2\n*** End Patch\n")
    assert apply_hunks("a", "x = 1   \ny\n", ops[0].hunks) == "x = 2\ny\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello", "not a patch"),
        ("*** Begin Patch\n*** Update File: a\n-x\n", "no '\\*\\*\\* End Patch'"),
        ("*** Begin Patch\n*** Add File: a\nnot plus\n*** End Patch\n", "must start with '\\+'"),
        ("*** Begin Patch\nrandom\n*** End Patch\n", "expected a"),
        ("*** Begin Patch\n*** Update File: a\n*** End Patch\n", "has no hunks"),
    ],
)
def test_malformed_patches(text: str, message: str) -> None:
    """Malformed patches are refused with a message that says what is wrong."""
    with pytest.raises(PatchError, match=message):
        parse(text)
