"""Messages per second and publish latency of the REST API end to end, on a real server.

``quorra bench rest [--json] [--quick] [--seconds S] [--procs P] [--phases ...]
[--profile FILE] [--trace-publish]``: starts ``quorra serve`` (a subprocess, temporary data directory,
127.0.0.1) and drives it from separate load-generator processes over loopback, 1 KiB
messages, JSON bodies. The generators speak HTTP/1.1 over keep-alive sockets with
pre-encoded requests (``Connection``) and read and check every response: a general
client (httpx) spent more CPU per request than the server, on the same cores.

The phases, and the keys below they give:

* publish (``publish_msgs_per_s``): batches of 100, ``--batch-clients`` concurrent
  requests per process; every 201 means durable (fsynced) on the quorum, here the one
  node; ``publish_single_msgs_per_s``: batches of 1, ``--single-clients`` concurrent
  requests per process;
* consume (``consume_msgs_per_s``): receive (up to 100) then ack those, the queue filled
  by the first phase;
* consume with piggybacked acks (``consume_ack_piggyback_msgs_per_s``): each receive (up
  to 100) carries the receipts of the one before (``"ack"``), one request and one Raft
  entry per batch; its queue is filled first by a publish of batches of 100 as long as a
  phase (``fill_piggyback`` in ``phases``, not a figure of its own);
* paced publish (``publish_p50_ms``, ``publish_p99_ms``): batches of 1 due at a steady
  ``--rate`` msgs/s, sent by up to 64 connections per generator (latency from the due
  time to the 201, so falling behind is counted, as wrk2 does); the same at
  ``--low-rate`` (``..._at_low_rate``) shows the latency of a server that keeps up.
  ``paced_send_late_ms`` and ``low_rate_send_late_ms`` say how late the generators sent
  (their event loop's timers are of millisecond grain, and its wake-ups are counted
  too): that part of the latency is the client's own, and is not subtracted;
* streams (one WebSocket per connection, ``GET /api/v1/queues/{name}/stream``, through
  ``quorra.client.AsyncStream``; bench/_stream_load.py): publish
  (``stream_publish_msgs_per_s``: ``--stream-connections`` connections over all the
  generators, frames of ``--stream-frame-messages`` messages, up to ``--stream-window``
  messages unconfirmed per connection; a message counts once confirmed, i.e. durable),
  consume (``stream_consume_msgs_per_s``: the same connections draining what that
  filled, a prefetch of ``--stream-prefetch``, one ack frame per delivery frame), and
  window 1 (``publish_window1_p50_ms``, ``publish_window1_p99_ms``: one connection, one
  message outstanding at a time, ``--window1-count`` of them, each timed from the send
  to its confirm: the shape of a RabbitMQ publisher with a confirm window of 1);
* the disk alone (``disk_fdatasync_ms``), after the phases: 1 KiB appends, each
  fdatasynced, one every 1/``--rate`` s, in the server's data directory (a paced
  publish waits for one such sync);
* the server's own WAL during the ``--rate`` phase (``paced_wal``), from the
  ``quorra_wal_sync_seconds`` histogram of ``/metrics`` read before and after it: group
  commits, how many took over 5, 10, 25 and 100 ms, and the bucket of the slowest. A paced
  publish is answered after one such sync, so a run whose ``publish_p99_ms`` misses the
  target with slow syncs here was held up by the disk, not by the server.

For each phase it reports the load generators' CPU use (``client_cpu_per_wall``: CPU
seconds per wall second summed over the generator processes; with ``cpus`` cores a
value near ``cpus`` would mean the generators, not the server, were the limit) and the
server's (``server_cpu_per_wall``; above 1.0 only through the WAL writer thread), and the
server's CPU per message of the phase (``server_cpu_us_per_msg``, from ``/proc/<pid>/stat``).
``--profile FILE`` runs the server under cProfile (main thread: the event loop) and
writes its stats there, plus the top functions by cumulative time to stderr.
``--trace-publish`` has the server stamp the stages of each window-1 publish
(``engine.publish_trace``: frame read, proposed, submitted to the WAL, taken by its
writer thread, written, synced, back on the loop, applied, task resumed, confirm sent)
and adds their median, p99 and maximum per step to ``phases.stream_window1.trace``; run
it with ``--phases stream_window1`` (the other phases' publishes overlap, and are not
traced).
``--quick``: 1 s phases, one generator process, generators started 1.5 s ahead, 200
window-1 publishes.

JSON keys (``JSON_KEYS``), the headline being ``publish_msgs_per_s``; a phase left out
with ``--phases`` gives ``null`` figures:

* ``bench``: "rest";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``message_bytes``: bytes per message body (1024);
* ``body_format``: how request bodies are encoded ("json");
* ``publish_msgs_per_s``: the headline: published messages per second, batches of 100;
* ``publish_single_msgs_per_s``: the same, batches of 1;
* ``consume_msgs_per_s``: received and acked messages per second;
* ``consume_ack_piggyback_msgs_per_s``: the same, each receive carrying the previous
  batch's acks;
* ``publish_p50_ms``: median latency of a paced publish at ``--rate``;
* ``publish_p99_ms``: its 99th percentile;
* ``paced_rate_msgs_per_s``: the rate asked for (``--rate``);
* ``paced_achieved_msgs_per_s``: the rate achieved;
* ``paced_timed_out``: paced publishes unanswered at the generators' deadline;
* ``paced_not_sent``: paced publishes never sent;
* ``paced_wal``: the server's WAL group commits during the paced phase;
* ``paced_send_late_ms``: how late the generators sent (p50, p99);
* ``publish_p50_ms_at_low_rate``: median latency of a paced publish at ``--low-rate``;
* ``publish_p99_ms_at_low_rate``: its 99th percentile;
* ``low_rate_msgs_per_s``: the rate asked for (``--low-rate``);
* ``low_rate_send_late_ms``: how late the generators sent at that rate;
* ``stream_publish_msgs_per_s``: messages per second published and confirmed on streams;
* ``stream_consume_msgs_per_s``: messages per second delivered and acked on streams;
* ``publish_window1_p50_ms``: median latency of a stream publish with one outstanding;
* ``publish_window1_p99_ms``: its 99th percentile;
* ``load_procs``: load-generator processes (``--procs``);
* ``batch_clients_per_proc``: concurrent batch-of-100 requests per process;
* ``single_clients_per_proc``: concurrent batch-of-1 requests per process;
* ``seconds_per_phase``: length of each phase (``--seconds``);
* ``disk_fdatasync_ms``: the disk's own append + fdatasync latency;
* ``phases``: every phase's figures (counts, errors, CPU, WAL);
* ``targets``: ``publish_msgs_per_s`` and ``publish_p99_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import os
import pstats
import queue
import random
import resource
import signal
import string
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

import bench
from app.ports import free_port

JSON_KEYS = (
    "bench",
    "machine",
    "message_bytes",
    "body_format",
    "publish_msgs_per_s",
    "publish_single_msgs_per_s",
    "consume_msgs_per_s",
    "consume_ack_piggyback_msgs_per_s",
    "publish_p50_ms",
    "publish_p99_ms",
    "paced_rate_msgs_per_s",
    "paced_achieved_msgs_per_s",
    "paced_timed_out",
    "paced_not_sent",
    "paced_wal",
    "paced_send_late_ms",
    "publish_p50_ms_at_low_rate",
    "publish_p99_ms_at_low_rate",
    "low_rate_msgs_per_s",
    "low_rate_send_late_ms",
    "stream_publish_msgs_per_s",
    "stream_consume_msgs_per_s",
    "publish_window1_p50_ms",
    "publish_window1_p99_ms",
    "load_procs",
    "batch_clients_per_proc",
    "single_clients_per_proc",
    "seconds_per_phase",
    "disk_fdatasync_ms",
    "phases",
    "targets",
)
HEADLINE_KEY = "publish_msgs_per_s"
MESSAGE_BYTES = 1024
ADMIN_PASSWORD = "bench-admin-password"
START_TIMEOUT_S = 60.0
PACED_GRACE_S = 15.0
PACED_CONNECTIONS_MAX = 64
"""Per generator: enough that requests queue in the server, not in the client's pool."""
START_DELAY_S = 3.0
"""Generators start their clocks together, this long after being spawned (imports)."""
QUICK_SECONDS = 1.0
QUICK_START_DELAY_S = 1.5


class CpuClock(Protocol):
    """What ``run_phase`` needs of the server: its CPU seconds so far (0.0 for a server
    measured from outside)."""

    def cpu_s(self) -> float: ...


# --- the server --------------------------------------------------------------------


class ServerProcess:
    def __init__(self, data_dir: Path, profile: Path | None, trace: Path | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.profile = profile
        self.trace = trace
        """Where the server writes its publish trace when it stops (``--trace-publish``)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / "server.log"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
        env["QUORRA_ADMIN_PASSWORD"] = ADMIN_PASSWORD
        if self.trace is not None:
            env["QUORRA_TRACE_PUBLISH_FILE"] = str(self.trace)
        serve = ["serve", "--data-dir", str(self.data_dir), "--host", "127.0.0.1"]
        serve += ["--port", str(self.port)]
        if self.profile is not None:
            command = [sys.executable, "-c", _PROFILED_SERVE, str(self.profile), *serve]
        else:
            command = [str(Path(sys.executable).with_name("quorra")), *serve]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not ready in time")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process, all threads."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


_PROFILED_SERVE = """
import cProfile, sys
out = sys.argv[1]
sys.argv = ["quorra"] + sys.argv[2:]
from app.cli import cli
profiler = cProfile.Profile()
profiler.enable()
try:
    cli(standalone_mode=False)
finally:
    profiler.disable()
    profiler.dump_stats(out)
"""


# --- load generators (separate processes) ---------------------------------------


def _cpu_self_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _payload(batch: int) -> bytes:
    rng = random.Random(batch)
    text = "".join(rng.choices(string.ascii_letters + string.digits, k=MESSAGE_BYTES))
    return json.dumps({"messages": [{"body": text}] * batch}).encode("ascii")


class Connection:
    """One HTTP/1.1 keep-alive connection of a load generator, over a plain asyncio
    stream: requests are pre-encoded bytes, and every response is read whole (head and
    ``Content-Length`` body) before the next request goes out, its status returned.
    Lean on purpose: the generators share the machine's cores with the server."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        try:
            self.writer.write(raw)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = _content_length(head)
            body = await self.reader.readexactly(length) if length else b""
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.close()
            raise ConnectionError("the connection failed") from None
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return int(value)
        if key.strip().lower() == b"transfer-encoding":
            raise ValueError("the bench reads only Content-Length bodies")
    return 0


def _request(spec: dict[str, Any], path: str, body: bytes) -> bytes:
    """A POST with ``body`` (JSON) as bytes on the wire."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {spec['host']}:{spec['port']}\r\n"
        f"Authorization: Bearer {spec['token']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


def _published(status: int, body: bytes, batch: int) -> bool:
    """A 201 whose ``ids`` hold one id per message."""
    return status == 201 and body.startswith(b'{"ids":[') and body.count(b",") == batch - 1


async def _publish_loop(
    conn: Connection, raw: bytes, batch: int, until: float, out: dict[str, Any]
) -> None:
    while time.time() < until:
        try:
            status, body = await conn.request(raw)
        except ConnectionError:
            out["transport_errors"] += 1
            await asyncio.sleep(0.01)
            continue
        if _published(status, body, batch):
            out["messages"] += batch
        else:
            out["errors"] += 1
            if status in (429, 503):
                await asyncio.sleep(0.01)


async def _consume_loop(
    conn: Connection, spec: dict[str, Any], until: float, out: dict[str, Any]
) -> None:
    base = f"/api/v1/queues/{spec['queue']}/messages"
    receive = _request(spec, f"{base}/receive", b'{"max_messages":100,"wait_ms":0}')
    while time.time() < until:
        try:
            status, body = await conn.request(receive)
        except ConnectionError:
            out["transport_errors"] += 1
            await asyncio.sleep(0.01)
            continue
        messages = json.loads(body)["messages"] if status == 200 else []
        if not messages:
            out["empty"] += 1
            if out["empty"] > 3:
                return
            await asyncio.sleep(0.05)
            continue
        receipts = json.dumps({"receipts": [m["receipt"] for m in messages]}).encode("ascii")
        try:
            status, body = await conn.request(_request(spec, f"{base}/ack", receipts))
        except ConnectionError:
            out["transport_errors"] += 1
            continue
        if status == 200:
            out["messages"] += json.loads(body)["settled"]
        else:
            out["errors"] += 1


async def _piggyback_loop(
    conn: Connection, spec: dict[str, Any], until: float, out: dict[str, Any]
) -> None:
    """Receive up to 100, each receive carrying the receipts of the one before; the
    last batch is acked once the time is up (its settle counts, as in ``_consume_loop``)."""
    path = f"/api/v1/queues/{spec['queue']}/messages/receive"
    ack: list[str] = []
    while True:
        last = time.time() >= until
        asked = {"max_messages": 1 if last else 100, "wait_ms": 0, "ack": ack}
        if last and not ack:
            return
        try:
            status, body = await conn.request(_request(spec, path, json.dumps(asked).encode()))
        except ConnectionError:
            out["transport_errors"] += 1
            await asyncio.sleep(0.01)
            continue
        if status != 200:
            out["errors"] += 1  # the acks are sent again: stale if they did settle
            continue
        answer = json.loads(body)
        out["messages"] += answer["settled"]
        if last:
            return  # (a message leased by this last receive stays unacked)
        ack = [m["receipt"] for m in answer["messages"]]
        if not ack:
            out["empty"] += 1
            if out["empty"] > 3:
                return
            await asyncio.sleep(0.05)


async def _paced_loop(
    spec: dict[str, Any], raw: bytes, start: float, until: float, out: dict[str, Any]
) -> None:
    """A send is due every 1/rate s; ``PACED_CONNECTIONS_MAX`` workers, one connection
    each, take the due times in order. Latency counts from the *due* time (as wrk2
    does), so a server that falls behind is charged for the wait, not hidden by it.
    Sends not started ``PACED_GRACE_S`` after the phase are counted in ``not_sent``."""
    rate = spec["rate"]
    latencies: list[float] = out["latencies_ms"]
    due: collections.deque[float] = collections.deque(
        start + i / rate for i in range(int((until - start) * rate))
    )
    in_flight: dict[int, float] = out["open"]

    async def worker(conn: Connection) -> None:
        while due and time.time() < until + PACED_GRACE_S:
            scheduled = due.popleft()
            delay = scheduled - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            out["send_late_ms"].append((time.time() - scheduled) * 1000)
            in_flight[id(scheduled)] = scheduled  # counted if the hard deadline hits
            try:
                status, body = await conn.request(raw)
            except ConnectionError:
                out["transport_errors"] += 1
                continue
            finally:
                in_flight.pop(id(scheduled), None)
            if _published(status, body, 1):
                out["messages"] += 1
                latencies.append((time.time() - scheduled) * 1000)
            else:
                out["errors"] += 1

    conns = out["connections"]
    await asyncio.gather(*(worker(conn) for conn in conns))
    out["not_sent"] += len(due)


def _generator(spec: dict[str, Any], results: Any) -> None:
    """One load-generator process: runs ``spec`` and puts its counts on ``results``.

    A hard deadline bounds it: a server (or a machine) too slow to answer must not hang
    the bench. What is still open then is cancelled and counted, and the process leaves
    at once (``os._exit``) rather than wait for connections to close.
    """
    out: dict[str, Any] = {
        "messages": 0,
        "errors": 0,
        "transport_errors": 0,
        "timed_out": 0,
        "not_sent": 0,
        "empty": 0,
        "latencies_ms": [],
        "send_late_ms": [],
        "open": {},
        "cpu0": _cpu_self_s(),
    }
    start = spec["start_at"]

    async def run() -> None:
        clients = spec["clients"] if spec["kind"] != "paced" else PACED_CONNECTIONS_MAX
        conns = [Connection(spec["host"], spec["port"]) for _ in range(clients)]
        ready = f"GET /readyz HTTP/1.1\r\nHost: {spec['host']}\r\n\r\n".encode("ascii")
        for conn in conns:  # connect before the clock starts
            status, _ = await conn.request(ready)
            assert status == 200, status
        out["connections"] = conns
        raw = _request(spec, f"/api/v1/queues/{spec['queue']}/messages", _payload(spec["batch"]))
        # A generator that became ready after the agreed start (its process spawned late
        # on a loaded machine) measures its own full window instead of an empty one.
        begin = out["begin"] = max(start, time.time())
        until = begin + spec["seconds"]
        await asyncio.sleep(max(0.0, begin - time.time()))
        out["cpu0"] = _cpu_self_s()
        if spec["kind"] == "publish":
            loops = [_publish_loop(c, raw, spec["batch"], until, out) for c in conns]
        elif spec["kind"] == "consume":
            loops = [_consume_loop(c, spec, until, out) for c in conns]
        elif spec["kind"] == "piggyback":
            loops = [_piggyback_loop(c, spec, until, out) for c in conns]
        else:
            loops = [_paced_loop(spec, raw, begin, until, out)]
        await asyncio.gather(*loops)

    async def bounded() -> None:
        deadline_s = max(0.0, start - time.time()) + spec["seconds"] + 2 * PACED_GRACE_S
        # Not wait_for: it would wait for the cancelled work to unwind.
        work = asyncio.create_task(run())
        done, _ = await asyncio.wait({work}, timeout=deadline_s)
        if not done:
            now = time.time()
            for scheduled in out["open"].values():
                out["timed_out"] += 1
                out["latencies_ms"].append((now - scheduled) * 1000)
        elif work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
        out["wall_s"] = time.time() - out.pop("begin", start)
        out["cpu_s"] = _cpu_self_s() - out.pop("cpu0")
        out.pop("open")
        out.pop("connections", None)
        results.put(out)
        results.close()
        results.join_thread()
        os._exit(0)

    _run(bounded())


def _run(main: Any) -> None:
    """``asyncio.run``, on uvloop where installed (a dependency of the server): the
    generators' CPU is taken from the cores the server runs on."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def server_spec(url: str, token: str, seconds: float) -> dict[str, Any]:
    """The part of a phase's spec (``run_phase``'s ``base``) that names the server and
    the phase's length; the generators speak plain HTTP/1.1, so ``url`` is ``http://``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the load generators speak plain HTTP only, not {url!r}")
    port = parts.port or 80
    return {"host": parts.hostname, "port": port, "token": token, "seconds": seconds}


def run_phase(
    server: CpuClock,
    base: dict[str, Any],
    procs: int,
    start_delay_s: float = START_DELAY_S,
    target: Callable[[dict[str, Any], Any], None] = _generator,
) -> dict[str, Any]:
    """Run ``procs`` generators (``target``) with ``base`` (``server_spec`` and the
    phase's own keys); the merged counts and CPU figures, and what the server's WAL did
    meanwhile."""
    url = f"http://{base['host']}:{base['port']}"
    wal_before = wal_sync_buckets(url, base["token"])
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + start_delay_s
    specs = [dict(base, start_at=start_at) for _ in range(procs)]
    if base["kind"] == "paced":
        for spec in specs:
            spec["rate"] = base["rate"] / procs
            spec["start_at"] = start_at + random.random() / spec["rate"]
    workers = [ctx.Process(target=target, args=(spec, results), daemon=True) for spec in specs]
    for w in workers:
        w.start()
    time.sleep(max(0.0, start_at - time.time()))
    server_cpu0, wall0 = server.cpu_s(), time.time()
    outs: list[dict[str, Any]] = []
    deadline = time.time() + start_delay_s + base["seconds"] + 3 * PACED_GRACE_S + 60
    try:
        for _ in workers:
            outs.append(results.get(timeout=max(1.0, deadline - time.time())))
    except queue.Empty:
        print(f"{len(workers) - len(outs)} load generators did not report", file=sys.stderr)
    finally:
        server_cpu, wall = server.cpu_s() - server_cpu0, time.time() - wall0
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.terminate()
    if not outs:
        raise RuntimeError(f"no load generator of phase {base['kind']} reported")
    wal = wal_sync_delta(wal_before, wal_sync_buckets(url, base["token"]))
    wall_s = max(o["wall_s"] for o in outs)
    messages = sum(o["messages"] for o in outs)
    latencies = sorted(x for o in outs for x in o["latencies_ms"])
    late = sorted(x for o in outs for x in o.get("send_late_ms", []))
    return {
        "messages": messages,
        "errors": sum(o["errors"] for o in outs),
        "transport_errors": sum(o["transport_errors"] for o in outs),
        "timed_out": sum(o["timed_out"] for o in outs),
        "not_sent": sum(o["not_sent"] for o in outs),
        "msgs_per_s": round(messages / wall_s, 1),
        "wall_s": round(wall_s, 2),
        "client_cpu_per_wall": round(sum(o["cpu_s"] for o in outs) / wall_s, 2),
        "server_cpu_per_wall": round(server_cpu / wall, 2),
        "server_cpu_us_per_msg": round(server_cpu * 1e6 / messages, 1) if messages else None,
        "latencies_ms": latencies,
        "send_late_ms": {"p50": _percentile(late, 0.5), "p99": _percentile(late, 0.99)},
        "generators_reported": f"{len(outs)}/{len(workers)}",
        "wal": wal,
    }


def wal_sync_buckets(url: str, token: str) -> dict[float, float]:
    """The server's ``quorra_wal_sync_seconds`` histogram: cumulative count by bound."""
    got = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
    got.raise_for_status()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(got.text)
        if family.name == "quorra_wal_sync_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }


def wal_sync_delta(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """What the WAL's group commits did between two reads of the histogram."""
    delta = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = delta.get(float("inf"), 0.0)

    def over(seconds: float) -> int:
        return int(total - delta.get(seconds, total))

    slowest = next(bound for bound, count in delta.items() if count >= total) if total else None
    return {
        "syncs": int(total),
        "over_5ms": over(0.005),
        "over_10ms": over(0.01),
        "over_25ms": over(0.025),
        "over_100ms": over(0.1),
        "slowest_le_ms": None if slowest is None else slowest * 1000,
    }


def disk_fdatasync_ms(directory: Path, gap_s: float, count: int = 300) -> dict[str, Any]:
    """The disk's own latency: append 1 KiB and ``fdatasync``, ``count`` times, one every
    ``gap_s`` (the paced phase's spacing), in ``directory`` (where the server's WAL is).
    Every paced publish waits for one such sync; its p99 bounds the p99 the server can
    reach."""
    path = directory / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    latencies: list[float] = []
    try:
        for _ in range(count):
            os.write(fd, b"x" * MESSAGE_BYTES)
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(gap_s)
    finally:
        os.close(fd)
        path.unlink()
    latencies.sort()
    return {
        "gap_ms": round(gap_s * 1000, 2),
        "p50": _percentile(latencies, 0.5),
        "p99": _percentile(latencies, 0.99),
        "max": round(latencies[-1], 2),
    }


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return round(sorted_values[k], 2)


# --- the run -------------------------------------------------------------------------


def _setup(url: str) -> str:
    made = httpx.post(f"{url}/api/v1/tokens", auth=("admin", ADMIN_PASSWORD), timeout=30.0)
    made.raise_for_status()
    token: str = made.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    queues = ("bench-batch", "bench-single", "bench-paced", "bench-piggyback")
    for name in (*queues, "bench-stream", "bench-window1"):
        created = httpx.put(f"{url}/api/v1/queues/{name}", headers=headers, timeout=30.0)
        assert created.status_code in (200, 201), created.text
    return token


PHASES = (
    "publish_batch_100",
    "publish_batch_1",
    "consume_batch_100",
    "consume_piggyback_100",
    "publish_paced",
    "stream_publish",
    "stream_consume",
    "stream_window1",
)
"""In this order (consume drains what publish_batch_100 filled, stream_consume what
stream_publish did); ``consume_piggyback_100`` drains its own queue, filled just before
it (``fill_piggyback``); ``publish_paced`` runs at ``--rate`` and then at
``--low-rate``."""
COMPANIONS = {"fill_piggyback": "consume_piggyback_100", "publish_paced_low": "publish_paced"}
"""Steps with no name in ``PHASES``, run (in ``_phase_specs``'s order) when the phase
they serve is chosen."""
STREAM_PHASES = frozenset({"stream_publish", "stream_consume", "stream_window1"})
QUICK_WINDOW1_COUNT = 200
WINDOW1_SECONDS_MAX = 120.0
"""The window-1 phase ends at ``--window1-count`` publishes, or after this long."""


def _phase_specs(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    batch = dict(base, queue="bench-batch", batch=100, clients=args.batch_clients)
    paced = dict(base, kind="paced", queue="bench-paced", batch=1, clients=1)
    return {
        "publish_batch_100": dict(batch, kind="publish"),
        "publish_batch_1": dict(
            base, kind="publish", queue="bench-single", batch=1, clients=args.single_clients
        ),
        "consume_batch_100": dict(batch, kind="consume"),
        "fill_piggyback": dict(batch, kind="publish", queue="bench-piggyback"),
        "consume_piggyback_100": dict(batch, kind="piggyback", queue="bench-piggyback"),
        "publish_paced": dict(paced, rate=args.rate),
        "publish_paced_low": dict(paced, rate=args.low_rate),
        **_stream_specs(args, base),
    }


def _stream_specs(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    stream = dict(
        base,
        queue="bench-stream",
        clients=max(1, args.stream_connections // args.procs),
        window=args.stream_window,
        frame_messages=args.stream_frame_messages,
        prefetch=args.stream_prefetch,
    )
    window1_s = args.seconds if args.quick else WINDOW1_SECONDS_MAX
    return {
        "stream_publish": dict(stream, kind="stream_publish"),
        "stream_consume": dict(stream, kind="stream_consume"),
        "stream_window1": dict(
            stream,
            kind="stream_window1",
            queue="bench-window1",
            window=1,
            count=args.window1_count,
            seconds=window1_s,
        ),
    }


def _run_phase(
    args: argparse.Namespace, server: ServerProcess, name: str, spec: dict[str, Any]
) -> dict[str, Any]:
    delay_s = QUICK_START_DELAY_S if args.quick else START_DELAY_S
    if name not in STREAM_PHASES:
        return run_phase(server, spec, args.procs, delay_s)
    from bench._stream_load import generator  # the client and its WebSocket library

    procs = 1 if name == "stream_window1" else args.procs
    phase = run_phase(server, spec, procs, delay_s, target=generator)
    phase["connections"] = 1 if name == "stream_window1" else spec["clients"] * procs
    return phase


def measure(args: argparse.Namespace, server: ServerProcess, token: str) -> dict[str, Any]:
    specs = _phase_specs(args, server_spec(server.url, token, args.seconds))
    chosen = [p for p in specs if p in args.phases or COMPANIONS.get(p) in args.phases]
    phases = {name: _run_phase(args, server, name, specs[name]) for name in chosen}
    none: dict[str, Any] = {"msgs_per_s": None, "timed_out": None, "not_sent": None}
    paced = phases.get("publish_paced", {}).get("latencies_ms", [])
    low = phases.get("publish_paced_low", {}).get("latencies_ms", [])
    window1 = phases.get("stream_window1", {}).get("latencies_ms", [])
    for phase in phases.values():
        phase.pop("latencies_ms")
    for name in specs:
        phases.setdefault(name, none)
    return {
        "message_bytes": MESSAGE_BYTES,
        "body_format": "json",
        "publish_msgs_per_s": phases["publish_batch_100"]["msgs_per_s"],
        "publish_single_msgs_per_s": phases["publish_batch_1"]["msgs_per_s"],
        "consume_msgs_per_s": phases["consume_batch_100"]["msgs_per_s"],
        "consume_ack_piggyback_msgs_per_s": phases["consume_piggyback_100"]["msgs_per_s"],
        "publish_p50_ms": _percentile(paced, 0.50),
        "publish_p99_ms": _percentile(paced, 0.99),
        "paced_rate_msgs_per_s": args.rate,
        "paced_achieved_msgs_per_s": phases["publish_paced"]["msgs_per_s"],
        "paced_timed_out": phases["publish_paced"]["timed_out"],
        "paced_not_sent": phases["publish_paced"]["not_sent"],
        "paced_wal": phases["publish_paced"].get("wal"),
        "paced_send_late_ms": phases["publish_paced"].get("send_late_ms"),
        "publish_p50_ms_at_low_rate": _percentile(low, 0.50),
        "publish_p99_ms_at_low_rate": _percentile(low, 0.99),
        "low_rate_msgs_per_s": args.low_rate,
        "low_rate_send_late_ms": phases["publish_paced_low"].get("send_late_ms"),
        "stream_publish_msgs_per_s": phases["stream_publish"]["msgs_per_s"],
        "stream_consume_msgs_per_s": phases["stream_consume"]["msgs_per_s"],
        "publish_window1_p50_ms": _percentile(window1, 0.50),
        "publish_window1_p99_ms": _percentile(window1, 0.99),
        "load_procs": args.procs,
        "batch_clients_per_proc": args.batch_clients,
        "single_clients_per_proc": args.single_clients,
        "seconds_per_phase": args.seconds,
        "disk_fdatasync_ms": disk_fdatasync_ms(server.data_dir, 1 / args.rate),
        "phases": {name: phase for name, phase in phases.items() if phase is not none},
        "targets": {
            "publish_msgs_per_s": 50_000,
            "publish_p99_ms": 10.0,
            "stream_publish_msgs_per_s": 70_000,
            "stream_consume_msgs_per_s": 80_000,
            "publish_window1_p50_ms": 0.8,
            "publish_window1_p99_ms": 2.0,
        },
    }


def _print_profile(path: Path, top: int = 40) -> None:
    stats = pstats.Stats(str(path), stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)


def main(argv: list[str]) -> int:
    parser = bench.parser("rest", __doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--procs", type=int, default=2, help="load-generator processes")
    parser.add_argument("--batch-clients", type=int, default=4, help="per process, batches of 100")
    parser.add_argument("--single-clients", type=int, default=32, help="per process, batches of 1")
    parser.add_argument("--rate", type=float, default=1000.0, help="paced publishes per second")
    parser.add_argument(
        "--low-rate", type=float, default=100.0, help="a second paced phase, for comparison"
    )
    parser.add_argument(
        "--stream-connections", type=int, default=4, help="stream connections, all generators"
    )
    parser.add_argument("--stream-window", type=int, default=1000, help="unconfirmed, per conn")
    parser.add_argument("--stream-prefetch", type=int, default=1000, help="credit, per conn")
    parser.add_argument("--stream-frame-messages", type=int, default=100, help="per publish frame")
    parser.add_argument("--window1-count", type=int, default=10_000, help="window-1 publishes")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the server to FILE")
    parser.add_argument(
        "--trace-publish",
        action="store_true",
        help="stamp each window-1 publish's stages in the server (phases.stream_window1.trace)",
    )
    parser.add_argument(
        "--phases",
        type=lambda text: text.split(","),
        default=list(PHASES),
        help=f"comma-separated, of {','.join(PHASES)} (default: all)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.procs = QUICK_SECONDS, 1
        args.window1_count = min(args.window1_count, QUICK_WINDOW1_COUNT)
    header = bench.header("rest")
    with tempfile.TemporaryDirectory(prefix="quorra-bench-rest-") as tmp:
        trace = Path(tmp) / "publish-trace.json" if args.trace_publish else None
        server = ServerProcess(Path(tmp) / "data", args.profile, trace)
        server.start()
        try:
            result = header | measure(args, server, _setup(server.url))
        except BaseException:
            print(server.log_path.read_text(errors="replace")[-5000:], file=sys.stderr)
            raise
        finally:
            alive = server.proc is not None and server.proc.poll() is None
            server.stop()
        if not alive:
            print(server.log_path.read_text(errors="replace")[-5000:], file=sys.stderr)
            raise RuntimeError("the server died during the run; its log is above")
        if trace is not None and "stream_window1" in result["phases"]:
            result["phases"]["stream_window1"]["trace"] = json.loads(trace.read_text())
    if args.profile is not None and args.profile.exists():
        _print_profile(args.profile)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0
