"""Dependencies shared by the API routers: the request's transaction, who is calling,
and the database. What a caller may do on a queue, and the engine node, are the queue
routers' dependencies (app/api/queue_deps.py: ``CanWrite``, ``NodeDep``, ...); use
``app.auth.require(principal, permission, name)`` for any other queue name in a
request (a dead-letter target needs ``configure`` on it, say).

Authentication never blocks the event loop: a bearer token is looked up in the token
cache, else in a short transaction on a worker thread; a password (HTTP Basic, and the
dashboard's login form through ``check_login``) is reserved against the lockout
(app/throttle.py), then checked on the password workers (app/passwords.py), with no
database session held across the hash.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)
from sqlalchemy.orm import Session
from starlette.datastructures import State

from app.auth import Principal, needs_rehash
from app.db import repo
from app.db.models import User
from app.db.session import Database
from app.names import QUEUE_NAME_CHARS_MAX, QUEUE_NAME_PATTERN, QUEUE_NAME_RULE
from app.passwords import PasswordWorkers
from app.problems import Forbidden, Unauthorized
from app.state import db_of, login_throttle_of, passwords_of, token_cache_of

API_PREFIX = "/api/v1"


# Declared for the OpenAPI document (security schemes); the credentials are parsed below,
# so that every failure is the same 401 problem.
BEARER_SCHEME = HTTPBearer(auto_error=False, description="A token from POST /api/v1/tokens.")
BASIC_SCHEME = HTTPBasic(auto_error=False, description="User name and password.")
BearerDoc = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER_SCHEME)]
BasicDoc = Annotated[HTTPBasicCredentials | None, Depends(BASIC_SCHEME)]


async def get_database(request: Request) -> Database:
    return db_of(request.app.state)


DatabaseDep = Annotated[Database, Depends(get_database)]
"""For async endpoints: ``app.queue_admin`` writes SQLite in its own short transaction
after the engine call, instead of holding a request session across the await."""


def get_session(db: Annotated[Database, Depends(get_database)]) -> Iterator[Session]:
    """One transaction per request: committed before the response, rolled back on error."""
    with db.transaction() as session:
        yield session


# scope="function": the transaction ends before the response is sent, so a failed
# commit becomes an error response instead of a success the server did not keep.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

QueueName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=QUEUE_NAME_CHARS_MAX,
        pattern=QUEUE_NAME_PATTERN,
        description=QUEUE_NAME_RULE.removeprefix("a queue name is ") + ".",
    ),
]


def principal_of(user: User, token_id: str | None = None) -> Principal:
    assert user.role in ("admin", "user")
    return Principal(
        user_id=user.id,
        name=user.name,
        role="admin" if user.role == "admin" else "user",
        configure=user.configure,
        write=user.write,
        read=user.read,
        token_id=token_id,
    )


def _credentials(header: str, scheme: str) -> str | None:
    """The value of an ``Authorization`` header of ``scheme``, else None."""
    given, _, value = header.partition(" ")
    if given.lower() != scheme.lower() or not value.strip():
        return None
    return value.strip()


async def authenticate(request: Request, _doc: BearerDoc) -> Principal:
    """A bearer token, as every /api/v1 call needs."""
    return await bearer_principal(request.app.state, request.headers.get("authorization", ""))


async def bearer_principal(state: State, authorization: str) -> Principal:
    """Who the ``Authorization`` header's bearer token belongs to (else 401); ``state``
    is the app's (its ``token_cache`` and ``db``).

    On the hot path of every publish and receive: a lookup in the token cache, and only
    on a miss (once a second per token, or a wrong token) one indexed SQLite read, on a
    worker thread so that the event loop never waits for the database, shared by the
    requests that missed together. That read also writes ``last_used_at`` when it is a
    minute old.
    """
    token = _credentials(authorization, "Bearer")
    if token is None:
        raise Unauthorized("send 'Authorization: Bearer <token>'; POST /api/v1/tokens makes one")
    cache = token_cache_of(state)
    digest = cache.digest_of(token)
    cached = cache.get(digest)
    if cached is not None:
        return cached
    db = db_of(state)
    return await cache.load(digest, lambda: db.run(lambda s: _token_principal(s, digest)))


def cached_bearer_principal(state: State, authorization: str) -> Principal | None:
    """``bearer_principal``'s answer when the token cache holds it, else None (then ask
    ``bearer_principal``): a plain call, where the coroutine made and awaited for the
    usual hit was a cost on every message request."""
    cache = token_cache_of(state)
    digest = cache.header_digest(authorization, _bearer_token)
    return None if digest is None else cache.get(digest)


def _bearer_token(authorization: str) -> str | None:
    return _credentials(authorization, "Bearer")


def _token_principal(session: Session, digest: str) -> Principal:
    row = repo.find_token(session, digest)
    if row is None:
        raise Unauthorized("the token is invalid or revoked")
    repo.maybe_touch_token(row)
    return principal_of(row.user, token_id=row.id)


async def check_login(state: State, name: str, password: str, address: str) -> Principal | None:
    """The user ``name`` when ``password`` is theirs, else None; ``state`` is the app's.

    ``TooManyFailures`` when the pair may not try now (app/throttle.py), ``LoginsBusy``
    when the password workers are full (app/passwords.py); both before any work. The
    user is read in a short session of its own, closed before the hash is checked.
    """
    throttle, passwords, db = login_throttle_of(state), passwords_of(state), db_of(state)
    with throttle.attempt(name, address) as attempt, passwords.slot():
        found = await db.run(lambda session: _login_facts(session, name))
        valid = await passwords.check(found[1] if found else None, password)
        attempt.verdict(found is not None and valid)
        if found is not None and valid and needs_rehash(found[1]):
            await _rehash(db, passwords, found[0].user_id, password)
    return found[0] if found is not None and valid else None


async def _rehash(db: Database, passwords: PasswordWorkers, user_id: int, password: str) -> None:
    """The same password, hashed with today's parameters (app/auth.py): a hash is only
    ever upgraded when its password is known, at a successful login."""
    new_hash = await passwords.rehash(password)
    await db.run(lambda session: repo.replace_password_hash(session, user_id, new_hash))


def _login_facts(session: Session, name: str) -> tuple[Principal, str] | None:
    user = repo.get_user(session, name)
    return (principal_of(user), user.password_hash) if user is not None else None


async def _basic(request: Request, authorization: str) -> Principal | None:
    encoded = _credentials(authorization, "Basic")
    if encoded is None:
        return None
    try:
        name, sep, password = (
            base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        raise Unauthorized("malformed Basic credentials", scheme="Basic") from None
    if not sep:
        raise Unauthorized("malformed Basic credentials", scheme="Basic")
    name = name[:100]  # no longer name exists; bounds the throttle's keys
    principal = await check_login(request.app.state, name, password, client_addr(request))
    if principal is None:
        raise Unauthorized("wrong user name or password", scheme="Basic")
    return principal


async def authenticate_token_or_password(
    request: Request, _bearer_doc: BearerDoc, _basic_doc: BasicDoc
) -> Principal:
    """A bearer token or HTTP Basic (user and password): only for /api/v1/tokens.

    ``async`` and without the request's session: the password is checked before the
    endpoint opens its transaction, so no connection is held across the hash.
    """
    authorization = request.headers.get("authorization", "")
    if _credentials(authorization, "Bearer") is not None:
        return await bearer_principal(request.app.state, authorization)
    principal = await _basic(request, authorization)
    if principal is None:
        raise Unauthorized("send HTTP Basic credentials or a bearer token", scheme="Basic")
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]
TokenOrPasswordDep = Annotated[Principal, Depends(authenticate_token_or_password)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise Forbidden(f"user {principal.name!r} is not an admin")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


def client_addr(request: Request) -> str:
    return request.client.host if request.client else ""
