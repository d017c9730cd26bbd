"""Logging what peers or strangers can cause, at a bounded rate.

Rule: a record whose cause comes from outside (bad frames, refused handshakes, dropped
messages) goes through a ``RateLimitedLog``: at most ``burst`` records per key in each
window of ``interval_s``; the others are counted and the count is told with the next
record of that key that passes. A flood of garbage costs a few log lines, not a full disk.
Keys name a kind of event ("bad-frame"), never a value a peer chose, so the table stays
small.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

KEYS_MAX = 256
"""Past this many keys the table is cleared (keys are meant to be a fixed few)."""


@dataclass(slots=True)
class _Window:
    start_s: float
    logged: int = 0
    suppressed: int = 0


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_s: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert interval_s > 0 and burst >= 1
        self.logger = logger
        self.interval_s = interval_s
        self.burst = burst
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def log(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless ``key`` logged ``burst`` records in this window;
        says whether it did."""
        now = self.clock()
        window = self._windows.get(key)
        if window is None or now - window.start_s >= self.interval_s:
            if len(self._windows) >= KEYS_MAX:
                self._windows.clear()
            suppressed = window.suppressed if window is not None else 0
            window = self._windows[key] = _Window(now, suppressed=suppressed)
        if window.logged >= self.burst:
            window.suppressed += 1
            return False
        window.logged += 1
        if window.suppressed:
            msg = f"{msg} ({window.suppressed} similar records suppressed)"
            window.suppressed = 0
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)


__all__ = ["RateLimitedLog"]
