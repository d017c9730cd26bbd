"""Users and tokens (admins only): add users, set their permissions, create and revoke
tokens. Bodies are validated by the REST API's own models (``UserIn``,
``Permissions``); rows change through ``app.db.repo`` in the request's transaction,
and every change lands in the audit log with ``source="ui"``. A password is hashed on
the app's password workers (app/passwords.py) before the first query. A created token's
secret is shown once, on a page with ``Cache-Control: no-store`` like every page here.

On a cluster node a change goes to the cluster metadata first (app/cluster_mirror.py),
as the REST API's does, and before the request's first query: the metadata's writer
commits the rows into SQLite meanwhile, and a transaction that had read before it could
neither see them nor write after them. So a user or token made here works on every node.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Form, Path, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.api.deps import SessionDep, client_addr
from app.api.schemas import USER_NAME_PATTERN, Permissions, UserIn
from app.api.tokens import issue_token
from app.auth import new_token, token_digest, token_prefix
from app.db import repo
from app.db.models import ApiToken
from app.problems import AppProblem, Forbidden, TokenNotFound, UserConflict, UserNotFound
from app.state import mirror_of, passwords_of
from app.ui.common import error_flash, flash, render
from app.ui.sessions import UiLogin
from app.ui.views import CsrfLoginDep, LoginDep
from engine.errors import QuorraError

router = APIRouter(include_in_schema=False)
UserName = Annotated[str, Path(pattern=USER_NAME_PATTERN)]


def refused(request: Request, login: UiLogin, page: bool = False) -> HTMLResponse | None:
    """403 unless the user is an admin: an error page, or a flash for an action."""
    if login.principal.is_admin:
        return None
    message = f"user {login.principal.name!r} is not an admin"
    if page:
        return render(request, "error.html", {"message": message}, login, 403)
    return error_flash(request, Forbidden(message))


Text = Annotated[str, Form(max_length=1024)]


def _audit(
    session: Session, request: Request, login: UiLogin, action: str, target: str, **detail: object
) -> None:
    repo.audit(
        session,
        actor=login.principal.name,
        action=action,
        target=target,
        detail=detail,
        source="ui",
        remote_addr=client_addr(request),
    )


def _users_context(session: Session) -> dict[str, object]:
    users = list(repo.list_users(session))
    return {"users": users, "tokens": list(repo.list_tokens(session))}


@router.get("/users", response_class=HTMLResponse)
def users_page(request: Request, session: SessionDep, login: LoginDep) -> HTMLResponse:
    return refused(request, login, page=True) or render(
        request, "users.html", _users_context(session), login
    )


@router.get("/fragments/users", response_class=HTMLResponse)
def users_fragment(request: Request, session: SessionDep, login: LoginDep) -> HTMLResponse:
    return refused(request, login, page=True) or render(
        request, "_users_tables.html", _users_context(session), login
    )


def _permissions(configure: str, write: str, read: str) -> Permissions:
    return Permissions.model_validate({"configure": configure, "write": write, "read": read})


def _done(request: Request, message: str) -> HTMLResponse:
    response = flash(request, message)
    response.headers["HX-Trigger"] = "quorra:users"
    return response


@router.post("/users", response_class=HTMLResponse)
def add_user(
    request: Request,
    session: SessionDep,
    login: CsrfLoginDep,
    name: Text = "",
    password: Text = "",
    role: Text = "user",
    configure: Text = "",
    write: Text = "",
    read: Text = "",
) -> HTMLResponse:
    if (refusal := refused(request, login)) is not None:
        return refusal
    mirror = mirror_of(request.app.state)
    try:
        body = UserIn.model_validate(
            {
                "name": name.strip(),
                "password": password,
                "role": role,
                "permissions": {"configure": configure, "write": write, "read": read},
            }
        )
        passwords = passwords_of(request.app.state)
        password_hash = passwords.hash_from_thread(body.password)  # before any query
        p = body.permissions
        if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
            args = (body.name, password_hash, body.role, p.configure, p.write, p.read)
            anyio.from_thread.run(mirror.create_user, *args)
        elif repo.get_user(session, body.name) is not None:
            raise UserConflict(f"user {body.name!r} exists")
    except (AppProblem, QuorraError, ValidationError) as e:
        return error_flash(request, e)
    if mirror is None:
        repo.create_user(
            session,
            name=body.name,
            password_hash=password_hash,
            role=body.role,
            configure=p.configure,
            write=p.write,
            read=p.read,
        )
    permissions = p.model_dump()
    _audit(
        session, request, login, "user.create", body.name, role=body.role, permissions=permissions
    )
    return _done(request, f"User {body.name} added.")


@router.post("/users/{user_name}/permissions", response_class=HTMLResponse)
def set_permissions(
    user_name: UserName,
    request: Request,
    session: SessionDep,
    login: CsrfLoginDep,
    configure: Text = "",
    write: Text = "",
    read: Text = "",
) -> HTMLResponse:
    if (refusal := refused(request, login)) is not None:
        return refusal
    mirror = mirror_of(request.app.state)
    try:
        permissions = _permissions(configure, write, read)
        wanted = (permissions.configure, permissions.write, permissions.read)
        if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
            anyio.from_thread.run(mirror.update_user, user_name, None, None, wanted)
            user = None
        else:
            user = repo.get_user(session, user_name)
            if user is None:
                raise UserNotFound(f"no user {user_name!r}")
    except (AppProblem, QuorraError, ValidationError) as e:
        return error_flash(request, e)
    if user is not None:
        user.configure, user.write, user.read = wanted
        session.flush()
    _audit(session, request, login, "user.permissions", user_name, **permissions.model_dump())
    return flash(request, f"Permissions of {user_name} saved.")  # the form shows them already


def _issue(request: Request, session: Session, user: str, name: str) -> tuple[str, ApiToken]:
    """A token of ``user``: through the metadata on a cluster node (then read back from
    SQLite, which holds it once the change committed), else in the request's session."""
    mirror = mirror_of(request.app.state)
    if mirror is None:
        owner = repo.get_user(session, user)
        if owner is None:
            raise UserNotFound(f"no user {user!r}")
        return issue_token(session, owner, name)
    secret, token_id = new_token(), repo.new_token_id()
    args = (token_id, user, token_digest(secret), token_prefix(secret), name)
    anyio.from_thread.run(mirror.put_token, *args)
    row = repo.get_token(session, token_id)
    if row is None:  # the user was deleted between the commit and the read
        raise UserNotFound(f"no user {user!r}")
    return secret, row


@router.post("/tokens", response_class=HTMLResponse)
def create_token(
    request: Request, session: SessionDep, login: CsrfLoginDep, user: Text = "", name: Text = ""
) -> HTMLResponse:
    if (refusal := refused(request, login)) is not None:
        return refusal
    try:
        secret, row = _issue(request, session, user, name[:200])
    except (AppProblem, QuorraError) as e:
        return error_flash(request, e)
    owner = row.user.name
    _audit(session, request, login, "token.create", owner, token_id=row.id, name=row.name)
    response = render(request, "_token_created.html", {"secret": secret, "owner": owner})
    response.headers["HX-Trigger"] = "quorra:users"
    return response


@router.post("/tokens/{token_id}/revoke", response_class=HTMLResponse)
def revoke_token(
    token_id: Annotated[str, Path(max_length=64)],
    request: Request,
    session: SessionDep,
    login: CsrfLoginDep,
) -> HTMLResponse:
    if (refusal := refused(request, login)) is not None:
        return refusal
    mirror = mirror_of(request.app.state)
    try:
        if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
            rec = anyio.from_thread.run(mirror.delete_token, token_id, login.principal.name, True)
            owner, prefix = rec.user, rec.prefix
        else:
            token = repo.get_token(session, token_id)
            if token is None:
                raise TokenNotFound(f"no token {token_id!r}")
            owner, prefix = token.user.name, token.prefix
            repo.revoke_token(session, token)
    except (AppProblem, QuorraError) as e:
        return error_flash(request, e)
    _audit(session, request, login, "token.revoke", owner, token_id=token_id)
    return _done(request, f"Token {prefix}… of {owner} revoked.")
