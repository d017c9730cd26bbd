"""Rate samples kept as runs (engine/runtime/rates.py) against every sample kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.limits import Limits
from engine.runtime.rates import SAMPLES_MAX, Sample, add_sample, rates_of

LIMITS = Limits()


def _every_sample_rates(
    samples: list[Sample], current: Sample, limits: Limits
) -> tuple[float, float, float]:
    """The rates as the rule states them, over every sample ever taken: from the first
    one in the window, or from the window's start when the one before it has the same
    figures."""
    now_ms = current[0]
    start_ms = now_ms - limits.rate_window_ms
    inside = [k for k, s in enumerate(samples) if s[0] >= start_ms]
    if not inside:
        return 0.0, 0.0, 0.0
    k = inside[0]
    old = samples[k]
    if k > 0 and samples[k - 1][1:] == old[1:]:
        old = (start_ms, *old[1:])
    if now_ms - old[0] < limits.rate_sample_ms // 2:
        return 0.0, 0.0, 0.0
    dt = (now_ms - old[0]) / 1000
    r = [round((current[j] - old[j]) / dt, 3) for j in (1, 2, 3)]
    return r[0], r[1], r[2]


_steps = st.lists(
    st.tuples(
        st.integers(0, 4_000),  # ms since the step before
        st.tuples(*[st.sampled_from([0, 0, 0, 1, 7]) for _ in range(3)]),  # counter growth
        st.booleans(),  # a rates read after the sample
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([(1_000, 10_000), (500, 2_000), (1_000, 2_000), (250, 3_000)]),
    _steps,
)
def test_runs_give_the_rates_of_every_sample(
    periods: tuple[int, int], steps: list[tuple[int, tuple[int, int, int], bool]]
) -> None:
    sample_ms, window_ms = periods
    limits = Limits(rate_sample_ms=sample_ms, rate_window_ms=window_ms)
    kept: list[Sample] = []
    every: list[Sample] = []
    now, counters = 5_000_000, (0, 0, 0)
    for dt, growth, read in steps:
        now += dt
        counters = (counters[0] + growth[0], counters[1] + growth[1], counters[2] + growth[2])
        current = (now, *counters)
        add_sample(kept, current, limits)
        if not every or now - every[-1][0] >= sample_ms:
            every.append(current)
        assert kept[-1] == every[-1]
        assert len(kept) <= min(SAMPLES_MAX, window_ms // sample_ms + 2)
        if read:
            assert rates_of(kept, current, limits) == _every_sample_rates(every, current, limits)


def test_an_idle_queue_keeps_two_samples_and_reads_no_rate() -> None:
    kept: list[Sample] = []
    for second in range(100):
        add_sample(kept, (second * 1_000, 10, 3, 3), LIMITS)
    assert kept == [(0, 10, 3, 3), (99_000, 10, 3, 3)]  # the run's first and last
    assert rates_of(kept, (99_500, 10, 3, 3), LIMITS) == (0.0, 0.0, 0.0)


def test_a_run_across_the_window_start_counts_from_the_start() -> None:
    """Constant for a minute, then 100 published in the last second: 100 over the
    10 s window, 10 per second (every sample kept would say the same)."""
    kept: list[Sample] = []
    for second in range(60):
        add_sample(kept, (second * 1_000, 50, 0, 0), LIMITS)
    add_sample(kept, (60_000, 150, 0, 0), LIMITS)
    assert len(kept) == 3
    assert rates_of(kept, (60_000, 150, 0, 0), LIMITS) == (10.0, 0.0, 0.0)


def test_steady_growth_gives_its_rate() -> None:
    kept: list[Sample] = []
    for second in range(30):
        add_sample(kept, (second * 1_000, 20 * second, 10 * second, 5 * second), LIMITS)
    assert rates_of(kept, (29_000, 580, 290, 145), LIMITS) == (20.0, 10.0, 5.0)
    assert len(kept) == 12  # the window's samples and the one before it
