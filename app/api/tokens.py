"""``/api/v1/tokens``: create (with HTTP Basic or a token), list and revoke API tokens.

A user manages their own tokens; an admin manages everyone's. The secret is returned
once, by the create call, with ``Cache-Control: no-store``; the server keeps only its
SHA-256 digest. Each endpoint authenticates (``who``, which checks a password off the
event loop) before it opens its transaction (``session``): FastAPI resolves
dependencies in the order of the parameters.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Query, Request, Response, status
from sqlalchemy.orm import Session

from app.api.deps import API_PREFIX, SessionDep, TokenOrPasswordDep, client_addr
from app.api.schemas import TokenCreated, TokenIn, TokenOut
from app.auth import Principal, new_token, token_digest, token_prefix
from app.cluster_mirror import ClusterMirror
from app.db import repo
from app.db.models import ApiToken, User
from app.negotiation import NegotiatedRoute
from app.problems import (
    API_ERROR_STATUSES,
    Forbidden,
    TokenNotFound,
    UserNotFound,
    problem_responses,
)
from app.state import mirror_of

router = APIRouter(
    prefix=f"{API_PREFIX}/tokens",
    tags=["tokens"],
    route_class=NegotiatedRoute,
    responses=problem_responses(*API_ERROR_STATUSES),
)


def token_out(token: ApiToken) -> TokenOut:
    return TokenOut(
        id=token.id,
        user=token.user.name,
        name=token.name,
        prefix=token.prefix,
        created_at=token.created_at,
        last_used_at=token.last_used_at,
    )


def issue_token(session: Session, user: User, name: str) -> tuple[str, ApiToken]:
    """Make a token for ``user``: the secret (to show once) and its stored row."""
    secret = new_token()
    row = repo.create_token(
        session, user=user, digest=token_digest(secret), prefix=token_prefix(secret), name=name
    )
    return secret, row


def _owner(session: Session, who: Principal, user_name: str | None) -> User:
    name = user_name or who.name
    if name != who.name and not who.is_admin:
        raise Forbidden("only admins manage other users' tokens")
    user = repo.get_user(session, name)
    if user is None:
        raise UserNotFound(f"no user {name!r}")
    return user


def _issue_in_cluster(
    mirror: ClusterMirror, session: Session, who: Principal, body: TokenIn
) -> tuple[str, ApiToken]:
    """``issue_token`` through the cluster metadata, before the session's first query."""
    name = body.user or who.name
    if name != who.name and not who.is_admin:
        raise Forbidden("only admins manage other users' tokens")
    secret, token_id = new_token(), repo.new_token_id()
    anyio.from_thread.run(
        mirror.put_token, token_id, name, token_digest(secret), token_prefix(secret), body.name
    )
    row = repo.get_token(session, token_id)
    if row is None:
        raise UserNotFound(f"no user {name!r}")
    return secret, row


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TokenCreated)
def create_token(
    request: Request,
    response: Response,
    who: TokenOrPasswordDep,
    session: SessionDep,
    body: TokenIn | None = None,
) -> TokenCreated:
    body = body or TokenIn()
    response.headers["Cache-Control"] = "no-store"  # the secret must stay out of caches
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        secret, row = _issue_in_cluster(mirror, session, who, body)
        user = row.user
    else:
        user = _owner(session, who, body.user)
        secret, row = issue_token(session, user, body.name)
    repo.audit(
        session,
        actor=who.name,
        action="token.create",
        target=user.name,
        detail={"token_id": row.id, "name": row.name},
        remote_addr=client_addr(request),
    )
    return TokenCreated(
        token=secret, id=row.id, user=user.name, name=row.name, created_at=row.created_at
    )


@router.get("", response_model=list[TokenOut])
def list_tokens(
    who: TokenOrPasswordDep,
    session: SessionDep,
    user: str | None = Query(default=None, max_length=100, description="Admins: filter by user."),
) -> list[TokenOut]:
    if who.is_admin and user is None:
        return [token_out(t) for t in repo.list_tokens(session)]
    return [token_out(t) for t in repo.list_tokens(session, _owner(session, who, user))]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_token(
    token_id: str, request: Request, who: TokenOrPasswordDep, session: SessionDep
) -> Response:
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        rec = anyio.from_thread.run(mirror.delete_token, token_id, who.name, who.is_admin)
        owner = rec.user
    else:
        token = repo.get_token(session, token_id)
        if token is None or (token.user_id != who.user_id and not who.is_admin):
            raise TokenNotFound(f"no token {token_id!r}")
        owner = token.user.name
        repo.revoke_token(session, token)
    repo.audit(
        session,
        actor=who.name,
        action="token.revoke",
        target=owner,
        detail={"token_id": token_id},
        remote_addr=client_addr(request),
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)
