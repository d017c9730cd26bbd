"""Dashboard logins: a signed session cookie backed by a row in ``ui_sessions``, and
CSRF tokens for every form.

The cookie holds a random session id signed with the data directory's secret key
(itsdangerous), HttpOnly and SameSite=Strict; the database keeps only the id's digest,
its expiry and the session's CSRF token, so logout, user deletion and a new password
end a session at once. Before login, the form's CSRF token is a double submit: a random
value in a signed, short-lived cookie and in the form.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy.orm import Session

from app.api.deps import principal_of
from app.auth import Principal, session_digest
from app.db import repo
from app.state import db_of, session_signer_of

SESSION_COOKIE = "quorra_session"
LOGIN_CSRF_COOKIE = "quorra_login_csrf"
LOGIN_CSRF_TTL_S = 3600
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class SessionSigner:
    """Signs cookie values with the app's secret key; one per app, made by the lifespan."""

    def __init__(self, secret_key: bytes, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self._session = URLSafeTimedSerializer(secret_key, salt="quorra.ui.session")
        self._login_csrf = URLSafeTimedSerializer(secret_key, salt="quorra.ui.login-csrf")

    def sign_session(self, session_id: str) -> str:
        return self._session.dumps(session_id)

    def unsign_session(self, value: str) -> str | None:
        try:
            loaded = self._session.loads(value, max_age=self.ttl_s)
        except BadSignature:
            return None
        return loaded if isinstance(loaded, str) else None

    def sign_login_csrf(self, token: str) -> str:
        return self._login_csrf.dumps(token)

    def unsign_login_csrf(self, value: str) -> str | None:
        try:
            loaded = self._login_csrf.loads(value, max_age=LOGIN_CSRF_TTL_S)
        except BadSignature:
            return None
        return loaded if isinstance(loaded, str) else None


def _signer(request: Request) -> SessionSigner:
    return session_signer_of(request.app.state)


def set_cookie(request: Request, response: Response, name: str, value: str, max_age_s: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age_s,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response, name: str) -> None:
    response.delete_cookie(name, path="/", httponly=True, samesite="strict")


@dataclass(frozen=True, slots=True)
class UiLogin:
    principal: Principal
    csrf_token: str
    session_digest: str


def start_session(
    request: Request, response: Response, session: Session, principal: Principal
) -> None:
    user = repo.get_user_by_id(session, principal.user_id)
    assert user is not None
    session_id = secrets.token_urlsafe(32)
    signer = _signer(request)
    repo.create_ui_session(
        session,
        user=user,
        digest=session_digest(session_id),
        csrf_token=secrets.token_urlsafe(32),
        ttl=timedelta(seconds=signer.ttl_s),
    )
    set_cookie(request, response, SESSION_COOKIE, signer.sign_session(session_id), signer.ttl_s)
    clear_cookie(response, LOGIN_CSRF_COOKIE)


def current_login(request: Request) -> UiLogin | None:
    """The logged-in user of this request, or None.

    Read in a short session of its own (this runs on a worker thread), not in the
    request's: an endpoint's transaction then holds no connection before it needs one.
    """
    cookie = request.cookies.get(SESSION_COOKIE)
    session_id = _signer(request).unsign_session(cookie) if cookie else None
    if session_id is None:
        return None
    digest = session_digest(session_id)
    with db_of(request.app.state).session_factory() as session:
        row = repo.find_ui_session(session, digest)
        if row is None:
            return None
        return UiLogin(principal_of(row.user), row.csrf_token, digest)


MaybeLogin = Annotated[UiLogin | None, Depends(current_login)]


def end_session(session: Session, login: UiLogin | None, response: Response) -> None:
    if login is not None:
        repo.delete_ui_session(session, login.session_digest)
    clear_cookie(response, SESSION_COOKIE)


def new_login_csrf() -> str:
    return secrets.token_urlsafe(32)


def set_login_csrf_cookie(request: Request, response: Response, token: str) -> None:
    """Pair the login form's CSRF token with a signed cookie (double submit)."""
    set_cookie(
        request,
        response,
        LOGIN_CSRF_COOKIE,
        _signer(request).sign_login_csrf(token),
        LOGIN_CSRF_TTL_S,
    )


def login_csrf_ok(request: Request, submitted: str) -> bool:
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE)
    expected = _signer(request).unsign_login_csrf(cookie) if cookie else None
    return expected is not None and hmac.compare_digest(expected, submitted)


async def submitted_csrf(request: Request) -> str:
    """The CSRF token of a state-changing request: the htmx header, else the form field."""
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    form = await request.form()
    value = form.get(CSRF_FIELD)
    return value if isinstance(value, str) else ""


def csrf_ok(login: UiLogin, submitted: str) -> bool:
    return bool(submitted) and hmac.compare_digest(login.csrf_token, submitted)
