"""``quorra bench restart --messages N [--json] [--restarts R] [--rss-wait-s S] [--quick]``:
start, fill, stop and restart a real ``quorra serve`` process, timed from the exec.

The server is a subprocess on 127.0.0.1 (a free port) with a temporary data directory.
It starts on an empty directory (``--restarts`` times, emptied in between); the bench
creates a token and a queue and receives once. It is then filled with N messages of 1 KiB (8 httpx clients, batches of 100), left
idle ``--rss-wait-s`` seconds, its memory read, and stopped with ``kill -9`` and then
with SIGTERM, ``--restarts`` times each, every restart timed from the exec to ``/readyz``
200 and to the first receive that returns a message (``/readyz`` and receive are polled
every 5 ms). A figure over restarts is their median. Memory is ``RssAnon`` of
``/proc/<pid>/status``: the server's anonymous resident memory (heap, arenas, arrays),
not the file cache of its data files, which the kernel may drop at any time.

The server runs as an installed package does: with bytecode caches (an untimed import
writes them first, even where ``PYTHONDONTWRITEBYTECODE`` is set, which would have every
start compile Quorra's modules again, about 150 ms).

Keys (``JSON_KEYS``; the headline is ``start_to_first_receive_ms``):

* ``bench``: "restart";
* ``messages``: N, the messages queued when the server is stopped;
* ``message_bytes``: the size of each message's body (1,024);
* ``restarts``: restarts timed per kind of stop;
* ``empty_start_to_ready_ms``: exec on an empty data directory to ``/readyz`` 200
  (median of ``restarts`` first starts, each on a directory emptied again);
* ``empty_start_ms``: exec on an empty data directory to the first receive answered
  (the token and the queue are created on the way, as a new user would; median);
* ``start_to_ready_ms``: after SIGTERM, exec to ``/readyz`` 200, N messages queued;
* ``start_to_first_receive_ms``: after SIGTERM, exec to the first receive that returns a
  message: how long a consumer waits for a restarted server;
* ``start_to_ready_ms_kill9``: ``start_to_ready_ms`` after ``kill -9`` (the first one
  right after the fill, nothing flushed by a clean stop);
* ``start_to_first_receive_ms_kill9``: ``start_to_first_receive_ms`` after ``kill -9``;
* ``empty_restart_to_first_receive_ms``: after SIGTERM with the queue empty, exec to the
  first receive answered; ``start_to_first_receive_ms`` minus this is what depth costs;
* ``rss_empty_bytes``: ``RssAnon`` of the started server before the fill;
* ``rss_bytes_per_message``: growth of ``RssAnon`` over ``rss_empty_bytes``, divided by
  N, ``--rss-wait-s`` after the fill, in the server that took the messages;
* ``rss_bytes_per_message_after_restart``: the same, ``--rss-wait-s`` after the last
  restart (the messages recovered from disk, not published);
* ``fill_msgs_per_s``: the publish rate of the fill (8 clients, batches of 100);
* ``rss_wait_s``: the wait before each memory reading;
* ``targets``: what the figures are held to;
* ``load_average``: the machine's 1, 5 and 15 minute load averages at the end;
* ``machine``: ``bench.machine_info()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import bench
from app.ports import free_port

JSON_KEYS: tuple[str, ...] = (
    "bench",
    "messages",
    "message_bytes",
    "restarts",
    "empty_start_to_ready_ms",
    "empty_start_ms",
    "start_to_ready_ms",
    "start_to_first_receive_ms",
    "start_to_ready_ms_kill9",
    "start_to_first_receive_ms_kill9",
    "empty_restart_to_first_receive_ms",
    "rss_empty_bytes",
    "rss_bytes_per_message",
    "rss_bytes_per_message_after_restart",
    "fill_msgs_per_s",
    "rss_wait_s",
    "targets",
    "load_average",
    "machine",
)
HEADLINE_KEY: str = "start_to_first_receive_ms"

MESSAGE_BYTES = 1024
BATCH = 100
CLIENTS = 8
QUEUE = "bench-restart"
ADMIN_PASSWORD = "bench-admin-password"
POLL_S = 0.005
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
TARGETS = {
    "start_to_first_receive_ms_minus_empty_start_ms": 100.0,
    "empty_start_ms": 1000.0,
    "rss_bytes_per_message": 32.0,
}


def rss_anon_bytes(pid: int) -> int:
    """``RssAnon`` of ``/proc/<pid>/status``: anonymous resident memory, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/<pid>/status (Linux 4.5 or later needed)")


class Server:
    """One ``quorra serve`` process at a time on ``data_dir`` and a fixed port; the
    server's output goes to ``server.log`` beside the data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.http = httpx.Client(base_url=self.url, timeout=30.0)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["QUORRA_ADMIN_PASSWORD"] = ADMIN_PASSWORD
        return env

    def compile(self) -> None:
        """Write the bytecode caches of what ``serve`` imports (untimed)."""
        warm = "import app.server, engine.runtime.node"
        subprocess.run([sys.executable, "-c", warm], env=self.env(), check=True)

    def start(self) -> None:
        """Exec the server; ``started_at`` is the moment just before the exec."""
        env = self.env()
        command = [str(Path(sys.executable).with_name("quorra")), "serve"]
        command += ["--data-dir", str(self.data_dir), "--host", "127.0.0.1"]
        command += ["--port", str(self.port)]
        with self.log_path.open("ab") as log:
            self.started_at = time.perf_counter()
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def since_start_ms(self) -> float:
        return (time.perf_counter() - self.started_at) * 1000

    def wait_ready(self) -> float:
        """Poll ``/readyz`` until 200; milliseconds since the exec."""
        while True:
            self._check_alive()
            try:
                if self.http.get("/readyz", timeout=1.0).status_code == 200:
                    return self.since_start_ms()
            except httpx.TransportError:
                pass
            time.sleep(POLL_S)

    def wait_receive(self, token: str, *, message: bool) -> float:
        """Poll a receive of one message until answered 200 (with a message when
        ``message``); milliseconds since the exec."""
        headers = {"Authorization": f"Bearer {token}"}
        body = {"max_messages": 1, "wait_ms": 0}
        while True:
            self._check_alive()
            try:
                got = self.http.post(
                    f"/api/v1/queues/{QUEUE}/messages/receive", json=body, headers=headers
                )
                if got.status_code == 200 and (got.json()["messages"] or not message):
                    return self.since_start_ms()
            except httpx.TransportError:
                pass
            time.sleep(POLL_S)

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
        if self.since_start_ms() > START_TIMEOUT_S * 1000:
            raise RuntimeError("server not ready in time")

    def stop(self, how: signal.Signals) -> None:
        """Send ``how`` (SIGTERM: a clean stop; SIGKILL: a crash) and wait for the exit."""
        if self.proc is None:
            return
        self.proc.send_signal(how)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the server did not stop on {how.name}") from None
        finally:
            self.proc = None

    def rss_anon_bytes(self) -> int:
        assert self.proc is not None
        return rss_anon_bytes(self.proc.pid)


def first_start(server: Server, starts: int) -> tuple[str, float, float]:
    """Start on an empty directory, make a token and the queue, receive once; ``starts``
    times, each on a directory emptied again. The last token and the medians of both
    timings (to ready, to the receive answered); the last server is left running."""
    server.compile()
    ready, receive = [], []
    for n in range(starts):
        if n:
            server.stop(signal.SIGTERM)
            shutil.rmtree(server.data_dir)
        server.start()
        ready.append(server.wait_ready())
        made = server.http.post("/api/v1/tokens", auth=("admin", ADMIN_PASSWORD))
        made.raise_for_status()
        token: str = made.json()["token"]
        created = server.http.put(
            f"/api/v1/queues/{QUEUE}", headers={"Authorization": f"Bearer {token}"}
        )
        assert created.status_code in (200, 201), created.text
        receive.append(server.wait_receive(token, message=False))
    return token, statistics.median(ready), statistics.median(receive)


def batch_body(message_bytes: int, batch: int) -> bytes:
    """A publish request of ``batch`` messages of ``message_bytes`` each, as JSON."""
    text = ("0123456789abcdef" * (message_bytes // 16 + 1))[:message_bytes]
    return json.dumps({"messages": [{"body": text}] * batch}).encode("ascii")


async def publish_all(
    url: str, token: str, queue: str, body: bytes, requests: int, clients: int
) -> None:
    """Send ``body`` to ``queue`` ``requests`` times from ``clients`` connections, each again
    after a 429 or 503 until it is confirmed (201)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    left = iter(range(requests))
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def client() -> None:
            for _ in left:
                while True:
                    got = await http.post(f"/api/v1/queues/{queue}/messages", content=body)
                    if got.status_code == 201:
                        break
                    if got.status_code not in (429, 503):
                        raise RuntimeError(f"publish answered {got.status_code}: {got.text}")
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(clients)))


def fill(server: Server, token: str, messages: int) -> float:
    """Publish ``messages``; the rate in messages per second."""
    started = time.perf_counter()
    body = batch_body(MESSAGE_BYTES, BATCH)
    asyncio.run(publish_all(server.url, token, QUEUE, body, messages // BATCH, CLIENTS))
    return messages / (time.perf_counter() - started)


def timed_restarts(
    server: Server, token: str, how: signal.Signals, restarts: int, *, message: bool = True
) -> tuple[float, float]:
    """Stop with ``how`` and start again, ``restarts`` times; the medians of exec to
    ready and exec to the first receive. The server is left running."""
    ready, receive = [], []
    for _ in range(restarts):
        server.stop(how)
        server.start()
        ready.append(server.wait_ready())
        receive.append(server.wait_receive(token, message=message))
    return statistics.median(ready), statistics.median(receive)


def _per_message(server: Server, empty_bytes: int, messages: int, wait_s: float) -> float:
    time.sleep(wait_s)
    return max(server.rss_anon_bytes() - empty_bytes, 0) / messages


def measure(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    token, empty_ready_ms, empty_ms = first_start(server, args.restarts)
    _, empty_restart_ms = timed_restarts(
        server, token, signal.SIGTERM, args.restarts, message=False
    )
    time.sleep(min(args.rss_wait_s, 5.0))
    rss_empty = server.rss_anon_bytes()
    rate = fill(server, token, args.messages)
    per_message = _per_message(server, rss_empty, args.messages, args.rss_wait_s)
    ready_kill9, receive_kill9 = timed_restarts(server, token, signal.SIGKILL, args.restarts)
    ready, receive = timed_restarts(server, token, signal.SIGTERM, args.restarts)
    per_message_restarted = _per_message(server, rss_empty, args.messages, args.rss_wait_s)
    return {
        "bench": "restart",
        "messages": args.messages,
        "message_bytes": MESSAGE_BYTES,
        "restarts": args.restarts,
        "empty_start_to_ready_ms": round(empty_ready_ms, 1),
        "empty_start_ms": round(empty_ms, 1),
        "start_to_ready_ms": round(ready, 1),
        "start_to_first_receive_ms": round(receive, 1),
        "start_to_ready_ms_kill9": round(ready_kill9, 1),
        "start_to_first_receive_ms_kill9": round(receive_kill9, 1),
        "empty_restart_to_first_receive_ms": round(empty_restart_ms, 1),
        "rss_empty_bytes": rss_empty,
        "rss_bytes_per_message": round(per_message, 2),
        "rss_bytes_per_message_after_restart": round(per_message_restarted, 2),
        "fill_msgs_per_s": round(rate, 1),
        "rss_wait_s": args.rss_wait_s,
        "targets": TARGETS,
        "load_average": list(os.getloadavg()),
        "machine": bench.machine_info(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="quorra bench restart", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON figures")
    parser.add_argument(
        "--messages", type=int, default=1_000_000, help="messages of 1 KiB to queue"
    )
    parser.add_argument("--restarts", type=int, default=3, help="timed restarts per kind of stop")
    parser.add_argument(
        "--rss-wait-s", type=float, default=60.0, help="idle seconds before reading memory"
    )
    parser.add_argument(
        "--quick", action="store_true", help="2,000 messages, 1 restart, 1 s waits (a smoke run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.restarts, args.rss_wait_s = 2_000, 1, 1.0
    if args.messages < BATCH or args.messages % BATCH or args.restarts < 1:
        parser.error(f"--messages must be a positive multiple of {BATCH}, --restarts at least 1")

    with tempfile.TemporaryDirectory(prefix="quorra-bench-restart-") as tmp:
        server = Server(Path(tmp) / "data")
        try:
            result = measure(server, args)
        except BaseException:
            print(server.log_path.read_text(errors="replace")[-5000:], file=sys.stderr)
            raise
        finally:
            server.stop(signal.SIGTERM)
            server.http.close()
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
