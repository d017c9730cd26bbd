"""A steady publish and consume load on one queue through the nodes of a cluster, and the
check that no confirmed message was lost and no message that was never sent appeared.

Rule: a message is *attempted* once it was sent, *confirmed* once a publish answered 201
(durable on a quorum), *received* once a receive handed it out. At-least-once delivery
means: every confirmed message is received at least once, and every received body was
attempted (an attempted but unconfirmed one may or may not appear: its outcome was
unknown). Redeliveries are counted, not failures.

* The publisher sends a batch of ``batch_size`` messages every ``interval_s``, to each
  endpoint in turn. Every message carries a dedup id unique to the run, which is also its
  body. A batch answered by 429 or 503, or whose connection failed or timed out (outcome
  unknown), is sent again with the same dedup ids to the next endpoint, until a 201, or
  until ``stop()``'s grace has passed.
* The consumer receives from each endpoint in turn with a short lease (``lease_ms``: a
  batch whose answer was lost comes back soon), records every body, and acks them on the
  same endpoint; a failed ack is left to the lease.
* Any other answer (a 404, a 500, a 201 confirming fewer ids than sent) is an error that
  ``check()`` reports, as is a worker that crashed; the loops go on regardless.

The load runs in two threads of the test process with plain httpx clients, one per
endpoint and thread; ``start()``, ``wait_confirmed()``, ``stop()`` and ``check()`` are
called from the test's thread.
"""

from __future__ import annotations

import secrets
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

import httpx

RETRY_STATUSES = frozenset({429, 503})
"""Answers after which the server did nothing, or cannot say what it did: send again."""
ACK_STATUSES = frozenset({200, 409, *RETRY_STATUSES})
"""409: every lease had ended (a failover outlasted it): the messages come back."""
REQUEST_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.05
RECEIVE_WAIT_MS = 200
RECEIVE_MAX = 100
LEASE_MS_DEFAULT = 2000
PUBLISH_GRACE_S = 10.0
"""How long ``stop()`` lets a batch in flight be confirmed before giving it up."""
DRAIN_S = 15.0
"""How long ``stop()`` goes on consuming for confirmed messages not received yet."""
ERRORS_SHOWN = 10


class Endpoint(NamedTuple):
    """A node to send requests to: its name, base URL and a bearer token valid there."""

    name: str
    url: str
    token: str


@dataclass(frozen=True)
class Summary:
    attempted: int
    confirmed: int
    received: int
    """Distinct bodies received."""
    deliveries: int
    """Bodies received, redeliveries included."""
    publish_retries: int
    consume_retries: int
    longest_confirm_gap_s: float
    """The longest wait between two confirmed batches: how long publishing was stalled."""


def verdict(
    attempted: set[str], confirmed: set[str], received: Counter[str], errors: Sequence[str]
) -> list[str]:
    """What is wrong with a run, one line each; empty when it passes."""
    problems = [f"error: {e}" for e in errors[:ERRORS_SHOWN]]
    if len(errors) > ERRORS_SHOWN:
        problems.append(f"... and {len(errors) - ERRORS_SHOWN} more errors")
    if not confirmed:
        problems.append("no publish was confirmed")
    if missing := sorted(confirmed - received.keys()):
        problems.append(f"{len(missing)} confirmed messages never received: {missing[:5]}")
    if strangers := sorted(received.keys() - attempted):
        problems.append(f"{len(strangers)} received messages never published: {strangers[:5]}")
    return problems


class Checker:
    """The load on ``queue`` and its check (module docstring)."""

    def __init__(
        self,
        queue: str,
        publish_to: Sequence[Endpoint],
        consume_from: Sequence[Endpoint] | None = None,
        *,
        batch_size: int = 5,
        interval_s: float = 0.05,
        lease_ms: int = LEASE_MS_DEFAULT,
    ) -> None:
        assert publish_to and batch_size >= 1 and interval_s > 0
        self.queue = queue
        self.publish_to = list(publish_to)
        self.consume_from = list(consume_from or publish_to)
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.lease_ms = lease_ms
        self.run = secrets.token_hex(4)
        self.attempted: set[str] = set()
        self.confirmed: set[str] = set()
        self.received: Counter[str] = Counter()
        self.errors: list[str] = []
        self.confirm_times: list[float] = []
        self.publish_retries = 0
        self.consume_retries = 0
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._publish_deadline = float("inf")
        self._drain_deadline = float("inf")
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._publish_loop,), name="publisher"),
            threading.Thread(target=self._guarded, args=(self._consume_loop,), name="consumer"),
        ]

    # --- from the test's thread --------------------------------------------------

    def start(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def confirmed_count(self) -> int:
        with self._changed:
            return len(self.confirmed)

    def wait_confirmed(self, count: int, timeout_s: float = 20.0) -> float:
        """Wait until ``count`` messages in all are confirmed; return when the last of
        them was (``time.monotonic()``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.confirmed) >= count, timeout_s):
                raise AssertionError(
                    f"{len(self.confirmed)} of {count} messages confirmed in {timeout_s} s; "
                    f"errors: {self.errors[:ERRORS_SHOWN]}"
                )
            return self.confirm_times[-1]

    def stop(self) -> None:
        """Stop publishing (a batch in flight gets ``PUBLISH_GRACE_S`` to be confirmed),
        then consume until every confirmed message was received or ``DRAIN_S`` passed."""
        self._publish_deadline = time.monotonic() + PUBLISH_GRACE_S
        self._stopping.set()
        self._threads[0].join()
        self._drain_deadline = time.monotonic() + DRAIN_S
        self._threads[1].join()

    def check(self) -> Summary:
        """Fail with every problem of the run (``verdict``); else its figures."""
        assert not any(t.is_alive() for t in self._threads), "stop() first"
        problems = verdict(self.attempted, self.confirmed, self.received, self.errors)
        assert not problems, "\n".join(problems)
        gaps = [b - a for a, b in zip(self.confirm_times, self.confirm_times[1:], strict=False)]
        return Summary(
            attempted=len(self.attempted),
            confirmed=len(self.confirmed),
            received=len(self.received),
            deliveries=sum(self.received.values()),
            publish_retries=self.publish_retries,
            consume_retries=self.consume_retries,
            longest_confirm_gap_s=max(gaps, default=0.0),
        )

    # --- in the worker threads ---------------------------------------------------

    def _guarded(self, loop: Callable[[dict[str, httpx.Client]], None]) -> None:
        """Run a worker with its own clients; a crash is an error of the run."""
        clients = {
            ep.name: httpx.Client(
                base_url=ep.url,
                headers={"Authorization": f"Bearer {ep.token}"},
                timeout=REQUEST_TIMEOUT_S,
            )
            for ep in {*self.publish_to, *self.consume_from}
        }
        try:
            loop(clients)
        except Exception:
            self._error(f"{threading.current_thread().name} crashed: {traceback.format_exc()}")
        finally:
            for client in clients.values():
                client.close()

    def _error(self, text: str) -> None:
        with self._changed:
            self.errors.append(text)

    def _turns(self, endpoints: list[Endpoint]) -> Iterator[Endpoint]:
        while True:
            yield from endpoints

    def _publish_loop(self, clients: dict[str, httpx.Client]) -> None:
        turns = self._turns(self.publish_to)
        path = f"/api/v1/queues/{self.queue}/messages"
        due = time.monotonic()
        seq = 0
        while not self._stopping.is_set():
            ids = [f"{self.run}-{seq + i}" for i in range(self.batch_size)]
            seq += self.batch_size
            with self._changed:
                self.attempted.update(ids)
            body = {"messages": [{"body": i, "dedup_id": i} for i in ids]}
            self._publish_until_confirmed(clients, turns, path, body, ids)
            due = max(due + self.interval_s, time.monotonic())
            time.sleep(max(0.0, due - time.monotonic()))

    def _publish_until_confirmed(
        self,
        clients: dict[str, httpx.Client],
        turns: Iterator[Endpoint],
        path: str,
        body: dict[str, Any],
        ids: list[str],
    ) -> None:
        while time.monotonic() < self._publish_deadline:
            endpoint = next(turns)
            try:
                response = clients[endpoint.name].post(path, json=body)
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code == 201:
                if len(response.json().get("ids", [])) != len(ids):
                    self._error(f"{endpoint.name} confirmed {response.text} for {len(ids)}")
                with self._changed:
                    self.confirmed.update(ids)
                    self.confirm_times.append(time.monotonic())
                    self._changed.notify_all()
                return
            if response is not None and response.status_code not in RETRY_STATUSES:
                self._error(f"publish on {endpoint.name}: {response.status_code} {response.text}")
            self.publish_retries += 1
            time.sleep(RETRY_PAUSE_S)

    def _consume_loop(self, clients: dict[str, httpx.Client]) -> None:
        turns = self._turns(self.consume_from)
        base = f"/api/v1/queues/{self.queue}/messages"
        ask = {"max_messages": RECEIVE_MAX, "wait_ms": RECEIVE_WAIT_MS, "lease_ms": self.lease_ms}
        while not self._drained():
            endpoint = next(turns)
            client = clients[endpoint.name]
            try:
                response = client.post(f"{base}/receive", json=ask)
                if response.status_code == 200:
                    self._acked(endpoint, client, base, response.json()["messages"])
                    continue
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code not in RETRY_STATUSES:
                self._error(f"receive on {endpoint.name}: {response.status_code} {response.text}")
            self.consume_retries += 1
            time.sleep(RETRY_PAUSE_S)

    def _acked(
        self, endpoint: Endpoint, client: httpx.Client, base: str, messages: list[dict[str, Any]]
    ) -> None:
        """Record ``messages`` as received, then ack them (a failure is left to the lease)."""
        if not messages:
            return
        with self._changed:
            self.received.update(str(m["body"]) for m in messages)
        receipts = [m["receipt"] for m in messages]
        try:
            response = client.post(f"{base}/ack", json={"receipts": receipts})
        except httpx.TransportError:
            return
        if response.status_code not in ACK_STATUSES:
            self._error(f"ack on {endpoint.name}: {response.status_code} {response.text}")

    def _drained(self) -> bool:
        """Whether the consumer is done: publishing stopped, and every confirmed message
        was received or the drain's time is up."""
        if not self._stopping.is_set() or self._threads[0].is_alive():
            return False
        with self._changed:
            caught_up = self.confirmed <= self.received.keys()
        return caught_up or time.monotonic() > self._drain_deadline
