"""Operations endpoints: ``/healthz`` and ``/readyz`` (open), ``/metrics`` (a token),
and ``/api/v1/whoami`` and ``/api/v1/audit``."""

from __future__ import annotations

from anyio import from_thread
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from app.api.deps import API_PREFIX, AdminDep, PrincipalDep, SessionDep
from app.api.schemas import ROW_ID_MAX, AuditOut, Health, Permissions, Readiness, WhoAmI
from app.db import repo
from app.metrics import CONTENT_TYPE_LATEST
from app.negotiation import NegotiatedRoute
from app.problems import API_ERROR_STATUSES, problem_responses
from app.state import engine_status_of, metrics_of, migrations_of, ready_of

ops_router = APIRouter(tags=["operations"])
api_router = APIRouter(
    prefix=API_PREFIX,
    tags=["operations"],
    route_class=NegotiatedRoute,
    responses=problem_responses(*API_ERROR_STATUSES),
)


def readiness(request: Request) -> Readiness:
    state = request.app.state
    engine, migrations = engine_status_of(state), migrations_of(state)
    ready = ready_of(state) and migrations is not None and engine != "recovering"
    return Readiness(ready=ready, migrations=migrations, engine=engine)


@ops_router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive and serving HTTP."""
    return Health(status="ok")


@ops_router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready yet."}},
)
def readyz(request: Request) -> Response:
    """Metadata migrated and, when an engine runs, every queue recovered."""
    result = readiness(request)
    return JSONResponse(result.model_dump(), status_code=200 if result.ready else 503)


@ops_router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."},
        **problem_responses(401, 405),
    },
)
def metrics(request: Request, session: SessionDep, who: PrincipalDep) -> Response:
    """Prometheus text format. Needs a bearer token of any user; per-queue series only of
    the queues that user may see (as ``GET /queues`` lists them)."""
    app_metrics = metrics_of(request.app.state)
    app_metrics.users.set(repo.count_users(session))
    app_metrics.ready.set(1 if readiness(request).ready else 0)
    # The queue collector reads the engine: do that on the event loop, which owns it.
    text = from_thread.run_sync(app_metrics.render, who.can_see)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@api_router.get("/whoami", response_model=WhoAmI)
async def whoami(who: PrincipalDep) -> WhoAmI:
    return WhoAmI(
        name=who.name,
        role=who.role,
        permissions=Permissions(configure=who.configure, write=who.write, read=who.read),
        token_id=who.token_id,
    )


@api_router.get("/audit", response_model=list[AuditOut])
def audit_log(
    session: SessionDep,
    _who: AdminDep,
    limit: int = Query(default=100, ge=1, le=1000),
    before: int | None = Query(
        default=None, ge=1, le=ROW_ID_MAX, description="Entries older than this id."
    ),
) -> list[AuditOut]:
    """Administrative actions, newest first."""
    return [
        AuditOut.model_validate(e, from_attributes=True)
        for e in repo.list_audit(session, limit, before)
    ]
