"""A bound on password guessing: after ``failures_max`` wrong passwords for one user
from one address within ``window_s``, that pair is refused (429) until the window ends.

In memory, per process, at most ``keys_max`` pairs (the oldest are forgotten first), so
an attacker cannot grow it without bound. Passwords are only checked by HTTP Basic on
``POST /api/v1/tokens`` and by the login form; bearer tokens are 256-bit random and need
no throttle.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from app.problems import AppProblem


class TooManyFailures(AppProblem):
    status, problem, title = 429, "too-many-failures", "Too many failed logins"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many wrong passwords; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class FailureThrottle:
    def __init__(
        self,
        failures_max: int = 10,
        window_s: float = 300.0,
        keys_max: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert failures_max >= 1 and window_s > 0 and keys_max >= 1
        self.failures_max = failures_max
        self.window_s = window_s
        self.keys_max = keys_max
        self._clock = clock
        self._lock = threading.Lock()  # callers run in the thread pool
        self._failures: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()

    def check(self, user: str, address: str) -> None:
        """Raise ``TooManyFailures`` while the pair is refused."""
        with self._lock:
            entry = self._failures.get((user, address))
            if entry is None:
                return
            count, since = entry
            left_s = since + self.window_s - self._clock()
            if left_s <= 0:
                del self._failures[(user, address)]
                return
        if count >= self.failures_max:
            raise TooManyFailures(max(1, math.ceil(left_s)))

    def failed(self, user: str, address: str) -> None:
        key = (user, address)
        with self._lock:
            count, since = self._failures.pop(key, (0, self._clock()))
            self._failures[key] = (count + 1, since)
            while len(self._failures) > self.keys_max:
                self._failures.popitem(last=False)

    def succeeded(self, user: str, address: str) -> None:
        with self._lock:
            self._failures.pop((user, address), None)
