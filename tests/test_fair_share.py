"""The size bound's fair share: the bytes to free come from the tenants that hold the most."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandbox.journal.fair_share import fair_cuts

usages = st.dictionaries(st.text(min_size=0, max_size=6), st.integers(min_value=-5, max_value=10**12), max_size=12)


def test_a_flooding_tenant_gives_up_its_own_history_and_a_quiet_one_keeps_all_of_it() -> None:
    assert fair_cuts({"noisy": 1_000_000, "quiet": 5_000}, 300_000) == {"noisy": 300_000}


def test_two_large_tenants_are_cut_to_the_same_level_and_a_small_one_is_not_cut() -> None:
    cuts = fair_cuts({"a": 900, "b": 600, "c": 100}, 500)
    assert cuts == {"a": 400, "b": 100}  # both left with 500; c keeps its 100


def test_a_tenant_alone_gives_up_exactly_the_excess() -> None:
    assert fair_cuts({"acme": 10_000}, 2_500) == {"acme": 2_500}


def test_nothing_to_free_or_nothing_held_cuts_nothing() -> None:
    assert fair_cuts({"a": 10}, 0) == {}
    assert fair_cuts({"a": 10}, -3) == {}
    assert fair_cuts({}, 100) == {}
    assert fair_cuts({"a": 0, "b": -4}, 100) == {}


def test_an_excess_over_everything_takes_everything() -> None:
    assert fair_cuts({"a": 10, "b": 3, "c": 0}, 50) == {"a": 10, "b": 3}


@given(usages, st.integers(min_value=-10, max_value=10**13))
def test_the_cuts_free_the_excess_and_nobody_is_cut_while_another_keeps_more(
    usage: dict[str, int], excess: int
) -> None:
    """Whatever the tenants hold and whatever is asked: exactly the excess (or all) is freed,
    no cut passes its tenant's bytes, and every cut tenant keeps at least what anyone else
    keeps, less one byte (the level's rounding)."""
    cuts = fair_cuts(usage, excess)
    held = {tenant: max(0, size) for tenant, size in usage.items()}
    total = sum(held.values())
    assert sum(cuts.values()) == (0 if excess <= 0 else min(excess, total))
    assert all(tenant in held and 0 < cut <= held[tenant] for tenant, cut in cuts.items())
    left = {tenant: size - cuts.get(tenant, 0) for tenant, size in held.items()}
    if cuts and excess < total:
        most = max(left.values())
        assert all(left[tenant] >= most - 1 for tenant in cuts)


@given(usages, st.integers(min_value=1, max_value=10**13))
def test_the_answer_does_not_depend_on_the_order_tenants_are_listed_in(usage: dict[str, int], excess: int) -> None:
    reordered = dict(reversed(list(usage.items())))
    assert fair_cuts(usage, excess) == fair_cuts(reordered, excess)
