"""The tests' private PostgreSQL server (tests/pg_server.py): it runs, on loopback only, and each
test gets a database of its own."""

from __future__ import annotations

import psycopg
import pytest

from tests.pg_server import PgServer

pytestmark = pytest.mark.postgres


def test_server_answers_on_loopback(pg_server: PgServer, pg_url: str) -> None:
    """The server takes a connection on 127.0.0.1 and listens on nothing else."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT current_setting('listen_addresses'), inet_server_addr()::text").fetchone()
    assert row == ("127.0.0.1", "127.0.0.1/32")


def test_each_test_gets_an_empty_database(pg_url: str) -> None:
    """A fresh database has no tables of ours."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert row == (0,)


def test_a_wrong_password_is_refused(pg_server: PgServer) -> None:
    """TCP connections authenticate (scram), so a test can see bad credentials refused."""
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg_server.url(password="wrong"), connect_timeout=5).close()
