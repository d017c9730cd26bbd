"""Where the queue API joins the app: ``install`` (routers and metrics, at construction)
and ``on_node_started`` (start-up reconciliation, before the server reports ready)."""

from __future__ import annotations

import logging

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app import queue_admin
from app.api import messages, queue_ops, queues, stream
from app.api.message_route import MessageDispatch, MessageRoute
from app.db.session import Database
from app.names import QUEUE_NAME_RULE, segment_queue_name
from app.problems import problem_response
from app.queue_metrics import QueueCollector
from app.routing import add_routes
from app.state import metrics_of, node_or_none
from engine.runtime.api import QueueEngine

log = logging.getLogger("quorra.app")


QUEUES_PREFIX = b"/api/v1/queues/"


class QueueNameGuard:
    """422 for a request whose queue name, as sent, is not a valid name.

    The router sees the path after percent-decoding, so ``/queues/..%2Fetc`` would be
    routed elsewhere (a 404) and ``/queues/a%20b`` would look like a bad name only by
    luck; this checks the raw segment after ``/api/v1/queues/`` instead. ``.`` and
    ``..`` match the name pattern but are dot-segments in a URL (RFC 3986): no client
    can address them, so they are refused too.

    The segments found valid are remembered (up to ``NAMES_MAX``, then forgotten
    together): a busy queue's requests name it again and again, and the check decodes
    the segment and runs the name's pattern on each (a microsecond or two). A few
    hundred cover the busy queues; remembering thousands kept about 80 bytes for each
    idle queue that a request once named (4,096 of them: 330 KB).
    """

    NAMES_MAX = 256

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._valid: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
            if raw.startswith(QUEUES_PREFIX):
                segment = raw[len(QUEUES_PREFIX) :].split(b"/", 1)[0].split(b"?", 1)[0]
                if segment not in self._valid and not self._check(segment):
                    response = problem_response(
                        422, "/problems/validation-failed", "Validation failed", QUEUE_NAME_RULE
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _check(self, segment: bytes) -> bool:
        if segment_queue_name(segment) is None:
            return False
        if len(self._valid) >= self.NAMES_MAX:
            self._valid.clear()
        self._valid.add(segment)
        return True


def install(app: FastAPI) -> None:
    """Add the queue, message, snapshot/compaction and cluster routes, the per-queue
    metrics, the message dispatch and the name guard to ``app`` (no I/O)."""
    add_routes(app, messages.router, first=True)  # publish, receive, ack: most requests
    add_routes(app, queues.router, queue_ops.router, queue_ops.cluster_router)
    app.router.routes.append(stream.ROUTE)
    metrics_of(app.state).registry.register(QueueCollector(lambda: node_or_none(app.state)))
    # Added first, so innermost: behind the name guard and every middleware of the app.
    routes = [r for r in messages.router.routes if isinstance(r, MessageRoute)]
    app.add_middleware(MessageDispatch, routes=routes, prefix=QUEUES_PREFIX.decode())
    app.add_middleware(QueueNameGuard)


async def on_node_started(db: Database, node: QueueEngine) -> None:
    """Make SQLite's queue definitions agree with the recovered engine (the truth)."""
    report = await anyio.to_thread.run_sync(queue_admin.reconcile, db, node.queues())
    if report.changed:
        log.warning(
            "queue definitions reconciled with the engine: added %s, removed %s, updated %s",
            report.added,
            report.removed,
            report.updated,
        )
