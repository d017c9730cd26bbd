"""The node's two clocks: a monotonic one for every timer and a wall clock for stamps.

Rule: Raft timers, rates and "last heard" ages count on ``monotonic_ms``, which a step
of the system clock does not move; ``wall_ms`` is read only where a time is recorded
(the leader time stamped into entries, which drives TTL, delay and leases; the time a
queue or a checkpoint was made) and where a timer waits for a leader time. Injected
into ``Node`` so that tests can step either clock.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic_ms(self) -> int: ...

    def wall_ms(self) -> int: ...


class SystemClock:
    """``time.monotonic_ns`` and ``time.time_ns`` in milliseconds."""

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK = SystemClock()

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]
