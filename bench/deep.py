"""``quorra bench deep [--messages N] [--queues Q] [--restarts R] [--json] [--rss-wait-s S] [--quick]``: a deep queue, or many idle queues, on a real server: memory, rates, restart to first receive.

A real ``quorra serve`` process (``bench.restart.Server``: 127.0.0.1, a free port, a
temporary data directory, default limits) is started empty, a queue created, and the
server restarted once empty, its memory then read. N messages of 64 bytes are published
(8 clients, batches of 1,000, JSON), the server left idle ``--rss-wait-s`` seconds (its
WAL rolls, its entries reach segments) and its memory read from ``/proc/<pid>/status``.
It is then stopped (SIGTERM) and started again ``--restarts`` times, each timed from the
exec to the first receive that returns a message (acknowledged, so R restarts take R
messages); every restart at depth follows one of a twin server, started on a data
directory of its own that holds the same queue empty, timed from the exec to the first
receive answered. A restart costs seconds, most of them importing the server's modules,
and on a shared machine the same restart varies by more than the 100 ms that depth may
add: each figure is the median of its restarts, taken in turns so that both see the
same load. Every message is then consumed (4 streams, a prefetch of 1,000 each, every
delivery frame acknowledged in one ack frame; REST receives before stop 34).
``--quick`` runs 10,000 messages with pages of 256 references and 16 pages per queue
(``QUICK_PAGES``), so that the smoke run pages its index out and back, and one restart
of each.

With ``--queues Q`` (many queues per node) a second server, on a data directory of its
own, holds Q queues: one is created, 10 messages published to it, and the server
restarted, timed from the exec to the first receive that returns a message
(``empty_restart_ms``); its memory is read after ``--rss-wait-s`` idle seconds. Q - 1
more queues are then created (16 clients), 10 messages published to each (one request
per queue), the server left idle ``--rss-wait-s`` seconds and its memory read again: the
growth of ``VmRSS`` divided by Q - 1 is what an idle queue costs. The server is then
stopped (SIGTERM) and started again, timed from the exec until a receive of one message
has returned a message on every queue (16 connections, each queue polled until it does;
the same for the one queue of ``empty_restart_ms``), its memory read again, and the
restart timed once more with the default idle time (``restart_ms_default_sleep``).
Those receives go through a lean HTTP/1.1 client (``bench._lean_http``), not httpx,
which spends several times the server's CPU per request: with httpx, 10,000 receives
timed mostly the client.
Only the parts asked for run: ``--messages`` alone (the default, 1,000,000) is the deep
queue, ``--queues`` alone the many queues, both flags both; the figures of a part that
did not run are ``null``. ``--quick`` runs both: 10,000 messages, and 200 queues.

Keys (``JSON_KEYS``; the headline is ``rss_mb``, the process's resident memory at
full depth):

* ``bench``: "deep";
* ``machine``: ``bench.machine_info()`` when the bench started;
* ``messages``: N;
* ``message_bytes``: the size of each body (64);
* ``rss_mb``: ``VmRSS`` of the server at full depth, in MiB (the empty server included);
* ``rss_anon_mb``: ``RssAnon`` at full depth, in MiB (without the mapped files);
* ``rss_empty_mb``: ``VmRSS`` of the empty server (the queue created), in MiB;
* ``resident_bytes_per_message``: growth of ``RssAnon`` from the empty server to full
  depth, divided by N;
* ``resident_pages``: the queue's ready-index pages in memory at full depth;
* ``paged_out_pages``: its pages in page files at full depth;
* ``disk_mb``: the data directory at full depth, in MiB;
* ``publish_msgs_per_s``: the rate of the publish of N;
* ``restarts``: restarts timed at depth, and as many of the empty twin (``--restarts``);
* ``empty_recovery_ms``: exec to the first receive answered, the queue empty (the twin,
  after a SIGTERM; median of ``restarts``);
* ``empty_recovery_ms_runs``: each of them, in order;
* ``recovery_ms``: exec to the first receive that returns a message, after a SIGTERM at
  full depth (median of ``restarts``; its difference to ``empty_recovery_ms`` is what
  depth costs a restart);
* ``recovery_ms_runs``: each of them, in order;
* ``recovery_cpu_ms``: the CPU time (user and system) the restarted server had used when
  that receive returned (median, to 10 ms): it does not count the time the server
  waited for a CPU, so it depends far less on the load of the machine than the wall
  time, and its difference to ``empty_recovery_cpu_ms`` shows what depth costs where
  that of the wall times is lost in the noise;
* ``empty_recovery_cpu_ms``: the same of the empty twin;
* ``consume_msgs_per_s``: the rate of receiving and acknowledging all N after the restart;
* ``page_waits``: pages a consumer reached before read-ahead loaded them, over the consume;
* ``read_ahead_hits``: pages read-ahead loaded in time, over the consume;
* ``queues``: Q, the queues of the many-queues server;
* ``create_queues_per_s``: the rate of creating the Q - 1 queues (16 clients);
* ``rss_bytes_per_idle_queue``: growth of ``VmRSS`` from the server holding one queue to
  the server holding Q, each queue with 10 messages of 64 bytes, divided by Q - 1;
* ``rss_bytes_per_idle_queue_after_restart``: the same, after the timed restart (every
  queue recovered from disk, the message each one delivered acknowledged),
  ``--rss-wait-s`` later;
* ``empty_restart_ms``: exec to the first receive that returns a message, the server
  holding one queue of 10 messages;
* ``restart_ms``: exec until every one of the Q queues has answered a receive with a
  message (target: at most 2 s more than ``empty_restart_ms``), the server putting a
  queue to sleep after ``restart_sleep_idle_ms`` idle (so a queue may fall asleep again
  before its receive comes, and that receive wakes it);
* ``restart_ms_default_sleep``: the same restart once more, the server with the default
  idle time (``QUORRA_QUEUE_SLEEP_IDLE_MS`` unset, 30 s): no queue falls asleep again
  during the round;
* ``restart_cpu_ms``: the CPU time (user and system) the restarted server of
  ``restart_ms`` had used when the last queue's receive returned: it counts no time spent
  waiting for a CPU, so on a loaded machine its difference to ``empty_restart_cpu_ms``
  shows what the Q queues cost a restart where that of the wall times is noise;
* ``empty_restart_cpu_ms``: the same of ``empty_restart_ms``;
* ``restart_sleep_idle_ms``: the idle time of ``restart_ms`` (and of the memory
  readings), ``SLEEP_IDLE_MS``;
* ``rss_wait_s``: the idle wait before each memory reading (the many-queues server
  waits longer if its sweep needs longer to put every queue to sleep: ``sleep_wait_s``);
* ``sleep_wait_s``: the many-queues server's wait before each memory reading;
* ``queues_sleeping``: the queues asleep (``/metrics``) after the last memory reading;
* ``targets``: what the issue holds the figures to;
* ``load_average``: the machine's 1, 5 and 15 minute load averages at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

import bench
from bench._lean_http import LeanHttp
from bench.restart import ADMIN_PASSWORD, Server, batch_body, publish_all
from engine.limits import DEFAULT_LIMITS
from quorra.client import AsyncStream

JSON_KEYS: tuple[str, ...] = (
    "bench",
    "machine",
    "messages",
    "message_bytes",
    "rss_mb",
    "rss_anon_mb",
    "rss_empty_mb",
    "resident_bytes_per_message",
    "resident_pages",
    "paged_out_pages",
    "disk_mb",
    "publish_msgs_per_s",
    "restarts",
    "empty_recovery_ms",
    "empty_recovery_ms_runs",
    "recovery_ms",
    "recovery_ms_runs",
    "recovery_cpu_ms",
    "empty_recovery_cpu_ms",
    "consume_msgs_per_s",
    "page_waits",
    "read_ahead_hits",
    "queues",
    "create_queues_per_s",
    "rss_bytes_per_idle_queue",
    "rss_bytes_per_idle_queue_after_restart",
    "empty_restart_ms",
    "restart_ms",
    "restart_ms_default_sleep",
    "restart_cpu_ms",
    "empty_restart_cpu_ms",
    "restart_sleep_idle_ms",
    "rss_wait_s",
    "sleep_wait_s",
    "queues_sleeping",
    "targets",
    "load_average",
)
HEADLINE_KEY: str = "rss_mb"

MESSAGE_BYTES = 64
BATCH = 1000
PUBLISHERS = 8
CONSUMERS = 4
QUEUE = "bench-deep"
MIB = 1024 * 1024
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
QUICK_PAGES = {
    "QUORRA_PAGE_REFS": "256",
    "QUORRA_PAGED_INDEX_BYTES_PER_QUEUE_MAX": str(16 * 256 * 8),
    "QUORRA_PAGED_INDEX_BYTES_PER_NODE_MAX": str(64 * 256 * 8),
    "QUORRA_PAGE_READ_AHEAD": "8",
}
"""The smoke run's pages: 256 references, 16 in memory per queue, 8 read ahead (2,048
messages, more than a receive takes), so that 10,000 messages page out and back."""
TARGETS = {
    "rss_mb_at_50m_messages": 256,
    "rates_vs_100k_messages_min": 0.8,
    "recovery_ms_minus_empty_recovery_ms": 100,
    "rss_bytes_per_idle_queue": 4096,
    "restart_ms_minus_empty_restart_ms": 2000,
}
RESTARTS = 3
QUICK_RESTARTS = 1
IDLE_MESSAGES = 10
"""Messages published to each of the many queues."""
IDLE_CLIENTS = 16
QUICK_MESSAGES = 10_000
"""40 pages of 256: more than twice the 16 a queue keeps in memory."""
QUICK_QUEUES = 200
"""Enough for the growth of ``VmRSS`` to stand clear of its noise (about 18 KiB an idle
queue, 40 KiB after a restart), in one turn of the sleep sweep."""
SLEEP_ENV = "QUORRA_QUEUE_SLEEP_IDLE_MS"
SLEEP_IDLE_MS = 1_000
"""The many-queues server puts a queue to sleep after this idle time
(``QUORRA_QUEUE_SLEEP_IDLE_MS``; 30 s by default), so that its queues sleep within the
bench's wait: its sweep puts at most ``Limits.queue_sleep_sweep_max`` to sleep a second."""


class DeepServer(Server):
    """``bench.restart.Server`` with more environment (the smoke run's small pages)."""

    def __init__(self, data_dir: Path, extra_env: dict[str, str]) -> None:
        super().__init__(data_dir)
        self.extra_env = extra_env
        self.receive_cpu_ms = 0.0

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}

    def vm_rss_bytes(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/<pid>/status")

    def cpu_ms(self) -> float:
        """CPU time the server process has used (user and system, every thread)."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / CLOCK_TICKS_PER_S

    def first_receive(self, token: str, *, message: bool) -> float:
        """Poll a receive of one message until answered (with a message when
        ``message``, which is acknowledged at once); milliseconds since the exec. The
        server's CPU time then is kept in ``receive_cpu_ms``."""
        headers = {"Authorization": f"Bearer {token}"}
        url = f"/api/v1/queues/{QUEUE}/messages"
        while True:
            self._check_alive()
            try:
                got = self.http.post(
                    f"{url}/receive", json={"max_messages": 1, "wait_ms": 0}, headers=headers
                )
                if got.status_code == 200 and (got.json()["messages"] or not message):
                    elapsed = self.since_start_ms()
                    self.receive_cpu_ms = self.cpu_ms()
                    receipts = [m["receipt"] for m in got.json()["messages"]]
                    if receipts:
                        acked = self.http.post(
                            f"{url}/ack", json={"receipts": receipts}, headers=headers
                        )
                        acked.raise_for_status()
                    return elapsed
            except httpx.TransportError:
                pass
            time.sleep(0.005)


async def _consume(url: str, token: str, messages: int) -> None:
    """Receive and acknowledge until ``messages`` have been consumed: ``CONSUMERS``
    streams, each with a prefetch of ``BATCH``, acking each delivery frame's messages in
    one ack frame (an HTTP client would spend more CPU than the server: at 200,000,000
    messages the consume is most of the run)."""
    left = [messages]

    async def consumer() -> None:
        async with await AsyncStream.open(url, token, QUEUE) as stream:
            await stream.consume(BATCH)
            while left[0] > 0:
                try:
                    batch = await asyncio.wait_for(stream.receive(), 0.5)
                except TimeoutError:
                    continue
                await stream.ack([d.receipt for d in batch])
                left[0] -= len(batch)

    await asyncio.gather(*(consumer() for _ in range(CONSUMERS)))


def _settled(server: DeepServer, token: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The queue's stats once the last acks sent have been applied (nothing ready or
    unacknowledged), or as they are after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = _queue_stats(server, token)
        done = stats["messages_ready"] == 0 and stats["messages_unacked"] == 0
        if done or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _queue_stats(server: Server, token: str) -> dict[str, Any]:
    got = server.http.get(f"/api/v1/queues/{QUEUE}", headers={"Authorization": f"Bearer {token}"})
    got.raise_for_status()
    stats: dict[str, Any] = got.json()["stats"]
    return stats


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _token(server: Server) -> str:
    made = server.http.post("/api/v1/tokens", auth=("admin", ADMIN_PASSWORD))
    made.raise_for_status()
    token: str = made.json()["token"]
    return token


def _with_queue(server: DeepServer) -> str:
    """Start a new server, make a token and the (empty) queue, and restart it once, as
    every timed restart is (a SIGTERM, then an exec); the token."""
    server.start()
    server.wait_ready()
    token = _token(server)
    created = server.http.put(
        f"/api/v1/queues/{QUEUE}", headers={"Authorization": f"Bearer {token}"}
    )
    assert created.status_code in (200, 201), created.text
    server.stop(signal.SIGTERM)
    server.start()
    server.first_receive(token, message=False)
    return token


class Restarts:
    """Timed restarts of the empty twin and of the deep server, in milliseconds."""

    def __init__(self) -> None:
        self.empty: list[float] = []
        self.empty_cpu: list[float] = []
        self.deep: list[float] = []
        self.deep_cpu: list[float] = []

    def figures(self) -> dict[str, Any]:
        median = statistics.median
        return dict(
            restarts=len(self.deep),
            empty_recovery_ms=round(median(self.empty), 1),
            empty_recovery_ms_runs=self.empty,
            empty_recovery_cpu_ms=round(median(self.empty_cpu), 1),
            recovery_ms=round(median(self.deep), 1),
            recovery_ms_runs=self.deep,
            recovery_cpu_ms=round(median(self.deep_cpu), 1),
        )


def _timed_restarts(
    server: DeepServer, token: str, twin: DeepServer, twin_token: str, restarts: int
) -> Restarts:
    """``restarts`` times: the stopped twin started and stopped (exec to the first receive
    answered), then the stopped deep server (exec to the first receive that returns a
    message), which is left running after the last."""
    timed = Restarts()
    for n in range(restarts):
        twin.start()
        timed.empty.append(round(twin.first_receive(twin_token, message=False), 1))
        timed.empty_cpu.append(twin.receive_cpu_ms)
        twin.stop(signal.SIGTERM)
        if n:
            server.stop(signal.SIGTERM)
        server.start()
        timed.deep.append(round(server.first_receive(token, message=True), 1))
        timed.deep_cpu.append(server.receive_cpu_ms)
    return timed


def measure_deep(server: DeepServer, args: argparse.Namespace) -> dict[str, Any]:
    """The deep queue's figures."""
    server.compile()
    twin = DeepServer(server.data_dir.parent / "empty-twin", server.extra_env)
    twin.log_path = server.data_dir.parent / "empty-twin.log"
    try:
        twin_token = _with_queue(twin)
        twin.stop(signal.SIGTERM)
        token = _with_queue(server)
        return _measure_deep(server, token, twin, twin_token, args)
    finally:
        twin.stop(signal.SIGTERM)
        twin.http.close()


def _measure_deep(
    server: DeepServer, token: str, twin: DeepServer, twin_token: str, args: argparse.Namespace
) -> dict[str, Any]:
    time.sleep(min(args.rss_wait_s, 5.0))
    rss_empty, anon_empty = server.vm_rss_bytes(), server.rss_anon_bytes()

    started = time.perf_counter()
    body = batch_body(MESSAGE_BYTES, BATCH)
    asyncio.run(publish_all(server.url, token, QUEUE, body, args.messages // BATCH, PUBLISHERS))
    publish_rate = args.messages / (time.perf_counter() - started)
    time.sleep(args.rss_wait_s)
    rss, anon = server.vm_rss_bytes(), server.rss_anon_bytes()
    paging = _queue_stats(server, token)["paging"]
    disk = _disk_bytes(server.data_dir)

    server.stop(signal.SIGTERM)
    timed = _timed_restarts(server, token, twin, twin_token, args.restarts)
    before = _queue_stats(server, token)["paging"]
    left = args.messages - args.restarts
    started = time.perf_counter()
    asyncio.run(_consume(server.url, token, left))
    consume_rate = left / (time.perf_counter() - started)
    after = _settled(server, token)
    assert after["messages_ready"] == 0 and after["messages_unacked"] == 0, after
    return dict(
        messages=args.messages,
        message_bytes=MESSAGE_BYTES,
        rss_mb=round(rss / MIB, 1),
        rss_anon_mb=round(anon / MIB, 1),
        rss_empty_mb=round(rss_empty / MIB, 1),
        resident_bytes_per_message=round(max(anon - anon_empty, 0) / args.messages, 2),
        resident_pages=paging["resident_pages"],
        paged_out_pages=paging["paged_out_pages"],
        disk_mb=round(disk / MIB, 1),
        publish_msgs_per_s=round(publish_rate, 1),
        **timed.figures(),
        consume_msgs_per_s=round(consume_rate, 1),
        page_waits=after["paging"]["page_waits"] - before["page_waits"],
        read_ahead_hits=after["paging"]["read_ahead_hits"] - before["read_ahead_hits"],
    )


def _idle_name(n: int) -> str:
    return f"bench-idle-{n:05d}"


async def _each_queue(
    url: str,
    token: str,
    names: list[str],
    call: Callable[[httpx.AsyncClient, str], Awaitable[bool]],
) -> None:
    """``call(http, name)`` for every name from ``IDLE_CLIENTS`` connections, each name
    again (after 5 ms) until it says done. A connection idle for a second is not reused:
    the server closes idle ones after 5 s, and a request sent as it does is lost."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=IDLE_CLIENTS, keepalive_expiry=1.0)
    left = iter(names)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def client() -> None:
            for name in left:
                while not await call(http, name):
                    await asyncio.sleep(0.005)

        await asyncio.gather(*(client() for _ in range(IDLE_CLIENTS)))


async def _create(http: httpx.AsyncClient, name: str) -> bool:
    try:
        got = await http.put(f"/api/v1/queues/{name}", json={})
    except httpx.TransportError:
        return False  # a create is idempotent: sent again
    if got.status_code in (429, 503):
        return False
    if got.status_code not in (200, 201):
        raise RuntimeError(f"create answered {got.status_code}: {got.text}")
    return True


def _publisher(body: bytes) -> Callable[[httpx.AsyncClient, str], Awaitable[bool]]:
    async def publish(http: httpx.AsyncClient, name: str) -> bool:
        try:
            got = await http.post(
                f"/api/v1/queues/{name}/messages",
                content=body,
                headers={"Content-Type": "application/json"},
            )
        except httpx.TransportError:
            return False  # sent again: the queue may then hold the batch twice
        if got.status_code in (429, 503):
            return False
        if got.status_code != 201:
            raise RuntimeError(f"publish answered {got.status_code}: {got.text}")
        return True

    return publish


RECEIVE_ONE = json.dumps({"max_messages": 1, "wait_ms": 0}).encode("ascii")


async def _receive_each(url: str, token: str, names: list[str], receipts: dict[str, str]) -> None:
    """A receive of one message from every queue, each polled (every 5 ms) until it
    returns one (the server may still be starting), from ``IDLE_CLIENTS`` connections of
    ``bench._lean_http``: the round is timed, and httpx would spend more CPU on it than
    the server. The receipts go into ``receipts``."""
    left = iter(names)

    async def client() -> None:
        http = LeanHttp(url, token)
        try:
            for name in left:
                while not await _received(http, name, receipts):
                    await asyncio.sleep(0.005)
        finally:
            http.close()

    await asyncio.gather(*(client() for _ in range(IDLE_CLIENTS)))


async def _received(http: LeanHttp, name: str, receipts: dict[str, str]) -> bool:
    try:
        status, body = await http.post(f"/api/v1/queues/{name}/messages/receive", RECEIVE_ONE)
    except (OSError, asyncio.IncompleteReadError):
        return False
    messages = json.loads(body)["messages"] if status == 200 else []
    if messages:
        receipts[name] = messages[0]["receipt"]
    return bool(messages)


def _acker(receipts: dict[str, str]) -> Callable[[httpx.AsyncClient, str], Awaitable[bool]]:
    async def ack(http: httpx.AsyncClient, name: str) -> bool:
        try:
            got = await http.post(
                f"/api/v1/queues/{name}/messages/ack", json={"receipts": [receipts[name]]}
            )
        except httpx.TransportError:
            return False
        # 409: the lease ended during a long restart; the message is ready again.
        if got.status_code not in (200, 409):
            raise RuntimeError(f"ack answered {got.status_code}: {got.text}")
        return True

    return ack


def _restart_until_received(server: DeepServer, token: str, names: list[str]) -> float:
    """SIGTERM, exec again, and receive a message from every queue; milliseconds from
    the exec until the last of them answered (the server's CPU time then is kept in
    ``receive_cpu_ms``). The messages are then acknowledged (untimed), so that the queues
    are idle again, without a lease, when memory is read."""
    server.stop(signal.SIGTERM)
    server.start()
    receipts: dict[str, str] = {}
    asyncio.run(_receive_each(server.url, token, names, receipts))
    elapsed = server.since_start_ms()
    server.receive_cpu_ms = server.cpu_ms()
    asyncio.run(_each_queue(server.url, token, names, _acker(receipts)))
    return elapsed


def _sleeping(server: DeepServer, token: str) -> int | None:
    """The server's ``quorra_queues_sleeping`` (read after the memory readings: a scrape
    reads every queue's stats)."""
    got = server.http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    for line in got.text.splitlines():
        if line.startswith("quorra_queues_sleeping "):
            return int(float(line.split()[1]))
    return None


def measure_queues(server: DeepServer, args: argparse.Namespace) -> dict[str, Any]:
    """The many idle queues' figures."""
    names = [_idle_name(n) for n in range(args.queues)]
    # Idle queues sleep: the wait covers the idle time and the sweep's turns over them.
    sweep = DEFAULT_LIMITS.queue_sleep_sweep_ms / 1000
    turns = -(-args.queues // DEFAULT_LIMITS.queue_sleep_sweep_max)
    wait_s = max(args.rss_wait_s, SLEEP_IDLE_MS / 1000 + (turns + 2) * sweep)
    body = batch_body(MESSAGE_BYTES, IDLE_MESSAGES)
    server.compile()
    server.start()
    server.wait_ready()
    token = _token(server)
    asyncio.run(_each_queue(server.url, token, names[:1], _create))
    asyncio.run(_each_queue(server.url, token, names[:1], _publisher(body)))
    empty_restart_ms = _restart_until_received(server, token, names[:1])
    empty_restart_cpu_ms = server.receive_cpu_ms
    time.sleep(wait_s)
    rss_one = server.vm_rss_bytes()

    started = time.perf_counter()
    asyncio.run(_each_queue(server.url, token, names[1:], _create))
    create_rate = (len(names) - 1) / (time.perf_counter() - started)
    asyncio.run(_each_queue(server.url, token, names[1:], _publisher(body)))
    time.sleep(wait_s)
    rss_all = server.vm_rss_bytes()

    restart_ms = _restart_until_received(server, token, names)
    restart_cpu_ms = server.receive_cpu_ms
    time.sleep(wait_s)
    rss_restarted = server.vm_rss_bytes()
    sleeping = _sleeping(server, token)
    # Once more with the default idle time: a queue woken by its receive stays awake.
    server.extra_env = {k: v for k, v in server.extra_env.items() if k != SLEEP_ENV}
    restart_default_ms = _restart_until_received(server, token, names)
    return dict(
        sleep_wait_s=wait_s,
        queues_sleeping=sleeping,
        queues=args.queues,
        create_queues_per_s=round(create_rate, 1),
        rss_bytes_per_idle_queue=round((rss_all - rss_one) / (len(names) - 1), 1),
        rss_bytes_per_idle_queue_after_restart=round(
            (rss_restarted - rss_one) / (len(names) - 1), 1
        ),
        empty_restart_ms=round(empty_restart_ms, 1),
        restart_ms=round(restart_ms, 1),
        restart_ms_default_sleep=round(restart_default_ms, 1),
        restart_cpu_ms=round(restart_cpu_ms, 1),
        empty_restart_cpu_ms=round(empty_restart_cpu_ms, 1),
        restart_sleep_idle_ms=SLEEP_IDLE_MS,
    )


def _run(
    name: str, extra_env: dict[str, str], part: Callable[[DeepServer], dict[str, Any]]
) -> dict[str, Any]:
    """One part on a server of its own, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix=f"quorra-bench-{name}-") as tmp:
        server = DeepServer(Path(tmp) / "data", extra_env)
        try:
            return part(server)
        except BaseException:
            print(server.log_path.read_text(errors="replace")[-5000:], file=sys.stderr)
            raise
        finally:
            server.stop(signal.SIGTERM)
            server.http.close()


def main(argv: list[str]) -> int:
    parser = bench.parser("deep", __doc__)
    parser.add_argument(
        "--messages", type=int, default=None, help="messages of 64 bytes to queue (1,000,000)"
    )
    parser.add_argument(
        "--queues", type=int, default=None, help="idle queues of 10 messages on one server"
    )
    parser.add_argument(
        "--rss-wait-s", type=float, default=10.0, help="idle seconds before reading memory"
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=RESTARTS,
        help=f"timed restarts at depth, and of the empty twin ({RESTARTS})",
    )
    args = parser.parse_args(argv)
    extra_env: dict[str, str] = {}
    if args.quick:
        args.messages, args.queues, args.rss_wait_s = QUICK_MESSAGES, QUICK_QUEUES, 1.0
        args.restarts = QUICK_RESTARTS
        extra_env = QUICK_PAGES
    elif args.messages is None and args.queues is None:
        args.messages = 1_000_000
    if args.messages is not None and (args.messages < BATCH or args.messages % BATCH):
        parser.error(f"--messages must be a positive multiple of {BATCH}")
    if args.messages is not None and not 1 <= args.restarts <= args.messages:
        parser.error("--restarts must be at least 1 and at most --messages")
    if args.queues is not None and args.queues < 2:
        parser.error("--queues must be at least 2")
    result = bench.header("deep")
    result.update({key: None for key in JSON_KEYS if key not in result})
    if args.messages is not None:
        result.update(_run("deep", extra_env, lambda server: measure_deep(server, args)))
    if args.queues is not None:
        sleepy = {SLEEP_ENV: str(SLEEP_IDLE_MS)}
        result.update(_run("idle", sleepy, lambda server: measure_queues(server, args)))
    result.update(
        rss_wait_s=args.rss_wait_s,
        targets=TARGETS,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
