"""``quorra bench deep --messages N [--json] [--rss-wait-s S] [--quick]``: a deep queue on a real server: memory at full depth, publish and consume rates, restart to first receive.

A real ``quorra serve`` process (``bench.restart.Server``: 127.0.0.1, a free port, a
temporary data directory, default limits) is started empty, a queue created, and the
server restarted once empty to time its recovery. N messages of 64 bytes are published
(8 clients, batches of 1,000, JSON), the server left idle ``--rss-wait-s`` seconds (its
WAL rolls, its entries reach segments) and its memory read from ``/proc/<pid>/status``.
It is then stopped (SIGTERM) and started again, timed from the exec to the first
receive that returns a message, and every message is consumed (4 clients, receive 1,000
then acknowledge them). ``--quick`` runs 20,000 messages with pages of 256 references and
16 pages per queue (``QUICK_PAGES``), so that the smoke run pages its index out and back.

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
* ``empty_recovery_ms``: exec to the first receive answered, the queue empty;
* ``recovery_ms``: exec to the first receive that returns a message, after a SIGTERM at
  full depth (its difference to ``empty_recovery_ms`` is what depth costs a restart);
* ``consume_msgs_per_s``: the rate of receiving and acknowledging all N after the restart;
* ``page_waits``: pages a consumer reached before read-ahead loaded them, over the consume;
* ``read_ahead_hits``: pages read-ahead loaded in time, over the consume;
* ``rss_wait_s``: the idle wait before the memory reading;
* ``targets``: what the issue holds the figures to;
* ``load_average``: the machine's 1, 5 and 15 minute load averages at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import bench
from bench.restart import ADMIN_PASSWORD, Server, batch_body, publish_all

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
    "empty_recovery_ms",
    "recovery_ms",
    "consume_msgs_per_s",
    "page_waits",
    "read_ahead_hits",
    "rss_wait_s",
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
QUICK_PAGES = {
    "QUORRA_PAGE_REFS": "256",
    "QUORRA_PAGED_INDEX_BYTES_PER_QUEUE_MAX": str(16 * 256 * 8),
    "QUORRA_PAGED_INDEX_BYTES_PER_NODE_MAX": str(64 * 256 * 8),
    "QUORRA_PAGE_READ_AHEAD": "8",
}
"""The smoke run's pages: 256 references, 16 in memory per queue, 8 read ahead (2,048
messages, more than a receive takes), so that 20,000 messages page out and back."""
TARGETS = {
    "rss_mb_at_50m_messages": 256,
    "rates_vs_100k_messages_min": 0.8,
    "recovery_ms_minus_empty_recovery_ms": 100,
}


class DeepServer(Server):
    """``bench.restart.Server`` with more environment (the smoke run's small pages)."""

    def __init__(self, data_dir: Path, extra_env: dict[str, str]) -> None:
        super().__init__(data_dir)
        self.extra_env = extra_env

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}

    def vm_rss_bytes(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc/<pid>/status")

    def first_receive(self, token: str, *, message: bool) -> float:
        """Poll a receive of one message until answered (with a message when
        ``message``, which is acknowledged at once); milliseconds since the exec."""
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
    """Receive and acknowledge until ``messages`` have been consumed."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=CONSUMERS)
    left = [messages]
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:

        async def consumer() -> None:
            path = f"/api/v1/queues/{QUEUE}/messages"
            while left[0] > 0:
                got = await http.post(
                    f"{path}/receive", json={"max_messages": BATCH, "wait_ms": 1000}
                )
                if got.status_code != 200:
                    raise RuntimeError(f"receive answered {got.status_code}: {got.text}")
                receipts = [m["receipt"] for m in got.json()["messages"]]
                if not receipts:
                    continue
                acked = await http.post(f"{path}/ack", json={"receipts": receipts})
                if acked.status_code != 200:
                    raise RuntimeError(f"ack answered {acked.status_code}: {acked.text}")
                left[0] -= len(receipts)

        await asyncio.gather(*(consumer() for _ in range(CONSUMERS)))


def _queue_stats(server: Server, token: str) -> dict[str, Any]:
    got = server.http.get(f"/api/v1/queues/{QUEUE}", headers={"Authorization": f"Bearer {token}"})
    got.raise_for_status()
    stats: dict[str, Any] = got.json()["stats"]
    return stats


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(server: DeepServer, args: argparse.Namespace) -> dict[str, Any]:
    result = bench.header("deep")
    server.compile()
    server.start()
    server.wait_ready()
    made = server.http.post("/api/v1/tokens", auth=("admin", ADMIN_PASSWORD))
    made.raise_for_status()
    token: str = made.json()["token"]
    created = server.http.put(
        f"/api/v1/queues/{QUEUE}", headers={"Authorization": f"Bearer {token}"}
    )
    assert created.status_code in (200, 201), created.text
    server.stop(signal.SIGTERM)
    server.start()
    empty_recovery_ms = server.first_receive(token, message=False)
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
    server.start()
    recovery_ms = server.first_receive(token, message=True)
    before = _queue_stats(server, token)["paging"]
    started = time.perf_counter()
    asyncio.run(_consume(server.url, token, args.messages - 1))
    consume_rate = (args.messages - 1) / (time.perf_counter() - started)
    after = _queue_stats(server, token)
    assert after["messages_ready"] == 0 and after["messages_unacked"] == 0, after
    result.update(
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
        empty_recovery_ms=round(empty_recovery_ms, 1),
        recovery_ms=round(recovery_ms, 1),
        consume_msgs_per_s=round(consume_rate, 1),
        page_waits=after["paging"]["page_waits"] - before["page_waits"],
        read_ahead_hits=after["paging"]["read_ahead_hits"] - before["read_ahead_hits"],
        rss_wait_s=args.rss_wait_s,
        targets=TARGETS,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    return result


def main(argv: list[str]) -> int:
    parser = bench.parser("deep", __doc__)
    parser.add_argument(
        "--messages", type=int, default=1_000_000, help="messages of 64 bytes to queue"
    )
    parser.add_argument(
        "--rss-wait-s", type=float, default=10.0, help="idle seconds before reading memory"
    )
    args = parser.parse_args(argv)
    extra_env: dict[str, str] = {}
    if args.quick:
        args.messages, args.rss_wait_s = 20_000, 1.0
        extra_env = QUICK_PAGES
    if args.messages < BATCH or args.messages % BATCH:
        parser.error(f"--messages must be a positive multiple of {BATCH}")
    with tempfile.TemporaryDirectory(prefix="quorra-bench-deep-") as tmp:
        server = DeepServer(Path(tmp) / "data", extra_env)
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
