"""Prometheus metrics of the app, in a registry owned by one app (no global registry).

Names follow rabbitmq_prometheus: ``quorra_`` prefix, units last. The engine's queue
metrics (``quorra_queue_messages_ready``, ...) arrive later as a collector registered
on ``app.state.metrics.registry`` when the node starts.

A series labelled ``queue`` is shown only to a caller who may see that queue (the rule of
``GET /queues``, ``Principal.can_see``); node-wide series are everyone's.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CONTENT_TYPE_LATEST", "STATUS_KEY", "AppMetrics", "MetricsMiddleware"]

UNMATCHED_ROUTE = "<unmatched>"
STATUS_KEY = "quorra.status"
"""The scope's key for the status of the response sent, set as it starts."""
QUEUE_LABEL = "queue"


class AppMetrics:
    def __init__(self) -> None:
        # Process-wide in prometheus_client; the *_created series are noise for Quorra.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "quorra_http_requests",
            "HTTP requests served, by route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_request_duration = Histogram(
            "quorra_http_request_duration_seconds",
            "Time to the end of the response, by route template.",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.ready = Gauge(
            "quorra_ready", "1 when the node serves requests (see /readyz).", registry=self.registry
        )
        self.users = Gauge(
            "quorra_users", "Users in the metadata database.", registry=self.registry
        )

    def render(self, can_see: Callable[[str], bool]) -> bytes:
        """The text format, without the series of queues ``can_see`` refuses."""
        return generate_latest(_QueuesSeen(self.registry, can_see))


class _QueuesSeen(Collector):
    """The registry's metrics, each without the samples of queues ``can_see`` refuses."""

    def __init__(self, registry: CollectorRegistry, can_see: Callable[[str], bool]) -> None:
        self.registry = registry
        self.can_see = can_see

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            samples = [
                s
                for s in metric.samples
                if QUEUE_LABEL not in s.labels or self.can_see(s.labels[QUEUE_LABEL])
            ]
            if len(samples) != len(metric.samples):
                metric = copy.copy(metric)
                metric.samples = samples
            yield metric


class MetricsMiddleware:
    """Counts every HTTP request by its route template, never by its raw path.

    The status is the one the layer inside notes in the scope (``STATUS_KEY``: the
    response headers' layer, app/main.py, which wraps ``send`` anyway); a request
    answered by no response (an exception, answered by Starlette's error layer outside)
    counts as 500."""

    def __init__(self, app: ASGIApp, metrics: AppMetrics) -> None:
        self.app = app
        self.metrics = metrics
        # The labelled children, by their labels: ``labels()`` takes a lock and checks
        # its arguments on every call, a cost on every request. One entry per series.
        self._counted: dict[tuple[str, str, int], Counter] = {}
        self._timed: dict[tuple[str, str], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            status = scope.get(STATUS_KEY, 500)
            self._count(scope["method"], template, status, time.perf_counter() - started)

    def _count(self, method: str, template: str, status: int, seconds: float) -> None:
        counter = self._counted.get((method, template, status))
        if counter is None:
            counter = self.metrics.http_requests.labels(method, template, str(status))
            self._counted[method, template, status] = counter
        counter.inc()
        timer = self._timed.get((method, template))
        if timer is None:
            timer = self.metrics.http_request_duration.labels(method, template)
            self._timed[method, template] = timer
        timer.observe(seconds)
