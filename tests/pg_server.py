"""A private PostgreSQL server for the tests, started from Debian's packages (`initdb`, `pg_ctl`).

One server per test run (the `postgres`-marked tests share one xdist worker, so one server),
listening on loopback only, on a free port and on a unix socket in its own temp dir, with
password (scram) authentication over TCP so that a wrong password can be tested. Every test
gets a fresh database (`pg_url`). The server stops and its folder goes at the end of the run.

`initdb` refuses to run as root: as root the server runs as Debian's `postgres` system user
(`runuser`), in a temp dir handed to that user.

Tests marked `postgres` skip (with the reason) only when the server binaries are absent;
`.ci/run` installs Debian's `postgresql` package, so in CI they always run.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SUPERUSER = "sbxtest"


def find_bin_dir() -> Path | None:
    """The newest `/usr/lib/postgresql/<version>/bin` holding initdb and pg_ctl, or None."""
    found = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    found = [d for d in found if (d / "pg_ctl").exists() and (d / "postgres").exists()]
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """One running server: where it listens and how to reach it as its superuser."""

    bin_dir: Path
    root: Path
    port: int
    password: str
    run_as: str | None  # the system user the server runs as (when the tests run as root)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        """A `postgresql://` URL to `database` over loopback TCP, as the superuser."""
        return f"postgresql://{SUPERUSER}:{password or self.password}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *argv: str) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *argv] if self.run_as else list(argv)

    def _run(self, *argv: str) -> None:
        proc = subprocess.run(self._cmd(*argv), capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")

    def init(self) -> None:
        """initdb: scram over TCP (the password in a file only the server user reads)."""
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        os.chmod(pwfile, 0o600)
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--pwfile",
            str(pwfile),
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )
        pwfile.unlink()

    def start(self) -> None:
        """pg_ctl start, waiting until it accepts connections (loopback and the socket only)."""
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
            "-l", str(self.root / "server.log"), "-o", options,
        )  # fmt: skip

    def stop(self) -> None:
        """pg_ctl stop (fast: open sessions are ended)."""
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError, OSError):
            self._run(str(self.bin_dir / "pg_ctl"), "stop", "-m", "fast", "-w", "-D", str(self.data))

    def _chown(self, path: Path) -> None:
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def log_tail(self) -> str:
        """The end of the server's log (for a failure message)."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def start_server() -> PgServer:
    """Start a private server, or skip the calling test when the binaries are absent."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries are absent (/usr/lib/postgresql/*/bin); apt-get install postgresql")
    run_as = None
    if os.geteuid() == 0:  # initdb refuses root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs Debian's `postgres` system user to run the test server")
        run_as = "postgres"
    root = Path(tempfile.mkdtemp(prefix="sbx-pg-"))
    server = PgServer(bin_dir, root, 0, secrets.token_hex(12), run_as)
    server.socket_dir.mkdir()
    for place in (root, server.socket_dir):
        server._chown(place)
    server.init()
    last: Exception | None = None
    for _ in range(3):  # a free port can be taken between the probe and the start
        server.port = _free_port()
        try:
            server.start()
            break
        except RuntimeError as exc:
            last = exc
    else:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"the test PostgreSQL did not start: {last}\n{server.log_tail()}")
    atexit.register(_stop_and_remove, server)  # also when the session fixture never finalises
    return server


def _stop_and_remove(server: PgServer) -> None:
    server.stop()
    shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The run's private PostgreSQL server (started on first use, stopped at the end)."""
    server = start_server()
    yield server
    _stop_and_remove(server)


def create_database(server: PgServer) -> str:
    """A new empty database on `server`; returns its URL."""
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.url(name)


def drop_database(server: PgServer, url: str) -> None:
    """Drop the database of `url` (its sessions are ended first)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh, empty database on the run's server: its `postgresql://` URL."""
    url = create_database(pg_server)
    yield url
    drop_database(pg_server, url)
