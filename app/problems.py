"""RFC 9457 problem details for every error the server returns.

Two families of typed errors map to problems: the engine's operating errors
(``engine.errors.QuorraError``) and the app's own (``AppProblem`` below: auth, users,
tokens, content negotiation). Both carry ``status``, ``problem_type``, ``title``,
``detail`` and ``retry_after_s``; ``install_problem_handlers`` renders them, FastAPI's
validation errors, Starlette's HTTP errors (unknown route, method, body too large) and
any unexpected exception as ``application/problem+json``. A response never carries a
stack trace; unexpected exceptions are logged on the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from engine.errors import QuorraError

PROBLEM_MEDIA_TYPE = "application/problem+json"
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
log = logging.getLogger("quorra.app")


class AppProblem(Exception):
    """An error of the app layer; ``detail`` is safe to show to the client."""

    status: ClassVar[int] = 500
    problem: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    retry_after_s: int | None = None

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}

    @property
    def problem_type(self) -> str:
        return f"/problems/{self.problem}"


class Unauthorized(AppProblem):
    status, problem, title = 401, "unauthorized", "Authentication required"

    def __init__(self, detail: str, *, scheme: str = "Bearer") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": f'{scheme} realm="quorra"'})


class Forbidden(AppProblem):
    status, problem, title = 403, "forbidden", "Not permitted"


class UserNotFound(AppProblem):
    status, problem, title = 404, "user-not-found", "User not found"


class TokenNotFound(AppProblem):
    status, problem, title = 404, "token-not-found", "Token not found"


class UserConflict(AppProblem):
    """The user exists already, or the change would leave no admin."""

    status, problem, title = 409, "user-conflict", "Conflicting user change"


class UnsupportedMediaType(AppProblem):
    status, problem, title = 415, "unsupported-media-type", "Unsupported media type"


_HTTP_PROBLEMS: dict[int, tuple[str, str]] = {
    400: ("invalid-request", "Malformed request"),
    401: ("unauthorized", "Authentication required"),
    403: ("forbidden", "Not permitted"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    406: ("not-acceptable", "Not acceptable"),
    413: ("message-too-large", "Message or batch too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    422: ("validation-failed", "Validation failed"),
}


class Problem(BaseModel):
    """RFC 9457 problem details, as every error response carries them."""

    type: str = Field(examples=["/problems/queue-not-found"])
    title: str
    status: int
    detail: str | None = None
    errors: list[dict[str, object]] | None = Field(
        default=None, description="Validation errors (422 only): loc, msg, type."
    )


API_ERROR_STATUSES = (400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 503)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, object]]:
    """OpenAPI ``responses`` documenting problem bodies for ``statuses``."""
    return {
        status: {
            "model": Problem,
            "content": {PROBLEM_MEDIA_TYPE: {}},
            "description": "Problem details.",
        }
        for status in statuses
    }


def problem_response(
    status: int,
    problem_type: str,
    title: str,
    detail: str,
    *,
    retry_after_s: int | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, object] | None = None,
) -> JSONResponse:
    body: dict[str, object] = {"type": problem_type, "title": title, "status": status}
    if detail:
        body["detail"] = detail
    if extra:
        body.update(extra)
    all_headers = dict(headers or {})
    if retry_after_s is not None:
        all_headers["Retry-After"] = str(retry_after_s)
    return JSONResponse(
        body, status_code=status, headers=all_headers, media_type=PROBLEM_MEDIA_TYPE
    )


def _typed_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QuorraError | AppProblem)
    return typed_problem(exc)


def typed_problem(exc: QuorraError | AppProblem) -> JSONResponse:
    """The problem answer of a typed error, as the installed handler renders it."""
    return problem_response(
        exc.status,
        exc.problem_type,
        exc.title,
        exc.detail,
        retry_after_s=exc.retry_after_s,
        headers=exc.headers if isinstance(exc, AppProblem) else None,
    )


def _validation_errors(errors: list[Any]) -> list[dict[str, object]]:
    # `errors` are FastAPI's `RequestValidationError.errors()`, typed `Sequence[Any]`.
    # Only location, message and kind: pydantic's `input` and `ctx` may echo secrets
    # (a password field) or hold values that are not JSON.
    return [
        {
            "loc": [str(part) for part in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors
    ]


def _request_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return problem_response(
            400, "/problems/invalid-request", "Malformed request", "the body is not valid JSON"
        )
    return problem_response(
        422,
        "/problems/validation-failed",
        "Validation failed",
        "the request does not match the schema; see errors",
        extra={"errors": _validation_errors(errors)},
    )


def _allowed_methods(request: Request) -> str:
    """Every method some route accepts on this path (a 405's ``Allow``): Starlette names
    only those of the first route that matched the path."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes
        )
    ]
    return ", ".join(allowed)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    problem, title = _HTTP_PROBLEMS.get(exc.status_code, (f"http-{exc.status_code}", "HTTP error"))
    detail = exc.detail if isinstance(exc.detail, str) else ""
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return problem_response(exc.status_code, f"/problems/{problem}", title, detail, headers=headers)


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        500, "/problems/internal", "Internal error", "the server failed; see its log"
    )


_HANDLERS: tuple[tuple[type[Exception], Callable[[Request, Exception], JSONResponse]], ...] = (
    (QuorraError, _typed_error),
    (AppProblem, _typed_error),
    (RequestValidationError, _request_validation),
    (StarletteHTTPException, _http_error),
    (Exception, _unexpected),
)
"""Most specific first: ``problem_of`` takes the first that matches."""


def install_problem_handlers(app: FastAPI) -> None:
    for kind, handler in _HANDLERS:
        app.add_exception_handler(kind, handler)


def problem_of(request: Request, exc: Exception) -> JSONResponse:
    """The answer the installed handlers give to ``exc``, for code that runs outside
    the app's exception middleware (the message endpoints' dispatch,
    app/api/message_route.py)."""
    for kind, handler in _HANDLERS:
        if isinstance(exc, kind):
            return handler(request, exc)
    raise AssertionError("Exception matches every exception")
