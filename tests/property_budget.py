"""How many examples a property test runs: its own number in CI's thorough profile, the quick
loop's (tests/conftest.py) otherwise, so `-m "not docker"` stays quick while CI searches as hard."""

from __future__ import annotations

import os

from hypothesis import settings


def examples(thorough: int, quick: int | None = None) -> int:
    """`thorough` under HYPOTHESIS_PROFILE=thorough (`.ci/run`), else `quick` (a test whose
    examples are costly, a request each) or the loaded profile's own."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
        return thorough
    return quick if quick is not None else int(settings.default.max_examples)
