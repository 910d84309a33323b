"""One line of `sandbox doctor`'s report, whatever backend it checks (runtime/docker/doctor.py,
runtime/kubernetes/doctor.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: ok / warn / fail, what was found, and the fix."""

    status: Status
    name: str
    detail: str
    fix: str = ""
