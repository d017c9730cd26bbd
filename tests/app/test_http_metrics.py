"""``HttpRequests`` (app/metrics.py): the HTTP series as a scrape shows them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.metrics import AppMetrics


def _samples(metrics: AppMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render(lambda _queue: True).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("quorra_http_")
    }


def test_requests_are_counted_by_method_route_and_status() -> None:
    metrics = AppMetrics()
    for status in (201, 201, 422):
        metrics.http.observe("POST", "/q/{name}", status, 0.0001)
    metrics.http.observe("GET", "/q/{name}", 200, 0.0001)
    samples = _samples(metrics)
    total = "quorra_http_requests_total"
    assert samples[total, (("method", "POST"), ("route", "/q/{name}"), ("status", "201"))] == 2
    assert samples[total, (("method", "POST"), ("route", "/q/{name}"), ("status", "422"))] == 1
    assert samples[total, (("method", "GET"), ("route", "/q/{name}"), ("status", "200"))] == 1


def test_durations_fall_in_inclusive_cumulative_buckets() -> None:
    metrics = AppMetrics()
    for seconds in (0.0005, 0.001, 0.0011, 0.3, 31.0):
        metrics.http.observe("GET", "/x", 200, seconds)
    samples = _samples(metrics)

    def bucket(le: str) -> float:
        labels = (("le", le), ("method", "GET"), ("route", "/x"))
        return samples["quorra_http_request_duration_seconds_bucket", labels]

    assert (bucket("0.001"), bucket("0.0025"), bucket("0.25"), bucket("0.5")) == (2, 3, 3, 4)
    assert (bucket("30.0"), bucket("+Inf")) == (4, 5)
    labels = (("method", "GET"), ("route", "/x"))
    assert samples["quorra_http_request_duration_seconds_count", labels] == 5
    assert abs(samples["quorra_http_request_duration_seconds_sum", labels] - 31.3026) < 1e-9
