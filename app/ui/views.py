"""Dashboard sign-in: login and logout (the pages themselves are in app/ui/pages.py).

Pages that need a login depend on ``LoginDep`` (redirects to ``/login``); pages that
change state also depend on ``CsrfLoginDep`` (403 without the session's CSRF token,
taken from the ``X-CSRF-Token`` header htmx sends or the ``csrf_token`` form field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session
from starlette.applications import Starlette

from app.api.deps import SessionDep, check_login, client_addr
from app.db import repo
from app.passwords import LoginsBusy
from app.state import db_of, templates_of
from app.throttle import TooManyFailures
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
    request: Request, name: str, context: Mapping[str, object], status_code: int = 200
) -> HTMLResponse:
    response: HTMLResponse = templates_of(request.app.state).TemplateResponse(
        request, name, dict(context), status_code=status_code
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
async def login_submit(request: Request) -> Response:
    """``async`` and without the request's session: the password is checked off the event
    loop (``check_login``), and the session row is written in a transaction of its own."""
    form = await request.form()
    username = str(form.get("username", ""))[:100]
    password = str(form.get("password", ""))[:1024]
    if not login_csrf_ok(request, str(form.get("csrf_token", ""))):
        return _login_page(request, "The form expired; please try again.", 403, username)
    state = request.app.state
    try:
        principal = await check_login(state, username, password, client_addr(request))
    except (TooManyFailures, LoginsBusy) as e:
        page = _login_page(request, f"{e.detail[:1].upper()}{e.detail[1:]}.", 429, username)
        page.headers["Retry-After"] = str(e.retry_after_s)
        return page
    if principal is None:
        return _login_page(request, "Wrong user name or password.", 401, username)
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)

    def begin(session: Session) -> None:
        start_session(request, response, session, principal)
        _audit(session, request, principal.name, "session.login")

    await db_of(state).run(begin)
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


def install_ui_handlers(app: Starlette) -> None:
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(CsrfFailed, _csrf_failed)
