"""The /proc kill as host/backend.py and host/shell.py still import it; it is sandbox/runtime/proc_kill.py.

Kept only for those two modules (changed on other branches of issue 25): import
`sandbox.runtime.proc_kill` instead, and remove this module when none imports it from here.
"""

from __future__ import annotations

from sandbox.runtime.proc_kill import all_pids, members_of, signal_members

__all__ = ["all_pids", "members_of", "signal_members"]
