"""Dashboard sign-in: login and logout (the pages themselves are in app/ui/pages.py).

Pages that need a login depend on ``LoginDep`` (redirects to ``/login``); pages that
change state also depend on ``CsrfLoginDep`` (403 without the session's CSRF token,
taken from the ``X-CSRF-Token`` header htmx sends or the ``csrf_token`` form field).
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from app.api.deps import SessionDep, client_addr, principal_of
from app.auth import check_password
from app.db import repo
from app.throttle import FailureThrottle, TooManyFailures
from app.ui.sessions import (
    MaybeLogin,
    UiLogin,
    csrf_ok,
    end_session,
    login_csrf_ok,
    new_login_csrf,
    set_login_csrf_cookie,
    start_session,
    submitted_csrf,
)

router = APIRouter(include_in_schema=False)


class LoginRequired(Exception):
    """Raised by ``LoginDep``; answered with a redirect to the login page."""


class CsrfFailed(Exception):
    """Raised by ``CsrfLoginDep``; answered with 403."""


def require_login(login: MaybeLogin) -> UiLogin:
    if login is None:
        raise LoginRequired
    return login


LoginDep = Annotated[UiLogin, Depends(require_login)]


async def require_csrf(request: Request, login: LoginDep) -> UiLogin:
    if not csrf_ok(login, await submitted_csrf(request)):
        raise CsrfFailed
    return login


CsrfLoginDep = Annotated[UiLogin, Depends(require_csrf)]


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    response: HTMLResponse = request.app.state.templates.TemplateResponse(
        request, name, context, status_code=status_code
    )
    response.headers["Cache-Control"] = "no-store"
    return response


def _login_page(
    request: Request, error: str = "", status_code: int = 200, username: str = ""
) -> HTMLResponse:
    token = new_login_csrf()
    context = {"error": error, "username": username, "csrf_token": token}
    response = render(request, "login.html", context, status_code)
    set_login_csrf_cookie(request, response, token)
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, login: MaybeLogin) -> Response:
    if login is not None:
        return RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    return _login_page(request)


@router.post("/login", response_class=HTMLResponse)
async def login_submit(request: Request, session: SessionDep) -> Response:
    form = await request.form()
    username = str(form.get("username", ""))[:100]
    password = str(form.get("password", ""))[:1024]
    if not login_csrf_ok(request, str(form.get("csrf_token", ""))):
        return _login_page(request, "The form expired; please try again.", 403, username)
    throttle: FailureThrottle = request.app.state.login_throttle
    address = client_addr(request)
    try:
        throttle.check(username, address)
    except TooManyFailures as e:
        return _login_page(
            request, f"Too many wrong passwords; retry in {e.retry_after_s} s.", 429, username
        )
    user = repo.get_user(session, username)
    valid = await anyio.to_thread.run_sync(
        check_password, user.password_hash if user else None, password
    )
    if user is None or not valid:
        throttle.failed(username, address)
        return _login_page(request, "Wrong user name or password.", 401, username)
    throttle.succeeded(username, address)
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    start_session(request, response, session, principal_of(user))
    _audit(session, request, user.name, "session.login")
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, login: CsrfLoginDep) -> Response:
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    end_session(session, login, response)
    _audit(session, request, login.principal.name, "session.logout")
    return response


def _audit(session: Session, request: Request, actor: str, action: str) -> None:
    repo.audit(session, actor=actor, action=action, source="ui", remote_addr=client_addr(request))


def _login_required(_request: Request, _exc: Exception) -> Response:
    return RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)


def _csrf_failed(request: Request, _exc: Exception) -> Response:
    return render(
        request, "error.html", {"message": "The form's CSRF token is missing or wrong."}, 403
    )


def install_ui_handlers(app: Any) -> None:
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(CsrfFailed, _csrf_failed)
