"""What every dashboard page and action shares: rendering with the dashboard's filters,
the logged-in user's context, the engine node, and errors shown as a flash message.

An action that fails answers with its HTTP status (403, 404, 409, 422, 429, 503) and
a flash fragment; htmx swaps it into ``#flash`` (``HX-Retarget``), as base.html's
``htmx-config`` swaps error responses too.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from app.api.deps import client_addr
from app.auth import Permission, Principal
from app.problems import AppProblem
from app.queue_admin import Actor
from app.state import node_or_none, templates_of
from app.ui.charts import FILTERS
from app.ui.sessions import UiLogin
from app.ui.views import render as _render
from engine.errors import NoLeader, QuorraError
from engine.runtime.api import QueueEngine


class EngineAbsent(NoLeader):
    pass


def render(
    request: Request,
    name: str,
    context: Mapping[str, object],
    login: UiLogin | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    env = templates_of(request.app.state).env
    if "bytes" not in env.filters:
        env.filters.update(FILTERS)
    if login is not None:
        context = {
            "login": login,
            "csrf_token": login.csrf_token,
            "user": login.principal,
            "path": request.url.path,
            **context,
        }
    return _render(request, name, context, status_code)


def node_of(request: Request) -> QueueEngine:
    node = node_or_none(request.app.state)
    if node is None:
        raise EngineAbsent("the queue engine is not running on this node")
    return node


def actor_of(request: Request, login: UiLogin) -> Actor:
    return Actor(login.principal.name, "ui", client_addr(request))


def can(principal: Principal, permission: Permission, queue: str) -> bool:
    return principal.can(permission, queue)


def flash(
    request: Request, message: str, *, kind: str = "ok", status_code: int = 200
) -> HTMLResponse:
    """A message for ``#flash``; on an error, htmx is told to put it there."""
    response = render(request, "_flash.html", {"message": message, "kind": kind}, None, status_code)
    if status_code >= 400 or kind != "ok":
        response.headers["HX-Retarget"] = "#flash"
        response.headers["HX-Reswap"] = "innerHTML"
    return response


def error_flash(request: Request, error: Exception) -> HTMLResponse:
    """The flash of an operating error, with its HTTP status."""
    if isinstance(error, QuorraError | AppProblem):
        return flash(
            request, f"{error.title}: {error.detail}", kind="bad", status_code=error.status
        )
    if isinstance(error, ValidationError | RequestValidationError):
        # A request body's errors (app/api/message_bodies.py) start their loc at "body".
        skip = 1 if isinstance(error, RequestValidationError) else 0
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][skip:]) or 'form'}: {e['msg']}"
            for e in error.errors()
        )
        return flash(request, f"Validation failed: {problems}", kind="bad", status_code=422)
    raise error
