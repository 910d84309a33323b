"""The public surface is exactly what __all__ says (httpx style)."""

import importlib

import pytest

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
        sandbox.NotAThing  # type: ignore[attr-defined]  # noqa: B018 - a misspelt name is a type error too


@pytest.mark.parametrize("package", ["sandbox", "sandbox.journal"])
def test_every_lazy_name_is_exported_and_every_export_loads(package: str) -> None:
    """The names a package loads on first use are exactly its `__all__`, and each one loads."""
    module = importlib.import_module(package)
    assert set(module._HOMES) == set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018 - the lookup is the test
