"""Read what a setting means, not how it is spelled: user specs and seccomp profiles.

The engine parses `User` with Go's `strconv.Atoi` (so `00`, `+0`, `-0` and `0000` are uid 0) and
applies a seccomp profile by its content (a file whose default action allows every syscall is
no filter at all). Rules that compared spellings passed both; these helpers read the meaning.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NUMBER = re.compile(r"[+-]?[0-9]+")
ROOT_NAMES = frozenset({"root"})  # the name the images here give uid 0
# default actions under which a syscall nobody listed simply runs
_ALLOWING = frozenset({"SCMP_ACT_ALLOW", "SCMP_ACT_LOG"})


def user_part(spec: str) -> str:
    """The user of `user[:group]`, trimmed."""
    return spec.split(":", 1)[0].strip()


def is_root_user(spec: str) -> bool:
    """Whether a `user[:group]` spec runs as uid 0: unset, `root`, or any integer spelling of 0."""
    user = user_part(spec)
    if user in ("", *ROOT_NAMES):
        return True
    return bool(_NUMBER.fullmatch(user)) and int(user) == 0


def seccomp_weakness(value: str) -> str | None:
    """What is wrong with one `seccomp=` value, or None when it filters.

    `value` is what follows `seccomp=` in SecurityOpt: `unconfined`, `builtin`, a profile's JSON
    (the engine and the spec inline files), or a path that could not be read.
    """
    value = value.strip()
    if value == "unconfined":
        return "seccomp=unconfined"
    if value in ("builtin", "default"):
        return None
    try:
        profile: Any = json.loads(value)
    except ValueError:
        return f"seccomp profile {value[:120]!r} is not a readable JSON profile (a missing file?)"
    if not isinstance(profile, dict):
        return "seccomp profile is not a JSON object"
    default = str(profile.get("defaultAction") or "")
    if default not in _ALLOWING:
        return None
    restricting = [
        rule
        for rule in profile.get("syscalls") or []
        if isinstance(rule, dict) and str(rule.get("action") or "") not in _ALLOWING and rule.get("names")
    ]
    denied = sorted({str(n) for rule in restricting for n in rule.get("names") or []})
    if not denied:
        return f"seccomp profile's defaultAction is {default} and it restricts no syscall: unconfined in effect"
    shown = ", ".join(denied[:8]) + (" ..." if len(denied) > 8 else "")
    return (
        f"seccomp profile's defaultAction is {default}: every syscall it does not list runs "
        f"(it restricts only {len(denied)}: {shown})"
    )


def denies_unix_sockets(opts: list[str]) -> bool:
    """Whether the seccomp option among `opts` refuses socket(AF_UNIX, ...), judged by content.

    True when the profile denies by default and every rule allowing `socket` pins the family to
    one value that is not AF_UNIX in its low 32 bits (the built-in `strict` profile's shape). A
    "not equal to 1" rule does not count: 0x100000001 passes it and the kernel reads AF_UNIX.
    False for the engine's default profile, which allows every family.
    """
    values = [o[8:] for o in opts if o[:8] in ("seccomp=", "seccomp:")]
    if not values:
        return False
    try:
        profile: Any = json.loads(values[-1])
    except ValueError:
        return False
    if not isinstance(profile, dict) or str(profile.get("defaultAction") or "") in _ALLOWING:
        return False
    for rule in profile.get("syscalls") or []:
        if not isinstance(rule, dict) or "socket" not in (rule.get("names") or []):
            continue
        if str(rule.get("action") or "") not in _ALLOWING:
            continue
        args = rule.get("args") or []
        if not any(
            a.get("index") == 0 and a.get("op") == "SCMP_CMP_EQ" and (int(a.get("value") or 0) & 0xFFFFFFFF) != 1
            for a in args
        ):
            return False
    return True
