"""The public surface is exactly what __all__ says (httpx style)."""

import sandbox


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted, every name exists, and every public attribute is in __all__."""
    assert sandbox.__all__ == sorted(sandbox.__all__)
    for name in sandbox.__all__:
        assert hasattr(sandbox, name), name
    public = {n for n in dir(sandbox) if not n.startswith("_")}
    modules = {
        "adapters",
        "config",
        "engine",
        "errors",
        "escape",
        "tools",
        "policy",
        "preview",
        "runtime",
        "fs",
        "cli",
        "audit",
        "journal",
        "api",
        "testing",
        "sessions",
        "state",
        "client",
    }
    assert public - modules == set(sandbox.__all__)


def test_unknown_names_raise_attribute_error() -> None:
    """A name outside the surface is an AttributeError, like any module's."""
    import pytest

    with pytest.raises(AttributeError):
        sandbox.NotAThing  # noqa: B018
