"""The publish trace: rows of stamps in path order, overlaps dropped, bounded, summarized."""

from __future__ import annotations

import gc
import itertools

import numpy as np

from engine.publish_trace import STAGES, PublishTrace, Stage, summarize


def _publish(trace: PublishTrace, stages: tuple[Stage, ...] = STAGES) -> None:
    for stage in stages:
        trace.stamp(stage)


def test_a_publish_made_alone_is_one_row_of_increasing_stamps() -> None:
    trace = PublishTrace()
    _publish(trace)
    _publish(trace)
    rows = trace.rows()
    assert rows.shape == (2, len(STAGES))
    assert (np.diff(rows, axis=1) >= 0).all() and (rows > 0).all()
    summary = trace.summary()
    assert summary["publishes"] == 2 and summary["overlapped"] == 0
    assert set(summary["steps_us"]) == {
        *(f"{a.name.lower()}->{b.name.lower()}" for a, b in itertools.pairwise(STAGES)),
        "received->sent",
    }


def test_a_stage_whose_predecessor_is_missing_is_not_stamped() -> None:
    trace = PublishTrace()
    trace.stamp(Stage.TAKEN)  # a batch of something else, no publish open
    trace.stamp(Stage.RECEIVED)
    trace.stamp(Stage.TAKEN)  # before its own proposal: another batch
    _publish(trace, STAGES[1:])
    rows = trace.rows()
    assert len(rows) == 1
    assert rows[0, Stage.TAKEN] >= rows[0, Stage.SUBMITTED]


def test_a_confirm_sent_from_the_apply_resumes_nothing() -> None:
    trace = PublishTrace()
    _publish(trace, STAGES[: Stage.APPLIED + 1])
    trace.stamp(Stage.SENT)
    trace.stamp(Stage.RESUMED)  # the task resumes after the row closed: not a new row
    rows = trace.rows()
    assert len(rows) == 1 and trace._open is None
    assert rows[0, Stage.RESUMED] == rows[0, Stage.APPLIED] <= rows[0, Stage.SENT]


def test_a_confirm_sent_before_the_apply_is_not_stamped() -> None:
    trace = PublishTrace()
    _publish(trace, STAGES[: Stage.SYNCED + 1])
    trace.stamp(Stage.SENT)
    assert len(trace.rows()) == 0 and trace._open is not None


def test_a_stage_is_stamped_once() -> None:
    trace = PublishTrace()
    _publish(trace, STAGES[:4])
    first = list(trace._open or [])
    trace.stamp(Stage.TAKEN)
    assert trace._open == first


def test_overlapping_publishes_are_dropped_not_mixed() -> None:
    trace = PublishTrace()
    _publish(trace, STAGES[:3])
    _publish(trace)
    assert trace.overlapped == 1 and len(trace.rows()) == 1


def test_rows_beyond_the_bound_are_counted_not_kept() -> None:
    trace = PublishTrace(rows_max=2)
    for _ in range(5):
        _publish(trace)
    assert len(trace.rows()) == 2 and trace.not_kept == 3


def test_summary_of_known_rows() -> None:
    rows = np.array([[k * 1000 * s for s in range(len(STAGES))] for k in (1, 2, 3)], np.int64)
    steps = summarize(rows)["steps_us"]
    assert steps["received->proposed"] == {"p50_us": 2.0, "p99_us": 3.0, "max_us": 3.0}
    assert steps["received->sent"]["max_us"] == 27.0
    assert summarize(rows[:0]) == {"publishes": 0, "steps_us": {k: {} for k in steps}}


def test_collections_are_counted_while_installed() -> None:
    trace = PublishTrace()
    trace.install_gc_callback()
    try:
        gc.collect()
    finally:
        trace.remove_gc_callback()
    gc.collect()
    assert trace.gc_runs == 1 and trace.gc_ns > 0
