"""Maps a long-running process keeps per sandbox, session or call: least recently used out.

A service runs for weeks; anything it remembers per thing it has ever seen must be bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping
from typing import TypeVar

import anyio

MAX_REMEMBERED = 4096

_K = TypeVar("_K")
_V = TypeVar("_V")


def remember(cache: OrderedDict[_K, _V], key: _K, value: _V, most: int = MAX_REMEMBERED) -> None:
    """Put `key` last (most recently used) and drop the oldest past `most`."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > most:
        cache.popitem(last=False)


def drop_if_idle(locks: MutableMapping[_K, anyio.Lock], key: _K) -> None:
    """Forget `key`'s lock unless someone holds it or waits for it (a lock per thing ever seen
    would stay otherwise; a new one is made on the next use)."""
    lock = locks.get(key)
    if lock is not None and not lock.locked() and not lock.statistics().tasks_waiting:
        del locks[key]
