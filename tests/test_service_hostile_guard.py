"""The connection guard's choices, without sockets: which connection goes when a bound is reached
(api/connections.py). The attack itself runs against a real server in test_service_hostile.py."""

from __future__ import annotations

from sandbox.api.connections import Conn, ConnectionGuard, EdgeLimits, limits_of
from sandbox.config.models import ServiceSection

LIMITS = EdgeLimits(
    head_timeout_s=5, max_connections=10, per_address=8, unauthenticated=6, unauthenticated_per_address=3
)


class Fake:
    """A connection: its address, how long it has been idle, whether it was closed."""

    def __init__(self, guard: ConnectionGuard, address: str, idle_s: float = 0.0) -> None:
        self.idle_s = idle_s
        self.closed = False
        self.conn = Conn(address, lambda: self.idle_s, self.close)
        self.admitted = guard.admit(self.conn)

    def close(self) -> None:
        self.closed = True


def test_a_burst_of_new_connections_from_one_address_is_let_in() -> None:
    """Honest clients opening many connections at once (each about to send its request) are not
    pushed out by each other: the unauthenticated bounds only close stalled connections."""
    guard = ConnectionGuard(LIMITS)
    burst = [Fake(guard, "10.0.0.1") for _ in range(8)]
    assert all(f.admitted and not f.closed for f in burst)
    assert guard.count() == 8


def test_stalled_strangers_go_first_and_tenants_are_kept() -> None:
    """Past the per-address unauthenticated bound the oldest stalled stranger is closed; a
    connection that authenticated is kept while a stranger can go instead."""
    guard = ConnectionGuard(LIMITS)
    tenant = Fake(guard, "10.0.0.1", idle_s=60)
    tenant.conn.authenticated = True
    stalled = [Fake(guard, "10.0.0.1", idle_s=3) for _ in range(3)]
    newcomer = Fake(guard, "10.0.0.1")
    assert newcomer.admitted
    assert stalled[0].closed and not any(s.closed for s in stalled[1:])
    assert not tenant.closed


def test_past_the_hard_bound_the_oldest_idle_stranger_goes_however_young() -> None:
    """At max_connections a new connection closes the oldest idle stranger even if it is young;
    when every connection is busy, the new one is refused."""
    guard = ConnectionGuard(LIMITS)
    fakes = [Fake(guard, f"10.0.0.{i}") for i in range(10)]
    newcomer = Fake(guard, "10.0.1.1")
    assert newcomer.admitted and fakes[0].closed
    for f in fakes[1:]:
        f.idle_s = -1.0  # serving a request: never closed to make room
    newcomer.idle_s = -1.0
    refused = Fake(guard, "10.0.1.2")
    assert not refused.admitted and guard.refused == 1


def test_bounds_stay_below_the_file_descriptor_limit() -> None:
    """Every bound is kept below RLIMIT_NOFILE, with room left for the journal and the engine."""
    for nofile in (64, 256, 1024, 20000):
        limits = limits_of(ServiceSection(), nofile=nofile)
        assert limits.max_connections < nofile
        assert (
            max(limits.per_address, limits.unauthenticated, limits.unauthenticated_per_address)
            <= limits.max_connections
        )
