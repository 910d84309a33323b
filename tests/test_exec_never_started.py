"""Which failed docker execs say nothing ran because the engine could not reach the container
(runtime/docker/exec.py): only those may be retried in a new sandbox."""

from __future__ import annotations

import pytest

from sandbox.runtime.docker.exec import never_started


@pytest.mark.parametrize(
    ("inspected", "output", "expected"),
    [
        # the shim died: the engine still says "running", and answers every exec so
        ({"ExitCode": 126, "Pid": 0}, b"ttrpc: closed: unknown\r\n", True),
        ({"ExitCode": 126, "Pid": 0}, b"OCI runtime exec failed: exec failed: cannot exec in a stopped state", True),
        ({"ExitCode": 126, "Pid": 0}, b"", True),
        # the command itself exited 126 (its process existed)
        ({"ExitCode": 126, "Pid": 4242}, b"", False),
        ({"ExitCode": 126, "Pid": 4242}, b"ttrpc: closed", False),
        # the engine reached the container and could not start the program (runc on Docker 26 and
        # 20.10, runsc, dockerd for the user)
        (
            {"ExitCode": 126, "Pid": 0},
            b'OCI runtime exec failed: exec failed: unable to start container process: exec: "/etc": permission denied',
            False,
        ),
        (
            {"ExitCode": 126, "Pid": 0},
            b"OCI runtime exec failed: exec failed: container_linux.go:380: starting container process caused: "
            b'exec: "nonexist": executable file not found in $PATH: unknown',
            False,
        ),
        (
            {"ExitCode": 126, "Pid": 0},
            b'OCI runtime exec failed: executing processes for container: executing command "nonexist" in '
            b'sandbox: error finding executable "nonexist" in PATH [/usr/bin /bin]: no such file or directory',
            False,
        ),
        ({"ExitCode": 126, "Pid": 0}, b"unable to find user nosuchuser: no matching entries in passwd file", False),
        ({"ExitCode": 0, "Pid": 0}, b"", False),
        ({"ExitCode": 127, "Pid": 0}, b"", False),
    ],
)
def test_only_an_exec_the_engine_never_started_counts(inspected: dict[str, int], output: bytes, expected: bool) -> None:
    assert never_started(inspected, output) is expected
