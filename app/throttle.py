"""A bound on password guessing: at most ``failures_max`` wrong passwords for one user
from one address within ``window_s``; then that pair is refused (429) until the window
ends.

The bound holds under concurrency because an attempt is reserved *before* its password
is checked (``attempt``): a pair whose failures plus attempts in flight reach
``failures_max`` is refused at once, so a burst of guesses sent together gets no more
checks than guesses sent one by one. The attempt ends as a failure (it counts), a
success (the pair's failures are forgotten) or neither (the password was never checked,
say because the server was busy: the reservation is given back).

In memory, per process, at most ``keys_max`` pairs (the oldest are forgotten first), so
an attacker cannot grow it without bound; a pair with nothing counted is dropped at
once. Passwords are only checked by HTTP Basic on ``POST /api/v1/tokens`` and by the
login form; bearer tokens are 256-bit random and need no throttle.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from app.problems import AppProblem

Key = tuple[str, str]
IN_FLIGHT_RETRY_S = 1
"""When attempts in flight fill the pair's allowance, they end within about a second."""


class TooManyFailures(AppProblem):
    status, problem, title = 429, "too-many-failures", "Too many failed logins"

    def __init__(self, retry_after_s: int, detail: str | None = None) -> None:
        super().__init__(detail or f"too many wrong passwords; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Pair:
    failures: int = 0
    in_flight: int = 0
    window_ends: float = 0.0
    """When the failures are forgotten; set by the first failure of the window."""


@dataclass(slots=True)
class Attempt:
    """One reserved password check; the caller says how it ended."""

    outcome: Literal["failed", "succeeded"] | None = None

    def verdict(self, valid: bool) -> None:
        self.outcome = "succeeded" if valid else "failed"


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
        self._lock = threading.Lock()  # short sections; callers may be on any thread
        self._pairs: OrderedDict[Key, _Pair] = OrderedDict()

    @contextmanager
    def attempt(self, user: str, address: str) -> Iterator[Attempt]:
        """Reserve a check of ``user``'s password from ``address`` (``TooManyFailures``
        when the pair may not try now); the block sets the attempt's ``verdict``."""
        key = (user, address)
        self._reserve(key)
        attempt = Attempt()
        try:
            yield attempt
        finally:
            self._end(key, attempt.outcome)

    def _reserve(self, key: Key) -> None:
        with self._lock:
            now = self._clock()
            pair = self._pairs.pop(key, None) or _Pair()
            if pair.failures and now >= pair.window_ends:
                pair.failures = 0
            self._pairs[key] = pair  # the newest key: forgotten last
            if pair.failures + pair.in_flight < self.failures_max:
                pair.in_flight += 1
                self._evict()
                return
            locked_s = pair.window_ends - now if pair.failures >= self.failures_max else 0.0
        if locked_s > 0:
            raise TooManyFailures(max(1, math.ceil(locked_s)))
        raise TooManyFailures(
            IN_FLIGHT_RETRY_S,
            f"too many password checks for this user at once; retry in {IN_FLIGHT_RETRY_S} s",
        )

    def _end(self, key: Key, outcome: Literal["failed", "succeeded"] | None) -> None:
        with self._lock:
            pair = self._pairs.get(key)
            if pair is None:  # forgotten meanwhile (keys_max): count what we know
                pair = self._pairs[key] = _Pair(in_flight=1)
            pair.in_flight = max(0, pair.in_flight - 1)
            if outcome == "succeeded":
                pair.failures = 0
            elif outcome == "failed":
                if pair.failures == 0 or self._clock() >= pair.window_ends:
                    pair.failures, pair.window_ends = 0, self._clock() + self.window_s
                pair.failures += 1
            if pair.failures == 0 and pair.in_flight == 0:
                del self._pairs[key]
            self._evict()

    def _evict(self) -> None:
        while len(self._pairs) > self.keys_max:
            self._pairs.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pairs)
