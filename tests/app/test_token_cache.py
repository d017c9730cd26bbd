"""The token cache: a hit skips the database, entries expire, misses that meet share one
lookup, and any flush that touches a user or a token empties it (so revocations and
permission changes apply at once)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.auth import Principal
from app.db import repo
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.settings import PROJECT_ROOT
from app.token_cache import TokenCache

ALICE = Principal(user_id=1, name="alice", role="user", configure="", write="a.*", read="a.*")


def test_hit_until_ttl_then_miss() -> None:
    cache = TokenCache(ttl_s=0.05)
    cache.put("d1", ALICE)
    assert cache.get("d1") == ALICE
    assert cache.get("d2") is None
    time.sleep(0.06)
    assert cache.get("d1") is None
    assert len(cache) == 0


def test_bounded() -> None:
    cache = TokenCache(entries_max=3)
    for i in range(3):
        cache.put(f"d{i}", ALICE)
    cache.put("d3", ALICE)
    assert len(cache) <= 3 and cache.get("d3") == ALICE


class Lookups:
    """A stand-in for the database read: counts calls, answers when released."""

    def __init__(self, answer: Principal | Exception) -> None:
        self.answer = answer
        self.calls = 0
        self.release = asyncio.Event()

    async def fetch(self) -> Principal:
        self.calls += 1
        await self.release.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_misses_that_meet_share_one_lookup() -> None:
    async def run() -> None:
        cache, lookups = TokenCache(), Lookups(ALICE)
        waiters = [asyncio.ensure_future(cache.load("d1", lookups.fetch)) for _ in range(64)]
        await asyncio.sleep(0)
        waiters[0].cancel()  # a waiter that leaves does not end the lookup of the others
        lookups.release.set()
        got = await asyncio.gather(*waiters[1:])
        assert got == [ALICE] * 63 and lookups.calls == 1
        assert cache.get("d1") == ALICE
        assert await cache.load("d1", lookups.fetch) == ALICE and lookups.calls == 2

    asyncio.run(run())


def test_a_shared_lookup_fails_every_waiter_and_keeps_nothing() -> None:
    async def run() -> None:
        cache, lookups = TokenCache(), Lookups(LookupError("no such token"))
        waiters = [asyncio.ensure_future(cache.load("d1", lookups.fetch)) for _ in range(3)]
        await asyncio.sleep(0)
        lookups.release.set()
        for waiter in waiters:
            with pytest.raises(LookupError):
                await waiter
        assert lookups.calls == 1 and cache.get("d1") is None

    asyncio.run(run())


def test_a_lookup_that_a_clear_overtook_is_not_kept() -> None:
    async def run() -> None:
        cache, lookups = TokenCache(), Lookups(ALICE)
        waiter = asyncio.ensure_future(cache.load("d1", lookups.fetch))
        await asyncio.sleep(0)
        cache.clear()  # e.g. the token was revoked while it was being read
        lookups.release.set()
        assert await waiter == ALICE
        assert cache.get("d1") is None

    asyncio.run(run())


def test_a_flush_touching_users_or_tokens_empties_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'meta.sqlite3'}")
    try:
        upgrade_to_head(db.engine, PROJECT_ROOT / "migrations")
        cache = TokenCache()
        cache.watch(db.session_factory)
        with db.transaction() as session:
            user = repo.create_user(
                session,
                name="bob",
                password_hash="x",
                role="user",
                configure="",
                write="",
                read="",
            )
            token = repo.create_token(session, user=user, digest="dg", prefix="qra_", name="t")
            token_id = token.id
        cache.put("dg", ALICE)
        with db.transaction() as session:
            repo.list_tokens(session)  # a read flushes nothing of interest
        assert cache.get("dg") == ALICE
        with db.transaction() as session:
            row = repo.get_token(session, token_id)
            assert row is not None
            repo.revoke_token(session, row)
        assert cache.get("dg") is None
        cache.put("dg", ALICE)
        with db.transaction() as session:
            found = repo.get_user(session, "bob")
            assert found is not None
            found.write = "b.*"
        assert cache.get("dg") is None
    finally:
        db.dispose()


def test_header_digest_is_the_carried_tokens_digest_and_bounded() -> None:
    cache = TokenCache(entries_max=2)
    seen: list[str] = []

    def token_of(header: str) -> str | None:
        seen.append(header)
        scheme, _, token = header.partition(" ")
        return token if scheme == "Bearer" and token else None

    assert cache.header_digest("Bearer t1", token_of) == cache.digest_of("t1")
    assert cache.header_digest("Bearer t1", token_of) == cache.digest_of("t1")
    assert seen == ["Bearer t1"]  # the second ask is remembered
    assert cache.header_digest("Basic dTpw", token_of) is None
    assert cache.header_digest("Bearer t2", token_of) == cache.digest_of("t2")
    assert cache.header_digest("Bearer t3", token_of) == cache.digest_of("t3")  # over the bound
    cache.clear()  # a digest says nothing of validity: kept across a clear
    assert cache.header_digest("Bearer t3", token_of) == cache.digest_of("t3")
    assert seen.count("Bearer t3") == 1
