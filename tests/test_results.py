"""Result shaping: long output is cut with an explicit marker (pure)."""

from sandbox.engine.results import shape


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
