"""Dependencies shared by the API routers: the request's transaction, who is calling,
what they may do, and the engine node.

Usage in a queue router::

    @router.post("/queues/{name}/messages")
    async def publish(name: QueueName, body: PublishIn, who: CanWrite, node: NodeDep): ...

``CanConfigure``/``CanWrite``/``CanRead`` authenticate the bearer token (401) and
check the permission against the ``{name}`` path parameter (403); use
``app.auth.require(principal, permission, name)`` for any other queue name in a
request (a dead-letter target needs ``configure`` on it, say).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import anyio
from fastapi import Depends, Path, Request
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)
from sqlalchemy.orm import Session

from app.auth import Permission, Principal, check_password, require, token_digest
from app.db import repo
from app.db.models import User
from app.db.session import Database
from app.problems import Forbidden, Unauthorized
from app.throttle import FailureThrottle
from app.token_cache import TokenCache
from engine.errors import NoLeader
from engine.runtime.api import QueueEngine

API_PREFIX = "/api/v1"
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,200}$"


# Declared for the OpenAPI document (security schemes); the credentials are parsed below,
# so that every failure is the same 401 problem.
BEARER_SCHEME = HTTPBearer(auto_error=False, description="A token from POST /api/v1/tokens.")
BASIC_SCHEME = HTTPBasic(auto_error=False, description="User name and password.")
BearerDoc = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER_SCHEME)]
BasicDoc = Annotated[HTTPBasicCredentials | None, Depends(BASIC_SCHEME)]


async def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


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
        max_length=200,
        pattern=QUEUE_NAME_PATTERN,
        description="1-200 letters, digits, '.', '_' or '-'.",
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


def _credentials(request: Request, scheme: str) -> str | None:
    header = request.headers.get("authorization", "")
    given, _, value = header.partition(" ")
    if given.lower() != scheme.lower() or not value.strip():
        return None
    return value.strip()


def _bearer(request: Request, session: Session) -> Principal | None:
    token = _credentials(request, "Bearer")
    if token is None:
        return None
    row = repo.find_token(session, token_digest(token))
    if row is None:
        raise Unauthorized("the token is invalid or revoked")
    repo.maybe_touch_token(row)
    return principal_of(row.user, token_id=row.id)


def _basic(request: Request, session: Session) -> Principal | None:
    encoded = _credentials(request, "Basic")
    if encoded is None:
        return None
    try:
        name, sep, password = (
            base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        raise Unauthorized("malformed Basic credentials", scheme="Basic") from None
    throttle: FailureThrottle = request.app.state.login_throttle
    address = client_addr(request)
    name = name[:100]  # no longer name exists; bounds the throttle's keys
    throttle.check(name, address)
    user = repo.get_user(session, name) if sep else None
    if not check_password(user.password_hash if user else None, password):
        throttle.failed(name, address)
        raise Unauthorized("wrong user name or password", scheme="Basic")
    assert user is not None
    throttle.succeeded(name, address)
    return principal_of(user)


async def authenticate(request: Request, _doc: BearerDoc) -> Principal:
    """A bearer token, as every /api/v1 call needs."""
    return await bearer_principal(request.app.state, request.headers.get("authorization", ""))


async def bearer_principal(state: Any, authorization: str) -> Principal:
    """Who the ``Authorization`` header's bearer token belongs to (else 401); ``state``
    is the app's (its ``token_cache`` and ``db``).

    On the hot path of every publish and receive, so it runs on the event loop: a
    lookup in the token cache, else one indexed SQLite read in its own short session,
    no thread hop. The rare write
    (``last_used_at``, once a minute per token) goes to a worker thread.
    """
    token = _bearer_token(authorization)
    if token is None:
        raise Unauthorized("send 'Authorization: Bearer <token>'; POST /api/v1/tokens makes one")
    digest = token_digest(token)
    cache: TokenCache = state.token_cache
    cached = cache.get(digest)
    if cached is not None:
        return cached
    db: Database = state.db
    with db.session_factory() as session:
        row = repo.find_token(session, digest)
        if row is None:
            raise Unauthorized("the token is invalid or revoked")
        principal = principal_of(row.user, token_id=row.id)
        stale = repo.token_use_is_stale(row)
    if stale:
        await anyio.to_thread.run_sync(_touch_token, db, row.id)
    cache.put(digest, principal)
    return principal


def _bearer_token(header: str) -> str | None:
    given, _, value = header.partition(" ")
    if given.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _touch_token(db: Database, token_id: str) -> None:
    with db.transaction() as session:
        row = repo.get_token(session, token_id)
        if row is not None:
            repo.maybe_touch_token(row)


def authenticate_token_or_password(
    request: Request, session: SessionDep, _bearer_doc: BearerDoc, _basic_doc: BasicDoc
) -> Principal:
    """A bearer token or HTTP Basic (user and password): only for /api/v1/tokens."""
    principal = _bearer(request, session) or _basic(request, session)
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


def queue_access(permission: Permission) -> Callable[[str, Principal], Principal]:
    """A dependency: the caller, once allowed ``permission`` on the ``{name}`` queue."""

    def dependency(name: QueueName, principal: PrincipalDep) -> Principal:
        require(principal, permission, name)
        return principal

    dependency.__name__ = f"can_{permission}"
    return dependency


CanConfigure = Annotated[Principal, Depends(queue_access("configure"))]
CanWrite = Annotated[Principal, Depends(queue_access("write"))]
CanRead = Annotated[Principal, Depends(queue_access("read"))]


def get_node(request: Request) -> QueueEngine:
    node: QueueEngine | None = request.app.state.node
    if node is None:
        raise NoLeader("the queue engine is not running on this node")
    return node


NodeDep = Annotated[QueueEngine, Depends(get_node)]


def client_addr(request: Request) -> str:
    return request.client.host if request.client else ""
