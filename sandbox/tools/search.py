"""web_search: a small provider interface, and nothing offered without a provider.

No search engine is built in. An application that has one (an API it pays for) passes an object
with this shape as `Orchestrator(..., search_provider=...)`; then, and only then, `web_search` is
offered (where the policy allows it). The provider runs in the orchestrator's process, from its
network position, with the application's credentials: it is the operator's code, unlike
`web_fetch`, which fetches from inside the sandbox. Its results are external content: returned
marked untrusted.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field


class SearchResult(BaseModel):
    """One hit."""

    title: str = Field(max_length=500)
    url: str = Field(max_length=2000)
    snippet: str = Field("", max_length=2000)


class SearchProvider(Protocol):
    """What an application implements to offer web_search."""

    name: str

    async def search(self, query: str, count: int) -> list[SearchResult]:
        """At most `count` results for `query`; raise an exception when the search fails."""
        ...
