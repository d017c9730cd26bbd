"""A queue replica's message rates: samples of its counters, kept as runs.

Rule: a sample is ``(ms, published, delivered, acked)``, taken at most every
``Limits.rate_sample_ms``; a rate is the growth of a counter from the start of the
window (``Limits.rate_window_ms``) to now, per second. The counters never go down, so
two samples with the same figures mean none changed between them: of a run of such
samples only the first and the last are kept, the ones between are told by them. An
idle queue so keeps two samples (about 200 bytes), not ``SAMPLES_MAX`` (1.7 KB), and no
sample older than the window is kept but the one the window starts after.

Where the window starts is read from the samples as every one of them had been kept:
from the first sample in the window, or from the window's start itself when the sample
before that one has the same figures (the counters were constant from one to the other).
"""

from __future__ import annotations

from engine.limits import Limits

SAMPLES_MAX = 16
"""Samples kept at most (whatever the limits: the window keeps fewer with the defaults,
``rate_window_ms / rate_sample_ms + 2``)."""

Sample = tuple[int, int, int, int]
"""(ms, published, delivered, acked)."""


def add_sample(samples: list[Sample], sample: Sample, limits: Limits) -> None:
    """Keep ``sample`` in ``samples`` (oldest first) unless the last one is more recent
    than ``rate_sample_ms``."""
    now_ms = sample[0]
    if samples and now_ms - samples[-1][0] < limits.rate_sample_ms:
        return
    if len(samples) >= 2 and samples[-1][1:] == sample[1:] == samples[-2][1:]:
        samples[-1] = sample  # the run's last sample moves on
    else:
        samples.append(sample)
    # The sample before the second one is older than any window from now on.
    while len(samples) > SAMPLES_MAX or (
        len(samples) >= 2 and now_ms - samples[1][0] > limits.rate_window_ms
    ):
        del samples[0]


def rates_of(samples: list[Sample], current: Sample, limits: Limits) -> tuple[float, float, float]:
    """Messages per second published, delivered and acked over the window that ends at
    ``current`` (a sample taken now); zeros when the samples span less than half a
    sample period of it."""
    now_ms = current[0]
    start_ms = now_ms - limits.rate_window_ms
    k = next((i for i, s in enumerate(samples) if s[0] >= start_ms), None)
    if k is None:
        return 0.0, 0.0, 0.0
    old = samples[k]
    if k > 0 and samples[k - 1][1:] == old[1:]:
        old = (start_ms, *old[1:])  # constant since before the window started
    if now_ms - old[0] < limits.rate_sample_ms // 2:
        return 0.0, 0.0, 0.0
    dt = (now_ms - old[0]) / 1000
    rate = [round((current[j] - old[j]) / dt, 3) for j in (1, 2, 3)]
    return rate[0], rate[1], rate[2]


__all__ = ["SAMPLES_MAX", "Sample", "add_sample", "rates_of"]
