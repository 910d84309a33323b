"""How a command is started so that a timeout can kill all of it, and how it is killed.

Docker has no API to kill an exec'd process. Each command therefore runs in a shell that is the
leader of its own process group (docker exec starts every process as a session leader; on the
host we ask for a new session), writes its pid (= its process group id) to a pid file, and
carries an environment tag `SBX_CALL=<id>`. Killing signals the group, then every process whose environment
still carries the tag, which also catches children that left the group with setsid themselves.
Background commands keep their output, exit code and stdin fifo in the same directory, so a
restarted orchestrator finds them again. The scripts need only sh, coreutils and grep.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.runtime.spec import SandboxSpec

PID_DIR = "/tmp/.sbx"
TAG_VAR = "SBX_CALL"

# One shell, no extra exec: write the pid (builtins only on the fast path), then eval the
# command in the same process. 1777: setup commands may run as root first; the sandbox user
# must still write pid files.
# A pid is also kept in a file's name (an empty file needs no space on a full tmpfs).
_PID_OF = """
pid_of() {
  p=$(cat "$1/$2.pid" 2>/dev/null)
  [ -n "$p" ] || for f in "$1/$2".pid-*; do [ -e "$f" ] && p="${f##*.pid-}"; done
  # a pid file is data: only a number above 1 is a process group we may signal (never -1)
  case "$p" in ''|*[!0-9]*) p= ;; *) [ "$p" -gt 1 ] || p= ;; esac
  echo "$p"
}
# alive and not a zombie (an orphan's zombie lingers where nothing reaps it, e.g. on a host
# whose pid 1 is not an init)
alive() {
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
  read -r _ _ st _ < "/proc/$1/stat" 2>/dev/null || return 0
  [ "$st" != Z ]
}
"""

# The pid file only helps the in-sandbox kill; the tag finds every process anyway, so a full
# /tmp (another session's doing, in agent scope) must not stop the command from running. The
# resident agent removes it once the command is over and its process group is empty (the
# orchestrator names it: `pid_file`); a trap here would cost every call an `rm` process.
_WRAP = (
    "__sbx_c=$1; __sbx_p=$0; __sbx_m=$2; set --; "
    '[ -z "$SBX_UMASK" ] || umask "$SBX_UMASK"; '
    '{ echo $$ > "$__sbx_p" || { mkdir -p -m "$__sbx_m" "${__sbx_p%/*}" && echo $$ > "$__sbx_p"; }; } 2>/dev/null; '
    '[ -z "$SBX_TMPDIR" ] || { [ -d "$SBX_TMPDIR" ] || mkdir -p -m 700 "$SBX_TMPDIR" 2>/dev/null; '
    '[ -d "$SBX_TMPDIR" ] && [ ! -L "$SBX_TMPDIR" ] && [ -O "$SBX_TMPDIR" ] && export TMPDIR="$SBX_TMPDIR"; }; '
    'unset __sbx_p __sbx_m SBX_TMPDIR SBX_UMASK; eval "$__sbx_c"'
)

# A private record directory (a session's own, see runtime/session_users.py) is trusted only
# when it is a real directory owned by the caller: one squatted by another uid, or a link, is
# refused (exit 96), so no other session's files are ever read or written as this session's.
_OWN_DIR = """
own_dir() {
  if [ "$2" = 1 ]; then
    [ -d "$1" ] || [ -L "$1" ] || mkdir -p -m 700 "$1" || exit 97
    [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] || exit 96
  else
    { [ -d "$1" ] || mkdir -p -m 1777 "$1"; } || exit 97
  fi
}
"""

_KILL = (
    _PID_OF
    + f"""
id="$1"; sig="$2"; d="$3"; private="$4"
pg=
# a private directory someone else made is not ours: its pid files are not trusted
if [ "$private" != 1 ] || {{ [ -O "$d" ] && [ ! -L "$d" ]; }}; then pg=$(pid_of "$d" "$id"); fi
[ -n "$pg" ] && kill -s "$sig" -- -"$pg" 2>/dev/null
for p in /proc/[0-9]*; do
  if grep -qsxz "{TAG_VAR}=$id" "$p"/task/*/environ 2>/dev/null; then
    kill -s "$sig" "${{p#/proc/}}" 2>/dev/null
  fi
done
true
"""
)

_ALIVE = f"""
id="$1"
for p in /proc/[0-9]*; do
  if grep -qsxz "{TAG_VAR}=$id" "$p"/task/*/environ 2>/dev/null; then echo "${{p#/proc/}}"; fi
done
true
"""

_START_BG = (
    _OWN_DIR
    + f"""
id="$1"; cmd="$2"; d="$3"; limit="$4"; watchdog="$5"; private="$6"; stdin="${{7:-fifo}}"
[ -z "$SBX_UMASK" ] || umask "$SBX_UMASK"
own_dir "$d" "$private"
rm -f "$d/$id.rc" "$d/$id".exit-* "$d/$id".pid-* "$d/$id.in" "$d/$id.timeout" || exit 97
mkfifo "$d/$id.in" && : > "$d/$id.out" || exit 97
setsid sh -c '
  echo $$ > "$0/$1.pid" 2>/dev/null; : > "$0/$1.pid-$$"
  w=
  if [ "$3" != 0 ]; then
    env -u {TAG_VAR} sh -c "$4" "$0" "$1" "$3" "$$" </dev/null >/dev/null 2>&1 &
    w=$!
  fi
  [ -z "$SBX_TMPDIR" ] || {{ [ -d "$SBX_TMPDIR" ] || mkdir -p -m 700 "$SBX_TMPDIR" 2>/dev/null;
    [ -d "$SBX_TMPDIR" ] && [ ! -L "$SBX_TMPDIR" ] && [ -O "$SBX_TMPDIR" ] && export TMPDIR="$SBX_TMPDIR"; }}
  unset SBX_TMPDIR SBX_UMASK
  if [ "$5" = null ]; then exec 3</dev/null; else exec 3<>"$0/$1.in"; fi
  /bin/sh -lc "$2" <&3 >>"$0/$1.out" 2>&1
  : > "$0/$1.exit-$?"
  [ -n "$w" ] && kill "$w" 2>/dev/null
' "$d" "$id" "$cmd" "$limit" "$watchdog" "$stdin" </dev/null >/dev/null 2>&1 &
# report `started` only once the process has recorded its pid: a poll right after must not
# mistake a process that has not written it yet for one that died
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  for f in "$d/$id".pid-*; do [ -e "$f" ] && break 2; done
  sleep 0.05
done
echo started
"""
)

# The deadline of a background command: not tagged itself, it marks the timeout, kills every
# tagged process (also those that left the group), then the whole group (itself included). Its
# trap is set before its sleep starts: a TERM at any moment leaves no sleep behind.
_WATCHDOG = f"""
d="$0"; id="$1"; t="$2"; pg="$3"
trap 'kill $! 2>/dev/null; exit 0' TERM
sleep "$t" &
wait $! || exit 0
for f in "$d/$id".exit-*; do [ -e "$f" ] && exit 0; done
: > "$d/$id.timeout"
for p in /proc/[0-9]*; do
  if grep -qsxz "{TAG_VAR}=$id" "$p"/task/*/environ 2>/dev/null; then kill -s KILL "${{p#/proc/}}" 2>/dev/null; fi
done
kill -s KILL -- -"$pg"
"""

_POLL = (
    _PID_OF
    + """
id="$1"; off="$2"; lim="$3"; d="$4"
if [ "$5" = 1 ] && { [ -L "$d" ] || [ ! -O "$d" ]; }; then echo gone; exit 0; fi
if [ ! -f "$d/$id.out" ]; then echo gone; exit 0; fi
exit_rc() {
  rc=; for f in "$d/$id".exit-*; do [ -e "$f" ] && rc="${f##*.exit-}"; done
  [ -z "$rc" ] && [ -f "$d/$id.rc" ] && rc=$(cat "$d/$id.rc")
}
exit_rc
if [ -n "$rc" ]; then echo "exited $rc"
# still alive: running, even past its deadline while the watchdog is still killing it
elif alive "$(pid_of "$d" "$id")"; then echo running
elif [ -f "$d/$id.timeout" ]; then echo timed_out
# it may have ended between the first look and this one: its exit file is written before it goes
elif exit_rc; [ -n "$rc" ]; then echo "exited $rc"
else echo killed; fi
stat -c %s "$d/$id.out"
tail -c +"$((off + 1))" "$d/$id.out" | head -c "$lim"
"""
)

# A write that does not fit in the pipe (the process does not read) is killed after a deadline.
_WRITE = (
    'id="$1"; d="$2"; t="$3"; private="$4"; shift 4; '
    '[ "$private" != 1 ] || { [ ! -L "$d" ] && [ -O "$d" ]; } || exit 96; '
    'exec timeout -s KILL "$t" sh -c \'f="$0"; printf "%s" "$@" > "$f"\' "$d/$id.in" "$@"'
)
STDIN_CHUNK = 64 * 1024  # one argv string stays far below the kernel's 128 KiB per argument

_CALL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SIGNALS = frozenset({"TERM", "KILL", "INT", "HUP"})


def is_private(pid_dir: str) -> bool:
    """Whether `pid_dir` is one caller's own (mode 700, checked) rather than the shared 1777 one."""
    return pid_dir != PID_DIR


def check_call_id(call_id: str) -> str:
    """Call ids end up in file names and patterns: keep them boring."""
    if not _CALL_ID.match(call_id):
        raise ValueError(f"bad call id {call_id!r}")
    return call_id


def wrapped_argv(command: str, call_id: str, pid_dir: str = PID_DIR) -> list[str]:
    """argv that runs `command` in /bin/sh -lc, its pid (= process group) in a pid file.

    The caller must start it as a process group leader (docker exec does; on the host use a
    new session).
    """
    return ["/bin/sh", "-lc", _WRAP, pid_file(call_id, pid_dir), command, f"{pid_dir_mode(pid_dir):o}"]


def pid_dir_mode(pid_dir: str) -> int:
    """The mode a pid file's folder is made with: 700 a caller's own, 1777 the shared one."""
    return 0o700 if is_private(pid_dir) else 0o1777


def pid_file(call_id: str, pid_dir: str = PID_DIR) -> str:
    """Where a call's wrapper writes its pid (its process group)."""
    return f"{pid_dir}/{check_call_id(call_id)}.pid"


# What a closed session's uid left at the top of shared folders (its record folder and TMPDIR,
# files it made in /tmp itself) goes, run as that uid: folders it locked (chmod 000) are opened
# first, from the top down (find visits a folder before it descends), and links are never
# followed (find -P; rm removes a link, not its target).
_CLEAN_USER = r"""
me=$(id -u)
for d in "$@"; do
  find -P "$d" -xdev -mindepth 1 -type d -user "$me" ! -perm -u=rwx -exec chmod u+rwx {} \; 2>/dev/null
  find -P "$d" -xdev -mindepth 1 -maxdepth 1 -user "$me" -exec rm -rf -- {} + 2>/dev/null
done
true
"""


def clean_user_argv(folders: Sequence[str]) -> list[str]:
    """argv that removes the caller's own entries at the top of each of `folders`."""
    return ["/bin/sh", "-c", _CLEAN_USER, "sbx", *folders]


def kill_argv(call_id: str, signal: str, pid_dir: str = PID_DIR) -> list[str]:
    """argv that signals everything `call_id` started."""
    if signal not in SIGNALS:
        raise ValueError(f"bad signal {signal!r}")
    private = "1" if is_private(pid_dir) else "0"
    return ["/bin/sh", "-c", _KILL, "sbx", check_call_id(call_id), signal, pid_dir, private]


def alive_argv(call_id: str) -> list[str]:
    """argv that prints the pids still tagged with `call_id`."""
    return ["/bin/sh", "-c", _ALIVE, "sbx", check_call_id(call_id)]


def start_background_argv(
    command: str, call_id: str, pid_dir: str = PID_DIR, timeout_s: float | None = None, *, stdin: bool = True
) -> list[str]:
    """argv that starts `command` detached, output to a file, stdin from a fifo (or, without
    `stdin`, at its end at once, as a plain exec's); prints `started`.

    With `timeout_s`, a watchdog kills it (and everything it started) at the deadline, whether
    or not anybody is still waiting for it.
    """
    limit = str(max(1, round(timeout_s))) if timeout_s else "0"
    private = "1" if is_private(pid_dir) else "0"
    feed = "fifo" if stdin else "null"
    argv = [check_call_id(call_id), command, pid_dir, limit, _WATCHDOG, private, feed]
    return ["/bin/sh", "-c", _START_BG, "sbx", *argv]


# A background command's records, once its outcome is known and kept elsewhere (a durable exec's):
# its log, status and pid files go, so the sandbox's temporary space is not filled call by call.
_FORGET = 'id="$1"; d="$2"; [ "$3" != 1 ] || { [ ! -L "$d" ] && [ -O "$d" ]; } || exit 96; ' + (
    'rm -f "$d/$id.out" "$d/$id.rc" "$d/$id".exit-* "$d/$id.pid" "$d/$id".pid-* "$d/$id.in" "$d/$id.timeout"'
)


def forget_argv(call_id: str, pid_dir: str = PID_DIR) -> list[str]:
    """argv that removes a finished background command's records (its log included)."""
    return ["/bin/sh", "-c", _FORGET, "sbx", check_call_id(call_id), pid_dir, "1" if is_private(pid_dir) else "0"]


def poll_argv(call_id: str, offset: int, limit: int, pid_dir: str = PID_DIR) -> list[str]:
    """argv that prints status line, total size line, then output from `offset`."""
    return [
        "/bin/sh",
        "-c",
        _POLL,
        "sbx",
        check_call_id(call_id),
        str(int(offset)),
        str(int(limit)),
        pid_dir,
        "1" if is_private(pid_dir) else "0",
    ]


def write_stdin_argv(call_id: str, data: str, pid_dir: str = PID_DIR, timeout_s: float = 5.0) -> list[str]:
    """argv that writes `data` to a background command's stdin fifo, killed after `timeout_s`.

    Exit status 137 (killed) means the pipe stayed full: the process is not reading its stdin.
    """
    chunks = [data[i : i + STDIN_CHUNK // 4] for i in range(0, len(data), STDIN_CHUNK // 4)] or [""]
    private = "1" if is_private(pid_dir) else "0"
    deadline = str(max(1, round(timeout_s)))
    return ["/bin/sh", "-c", _WRITE, "sbx", check_call_id(call_id), pid_dir, deadline, private, *chunks]


class InSandbox:
    """What every sandbox whose commands run inside it says of itself (Docker's containers,
    Kubernetes' Pods): its spec, pid files under PID_DIR (a tmpfs there), no TMPDIR of its own
    (the tools choose one per session)."""

    _spec: SandboxSpec

    @property
    def spec(self) -> SandboxSpec:
        """The spec it was made from."""
        return self._spec

    @property
    def durable_processes(self) -> bool:
        """True: a background process lives in the sandbox, not in this orchestrator."""
        return True

    @property
    def pid_dir(self) -> str:
        """Where pid files and background output live (a tmpfs in the sandbox)."""
        return PID_DIR

    @property
    def tmp_dir(self) -> str | None:
        """None: without a session user the session's TMPDIR is the tools' choice."""
        return None
