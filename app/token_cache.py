"""Principals by token digest, for a second: authentication without a query per request.

Every API call authenticates its bearer token; an ORM read of the token and its user
was about half of a publish's server time. The cache keeps what such a read found for
``ttl_s`` and forgets everything as soon as a flush in this process touches a user or a
token (revocation, deletion, new permissions), so those take effect at once here. A
change made by another process on the same database (``quorra user add``) adds users
and tokens, which are never cached as missing; anything else it changes is seen within
``ttl_s``.

A miss is looked up once however many requests meet it (``load``): when an entry
expires under load, every request in flight with that token missed at once, and each
sent its own read to a worker thread (64 reads a second per token with 64 clients).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from itertools import chain

from sqlalchemy import event
from sqlalchemy.orm import Session, UOWTransaction, sessionmaker

from app.auth import Principal, token_digest
from app.db.models import ApiToken, User


class TokenCache:
    def __init__(self, ttl_s: float = 1.0, entries_max: int = 10_000) -> None:
        assert ttl_s > 0 and entries_max > 0
        self.ttl_s = ttl_s
        self.entries_max = entries_max
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._loading: dict[str, asyncio.Future[Principal]] = {}
        """Lookups in flight, by digest: later misses wait for them (``load``)."""
        self._generation = 0
        """Counts ``clear``: a lookup that began before one is not kept."""
        self._digests: dict[str, str] = {}
        """Tokens seen lately -> their digest (``digest_of``)."""
        self._headers: dict[str, str] = {}
        """``Authorization`` headers seen lately -> their bearer token's digest
        (``header_digest``)."""

    def digest_of(self, token: str) -> str:
        """``token_digest(token)``, remembered: a client sends the same token on every
        request, and the hash (an object made, fed and formatted) cost more than the
        lookup it leads to. At most ``entries_max`` are remembered, then forgotten
        together; a digest says nothing of whether its token is valid, so nothing here
        is forgotten on ``clear``."""
        digests = self._digests
        digest = digests.get(token)
        if digest is None:
            if len(digests) >= self.entries_max:
                digests.clear()
            digest = digests[token] = token_digest(token)
        return digest

    def header_digest(self, header: str, token_of: Callable[[str], str | None]) -> str | None:
        """The digest of the token that the ``Authorization`` header ``header`` carries
        (``token_of`` finds it, None when there is none), remembered by the header's
        whole value: a client sends the same header on every request, and taking the
        token out of it (the scheme split off, compared and stripped) cost as much as
        the lookup it leads to. At most ``entries_max`` are remembered, then forgotten
        together; like a digest, what a header carries does not change on ``clear``."""
        headers = self._headers
        digest = headers.get(header)
        if digest is None:
            token = token_of(header)
            if token is None:
                return None
            if len(headers) >= self.entries_max:
                headers.clear()
            digest = headers[header] = self.digest_of(token)
        return digest

    def get(self, digest: str) -> Principal | None:
        found = self._entries.get(digest)
        if found is None:
            return None
        principal, expires = found
        if time.monotonic() >= expires:
            del self._entries[digest]
            return None
        return principal

    def put(self, digest: str, principal: Principal) -> None:
        if len(self._entries) >= self.entries_max:
            self._entries.clear()  # bounded; a full cache refills within a second
        self._entries[digest] = (principal, time.monotonic() + self.ttl_s)

    async def load(self, digest: str, fetch: Callable[[], Awaitable[Principal]]) -> Principal:
        """The principal of ``digest`` after a miss: ``fetch()``, shared by every miss of
        the same digest meanwhile (its error too, e.g. an unknown token), then kept
        unless the cache was cleared while it ran. A waiter cancelled meanwhile leaves
        the lookup to the others."""
        loading = self._loading.get(digest)
        if loading is None:
            loading = asyncio.ensure_future(self._fetch(digest, fetch, self._generation))
            # Its error is seen here even when every waiter was cancelled meanwhile.
            loading.add_done_callback(_seen)
            self._loading[digest] = loading
        return await asyncio.shield(loading)

    async def _fetch(
        self, digest: str, fetch: Callable[[], Awaitable[Principal]], generation: int
    ) -> Principal:
        try:
            principal = await fetch()
        finally:
            del self._loading[digest]
        if generation == self._generation:
            self.put(digest, principal)
        return principal

    def clear(self) -> None:
        self._generation += 1
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def watch(self, factory: sessionmaker[Session]) -> None:
        """Forget everything whenever a session of ``factory`` flushes a user or token."""
        event.listen(factory, "after_flush", self._on_flush)

    def _on_flush(self, session: Session, _context: UOWTransaction) -> None:
        changed = chain(session.new, session.dirty, session.deleted)
        if any(isinstance(obj, User | ApiToken) for obj in changed):
            self.clear()


def _seen(loading: asyncio.Future[Principal]) -> None:
    if not loading.cancelled():
        loading.exception()
