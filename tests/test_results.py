"""Result shaping: long output is cut with an explicit marker (pure)."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sandbox.engine.results import WORD_SLACK, cut, shape
from sandbox.journal.redact import redact_text


def test_short_output_untouched() -> None:
    """Output under the limit is returned as is."""
    shaped = shape({"output": "hi", "exit_code": 0}, 100, "/p")
    assert shaped.output == {"output": "hi", "exit_code": 0} and not shaped.truncated


def test_long_output_cut_with_marker_and_kept() -> None:
    """Long text keeps head and tail, says how much was cut and where the rest is."""
    text = "a" * 600 + "b" * 400
    shaped = shape({"output": text}, 200, "/workspace/.sandbox/outputs/c.txt")
    out = shaped.output["output"]
    assert shaped.truncated and shaped.full_text == text
    assert out.startswith("a" * 120) and out.endswith("b" * 80)
    assert "[... truncated: 800 of 1,000 characters cut; full output in /workspace/.sandbox/outputs/c.txt ...]" in out


def test_output_capture_keeps_head_and_tail_and_counts_the_cut() -> None:
    """Past its bound a capture keeps the first and last bytes of each stream and the exact total."""
    from sandbox.runtime.output import OutputCapture

    capture = OutputCapture(keep_bytes=10)
    for i in range(100):
        capture.add(1, f"{i:03d}\n".encode())
    kept = capture.stream(1)
    assert kept.head == b"000\n001\n00" and kept.tail == b"7\n098\n099\n"
    assert kept.total == 400 and kept.cut == 380 and capture.stream(0).total == 400


def test_a_capture_forgets_the_engines_words_about_a_command_that_never_ran(tmp_path: Path) -> None:
    """What an exec that never ran left in a fresh capture goes before the command runs elsewhere;
    a capture that held earlier output, or spilled, keeps everything."""
    from sandbox.runtime.output import OutputCapture

    capture = OutputCapture(keep_bytes=100)
    capture.add(1, b"OCI runtime exec failed: exec failed: cannot exec in a stopped state\r\n")
    capture.clear_if_from(0)
    capture.add(1, b"ran\n")
    assert capture.joined(0) == capture.joined(1) == b"ran\n" and capture.total == 4

    earlier = OutputCapture(keep_bytes=100)
    earlier.add(1, b"before\n")
    taken = earlier.total
    earlier.add(2, b"engine\n")
    earlier.clear_if_from(taken)
    assert earlier.joined(0) == b"before\nengine\n"

    spilled = OutputCapture(tmp_path / "s.txt", keep_bytes=10)
    spilled.add(1, b"x" * 50)
    spilled.clear_if_from(0)
    spilled.close()
    assert spilled.total == 50 and (tmp_path / "s.txt").read_bytes() == b"x" * 50


def test_a_capture_never_spills_past_its_cap_and_goes_when_discarded(tmp_path: Path) -> None:
    """Past `spill_max_bytes` the spill file is removed at once (head and tail stay, a note says
    why); `discard` removes a spill file and hands its bytes back to the budget."""
    from sandbox.runtime.output import OutputCapture, SpillBudget

    budget = SpillBudget(10_000)
    capped = OutputCapture(tmp_path / "a.txt", keep_bytes=100, spill_max_bytes=1_000, spill_budget=budget)
    for _ in range(50):
        capped.add(1, b"x" * 100)
    capped.close()
    assert not capped.spilled and not (tmp_path / "a.txt").exists()
    assert capped.spill_error is not None and "not saved" in capped.spill_error
    assert capped.stream(1).total == 5_000 and budget.used == 0

    kept = OutputCapture(tmp_path / "b.txt", keep_bytes=100, spill_max_bytes=5_000, spill_budget=budget)
    for _ in range(20):
        kept.add(1, b"y" * 100)
    kept.close()
    assert kept.spilled and (tmp_path / "b.txt").stat().st_size == 2_000 and budget.used == 2_000
    kept.discard()
    kept.discard()  # twice is fine
    assert not (tmp_path / "b.txt").exists() and budget.used == 0


def test_captures_of_one_tenant_share_its_budget(tmp_path: Path) -> None:
    """Two captures in flight reserve from one budget: the second stops spilling where the budget
    ends, whatever its own cap, and the first keeps its whole output."""
    from sandbox.runtime.output import OutputCapture, SpillBudget

    budget = SpillBudget(3_000)
    first = OutputCapture(tmp_path / "1.txt", keep_bytes=100, spill_max_bytes=10_000, spill_budget=budget)
    second = OutputCapture(tmp_path / "2.txt", keep_bytes=100, spill_max_bytes=10_000, spill_budget=budget)
    for _ in range(20):
        first.add(1, b"a" * 100)
    for _ in range(20):
        second.add(1, b"b" * 100)
    first.close()
    second.close()
    assert first.spilled and (tmp_path / "1.txt").stat().st_size == 2_000
    assert not second.spilled and not (tmp_path / "2.txt").exists()
    assert second.spill_error is not None and "in flight" in second.spill_error
    assert budget.used == 2_000 <= budget.limit


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def leaked(text: str) -> bool:
    """Whether any 8 characters of SECRET in a row are in `text`."""
    return any(SECRET[i : i + 8] in text for i in range(len(SECRET) - 7))


def test_a_cut_never_leaves_half_a_secret_for_the_journal() -> None:
    """The tail's cut falling inside an AWS secret key left its last characters, which no pattern
    matches, in the journal's copy; the cut now moves to the space before it, so the key is
    there whole (and masked) or not at all. The same for the head's cut."""
    tail_cut = "x " * 2_000 + f"aws_secret_access_key = {SECRET} " + "y " * 290  # the tail's 600 start in it
    shaped = shape({"output": tail_cut}, 1_500, None).output["output"]
    assert not leaked(redact_text(shaped))
    head_cut = "z " * 443 + f"key {SECRET} " + "w " * 3_000  # the head's 900 end in it
    assert not leaked(redact_text(cut(head_cut, 1_500, None)))


words = st.lists(
    st.text(st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=60), min_size=1
)


@given(words, st.sampled_from([" ", "\n", "\t"]), st.integers(50, 400))
def test_a_cut_falls_between_two_words_when_a_space_is_near(parts: list[str], space: str, max_chars: int) -> None:
    """Whatever the words, the head ends and the tail starts on whole words of the text, unless
    no space is within reach of the cut (a word longer than the slack)."""
    text = space.join(parts)
    out = cut(text, max_chars, None)
    if out == text:
        return
    head, _, rest = out.partition("\n\n[... truncated: ")
    tail = rest.split(" ...]\n\n", 1)[1]
    original = set(text.split())
    h, t = int(max_chars * 0.6), len(text) - (max_chars - int(max_chars * 0.6))
    if head.split() and space in text[max(0, h - WORD_SLACK) : h + 1]:
        assert head.split()[-1] in original
    if tail.split() and space in text[t - 1 : t + WORD_SLACK]:
        assert tail.split()[0] in original
