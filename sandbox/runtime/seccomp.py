"""The built-in `strict` seccomp profile: deny by default, and no Unix sockets.

A Unix socket that appears below a mounted folder after a sandbox started (a dev database's
`.s.PGSQL.5432` in the workspace) is reachable through the mount, read-only or not, whatever the
network mode. Seccomp cannot read `connect`'s address, so the filter is on socket creation:
`socket()` is allowed for IP and netlink families only (matched exactly, all 64 bits), so
AF_UNIX fails with EPERM; `socketpair` only for stream and seqpacket pairs (connected, they
reach nothing on disk; a datagram pair could `sendto` a path). The engine applies one profile only, so this one is
a whole allowlist, written here from the syscalls an ordinary userland needs; whatever it does
not name is EPERM. Left out on purpose: namespaces and mounts (`unshare`, `setns`, `mount`, new
mount API), `ptrace` and `process_vm_*` and `pidfd_getfd` (reading or stealing from another
session's processes under the same uid), `io_uring_*` (it creates sockets past seccomp),
`bpf`, `perf_event_open`, `userfaultfd`, keyrings, modules, clocks, reboot/kexec/swap, file
handles, NUMA placement, and every 32-bit entry point (only the engine's native architecture is
allowed, so `socketcall` cannot be used to get round the rule).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

STRICT = "strict"
ENGINE_DEFAULT = "default"
PROFILE_VERSION = 2  # bump when the allowlist changes: sandboxes are recreated under the new one

AF_UNIX = 1
# socket() families allowed, each matched exactly on all 64 bits of the argument: a "not AF_UNIX"
# rule let 0x100000001 through (the kernel reads only the low 32 bits: AF_UNIX again)
SOCKET_FAMILIES = (2, 10, 16)  # AF_INET, AF_INET6, AF_NETLINK
# socketpair() types (low 4 bits of the type; the flags above them are free): a datagram pair
# could still sendto() a datagram socket by path (/dev/log, a notify socket)
SOCKETPAIR_TYPES = (1, 5)  # SOCK_STREAM, SOCK_SEQPACKET
SOCK_TYPE_MASK = 0xF
EPERM = 1
ENOSYS = 38
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACE_FLAGS = 0x7E020000
# personality values a userland asks for: Linux, PER_LINUX32, UNAME26 and both, and "query"
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

_ALLOWED = """
read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 open openat openat2
close close_range creat lseek _llseek dup dup2 dup3 fcntl fcntl64 flock fsync fdatasync sync
syncfs sync_file_range truncate truncate64 ftruncate ftruncate64 fallocate fadvise64
fadvise64_64 readahead sendfile sendfile64 splice tee vmsplice copy_file_range

stat stat64 lstat lstat64 fstat fstat64 newfstatat fstatat64 statx statfs statfs64 fstatfs
fstatfs64 access faccessat faccessat2 readlink readlinkat getdents getdents64 getcwd chdir fchdir

mkdir mkdirat rmdir rename renameat renameat2 link linkat symlink symlinkat unlink unlinkat
chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat chown32 fchown32 lchown32 umask
utime utimes utimensat utimensat_time64 futimesat mknod mknodat
getxattr lgetxattr fgetxattr setxattr lsetxattr fsetxattr listxattr llistxattr flistxattr
removexattr lremovexattr fremovexattr inotify_init inotify_init1 inotify_add_watch
inotify_rm_watch

brk mmap mmap2 munmap mremap mprotect madvise mlock mlock2 munlock mlockall munlockall mincore
msync membarrier memfd_create pkey_alloc pkey_free pkey_mprotect remap_file_pages
map_shadow_stack mseal

fork vfork execve execveat exit exit_group wait4 waitid waitpid kill tkill tgkill
rt_sigqueueinfo rt_tgsigqueueinfo pidfd_open pidfd_send_signal getpid getppid gettid getpgid
setpgid getpgrp getsid setsid getuid geteuid getgid getegid getuid32 geteuid32 getgid32
getegid32 getresuid getresgid getresuid32 getresgid32 getgroups getgroups32 setuid setgid
setreuid setregid setresuid setresgid setgroups setfsuid setfsgid setuid32 setgid32 setreuid32
setregid32 setresuid32 setresgid32 setgroups32 setfsuid32 setfsgid32 capget capset prctl
arch_prctl set_tid_address set_robust_list get_robust_list futex futex_time64 futex_waitv
rseq restart_syscall sched_yield sched_getaffinity sched_setaffinity sched_getparam
sched_setparam sched_getscheduler sched_setscheduler sched_get_priority_max
sched_get_priority_min sched_rr_get_interval sched_rr_get_interval_time64 sched_getattr
sched_setattr getpriority setpriority ioprio_get ioprio_set getrlimit setrlimit prlimit64
ugetrlimit getrusage times uname sysinfo getcpu getrandom set_thread_area get_thread_area
seccomp landlock_create_ruleset landlock_add_rule landlock_restrict_self

rt_sigaction rt_sigprocmask rt_sigreturn sigreturn rt_sigpending rt_sigsuspend
rt_sigtimedwait rt_sigtimedwait_time64 sigaltstack signalfd signalfd4 pause alarm

clock_gettime clock_gettime64 clock_getres clock_getres_time64 clock_nanosleep
clock_nanosleep_time64 nanosleep gettimeofday time adjtimex getitimer setitimer timer_create
timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64
timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64

select _newselect pselect6 pselect6_time64 poll ppoll ppoll_time64 epoll_create epoll_create1
epoll_ctl epoll_ctl_old epoll_wait epoll_wait_old epoll_pwait epoll_pwait2 eventfd eventfd2
pipe pipe2 ioctl

bind listen accept accept4 connect getsockname getpeername getsockopt setsockopt
sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg recvmmsg_time64 shutdown

shmget shmat shmdt shmctl semget semop semtimedop semtimedop_time64 semctl msgget msgsnd
msgrcv msgctl mq_open mq_unlink mq_timedsend mq_timedsend_time64 mq_timedreceive
mq_timedreceive_time64 mq_notify mq_getsetattr
io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents io_pgetevents_time64
"""

ALLOWED_SYSCALLS: tuple[str, ...] = tuple(sorted(set(_ALLOWED.split())))


def _rule(names: list[str], action: str, args: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"names": names, "action": action, "args": args or [], **extra}


@cache
def strict_profile_json() -> str:
    """The `strict` profile as the JSON the engine takes inline (`seccomp=<json>`)."""
    rules = [
        _rule(list(ALLOWED_SYSCALLS), "SCMP_ACT_ALLOW"),
        # IP and netlink sockets only, never AF_UNIX however the argument is spelled
        *(
            _rule(["socket"], "SCMP_ACT_ALLOW", [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}])
            for family in SOCKET_FAMILIES
        ),
        # connected pairs only: a stream or seqpacket pair cannot reach a path
        *(
            _rule(
                ["socketpair"],
                "SCMP_ACT_ALLOW",
                [{"index": 1, "value": SOCK_TYPE_MASK, "valueTwo": kind, "op": "SCMP_CMP_MASKED_EQ"}],
            )
            for kind in SOCKETPAIR_TYPES
        ),
        # fork-like clones only: no new namespaces (a user namespace would bring capabilities back)
        _rule(
            ["clone"],
            "SCMP_ACT_ALLOW",
            [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        ),
        # its flags live in memory seccomp cannot read; ENOSYS makes libc fall back to clone
        _rule(["clone3"], "SCMP_ACT_ERRNO", errnoRet=ENOSYS),
        *(
            _rule(["personality"], "SCMP_ACT_ALLOW", [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}])
            for v in PERSONALITIES
        ),
    ]
    profile = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        # native architectures only: no 32-bit or x32 entry points
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": []},
        ],
        "syscalls": rules,
    }
    return json.dumps(profile, separators=(",", ":"))


def seccomp_identity(setting: str | None) -> str:
    """What the setting means, for the config hash: the built-in profile carries its version."""
    if setting == STRICT:
        return f"{STRICT}:v{PROFILE_VERSION}"
    return setting or ENGINE_DEFAULT


def seccomp_label(setting: str | None) -> str:
    """A short human name for the profile in effect (explain, doctor)."""
    if setting == STRICT:
        return f"seccomp=strict (built-in v{PROFILE_VERSION}: deny by default, no AF_UNIX sockets)"
    if not setting or setting == ENGINE_DEFAULT:
        return "seccomp=engine default"
    return f"seccomp={setting}"


def describe_security_opts(opts: list[str]) -> list[str]:
    """SecurityOpt as a person reads it: an inline profile is named, not printed whole."""
    out = [o for o in opts if not o.startswith("seccomp=")]
    profiles = [o[8:] for o in opts if o.startswith("seccomp=")]
    if not profiles:
        out.append(seccomp_label(None))
    for profile in profiles:
        if profile == strict_profile_json():
            out.append(seccomp_label(STRICT))
        elif profile.lstrip().startswith("{"):
            out.append(f"seccomp=custom profile ({len(profile)} bytes)")
        else:
            out.append(f"seccomp={profile}")
    return out
