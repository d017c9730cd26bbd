"""Users and tokens (admins only): add users, set their permissions, create and revoke
tokens. Bodies are validated by the REST API's own models (``UserIn``,
``Permissions``); rows change through ``app.db.repo`` in the request's transaction,
and every change lands in the audit log with ``source="ui"``. A password is hashed on
the app's password workers (app/passwords.py) before the first query. A created token's
secret is shown once, on a page with ``Cache-Control: no-store`` like every page here.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Path, Request
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.api.deps import SessionDep, client_addr
from app.api.schemas import USER_NAME_PATTERN, Permissions, UserIn
from app.api.tokens import issue_token
from app.db import repo
from app.problems import AppProblem, Forbidden, TokenNotFound, UserConflict, UserNotFound
from app.state import passwords_of
from app.ui.common import error_flash, flash, render
from app.ui.sessions import UiLogin
from app.ui.views import CsrfLoginDep, LoginDep

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
        if repo.get_user(session, body.name) is not None:
            raise UserConflict(f"user {body.name!r} exists")
    except (AppProblem, ValidationError) as e:
        return error_flash(request, e)
    repo.create_user(
        session,
        name=body.name,
        password_hash=password_hash,
        role=body.role,
        configure=body.permissions.configure,
        write=body.permissions.write,
        read=body.permissions.read,
    )
    permissions = body.permissions.model_dump()
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
    try:
        permissions = _permissions(configure, write, read)
        user = repo.get_user(session, user_name)
        if user is None:
            raise UserNotFound(f"no user {user_name!r}")
    except (AppProblem, ValidationError) as e:
        return error_flash(request, e)
    user.configure, user.write, user.read = (
        permissions.configure,
        permissions.write,
        permissions.read,
    )
    session.flush()
    _audit(session, request, login, "user.permissions", user_name, **permissions.model_dump())
    return flash(request, f"Permissions of {user_name} saved.")  # the form shows them already


@router.post("/tokens", response_class=HTMLResponse)
def create_token(
    request: Request, session: SessionDep, login: CsrfLoginDep, user: Text = "", name: Text = ""
) -> HTMLResponse:
    if (refusal := refused(request, login)) is not None:
        return refusal
    owner = repo.get_user(session, user)
    if owner is None:
        return error_flash(request, UserNotFound(f"no user {user!r}"))
    secret, row = issue_token(session, owner, name[:200])
    _audit(session, request, login, "token.create", owner.name, token_id=row.id, name=row.name)
    response = render(request, "_token_created.html", {"secret": secret, "owner": owner.name})
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
    token = repo.get_token(session, token_id)
    if token is None:
        return error_flash(request, TokenNotFound(f"no token {token_id!r}"))
    owner = token.user.name
    repo.revoke_token(session, token)
    _audit(session, request, login, "token.revoke", owner, token_id=token_id)
    return _done(request, f"Token {token.prefix}… of {owner} revoked.")
