"""`state.url` and `SANDBOX_STATE_URL`: the form is checked at load time, naming the key; a
password never shows in a message."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.config import load_config_text
from sandbox.config.state import ENV_VAR, mask_password, parse_state_url
from sandbox.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_absent_means_sqlite() -> None:
    """No `state:` at all: the files in state_dir, as before."""
    config = load_config_text("{}\n")
    assert config.state.parsed().kind == "sqlite"


@pytest.mark.parametrize("url", ["sqlite:", "sqlite"])
def test_sqlite_spellings(url: str) -> None:
    """`sqlite:` names the embedded store explicitly."""
    assert load_config_text(f"state:\n  url: {url!r}\n").state.parsed().kind == "sqlite"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://sbx@db.internal:5432/sandbox",
        "postgres://sbx:pw@127.0.0.1/sandbox?sslmode=require",
        "postgresql:///sandbox?host=/run/postgresql",
    ],
)
def test_postgresql_urls(url: str) -> None:
    """postgresql:// and postgres:// URLs naming a database are the shared store."""
    parsed = load_config_text(f"state:\n  url: {url!r}\n").state.parsed()
    assert (parsed.kind, parsed.url) == ("postgresql", url)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://u@h/db", "expected `sqlite:` or postgresql://"),
        ("postgresql://u@h:5432/", "names no database"),
        ("postgresql://u@h:70000/db", "Port out of range"),
        ("postgresql://u@h:abc/db", "expected `sqlite:`"),
        ("/var/lib/state.db", "expected `sqlite:`"),
    ],
)
def test_a_wrong_url_is_a_load_error_at_its_key(url: str, why: str) -> None:
    """A malformed URL fails the load with the key path `state.url` and what was expected."""
    with pytest.raises(ConfigError) as info:
        load_config_text(f"state:\n  url: {url!r}\n")
    text = str(info.value)
    assert "state.url" in text and why in text


def test_the_password_never_shows_in_a_load_error() -> None:
    """The error quotes the URL with its password masked."""
    with pytest.raises(ConfigError) as info:
        load_config_text("state:\n  url: 'postgresql://sbx:hunter2@h:99999/db'\n")
    assert "hunter2" not in str(info.value) and "sbx:***@h" in str(info.value)


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """SANDBOX_STATE_URL overrides state.url (the URL and its password live in a Secret)."""
    monkeypatch.setenv(ENV_VAR, "postgresql://sbx@h/other")
    config = load_config_text("state:\n  url: 'sqlite:'\n")
    assert config.state.parsed().url == "postgresql://sbx@h/other"


def test_a_wrong_environment_url_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed SANDBOX_STATE_URL fails the load, naming the variable and the key it overrides."""
    monkeypatch.setenv(ENV_VAR, "redis://h/0")
    with pytest.raises(ConfigError) as info:
        load_config_text("{}\n")
    assert f"{ENV_VAR} (overrides state.url)" in str(info.value)


@given(st.text(min_size=1, max_size=40).filter(lambda s: ":" not in s and "@" not in s and "/" not in s))
def test_mask_password_hides_any_password(secret: str) -> None:
    """Whatever the password, the masked URL does not contain it."""
    from urllib.parse import quote

    url = f"postgresql://user:{quote(secret, safe='')}@host:5432/db"
    shown = mask_password(url)
    assert quote(secret, safe="") not in shown.split("@", 1)[0].split(":", 2)[-1]
    assert shown.startswith("postgresql://user:***@host:5432/db")


def test_password_in_the_query_is_masked() -> None:
    """libpq also reads `password=` from the query string: masked there too."""
    assert mask_password("postgresql://u@h/db?password=s3cret&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://u@h/db?sslpassword=KEYPASS&sslmode=verify-full",
            "postgresql://u@h/db?sslpassword=***&sslmode=verify-full",
        ),
        ("postgresql://u@h/db?pass%77ord=s3cret", "postgresql://u@h/db?pass%77ord=***"),
        ("postgresql://u@h/db?PASSWORD=s3cret", "postgresql://u@h/db?PASSWORD=***"),
    ],
)
def test_every_query_item_naming_a_password_is_masked(url: str, shown: str) -> None:
    """libpq reads `sslpassword` (a client key's passphrase) and percent-encoded names too."""
    assert mask_password(url) == shown


def test_libpqs_complaint_about_a_malformed_password_does_not_quote_it() -> None:
    """libpq quotes a password it cannot decode whole ("invalid percent-encoded token: ...")."""
    from sandbox.state.postgres.connect import unreachable

    url = parse_state_url("postgresql://u:Pa%zzSECRET@h:5432/db?sslpassword=KEY%PASS")
    failure = ValueError('invalid percent-encoded token: "Pa%zzSECRET"; also "KEY%PASS" in sslpassword')
    error = unreachable(url, failure)
    assert "SECRET" not in error.message and "KEY%PASS" not in error.message
    assert "invalid percent-encoded token" in error.message and "u:***@h:5432/db" in error.message


def test_an_at_sign_in_the_query_is_not_taken_for_a_broken_password() -> None:
    assert parse_state_url("postgresql://u:pw@h/db?application_name=me@x").kind == "postgresql"


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:ab/cd+ef==@h:5432/db", "postgresql://u:ab?cd@h:5432/db", "postgresql://u:ab#cd@h/db",
     "postgresql://u:p@ss/w?rd#x@h:5432/db"],
)  # fmt: skip
def test_a_password_written_with_url_characters_never_shows_in_a_load_error(url: str) -> None:
    """A base64 password holds `/`; unencoded, a URL parser ends the host in the middle of it and
    complained with its piece (`Port could not be cast to integer value as 'ab'`)."""
    with pytest.raises(ConfigError) as info:
        load_config_text(f'state:\n  url: "{url}"\n', source="c.yaml")
    text = str(info.value)
    assert "state.url" in text and "u:***@" in text
    assert not any(piece in text for piece in ("ab", "cd", "ef==", "p@ss", "w?rd"))


def test_parse_rejects_garbage() -> None:
    """parse_state_url raises ValueError (the loader turns it into a located error)."""
    with pytest.raises(ValueError, match="expected"):
        parse_state_url("postgresql://[::1/db")
