"""The resident agent (images/sandbox/sandbox_agent.py) run for real on this host over pipes, and
the orchestrator's frame reader (behind Docker's demultiplexer) and link fed hostile bytes. The
link's calls over the pipe transport are in test_agent_link_pipe.py; the same agent in a
container, through Docker's exec socket, is in test_resident_agent_docker.py."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox.runtime.agent.exec_path import AGENT_LABEL, AGENT_PROTOCOL_LABEL, path_from_labels
from sandbox.runtime.agent.frames import (
    HEAD,
    MAX_PAYLOAD,
    Exit,
    FrameError,
    FrameReader,
    Hello,
    Out,
    Reply,
    Started,
    encode,
)
from sandbox.runtime.docker.agent_stream import DOCKER_HEAD, DockerDemux

AGENT = Path(__file__).resolve().parents[1] / "images/sandbox/sandbox_agent.py"


class LocalAgent:
    """The agent as a child process of the test, spoken to with the orchestrator's frame code."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        max_file_bytes: int | None = None,
        pass_fds: tuple[int, ...] = (),
        prefix: tuple[str, ...] = (),
        cwd: str | None = None,
        program: tuple[str, str] = (sys.executable, str(AGENT)),
    ) -> None:
        def limit() -> None:
            if max_file_bytes is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

        self.proc = subprocess.Popen(
            [*prefix, program[0], "-I", "-S", program[1]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            preexec_fn=limit if max_file_bytes is not None else None,
            pass_fds=pass_fds,
            cwd=cwd,
        )
        self.reader = FrameReader()
        self.backlog: list[tuple[Any, bytes]] = []

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=10)
        self.proc.stdout.close()
        return code

    def send(self, header: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode(header))
        self.proc.stdin.flush()

    def next(self, timeout: float = 10) -> tuple[Any, bytes]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while not self.backlog:
            assert time.monotonic() < deadline, "the agent did not answer"
            data = os.read(self.proc.stdout.fileno(), 65536)
            assert data, "the agent's stdout ended"
            self.backlog += self.reader.feed(data)
        return self.backlog.pop(0)

    def run(self, rid: int, argv: list[str], **extra: Any) -> tuple[Exit, dict[int, bytes], int]:
        self.send({"t": "run", "id": rid, "argv": argv, "env": {}, "cwd": None, **extra})
        out: dict[int, bytes] = {1: b"", 2: b""}
        pid = 0
        while True:
            frame, payload = self.next()
            assert frame.id == rid
            if isinstance(frame, Started):
                pid = frame.pid
            elif isinstance(frame, Out):
                out[frame.stream] += payload
            elif isinstance(frame, Exit):
                return frame, out, pid


def processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command's name: state, parent, group, ...)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue


def live_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are not zombies."""
    return [pid for pid, fields in processes() if int(fields[2]) == pgid and fields[0] != "Z"]


@pytest.fixture
def agent() -> Iterator[LocalAgent]:
    a = LocalAgent()
    hello, _ = a.next()
    assert isinstance(hello, Hello) and hello.protocol == 1 and hello.pid == a.proc.pid
    yield a
    a.close()


def test_runs_commands_streams_both_outputs_and_reports_exit(agent: LocalAgent) -> None:
    done, out, pid = agent.run(1, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (done.code, done.signal, out[1], out[2]) == (7, 0, b"out\n", b"err\n")
    assert pid > 0


def test_each_command_leads_its_own_session_and_process_group(agent: LocalAgent) -> None:
    done, out, pid = agent.run(1, ["sh", "-c", "ps -o pid=,pgid=,sid= -p $$"])
    assert done.code == 0
    assert out[1].decode().split() == [str(pid)] * 3


def test_environment_and_working_directory(agent: LocalAgent, tmp_path: Path) -> None:
    _, out, _ = agent.run(1, ["sh", "-c", 'echo "$SBX_CALL"; pwd'], env={"SBX_CALL": "c-1"}, cwd=str(tmp_path))
    assert out[1].decode().split() == ["c-1", str(tmp_path)]
    # the tag is the command's, never the agent's own (its own would mark it as part of the call)
    assert b"SBX_CALL=" not in Path(f"/proc/{agent.proc.pid}/environ").read_bytes()


def test_missing_command_and_missing_directory_are_exit_codes(agent: LocalAgent, tmp_path: Path) -> None:
    missing, out, _ = agent.run(1, ["no-such-command-here"])
    assert missing.code == 127 and b"no-such-command-here" in out[2]
    nodir, _, _ = agent.run(2, ["true"], cwd=str(tmp_path / "gone"))
    assert nodir.code == 126


def test_signals_reach_the_whole_group_and_are_reported(agent: LocalAgent) -> None:
    agent.send({"t": "run", "id": 5, "argv": ["sh", "-c", "sleep 30 & sleep 30; echo never"], "env": {}, "cwd": None})
    started, _ = agent.next()
    assert isinstance(started, Started)
    agent.send({"t": "signal", "id": 6, "target": 5, "sig": int(signal.SIGKILL)})
    seen: list[Any] = []
    while not any(isinstance(f, Exit) for f in seen):
        seen.append(agent.next()[0])
    done = next(f for f in seen if isinstance(f, Exit))
    assert (done.code, done.signal) == (137, 9)
    assert any(isinstance(f, Reply) and f.id == 6 for f in seen) or isinstance(agent.next()[0], Reply)
    # nothing of the group is left alive (a killed orphan may linger as a zombie until whoever
    # adopted it reaps it: dead all the same)
    for _ in range(100):
        if not live_members(started.pid):
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"process group {started.pid} still has live members: {live_members(started.pid)}")


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_a_background_child_holding_the_output_keeps_the_command_open(agent: LocalAgent) -> None:
    """As docker exec: the command ends when it exited and its output ended."""
    start = time.monotonic()
    done, out, _ = agent.run(1, ["sh", "-c", "sleep 0.6 & echo first"])
    assert done.code == 0 and out[1] == b"first\n" and time.monotonic() - start >= 0.5
    quick, _, _ = agent.run(2, ["sh", "-c", "sleep 5 >/dev/null 2>&1 & echo ok"])
    assert quick.code == 0


def test_large_output_arrives_whole_and_in_bounded_frames(agent: LocalAgent) -> None:
    done, out, _ = agent.run(1, ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"])
    assert done.code == 0 and out[1] == b"x" * 3_000_000


@pytest.mark.slow  # real waits or schema loads: the full tier, not the quick loop
def test_concurrent_commands_are_multiplexed(agent: LocalAgent) -> None:
    for rid, delay in ((1, "0.4"), (2, "0")):
        agent.send({"t": "run", "id": rid, "argv": ["sh", "-c", f"sleep {delay}; echo {rid}"], "env": {}, "cwd": None})
    order: list[int] = []
    while len(order) < 2:
        frame, _ = agent.next()
        if isinstance(frame, Exit):
            order.append(frame.id)
    assert order == [2, 1]


def test_bad_requests_get_errors_and_the_agent_goes_on(agent: LocalAgent) -> None:
    agent.send({"t": "run", "id": 1, "argv": "not a list"})
    frame, _ = agent.next()
    assert frame.t == "error" and frame.id == 1
    agent.send({"t": "launch-missiles", "id": 2})
    assert agent.next()[0].t == "error"
    agent.send({"t": "ping", "id": 3})
    assert isinstance(agent.next()[0], Reply)


@pytest.mark.parametrize(
    "header",
    [
        b'{"t":"ping","id":1e999}',  # a number past a float: refused, not read as infinity
        b'{"t":"ping","id":Infinity}',
        b'{"t":"ping","id":NaN}',
        b"[" * 100_000 + b"]" * 100_000,  # nested past the interpreter's stack
        b'{"t":"ping","id":1}{"t":"ping","id":2}',
        b"\xff\xfe",
    ],
    ids=["1e999", "infinity", "nan", "nested", "two-values", "not-utf8"],
)
def test_a_request_the_agent_cannot_use_is_answered_and_the_agent_goes_on(agent: LocalAgent, header: bytes) -> None:
    """Each ended the agent (an OverflowError or a RecursionError nobody caught) or was read as
    something it is not; each is an error frame now, and the agent answers the next request."""
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(frame(header))
    agent.proc.stdin.flush()
    answer, _ = agent.next()
    assert answer.t == "error", answer
    agent.send({"t": "ping", "id": 9})
    assert isinstance(agent.next()[0], Reply)


def test_a_signal_number_past_a_c_int_is_an_error_and_the_command_runs_on(agent: LocalAgent) -> None:
    """os.killpg raised OverflowError for it, which ended the agent with its command running."""
    agent.send({"t": "run", "id": 1, "argv": ["sleep", "30"], "env": {}, "cwd": None})
    assert isinstance(agent.next()[0], Started)
    agent.send({"t": "signal", "id": 2, "target": 1, "sig": 10**30})
    answer, _ = agent.next()
    assert answer.t == "error" and answer.id == 2 and "OverflowError" in answer.message, answer
    agent.send({"t": "signal", "id": 3, "target": 1, "sig": signal.SIGKILL})
    frames = [agent.next()[0] for _ in range(2)]
    assert {f.t for f in frames} == {"done", "exit"}, frames


def test_the_agent_ends_with_its_stdin() -> None:
    a = LocalAgent()
    a.next()
    assert a.close() == 0


def test_health_check_passes_where_commands_can_start() -> None:
    assert subprocess.run([sys.executable, "-I", "-S", str(AGENT), "--health"], timeout=30).returncode == 0


def test_a_command_starts_as_popen_started_it(tmp_path: Path) -> None:
    """os.posix_spawn in place of subprocess.Popen, with Popen's guarantees: stdin /dev/null; no
    descriptor of the agent's; SIGPIPE (which the agent ignores) back to default; the program
    found on the request's PATH, past a file there that cannot run; and the agent's own working directory unchanged by a command's."""
    leak_r, leak_w = os.pipe()
    bin_a, bin_b = tmp_path / "a", tmp_path / "b"
    for folder in (bin_a, bin_b):
        folder.mkdir()
    (bin_a / "tool").write_text("#!/bin/sh\necho wrong\n")  # not executable: skipped, as Popen skips it
    (bin_b / "tool").write_text("#!/bin/sh\necho found\n")
    (bin_b / "tool").chmod(0o755)
    a = LocalAgent(pass_fds=(leak_w,))
    os.close(leak_w)
    try:
        a.next()
        done, out, _ = a.run(
            1, ["/bin/sh", "-c", "readlink /proc/$$/fd/0; ls /proc/$$/fd; grep SigIgn /proc/$$/status"]
        )
        lines = out[1].decode().split("\n")
        assert done.code == 0 and lines[0] == "/dev/null", out
        assert sorted(lines[1:-2], key=int) == ["0", "1", "2"], out  # none of the agent's
        assert int(lines[-2].split()[1], 16) & (1 << (signal.SIGPIPE - 1)) == 0, out
        found, out, _ = a.run(2, ["tool"], env={"PATH": f"{bin_a}:{bin_b}"})
        assert (found.code, out[1]) == (0, b"found\n"), out
        before = os.readlink(f"/proc/{a.proc.pid}/cwd")
        assert a.run(3, ["true"], cwd=str(tmp_path))[0].code == 0
        assert a.run(4, ["true"], cwd=str(tmp_path / "gone"))[0].code == 126
        assert os.readlink(f"/proc/{a.proc.pid}/cwd") == before
        _, out, _ = a.run(5, ["pwd"])
        assert out[1].decode().strip() == before
        nothing = a.run(6, ["tool"], env={"PATH": f"{bin_a}:{tmp_path / 'none'}"})[0]
        assert nothing.code == 126, "a file found that cannot run is a shell's 126, not a missing one's 127"
        # counted after a command that ran: its answer comes once its descriptors are closed (a
        # refused one's answer comes just before the agent closes its pipes' write ends)
        assert a.run(7, ["true"])[0].code == 0
        fds = sorted(os.listdir(f"/proc/{a.proc.pid}/fd"))
        for rid in range(8, 18):  # what posix_spawn refuses and Popen did not: 126, nothing held
            odd, out, _ = a.run(rid, ["" if rid % 2 else "true"], env={} if rid % 2 else {"": "x"})
            assert odd.code == 126 and out[2], out
        assert a.run(18, ["true"])[0].code == 0
        assert sorted(os.listdir(f"/proc/{a.proc.pid}/fd")) == fds  # a leak was 2 more a call
    finally:
        a.close()
        os.close(leak_r)


HIDDEN_PROC = ("unshare", "-m", "sh", "-c", 'mount -t tmpfs none /proc && exec "$@"', "sh")


@pytest.mark.parametrize("proc", ["mounted", "hidden"])
def test_no_descriptor_handed_to_the_agent_reaches_a_command(proc: str) -> None:
    """A descriptor the agent's parent left open across exec (as its FIFOs to the orchestrator
    would be, were they inheritable) never reaches a command: forged frames could go up it. Also
    where /proc is not mounted, which the agent's check of its descriptors reads."""
    if proc == "hidden" and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("needs root and unshare to hide /proc from the agent")
    read_end, write_end = os.pipe()
    a = LocalAgent(pass_fds=(write_end,), prefix=HIDDEN_PROC if proc == "hidden" else ())
    os.close(write_end)
    try:
        a.next()
        assert Path(f"/proc/{a.proc.pid}/fd/{write_end}").exists(), "the agent was not handed the descriptor"
        probe = f"import os\ntry:\n    os.write({write_end}, b'forged')\n    print('open')\nexcept OSError:\n    print('closed')"
        done, out, _ = a.run(1, [sys.executable, "-I", "-S", "-c", probe])
        assert (done.code, out[1]) == (0, b"closed\n"), out
    finally:
        a.close()
    os.set_blocking(read_end, False)
    assert os.read(read_end, 100) == b"", "a frame was forged up the descriptor"  # every writer gone
    os.close(read_end)


def test_an_agent_whose_own_folder_turns_unsearchable_still_reports_what_ran() -> None:
    """The sandbox's user (the agent's own) takes search permission off the agent's folder: a
    command given a folder still runs and is reported as it ended (never as not started, never
    left unreaped), and one given none runs in /."""
    python = "/usr/bin/python3"  # the test's own may sit in a folder only root can enter (a CI clone)
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access(python, os.X_OK):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run the agent as another user")
    base = Path(tempfile.mkdtemp(prefix="sbx-agent-home-", dir="/tmp"))
    try:
        base.chmod(0o755)
        home, other = base / "home", base / "other"
        for folder in (home, other):
            folder.mkdir()
            os.chown(folder, 65534, 65534)
        agent_copy = base / "agent.py"
        shutil.copyfile(AGENT, agent_copy)
        agent_copy.chmod(0o644)
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        a = LocalAgent(prefix=nobody, cwd=str(home), program=(python, str(agent_copy)))
        try:
            a.next()
            assert a.run(1, ["chmod", "a-x", str(home)])[0].code == 0
            codes = [a.run(rid, ["sh", "-c", f"echo {rid} >> log"], cwd=str(other))[0].code for rid in range(2, 7)]
            assert codes == [0] * 5 and (other / "log").read_text().split() == [str(r) for r in range(2, 7)]
            assert a.run(7, ["pwd"])[1][1] == b"/\n"
            assert not [pid for pid in live_or_zombie_children(a.proc.pid) if pid[1] == "Z"]
        finally:
            a.close()
    finally:
        home.chmod(0o755)
        shutil.rmtree(base)


def live_or_zombie_children(parent: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `parent`."""
    return [(pid, fields[0]) for pid, fields in processes() if int(fields[1]) == parent]


# -- the orchestrator's reader, fed hostile bytes -----------------------------------------


def frame(header: bytes, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(header), len(payload)) + header + payload


def muxed(data: bytes, stream: int = 1) -> bytes:
    return DOCKER_HEAD.pack(stream, len(data)) + data


class MuxedReader:
    """What the link reads from Docker: the exec stream's demultiplexer, then the frame reader."""

    def __init__(self) -> None:
        self._demux, self._reader = DockerDemux(), FrameReader()

    @property
    def stderr(self) -> bytes:
        return bytes(self._demux.stderr)

    def feed(self, data: bytes) -> list[tuple[Any, bytes]]:
        return self._reader.feed(self._demux.feed(data))


def test_a_gigabyte_frame_is_refused_from_its_header() -> None:
    reader = MuxedReader()
    with pytest.raises(FrameError, match="over the limits"):
        reader.feed(muxed(HEAD.pack(10, 1 << 30)))  # the header alone: nothing is waited for


def test_garbage_and_off_protocol_frames_are_refused() -> None:
    for bad in (
        b"not json at all",
        b'{"t":"exit","id":1,"code":300,"signal":0}',
        b'{"t":"exit","id":1,"code":"0","signal":0}',  # strict: no coercion
        b'{"t":"started","id":1,"pid":5,"extra":1}',
        b'{"t":"hello","id":3,"protocol":1,"pid":1,"pidfd":true}',
        b'{"t":"unknown","id":1}',
    ):
        with pytest.raises(FrameError):
            MuxedReader().feed(muxed(frame(bad)))
    with pytest.raises(FrameError, match="payload"):
        MuxedReader().feed(muxed(frame(b'{"t":"pong","id":1}', b"smuggled")))
    with pytest.raises(FrameError, match="multiplexed"):
        MuxedReader().feed(b"\x07\x00\x00\x00\x00\x00\x00\x01x")


def test_frames_split_anywhere_reassemble() -> None:
    stream = muxed(frame(b'{"t":"started","id":1,"pid":9}')) + muxed(frame(b'{"t":"out","id":1,"stream":1}', b"hi"))
    stream += muxed(b"agent says hi on stderr", 2)
    for cut in range(len(stream) + 1):
        reader = MuxedReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [f.t for f, _ in got] == ["started", "out"] and got[1][1] == b"hi"
        assert bytes(reader.stderr) == b"agent says hi on stderr"


@given(st.binary(max_size=300))
def test_any_bytes_give_frames_or_a_frame_error_never_anything_else(data: bytes) -> None:
    reader = MuxedReader()
    try:
        for f, payload in reader.feed(data):
            assert len(payload) <= MAX_PAYLOAD and f.t in {"hello", "started", "out", "exit", "pong", "done", "error"}
    except FrameError:
        pass


def test_path_follows_the_image_labels_and_the_config() -> None:
    good = {AGENT_LABEL: "/usr/local/lib/sandbox-agent/agent.py", AGENT_PROTOCOL_LABEL: "1"}
    assert path_from_labels(good, "auto").kind == "agent"
    assert path_from_labels(good, "off").kind == "docker exec"
    assert "no resident agent" in path_from_labels({}, "auto").reason
    old = path_from_labels({**good, AGENT_PROTOCOL_LABEL: "0"}, "auto")
    assert old.kind == "docker exec" and "rebuild" in old.reason
    assert struct.calcsize(">II") == HEAD.size


def test_the_session_tmpdir_is_made_700_and_never_its_parent(agent: LocalAgent, tmp_path: Path) -> None:
    """The agent makes a missing session TMPDIR (a mkdir process less) only as its last folder, 0700:
    a missing parent is a session's private record folder, which the wrapper makes with its own
    mode and checks (made here, it would be world-readable)."""
    private = tmp_path / "private"
    agent.run(1, ["true"], env={"SBX_TMPDIR": str(private / "tmp")})
    assert not private.exists()
    agent.run(2, ["true"], env={"SBX_TMPDIR": str(tmp_path / "tmp")})
    assert (tmp_path / "tmp").stat().st_mode & 0o777 == 0o700


def test_the_pid_files_folder_is_made_with_its_mode_and_never_through_a_link(agent: LocalAgent, tmp_path: Path) -> None:
    """A command's first run makes its pid file's folder (1777 shared, 700 a session's own) in the
    agent, not in a mkdir process of the wrapper: only the last folder, only with one of those two
    modes, and never through a link planted where the folder goes (the link's target keeps its mode)."""
    agent.run(1, ["true"], pid_file=str(tmp_path / "shared" / "c1.pid"), pid_dir_mode=0o1777)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o1777
    agent.run(2, ["true"], pid_file=str(tmp_path / "own" / "c2.pid"), pid_dir_mode=0o700)
    assert stat.S_IMODE((tmp_path / "own").stat().st_mode) == 0o700
    agent.run(3, ["true"], pid_file=str(tmp_path / "missing" / "own" / "c3.pid"), pid_dir_mode=0o700)
    assert not (tmp_path / "missing").exists()
    for rid, mode in enumerate([0o777, True, "1777", 1023.0, None], start=4):
        agent.run(rid, ["true"], pid_file=str(tmp_path / f"odd{rid}" / "c.pid"), pid_dir_mode=mode)
        assert not (tmp_path / f"odd{rid}").exists(), mode
    target = tmp_path / "target"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    (tmp_path / "planted").symlink_to(target)
    agent.run(10, ["true"], pid_file=str(tmp_path / "planted" / "c.pid"), pid_dir_mode=0o1777)
    assert (tmp_path / "planted").is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o755


# -- file operations beneath a root (what serves a workspace on a volume) ---------------------


@pytest.fixture(params=["openat2", "walk"])
def file_agent(request: pytest.FixtureRequest) -> Iterator[LocalAgent]:
    """The agent with openat2 (this kernel has it) and with the O_NOFOLLOW walk alone."""
    a = LocalAgent({"SBX_AGENT_NO_OPENAT2": "1"} if request.param == "walk" else None)
    a.next()
    yield a
    a.close()


def file_call(agent: LocalAgent, rid: int, kind: str, root: Path, parts: list[str], **extra: Any) -> tuple[Any, bytes]:
    payloads = extra.pop("chunks", [b""])
    for index, chunk in enumerate(payloads):
        last = index == len(payloads) - 1
        header = {"t": kind, "id": rid, "root": str(root), "parts": parts, "first": index == 0, "last": last, **extra}
        assert agent.proc.stdin is not None
        agent.proc.stdin.write(encode(header, chunk))
        agent.proc.stdin.flush()
    data = b""
    while True:
        frame, payload = agent.next()
        assert frame.id == rid
        if frame.t == "data":
            data += payload
        else:
            return frame, data


def test_files_are_written_atomically_in_chunks_and_read_back(file_agent: LocalAgent, tmp_path: Path) -> None:
    chunks = [b"a" * 1000, b"b" * 1000, b"c"]
    done, _ = file_call(file_agent, 1, "fwrite", tmp_path, ["new", "dir", "f.txt"], chunks=chunks, mode=0o640)
    assert done.t == "file" and done.size == 2001
    assert (tmp_path / "new/dir/f.txt").read_bytes() == b"".join(chunks)
    assert (tmp_path / "new/dir/f.txt").stat().st_mode & 0o777 == 0o640
    assert not [p for p in (tmp_path / "new/dir").iterdir() if p.name.endswith(".sbx-tmp")]
    info, data = file_call(file_agent, 2, "fread", tmp_path, ["new", "dir", "f.txt"], max=10_000)
    assert info.t == "file" and data == b"".join(chunks)
    big, _ = file_call(file_agent, 3, "fread", tmp_path, ["new", "dir", "f.txt"], max=100)
    assert (big.t, big.why, big.size) == ("ferror", "too_big", 2001)
    gone, _ = file_call(file_agent, 4, "funlink", tmp_path, ["new", "dir", "f.txt"])
    missing, _ = file_call(file_agent, 5, "fstat", tmp_path, ["new", "dir", "f.txt"])
    assert gone.t == "done" and missing.t == "file" and missing.exists is False


def test_links_anywhere_in_a_path_are_refused(file_agent: LocalAgent, tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    (root / "flink").symlink_to(outside / "secret.txt")
    (root / "dlink").symlink_to(outside)
    (root / "real").mkdir()
    (root / "real" / "up").symlink_to("..")
    for rid, parts in enumerate((["flink"], ["dlink", "secret.txt"], ["real", "up", "flink"]), start=1):
        read, data = file_call(file_agent, rid, "fread", root, parts, max=100)
        assert read.t == "ferror" and data == b"", (parts, read)
        wrote, _ = file_call(file_agent, 10 + rid, "fwrite", root, parts, chunks=[b"PWNED"])
        if parts == ["flink"]:  # the link itself is replaced by a file, never written through
            assert wrote.t == "file" and not (root / "flink").is_symlink()
        else:
            assert wrote.t == "ferror", (parts, wrote)
    assert (outside / "secret.txt").read_text() == "SECRET" and sorted(p.name for p in outside.iterdir()) == [
        "secret.txt"
    ]


def test_file_requests_with_path_tricks_are_refused(file_agent: LocalAgent, tmp_path: Path) -> None:
    for rid, parts in enumerate(([".."], ["a/b"], [""], ["ok", "."]), start=1):
        answer, _ = file_call(file_agent, rid, "fstat", tmp_path, parts)
        assert answer.t == "error" and "component" in answer.message, (parts, answer)


def test_a_write_that_fails_half_way_changes_nothing_and_answers_once(tmp_path: Path) -> None:
    """The second of three chunks fails (the file size limit): one `ferror`, the rest of that write
    is dropped, the old file stays, no temp file is left, and the stream stays in step."""
    agent = LocalAgent(max_file_bytes=100)
    agent.next()
    try:
        (tmp_path / "f.txt").write_text("OLD")
        failed, _ = file_call(agent, 1, "fwrite", tmp_path, ["f.txt"], chunks=[b"A" * 60, b"B" * 60, b"C" * 10])
        assert failed.t == "ferror"
        assert agent.run(2, ["true"])[0].code == 0  # the next answer is the next request's
        assert (tmp_path / "f.txt").read_text() == "OLD"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    finally:
        agent.close()


# -- the orchestrator's link, fed hostile bytes (its transport: a real agent's pipes) ----------


async def _link() -> tuple[Any, Any]:
    from sandbox.runtime.agent.link import AgentLink
    from sandbox.runtime.agent.pipe import LocalAgents

    agents = LocalAgents()
    transport = await agents.start("container-id", ["python3", "-I", "-S", str(AGENT)], None)
    return AgentLink(transport, "container-id", None), agents


@pytest.mark.slow
@pytest.mark.anyio
async def test_empty_output_frames_and_answers_to_requests_never_made_end_the_link() -> None:
    from sandbox.runtime.agent.link import _Pending
    from sandbox.runtime.output import OutputCapture

    for bad, words in (
        (frame(b'{"t":"out","id":1,"stream":1}'), "empty"),
        (frame(b'{"t":"pong","id":7}'), "never made"),
    ):
        link, agents = await _link()
        link._next = 2
        link._pending[1] = _Pending(1, capture=OutputCapture(), answered=True)
        await link._dispatch(bad)
        assert link.dead is not None and words in link.dead, link.dead
        assert link._pending[1].error is not None  # the call waiting on it fails at once
        agents.reap()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_flood_of_small_frames_lets_other_tasks_run_between_them() -> None:
    """Thousands of tiny (legal) frames in one read: the link hands the event loop back every
    few hundred, so other tenants' calls are not held up behind them (order, not timing)."""
    link, agents = await _link()
    link._next = 2  # request 1 was made and is no longer waited for: its late answers are dropped
    ran = anyio.Event()

    async def neighbour() -> None:
        ran.set()

    flood = frame(b'{"t":"pong","id":1}') * 2000
    async with anyio.create_task_group() as tg:
        tg.start_soon(neighbour)
        await link._dispatch(flood)
        assert ran.is_set()  # the neighbour ran before the flood was through
        assert link.dead is None  # late answers are legal; a flood of them costs only CPU
    link.close()
    agents.reap()
