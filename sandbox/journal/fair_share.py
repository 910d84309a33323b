"""Which tenants give up history when the journal passes its size bound: the largest first.

The journal is shared by every tenant of a service, and its size bound (`journal.retention.
max_bytes`) used to delete the oldest events whoever wrote them: one tenant writing fast could
push every other tenant's history out of the journal (their audit trail with it) while keeping
its own newest events. Now the bytes to free are taken from the tenants that hold the most,
down to one level (water-filling): a tenant under that level keeps all of its history, and the
ones above it keep the same amount each. A tenant alone in the journal loses its oldest events,
as before.

Pure arithmetic, shared by the journal's prune (journal/size_prune.py) and the PostgreSQL store's
(state/postgres/events.py), each of which then deletes every cut tenant's oldest events.
"""

from __future__ import annotations

from collections.abc import Mapping


def fair_cuts(usage: Mapping[str, int], excess: int) -> dict[str, int]:
    """How many bytes each tenant gives up so that `excess` bytes are freed, largest first.

    Args:
        usage: each tenant's bytes (negative counts as none).
        excess: the bytes to free; more than all of them frees all of them.

    Returns:
        The tenants that give something up and how much: the cuts add up to `excess` (or to
        everything held), no cut passes what its tenant holds, and every cut tenant is left
        with as much as the largest one left, or one byte less, so no tenant is cut while
        another keeps more than it.
    """
    held = {tenant: max(0, int(size)) for tenant, size in usage.items()}
    total = sum(held.values())
    if excess <= 0 or total == 0:
        return {}
    if excess >= total:
        return {tenant: size for tenant, size in held.items() if size}
    # the highest level whose overflow still covers the excess (binary search: the overflow
    # falls as the level rises); everything above it is cut down to it
    low, high = 0, max(held.values())
    while low < high:
        level = (low + high + 1) // 2
        if _overflow(held, level) >= excess:
            low = level
        else:
            high = level - 1
    cuts = {tenant: size - low for tenant, size in held.items() if size > low}
    # the level one higher frees too little, so fewer than len(cuts) bytes are over: given back
    # one each to the largest cut tenants (ties by name, so the answer is the same every time)
    over = sum(cuts.values()) - excess
    for tenant in sorted(cuts, key=lambda name: (-held[name], name))[:over]:
        cuts[tenant] -= 1
    return {tenant: cut for tenant, cut in cuts.items() if cut}


def _overflow(held: Mapping[str, int], level: int) -> int:
    return sum(size - level for size in held.values() if size > level)
