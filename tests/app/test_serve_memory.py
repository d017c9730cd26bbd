"""A running server's memory does not grow with the bytes of the messages it queues:
entries are held in memory only until their WAL file (``wal_file_bytes_max``) is
flushed to segments, and the allocator gives freed buffers back (app/server.py,
``tune_malloc``). ``quorra bench restart`` measures the same at a million messages."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.restart import rss_anon_bytes
from engine.limits import DEFAULT_LIMITS, MIB
from tests.app.conftest import ADMIN_PASSWORD, Server, make_token

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/<pid>/status"),
]

MESSAGE_BYTES = 1024
BATCH = 100
BATCHES = 800
"""About 80 MiB of messages: five WAL files at the default limit."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


def test_queued_messages_are_not_held_in_memory(server: Server) -> None:
    token = make_token(server, "admin", ADMIN_PASSWORD)
    body = {"messages": [{"body": "x" * MESSAGE_BYTES}] * BATCH}
    assert server.proc is not None
    with server.client(token) as http:
        assert http.put("/api/v1/queues/deep").status_code == 201
        assert http.post("/api/v1/queues/deep/messages", json=body).status_code == 201
        empty_bytes = rss_anon_bytes(server.proc.pid)

        def publish(_: int) -> int:
            return http.post("/api/v1/queues/deep/messages", json=body).status_code

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(publish, range(BATCHES - 1))) == {201}
    growth_bytes = rss_anon_bytes(server.proc.pid) - empty_bytes
    published_bytes = BATCHES * BATCH * MESSAGE_BYTES
    assert published_bytes > 4 * DEFAULT_LIMITS.wal_file_bytes_max
    # The current WAL file's entries, one more in the WAL writer, slack for the rest.
    assert growth_bytes < 2 * DEFAULT_LIMITS.wal_file_bytes_max + 8 * MIB, (
        f"RssAnon grew by {growth_bytes / MIB:.1f} MiB for {published_bytes / MIB:.0f} MiB"
    )
