"""The dashboard's pure parts: number formats, SVG charts, the sample rings, message
bodies and the header field of the publish form."""

from __future__ import annotations

import gc
import tracemalloc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ui.actions import parse_headers
from app.ui.charts import history_chart, human_bytes, human_count, human_rate, line_chart
from app.ui.pages import decode_body
from app.ui.series import (
    PAUSE_S,
    SLICE_S,
    WAIT_PER_ROUND_S,
    Sample,
    SeriesStore,
    sample_of,
    wait_after,
)
from engine.errors import ValidationFailed


def test_number_formats() -> None:
    assert [human_bytes(v) for v in (0, 1023, 1024, 5 * 1024**2)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
    ]
    assert [human_count(v) for v in (7, 9999, 12_345, 1_000_000, 250_000_000)] == [
        "7",
        "9,999",
        "12.3k",
        "1.0M",
        "250M",
    ]
    assert [human_rate(v) for v in (0, 2.345, 12_000.0)] == ["0/s", "2.3/s", "12.0k/s"]
    assert human_bytes(None) == human_count(None) == "\N{EN DASH}"


def test_line_chart_is_inline_svg_scaled_from_zero() -> None:
    svg = str(line_chart([("a", [0.0, 5.0, 10.0]), ("b", [1.0])], width=100, height=50))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 1  # one point is no line
    empty = str(line_chart([("a", [])]))
    assert "collecting samples" in empty


def test_history_chart_marks_checkpoints_and_reclaimed_bytes() -> None:
    svg = str(history_chart([(1_000, 500), (2_000, 700)], [(1_500, 4096)]))
    assert svg.count("<circle") == 2 and svg.count("<rect") == 1
    assert "reclaimed 4.0 KiB" in svg
    assert "no snapshots" in str(history_chart([], []))


def test_rings_are_bounded_and_forget_deleted_queues() -> None:
    store = SeriesStore(samples_max=3)
    for at in range(5):
        store.add("a", Sample(at, at, 0, 0.0, 0.0, 0.0, 0, 0))
    store.add("b", Sample(0, 1, 0, 0.0, 0.0, 0.0, 0, 0))
    assert [s.at_ms for s in store.queue("a")] == [2, 3, 4]
    assert [(n, s.ready) for n, s in store.latest()] == [("a", 4), ("b", 1)]
    store.forget_except({"b"})
    assert store.queue("a") == [] and len(store.queue("b")) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 6),
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.integers(0, 1), st.booleans()),
        max_size=120,
    ),
)
def test_rings_kept_as_runs_give_back_what_was_added(
    samples_max: int, steps: list[tuple[str, int, int, bool]]
) -> None:
    """Against bounded deques as the model: the same samples, in order, whatever the
    runs (same figures in consecutive rounds), the skipped rounds, and the forgetting."""
    store = SeriesStore(samples_max=samples_max)
    model: dict[str, deque[Sample]] = {}
    at = 0
    for name, ready, advance, forget in steps:
        at += advance
        sample = Sample(at, ready, 0, 0.0, 0.0, 0.0, 0, 0)
        store.add(name, sample)
        model.setdefault(name, deque(maxlen=samples_max)).append(sample)
        if forget:
            kept = {name}
            store.forget_except(kept)
            model = {n: ring for n, ring in model.items() if n in kept}
        for n, ring in model.items():
            assert store.queue(n) == list(ring)
        assert store.latest() == [(n, ring[-1]) for n, ring in model.items()]


def test_idle_queues_rings_stay_small() -> None:
    """A full ring of an idle queue (the same figures each round) is one run, and the
    runs of queues alike share one sample."""
    store = SeriesStore()
    names = [f"q{n}" for n in range(200)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for at in range(2 * 180):
            for name in names:
                store.add(name, Sample(at * 5000, 10, 0, 0.0, 0.0, 0.0, 3000, 0, 2600))
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_queue = sum(s.size_diff for s in after.compare_to(before, "filename")) / len(names)
    # 275: the runs share their sample (500 each apart); 355 while a list held the runs
    assert per_queue < 300, per_queue
    assert len(store.queue("q7")) == 180
    assert store.queue("q7")[-1].at_ms == 359 * 5000


def test_sample_of_engine_stats() -> None:
    stats = {
        "messages_ready": 3,
        "messages_unacked": 2,
        "publish_rate": 1.5,
        "deliver_rate": 1,
        "ack_rate": 0.5,
        "memory_bytes": 40,
        "consumers": {"c1": 2},
    }
    assert sample_of(stats, 7) == Sample(7, 3, 2, 1.5, 1.0, 0.5, 40, 1)
    with_parts = {**stats, "memory": {"index_bytes": 10, "fixed_bytes": 30}}
    assert sample_of(with_parts, 7) == Sample(7, 3, 2, 1.5, 1.0, 0.5, 40, 1, 30)
    assert sample_of({"status": "failed"}, 7) == Sample(7, 0, 0, 0.0, 0.0, 0.0, 0, 0)


@given(st.floats(0, 100), st.floats(0.1, 10))
def test_sampling_takes_at_most_a_tenth_of_the_loop(round_s: float, interval_s: float) -> None:
    wait_s = wait_after(round_s, interval_s)
    assert wait_s >= interval_s
    worked_s = round_s * SLICE_S / (SLICE_S + PAUSE_S)  # a round works in slices
    assert worked_s <= (round_s + wait_s) / 10 + 1e-9
    assert wait_after(0.01, 5.0) == 5.0  # a small node: every interval
    assert wait_after(2.0, 5.0) == WAIT_PER_ROUND_S * 2.0


def test_bodies_are_shown_as_json_text_or_hex() -> None:
    assert decode_body(b'{"a":[1,2]}') == ("json", '{\n  "a": [\n    1,\n    2\n  ]\n}')
    assert decode_body("plain tëxt".encode()) == ("text", "plain tëxt")
    assert decode_body(b"\xff\x00\x01") == ("binary", "ff 00 01")


def test_publish_headers_field() -> None:
    assert parse_headers("") == {}
    assert parse_headers("a: 1\n\n b :two: three ") == {"a": "1", "b": "two: three"}
    assert parse_headers('{"k": "v"}') == {"k": "v"}
    for bad in ("no colon", '{"k": 1}', "{not json", ": empty key"):
        with pytest.raises(ValidationFailed):
            parse_headers(bad)
