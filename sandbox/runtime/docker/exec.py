"""Running one argv in a container through the docker SDK, streaming its output.

docker-py's streaming exec leaves sockets open and offers no cancellation; this module reads the
raw socket itself, closes every layer of it, and shuts it down to stop a wait on timeout.
"""

from __future__ import annotations

import builtins
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import docker.errors
from docker.utils.socket import frames_iter

from sandbox.errors import SandboxUnavailable
from sandbox.runtime.docker.errors import mapped
from sandbox.runtime.output import OutputCapture
from sandbox.runtime.protocol import ExecResult

if TYPE_CHECKING:
    from sandbox.runtime.docker.backend import DockerBackend


# what the engine says when it reached the container but could not start the command in it: runc
# (1.1 and later; before) and runsc for a missing program, dockerd for a user not in its passwd
REACHED_THE_CONTAINER = (
    b"unable to start container process",
    b"starting container process caused",
    b'executing command "',
    b"unable to find user",
)
ENGINE_SETTLE_S = 5.0
STOPPED = frozenset({"exited", "dead", "removing"})


class SandboxGone(SandboxUnavailable):
    """The container disappeared or stopped before a command could start in it."""


class SandboxStopped(SandboxUnavailable):
    """The container stopped while a command was starting in it (it may have run a moment)."""


async def exec_stream(
    backend: DockerBackend,
    container_id: str,
    argv: builtins.list[str],
    *,
    environment: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | None = None,
    timeout_s: float | None = None,
    on_output: Callable[[bytes], None] | None = None,
    capture: OutputCapture | None = None,
) -> ExecResult:
    """Run argv in a container, streaming output; stop waiting after `timeout_s`.

    Stopping the wait (timeout, cancellation, output past the capture's maximum) does not stop
    the process: callers that own a call id kill it.
    """
    capture = capture or OutputCapture()
    taken_before = capture.total
    api = backend.client.api
    start = time.perf_counter()
    params: dict[str, Any] = {
        "stdout": True,
        "stderr": True,
        "environment": dict(environment or {}),
    }
    if workdir:
        params["workdir"] = workdir
    if user:
        params["user"] = user

    exec_id = await create_exec(backend, container_id, argv, params)
    streams: builtins.list[Any] = []
    closed = threading.Event()  # the waiting side gave up: reading errors are expected
    done = threading.Event()  # the reader finished on its own and closed its socket

    def pump() -> None:
        with mapped("exec output"):
            try:
                raw = api.exec_start(exec_id, socket=True)
            except docker.errors.APIError as exc:
                raise_if_not_running(exc)  # it stopped between create and start: nothing ran
                raise
            streams.append(raw)
            # the client's timeout (CONTROL_TIMEOUT_S) bounds this start, not the stream: frames_iter
            # polls the socket without a timeout, so a silent command runs as long as it is allowed
            try:
                if closed.is_set():
                    return
                for stream_id, data in frames_iter(raw, tty=False):
                    if not capture.add(stream_id, data):
                        return  # over the output maximum: stop reading; the caller kills
                    if on_output is not None:
                        _deliver(on_output, data)
            except OSError:
                if not closed.is_set():
                    raise
            finally:
                close_exec_socket(raw)
                done.set()

    try:
        with anyio.move_on_after(timeout_s) as scope:
            await anyio.to_thread.run_sync(pump, abandon_on_cancel=True, limiter=backend.stream_limiter)
    finally:
        if not done.is_set():
            # a timeout or a cancelled caller: unblock the reader thread (the caller kills)
            closed.set()
            for raw in streams:
                _shutdown_exec_socket(raw)
    timed_out = scope.cancelled_caught
    exit_code = None
    if not timed_out and not capture.overflowed:
        inspected = await backend.call("exec inspect", api.exec_inspect, exec_id)
        exit_code = inspected.get("ExitCode")
        said = capture.joined(0)
        if never_started(inspected, said) and await stopped_once_settled(backend, container_id):
            if b"cannot exec in a stopped state" in said:
                # runc found the container stopped and started nothing: the caller may run it
                # again elsewhere, and the engine's words are no part of that run's output
                capture.clear_if_from(taken_before)
                raise SandboxGone("the sandbox container stopped; it is recreated on next use")
            # its shim died ("ttrpc: closed"), perhaps while starting the command: it may have
            # run a moment, so it is not run again for the model
            raise SandboxStopped(
                "the sandbox container stopped while the command was starting (the engine said: "
                f"{said.decode(errors='replace').strip()[:200]}); it may have run briefly, and a new "
                "sandbox is made on the next call"
            )
    return ExecResult.from_capture(
        capture, exit_code=exit_code, duration_ms=(time.perf_counter() - start) * 1000, timed_out=timed_out
    )


def never_started(inspected: Mapping[str, Any], output: bytes) -> bool:
    """Whether the engine gave up on an exec before its process existed: exit code 126 without a
    pid. Not when it said it reached the container and failed to start the command there
    (:data:`REACHED_THE_CONTAINER`): the container is alive, and the message is the result."""
    return (
        inspected.get("ExitCode") == 126
        and not inspected.get("Pid")
        and not any(said in output for said in REACHED_THE_CONTAINER)
    )


async def stopped_once_settled(backend: DockerBackend, container_id: str) -> bool:
    """Whether the container is gone or stopped, waiting up to :data:`ENGINE_SETTLE_S` for the
    engine to notice: after a shim dies, it reports the container running for 0.1-0.2 s on an idle
    machine (longer on a busy one) while every exec in it fails. Asked only after an exec the
    engine could not start, so a live container costs this wait on that failure alone."""
    deadline = time.monotonic() + ENGINE_SETTLE_S
    while True:
        if stopped(await backend.find(container_id)):
            return True
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(0.05)


def stopped(attrs: Mapping[str, Any] | None) -> bool:
    """Whether an inspected container is gone or stopped for good: not when it is paused (a
    kill's freeze, which ends) or restarting."""
    return attrs is None or attrs["State"].get("Status") in STOPPED


def raise_if_not_running(exc: docker.errors.APIError) -> None:
    """SandboxGone for the engine's answer that the container is gone (404) or not running
    (409), to an exec's create or start: nothing ran."""
    if isinstance(exc, docker.errors.NotFound):
        raise SandboxGone("the sandbox container is gone; it is recreated on next use") from exc
    if exc.status_code == 409:  # container stopped or paused
        raise SandboxGone(
            f"the sandbox container is not running ({exc.explanation}); it is recreated on next use"
        ) from exc


async def create_exec(
    backend: DockerBackend, container_id: str, argv: builtins.list[str], params: Mapping[str, Any]
) -> str:
    """Create an exec; SandboxGone when the container is gone or not running (nothing ran)."""
    api = backend.client.api

    def create() -> str:
        try:
            return str(api.exec_create(container_id, argv, **params)["Id"])
        except docker.errors.APIError as exc:
            raise_if_not_running(exc)
            raise

    return await backend.call("exec", create)


def _deliver(on_output: Callable[[bytes], None], data: bytes) -> None:
    # called in the reader thread: hand the chunk to the event loop; a gone loop drops it
    with contextlib.suppress(Exception):
        anyio.from_thread.run_sync(on_output, data)


def _shutdown_exec_socket(raw: Any) -> None:
    inner = getattr(raw, "_sock", raw)
    with contextlib.suppress(OSError):
        inner.shutdown(socket.SHUT_RDWR)


def close_exec_socket(raw: Any) -> None:
    """Close docker-py's exec socket and every layer around it."""
    # docker-py hands out the SocketIO of the HTTP response; closing it leaves the real
    # socket (and the response) open until garbage collection, so close all three.
    inner = getattr(raw, "_sock", None)
    response = getattr(raw, "_response", None)
    with contextlib.suppress(OSError):
        raw.close()
    if inner is not None:
        with contextlib.suppress(OSError):
            inner.close()
    if response is not None:
        with contextlib.suppress(Exception):
            response.close()
