"""Maps a long-running process keeps per sandbox, session or call: least recently used out.

A service runs for weeks; anything it remembers per thing it has ever seen must be bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

MAX_REMEMBERED = 4096

_K = TypeVar("_K")
_V = TypeVar("_V")


def remember(cache: OrderedDict[_K, _V], key: _K, value: _V, most: int = MAX_REMEMBERED) -> None:
    """Put `key` last (most recently used) and drop the oldest past `most`."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > most:
        cache.popitem(last=False)
