"""``create_app(settings)``: the FastAPI app, whose lifespan owns every resource.

Start-up, in order (shutdown undoes it in reverse):

1. the secret key (created in the data directory on first start), the session signer and
   the password workers (app/passwords.py);
2. the metadata database: Alembic migrations to head, then the engine and session factory;
3. bootstrap: user ``admin`` while there is no admin, this node in the node registry;
4. the queue engine (app/engine_seam.py): ``make_node``, a cluster node's network
   started (``running_network``), its record listener, ``await node.start()``
   (recovery; ``/readyz`` says ``engine: recovering``), then ``app.state.node``;
5. ready: ``app.state.ready``; ``/readyz`` answers 200.

Nothing is created at import time; two apps in one process share nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from fastapi import FastAPI
from fastapi._body_limit import AppBodyLimitMiddleware
from fastapi.staticfiles import StaticFiles
from fastapi.telemetry._asgi import ExceptionTelemetryMiddleware
from starlette.datastructures import State
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import queue_api
from app.api import ops, tokens, users
from app.api.deps import API_PREFIX
from app.api.stream import OPENAPI_DESCRIPTION
from app.auth import hash_password, random_password
from app.cluster_mirror import ClusterMirror
from app.cluster_settings import format_address
from app.db import repo
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.engine_seam import (
    NodeFactory,
    NodeNetwork,
    make_node,
    metadata_of,
    on_forgotten,
    record_listener,
    running_network,
    serve_history,
)
from app.memory_trim import trim_forever
from app.metrics import UNMATCHED_ROUTE, AppMetrics
from app.passwords import PasswordWorkers
from app.problems import install_problem_handlers, problem_response
from app.queue_history import history_source
from app.routing import add_routes
from app.settings import Settings, load_secret_key
from app.state import node_or_none, publish_trace_of
from app.throttle import FailureThrottle
from app.token_cache import TokenCache
from app.ui import dashboard
from app.ui.sessions import SessionSigner
from app.ui.views import install_ui_handlers
from app.ui.views import router as ui_router
from engine.publish_trace import PublishTrace
from engine.runtime.api import QueueEngine

ADMIN_USER = "admin"
log = logging.getLogger("quorra.app")


@dataclass(frozen=True, slots=True)
class StartupReport:
    """What the server tells the operator once it is ready."""

    base_url: str
    admin_created: bool
    admin_password: str | None
    """Only when generated at this start; shown once, never stored in clear."""
    cluster: ClusterReport | None = None
    """A cluster node's place in its cluster; ``None`` on a single-node server."""


@dataclass(frozen=True, slots=True)
class ClusterReport:
    node_id: str
    cluster_id: str
    listen: str
    """Where this node listens for its peers (``host:port``, the port bound)."""
    members: list[str]


Announce = Callable[[StartupReport], None]
Refuse = Callable[[str], None]
"""Told (with the log line) that the cluster forgot this node: the server must stop."""


def bootstrap(db: Database, settings: Settings) -> StartupReport:
    """Create ``admin`` when there is no admin yet; register this node. Idempotent.

    "No admin" rather than "no user": users added with ``quorra user add`` before the
    first start must not leave the server without anyone who can manage it.
    """
    with db.transaction() as session:
        created, shown = False, None
        if repo.count_admins(session) == 0 and repo.get_user(session, ADMIN_USER) is None:
            password = settings.admin_password or random_password()
            repo.create_user(
                session,
                name=ADMIN_USER,
                password_hash=hash_password(password),
                role="admin",
                configure=".*",
                write=".*",
                read=".*",
            )
            repo.audit(
                session, actor="system", action="user.bootstrap", target=ADMIN_USER, source="system"
            )
            created, shown = True, (None if settings.admin_password else password)
        repo.register_local_node(session, name=settings.node_name, api_url=settings.base_url)
        repo.delete_expired_ui_sessions(session)
    return StartupReport(settings.base_url, created, shown)


def with_cluster(
    report: StartupReport, settings: Settings, network: NodeNetwork | None
) -> StartupReport:
    """The report with this node's place in its cluster, once its network listens."""
    cluster = settings.cluster
    if cluster is None or network is None:
        return report
    assert cluster.cluster_id is not None
    listen = format_address((cluster.listen[0], network.listen_port))
    return dataclasses.replace(
        report, cluster=ClusterReport(cluster.node_id, cluster.cluster_id, listen, cluster.members)
    )


@asynccontextmanager
async def engine_serving(
    state: State,
    db: Database,
    node: QueueEngine | None,
    refuse: Refuse | None = None,
    *,
    mirror_wait_s: float,
) -> AsyncIterator[None]:
    """The node recovered and in ``state.node`` for the body (``/readyz`` says
    ``engine: recovering`` meanwhile), taken out and stopped after it; a cluster node
    waits up to ``mirror_wait_s`` for the metadata's users and tokens in SQLite."""
    started = False
    refused = asyncio.Event()

    def refused_by_cluster(message: str) -> None:
        refused.set()
        if refuse is not None:
            refuse(message)

    try:
        if node is not None:
            state.engine_status = "recovering"
            node.set_record_listener(record_listener(db, node))
            serve_history(node, history_source(db))
            if refuse is not None:
                on_forgotten(node, refused_by_cluster)
            await node.start()
            started = True
            await queue_api.on_node_started(db, node)
            group = metadata_of(node)
            if group is not None:
                # A cluster node: its users and tokens are the cluster metadata's.
                state.mirror = ClusterMirror(db, group)
                state.mirror.start()
                # A node its cluster refused stops at once: nothing to wait for.
                if not await state.mirror.wait_adopted(mirror_wait_s, refused):
                    log.warning("ready before the cluster metadata's users reached SQLite")
            state.node, state.engine_status = node, "recovered"
        yield
    finally:
        state.node, state.engine_status = None, "absent"
        mirror, state.mirror = getattr(state, "mirror", None), None
        if mirror is not None:
            await mirror.stop()
        if node is not None and started:
            await node.stop()


@asynccontextmanager
async def tracing_publishes(trace: PublishTrace | None, path: Path | None) -> AsyncIterator[None]:
    """Count the collector's runs into ``trace`` for the body, then write its summary to
    ``path`` (a measuring aid: ``Settings.trace_publish_file``)."""
    if trace is None or path is None:
        yield
        return
    trace.install_gc_callback()
    try:
        yield
    finally:
        trace.remove_gc_callback()
        text = json.dumps(trace.summary())
        await anyio.to_thread.run_sync(path.write_text, text)


def _lifespan(
    settings: Settings,
    node_factory: NodeFactory,
    announce: Announce | None,
    refuse: Refuse | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.ready, state.node, state.engine_status, state.migrations = False, None, "absent", None
        secret_key = await anyio.to_thread.run_sync(load_secret_key, settings.data_dir)
        state.session_signer = SessionSigner(secret_key, settings.session_ttl_s)
        state.passwords = PasswordWorkers(
            settings.password_workers, settings.password_waiting_max, settings.password_wait_ms_max
        )
        db = Database(settings.database_url)
        try:
            state.migrations = await anyio.to_thread.run_sync(
                upgrade_to_head, db.engine, settings.migrations_dir
            )
            state.db = db
            state.token_cache.watch(db.session_factory)
            report = await anyio.to_thread.run_sync(bootstrap, db, settings)
            # The engine seam (app/engine_seam.py): started after the metadata it mirrors
            # into, stopped before the database closes; a cluster node's network around it.
            node = node_factory(settings)
            trace = publish_trace_of(state)
            if trace is not None and node is not None:
                node.trace_publishes(trace)
            async with (
                tracing_publishes(trace, settings.trace_publish_file),
                running_network(node) as network,
                engine_serving(
                    state,
                    db,
                    node,
                    refuse,
                    mirror_wait_s=settings.metadata_mirror_wait_ms / 1000,
                ),
            ):
                # What start-up built (modules, queues, recovered state) lives as long as
                # the process: move it out of the collector's sight so that a full
                # collection does not walk it (about 200 ms with 1,000 queues). No
                # collection first: at this point it finds little garbage (a few
                # thousand objects, once) and costs about 60 ms of the start (quorra
                # bench restart). `quorra serve` starts with collection off (app/cli.py).
                gc.freeze()
                gc.enable()
                trimming = asyncio.get_running_loop().create_task(trim_forever())
                state.ready = True
                if announce is not None:
                    announce(with_cluster(report, settings, network))
                try:
                    async with dashboard.sampler_lifespan(app):
                        yield
                finally:
                    trimming.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await trimming
                    gc.unfreeze()  # what stopping releases can be collected again
                    state.ready = False
        finally:
            db.dispose()
            state.passwords.close()

    return lifespan


class ResponseHeadersMiddleware:
    """The headers this server adds to its answers and the request metrics, in one layer
    with one ``send`` wrapper (a layer each cost a coroutine and a wrapper more on every
    request): every response gets ``HEADERS`` (HTML pages may load only this server's
    files), and every answer about a queue (``/api/v1/queues/{name}...``) names the node
    that leads it, as this node knows it, in ``Quorra-Leader``: a client may send its
    next requests there directly and save the forwarding hop.

    Every HTTP request is counted (``HttpRequests``, app/metrics.py) by its route template
    (``scope["route"]``, set by the router or the message dispatch inside), never by its
    raw path, with the status its response started with; a request answered by no
    response (an exception, answered by Starlette's error layer outside) counts as 500."""

    HEADERS = (
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (
            b"content-security-policy",
            b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
            b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    )
    PREFIX = f"{API_PREFIX}/queues/"

    LEADER_LINES_MAX = 256

    def __init__(self, app: ASGIApp, state: State, metrics: AppMetrics) -> None:
        self.app = app
        self.state = state
        self.http = metrics.http
        self._leader_lines: dict[str, tuple[tuple[bytes, bytes], ...]] = {}
        """Leader's name -> ``HEADERS`` and its header line, made once: the same few on
        every answer."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path: str = scope["path"]
        name = path[len(self.PREFIX) :].partition("/")[0] if path.startswith(self.PREFIX) else ""
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra: tuple[tuple[bytes, bytes], ...] = self.HEADERS
                if name:
                    node = node_or_none(self.state)
                    leader = None if node is None else node.leader_of(name)
                    if leader is not None:
                        extra = self._lines_with(leader)
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            self.http.observe(scope["method"], template, status, time.perf_counter() - started)

    def _lines_with(self, leader: str) -> tuple[tuple[bytes, bytes], ...]:
        """``HEADERS`` and the leader's line, made once per leader."""
        lines = self._leader_lines.get(leader)
        if lines is None:
            if len(self._leader_lines) >= self.LEADER_LINES_MAX:
                self._leader_lines.clear()
            lines = (*self.HEADERS, (b"quorra-leader", leader.encode()))
            self._leader_lines[leader] = lines
        return lines


def _framing(scope: Scope) -> tuple[bytes | None, bool]:
    """The raw ``Content-Length``, and whether a ``Transfer-Encoding`` is named: one
    scan, not ``Headers``, on every request."""
    declared, coded = None, False
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = bytes(value)
        elif key == b"transfer-encoding":
            coded = True
    return declared, coded


class BodyLimitMiddleware:
    """Refuse request bodies over ``limit_bytes`` with a 413 problem, before parsing.

    A declared ``Content-Length`` over the limit is refused without reading, one within
    it is read as it is (the parser reads no more); a chunked body is counted as it
    arrives and refused when it crosses the limit.
    """

    def __init__(self, app: ASGIApp, limit_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, coded = _framing(scope)
        length = int(declared) if declared is not None and declared.isdigit() else None
        if length is not None and length > self.limit_bytes:
            await self._too_large()(scope, receive, send)
            return
        if length is not None and not coded:
            # The HTTP parser delivers exactly the declared length (HTTP/1.1 framing: what
            # follows is the next request), so there is nothing to count on the way.
            await self.app(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit_bytes:
                    raise StarletteHTTPException(413, self._detail())
            return message

        await self.app(scope, counting_receive, send)

    def _detail(self) -> str:
        return f"the request body is larger than {self.limit_bytes} bytes"

    def _too_large(self) -> ASGIApp:
        return problem_response(
            413, "/problems/message-too-large", "Message or batch too large", self._detail()
        )


class QuorraApp(FastAPI):
    """FastAPI, without the two layers its stack puts outside the app's own that do
    nothing in Quorra: the telemetry's exception observer (telemetry is off, so no
    request carries what it would note) and FastAPI's body limit (no ``max_body_size``:
    ``BodyLimitMiddleware`` bounds bodies). Each was a coroutine on every request."""

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        assert isinstance(stack, ServerErrorMiddleware), stack
        observer = stack.app
        assert isinstance(observer, ExceptionTelemetryMiddleware), observer
        assert not any(self._telemetry[kind] for kind in ("tracing", "metrics", "logs"))
        limit = observer.app
        assert isinstance(limit, AppBodyLimitMiddleware) and self.max_body_size is None
        stack.app = limit.app  # without max_body_size, the very app it was given
        return stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request straight into the middleware stack, as ``Starlette.__call__`` does:
        FastAPI's own first asks its telemetry, which is off (``build_middleware_stack``
        checks it), whether to observe the request, and adds a coroutine on the way."""
        if scope["type"] != "http" or self.root_path or self.middleware_stack is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await self.middleware_stack(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    node_factory: NodeFactory = make_node,
    announce: Announce | None = None,
    refuse: Refuse | None = None,
) -> FastAPI:
    app = QuorraApp(
        title="Quorra",
        version="0.1.0",
        summary="A Raft-replicated queue platform.",
        description=OPENAPI_DESCRIPTION,
        lifespan=_lifespan(settings, node_factory, announce, refuse),
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; /openapi.json is the contract
        redoc_url=None,
        # FastAPI's OpenTelemetry asks the global providers on every request whether it
        # should trace (about 16 us, environment reads included); Quorra configures none.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = AppMetrics()
    app.state.login_throttle = FailureThrottle()
    app.state.token_cache = TokenCache()
    app.state.publish_trace = PublishTrace() if settings.trace_publish_file else None
    app.state.ready, app.state.node, app.state.engine_status, app.state.migrations = (
        False,
        None,
        "absent",
        None,
    )

    install_problem_handlers(app)
    install_ui_handlers(app)
    add_routes(app, ops.ops_router, ops.api_router, users.router, tokens.router)
    queue_api.install(app)
    add_routes(app, *dashboard.ROUTERS, ui_router)
    app.mount("/static", StaticFiles(directory=settings.static_dir, check_dir=False), name="static")

    app.add_middleware(BodyLimitMiddleware, limit_bytes=settings.request_body_bytes_max)
    app.add_middleware(ResponseHeadersMiddleware, state=app.state, metrics=app.state.metrics)
    return app
