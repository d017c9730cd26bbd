"""Prometheus metrics of the app, in a registry owned by one app (no global registry).

Names follow rabbitmq_prometheus: ``quorra_`` prefix, units last. The engine's queue
metrics (``quorra_queue_messages_ready``, ...) arrive later as a collector registered
on ``app.state.metrics.registry`` when the node starts.

A series labelled ``queue`` is shown only to a caller who may see that queue (the rule of
``GET /queues``, ``Principal.can_see``); node-wide series are everyone's.
"""

from __future__ import annotations

import bisect
import copy
import itertools
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Metric,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE_LATEST", "UNMATCHED_ROUTE", "AppMetrics"]

UNMATCHED_ROUTE = "<unmatched>"
QUEUE_LABEL = "queue"


class AppMetrics:
    def __init__(self) -> None:
        # Process-wide in prometheus_client; the *_created series are noise for Quorra.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.http = HttpRequests(HTTP_DURATION_BUCKETS_S)
        self.registry.register(self.http)
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


HTTP_DURATION_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip


class HttpRequests(Collector):
    """``quorra_http_requests_total`` (by method, route template and status) and the
    histogram ``quorra_http_request_duration_seconds`` (by method and route template),
    counted in plain dicts and lists and turned into series when scraped.

    prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock and check
    their child on each call (three locked increments per request); these counts are
    only ever changed on the event loop, and a scrape copies each of them in one step
    (a dict's items, a list: atomic under the GIL), so a scrape from another thread sees
    whole counts."""

    def __init__(self, buckets_s: tuple[float, ...]) -> None:
        assert list(buckets_s) == sorted(set(buckets_s)), buckets_s
        self.buckets_s = buckets_s
        self.counts: dict[tuple[str, str, int], int] = {}
        self.timings: dict[tuple[str, str], list[float]] = {}
        """Per bucket (the last: over every bound) the requests it holds, then their sum
        of seconds."""

    def observe(self, method: str, template: str, status: int, seconds: float) -> None:
        key = (method, template, status)
        self.counts[key] = self.counts.get(key, 0) + 1
        timing = self.timings.get((method, template))
        if timing is None:
            timing = self.timings[method, template] = [0.0] * (len(self.buckets_s) + 2)
        timing[bisect.bisect_left(self.buckets_s, seconds)] += 1  # bounds are inclusive
        timing[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        counts = sorted(list(self.counts.items()))
        timings = sorted((key, list(timing)) for key, timing in list(self.timings.items()))
        requests = CounterMetricFamily(
            "quorra_http_requests",
            "HTTP requests served, by route template and status.",
            labels=["method", "route", "status"],
        )
        for (method, template, status), count in counts:
            requests.add_metric([method, template, str(status)], count)
        yield requests
        duration = HistogramMetricFamily(
            "quorra_http_request_duration_seconds",
            "Time to the end of the response, by route template.",
            labels=["method", "route"],
        )
        bounds = [floatToGoString(b) for b in self.buckets_s] + ["+Inf"]  # type: ignore[no-untyped-call]
        for (method, template), timing in timings:
            cumulative = list(itertools.accumulate(timing[:-1]))
            duration.add_metric(
                [method, template], list(zip(bounds, cumulative, strict=True)), timing[-1]
            )
        yield duration
