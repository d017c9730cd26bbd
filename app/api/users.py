"""``/api/v1/users``: user and permission management (admins only), every change audited.

A new password is hashed on the app's password workers (app/passwords.py) before the
endpoint's first query, and ends the user's dashboard sessions. On a cluster node a change
goes to the cluster metadata first (app/cluster_mirror.py), before the endpoint's first
query: it answers once the change committed and this node's SQLite holds it.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Request, Response, status
from sqlalchemy.orm import Session

from app.api.deps import API_PREFIX, AdminDep, SessionDep, client_addr
from app.api.schemas import USER_NAME_PATTERN, Permissions, UserIn, UserOut, UserPatch
from app.auth import Principal
from app.db import repo
from app.db.models import User
from app.negotiation import NegotiatedRoute
from app.passwords import PasswordWorkers
from app.problems import API_ERROR_STATUSES, UserConflict, UserNotFound, problem_responses
from app.state import mirror_of, passwords_of

UserName = Annotated[str, Path(pattern=USER_NAME_PATTERN)]

router = APIRouter(
    prefix=f"{API_PREFIX}/users",
    tags=["users"],
    route_class=NegotiatedRoute,
    responses=problem_responses(*API_ERROR_STATUSES),
)


def user_out(user: User) -> UserOut:
    return UserOut(
        name=user.name,
        role="admin" if user.role == "admin" else "user",
        permissions=Permissions(configure=user.configure, write=user.write, read=user.read),
        created_at=user.created_at,
        updated_at=user.updated_at,
    )


def _get(session: Session, name: str) -> User:
    user = repo.get_user(session, name)
    if user is None:
        raise UserNotFound(f"no user {name!r}")
    return user


def _passwords(request: Request) -> PasswordWorkers:
    return passwords_of(request.app.state)


def _audit(
    session: Session, request: Request, who: Principal, action: str, target: str, **detail: object
) -> None:
    repo.audit(
        session,
        actor=who.name,
        action=action,
        target=target,
        detail=dict(detail),
        source="api",
        remote_addr=client_addr(request),
    )


def _keep_an_admin(session: Session, user: User) -> None:
    if user.role == "admin" and repo.count_admins(session) <= 1:
        raise UserConflict(f"{user.name!r} is the last admin")


@router.get("", response_model=list[UserOut])
def list_users(session: SessionDep, _who: AdminDep) -> list[UserOut]:
    return [user_out(u) for u in repo.list_users(session)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=UserOut)
def create_user(body: UserIn, request: Request, session: SessionDep, who: AdminDep) -> UserOut:
    password_hash = _passwords(request).hash_from_thread(body.password)
    perms = body.permissions
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        anyio.from_thread.run(
            mirror.create_user,
            body.name,
            password_hash,
            body.role,
            perms.configure,
            perms.write,
            perms.read,
        )
        user = _get(session, body.name)
    else:
        if repo.get_user(session, body.name) is not None:
            raise UserConflict(f"user {body.name!r} exists")
        user = repo.create_user(
            session,
            name=body.name,
            password_hash=password_hash,
            role=body.role,
            configure=perms.configure,
            write=perms.write,
            read=perms.read,
        )
    _audit(
        session,
        request,
        who,
        "user.create",
        user.name,
        role=user.role,
        permissions=body.permissions.model_dump(),
    )
    return user_out(user)


@router.get("/{user_name}", response_model=UserOut)
def get_user(user_name: UserName, session: SessionDep, _who: AdminDep) -> UserOut:
    return user_out(_get(session, user_name))


@router.patch("/{user_name}", response_model=UserOut)
def update_user(
    user_name: UserName, body: UserPatch, request: Request, session: SessionDep, who: AdminDep
) -> UserOut:
    password_hash = None
    if body.password is not None:
        password_hash = _passwords(request).hash_from_thread(body.password)
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        p = body.permissions
        perms = None if p is None else (p.configure, p.write, p.read)
        anyio.from_thread.run(mirror.update_user, user_name, password_hash, body.role, perms)
        user = _get(session, user_name)
        asked = (("role", body.role), ("password", password_hash), ("permissions", p))
        done = [name for name, value in asked if value is not None]
        _audit(session, request, who, "user.update", user.name, changed=done, role=user.role)
        return user_out(user)
    user = _get(session, user_name)
    changed: list[str] = []
    if body.role is not None and body.role != user.role:
        if body.role == "user":
            _keep_an_admin(session, user)
        user.role = body.role
        changed.append("role")
    if password_hash is not None:
        repo.set_password(session, user, password_hash)
        changed.append("password")
    if body.permissions is not None:
        _set_permissions(user, body.permissions)
        changed.append("permissions")
    session.flush()
    _audit(session, request, who, "user.update", user.name, changed=changed, role=user.role)
    return user_out(user)


@router.delete("/{user_name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_user(
    user_name: UserName, request: Request, session: SessionDep, who: AdminDep
) -> Response:
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        anyio.from_thread.run(mirror.delete_user, user_name)
    else:
        user = _get(session, user_name)
        _keep_an_admin(session, user)
        repo.delete_user(session, user)
    _audit(session, request, who, "user.delete", user_name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{user_name}/permissions", response_model=Permissions)
def get_permissions(user_name: UserName, session: SessionDep, _who: AdminDep) -> Permissions:
    return user_out(_get(session, user_name)).permissions


@router.put("/{user_name}/permissions", response_model=Permissions)
def set_permissions(
    user_name: UserName, body: Permissions, request: Request, session: SessionDep, who: AdminDep
) -> Permissions:
    mirror = mirror_of(request.app.state)
    if mirror is not None:  # a cluster node: the metadata's, then this node's SQLite
        wanted = (body.configure, body.write, body.read)
        anyio.from_thread.run(mirror.update_user, user_name, None, None, wanted)
    else:
        _set_permissions(_get(session, user_name), body)
        session.flush()
    _audit(session, request, who, "user.permissions", user_name, **body.model_dump())
    return body


def _set_permissions(user: User, permissions: Permissions) -> None:
    user.configure = permissions.configure
    user.write = permissions.write
    user.read = permissions.read
