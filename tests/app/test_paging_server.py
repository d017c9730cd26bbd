"""A deep queue on a real server whose ready index is paged to page files (a tiny page
budget from the environment): it restarts from a checkpoint that names its pages, after
a clean stop or a kill, and delivers everything in publish order; a page file corrupted
while the server is down is rebuilt from the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server, make_token
from tests.app.test_ui import browser, log_in

pytestmark = pytest.mark.integration

TINY_PAGES = {
    "QUORRA_PAGE_REFS": "16",
    "QUORRA_PAGED_INDEX_BYTES_PER_QUEUE_MAX": str(2 * 16 * 8),
    "QUORRA_PAGED_INDEX_BYTES_PER_NODE_MAX": str(4 * 16 * 8),
    "QUORRA_PAGE_READ_AHEAD": "1",
}
"""Pages of 16 messages, two resident per queue, four per node."""
DEPTH = 3000
QUEUE = "deep"


@pytest.fixture
def paged(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", env=TINY_PAGES).start()
    try:
        yield srv
    finally:
        srv.stop()


def client(server: Server) -> httpx.Client:
    return server.client(make_token(server, "admin", ADMIN_PASSWORD))


def publish_deep(api: httpx.Client) -> None:
    assert api.put(f"/api/v1/queues/{QUEUE}", json={}).status_code == 201
    for start in range(0, DEPTH, 500):
        batch = [{"body": f"m{k}"} for k in range(start, start + 500)]
        response = api.post(f"/api/v1/queues/{QUEUE}/messages", json={"messages": batch})
        assert response.status_code == 201, response.text


def consume_all(api: httpx.Client) -> list[str]:
    bodies: list[str] = []
    while True:
        response = api.post(
            f"/api/v1/queues/{QUEUE}/messages/receive", json={"max_messages": 250, "wait_ms": 0}
        )
        assert response.status_code == 200, response.text
        messages = response.json()["messages"]
        if not messages:
            return bodies
        bodies += [m["body"] for m in messages]
        receipts = [m["receipt"] for m in messages]
        acked = api.post(f"/api/v1/queues/{QUEUE}/messages/ack", json={"receipts": receipts})
        assert acked.status_code == 200, acked.text


def page_files(server: Server) -> list[Path]:
    return sorted(server.data_dir.glob("queues/*/pages/*.page"))


def test_a_deep_queue_pages_out_restarts_and_delivers_in_order(paged: Server) -> None:
    with client(paged) as api:
        publish_deep(api)
        assert len(page_files(paged)) >= DEPTH // 16 - 8
        paging = api.get(f"/api/v1/queues/{QUEUE}").json()["stats"]["paging"]
        assert paging["paged_out_pages"] >= DEPTH // 16 - 8
        # Two pages of budget; a lane's head and tail pages stay whatever the budget.
        assert paging["resident_pages"] <= 4
        assert paging["resident_bytes"] == paging["resident_pages"] * 16 * 8
        assert paging["page_writes"] >= paging["paged_out_pages"]
        assert api.post(f"/api/v1/queues/{QUEUE}/snapshots").status_code == 202
    paged.stop()
    paged.start()
    with client(paged) as api:
        stats = api.get(f"/api/v1/queues/{QUEUE}").json()["stats"]
        assert stats["messages_ready"] == DEPTH
        assert consume_all(api) == [f"m{k}" for k in range(DEPTH)]
        stats = api.get(f"/api/v1/queues/{QUEUE}").json()["stats"]
        assert stats["messages_ready"] == 0
        paging = stats["paging"]
        reached = paging["read_ahead_hits"] + paging["page_waits"]
        assert reached >= DEPTH // 16 - 8 and paging["page_loads"] >= reached
        assert paging["read_ahead_hit_rate"] == round(paging["read_ahead_hits"] / reached, 4)
        assert paging["paged_out_pages"] == 0 and paging["pages_rebuilt"] == 0
        # After the restart the entries are in segments: each receive of 250 wants one
        # entry of 500 messages, and the first read of a segment keeps a block of them
        # all (some 110 KB) in the node's read cache for the receives after it.
        reads = stats["read_cache"]
        assert reads["reads"] >= DEPTH // 250 and 0 <= reads["hit_rate"] <= 1
        assert 1 <= reads["segment_reads"] <= 3 and reads["segment_bytes"] >= DEPTH * 2
        assert reads["cache_hits"] >= reads["reads"] - 3
        assert reads["hits"] == reads["mem_table_hits"] + reads["cache_hits"]
        assert reads["misses"] == reads["reads"] - reads["hits"] >= reads["segment_reads"]
        assert page_files(paged), "the checkpoint restored from still names its pages"
        # A newer checkpoint made the snapshot drops the older ones, and their pages.
        assert api.post(f"/api/v1/queues/{QUEUE}/snapshots").status_code == 202
        compacted = api.post(f"/api/v1/queues/{QUEUE}/compactions", json={"phase": "auto"})
        assert compacted.status_code == 202, compacted.text
    assert page_files(paged) == []


def test_a_killed_server_restarts_from_its_checkpoint_and_log(paged: Server) -> None:
    with client(paged) as api:
        publish_deep(api)
        assert api.post(f"/api/v1/queues/{QUEUE}/snapshots").status_code == 202
        more = [{"body": f"m{k}"} for k in range(DEPTH, DEPTH + 400)]
        response = api.post(f"/api/v1/queues/{QUEUE}/messages", json={"messages": more})
        assert response.status_code == 201
        got = consume_all_but(api, 700)
    paged.kill()
    paged.start()
    with client(paged) as api:
        # The 700 received but never acknowledged come back first (their leases were
        # lost with the process, and they are returned when those expire), then the rest.
        rest = consume_all(api)
    assert got == [f"m{k}" for k in range(700)]
    assert sorted(rest, key=lambda b: int(b[1:])) == [f"m{k}" for k in range(DEPTH + 400)]
    assert [b for b in rest if int(b[1:]) >= 700] == [f"m{k}" for k in range(700, DEPTH + 400)]


def consume_all_but(api: httpx.Client, count: int) -> list[str]:
    """Receive ``count`` messages, acknowledging none."""
    bodies: list[str] = []
    while len(bodies) < count:
        response = api.post(
            f"/api/v1/queues/{QUEUE}/messages/receive",
            json={"max_messages": min(100, count - len(bodies)), "lease_ms": 1000},
        )
        assert response.status_code == 200, response.text
        bodies += [m["body"] for m in response.json()["messages"]]
    return bodies


def test_a_corrupted_page_file_is_rebuilt_from_the_log(paged: Server) -> None:
    with client(paged) as api:
        publish_deep(api)
        assert api.post(f"/api/v1/queues/{QUEUE}/snapshots").status_code == 202
    paged.stop()
    damaged = page_files(paged)
    assert len(damaged) >= DEPTH // 16 - 8
    for path in damaged[::3]:
        raw = bytearray(path.read_bytes())
        raw[-5] ^= 0x10  # a bit of the page's data: its CRC no longer matches
        path.write_bytes(bytes(raw))
    paged.start()
    with client(paged) as api:
        assert consume_all(api) == [f"m{k}" for k in range(DEPTH)]
        paging = api.get(f"/api/v1/queues/{QUEUE}").json()["stats"]["paging"]
        assert paging["pages_rebuilt"] == len(damaged[::3])


def test_memory_shows_in_metrics_and_on_the_dashboard(paged: Server) -> None:
    with client(paged) as api:
        publish_deep(api)
        stats = api.get(f"/api/v1/queues/{QUEUE}").json()["stats"]
        metrics = api.get("/metrics").text
    out = stats["paging"]["paged_out_pages"]
    assert f'quorra_queue_index_paged_out_pages{{queue="{QUEUE}"}} {float(out)}' in metrics
    for name in (
        f'quorra_queue_index_resident_pages{{queue="{QUEUE}"}}',
        f'quorra_queue_index_page_waits_total{{queue="{QUEUE}"}}',
        f'quorra_queue_read_cache_hit_ratio{{queue="{QUEUE}"}}',
        "quorra_index_resident_pages_max 4.0",
        f"quorra_index_paged_out_pages {float(out)}",
        "quorra_engine_memory_bytes ",
        f'quorra_queue_read_cache_misses_total{{queue="{QUEUE}"}}',
        f'quorra_queue_segment_read_bytes_total{{queue="{QUEUE}"}}',
        "quorra_read_cache_bytes ",
        "quorra_read_cache_bytes_max 1.6777216e+07",
        "quorra_read_cache_evictions_total 0.0",
    ):
        assert name in metrics, name
    with browser(paged) as web:
        log_in(web, ADMIN_PASSWORD)
        queue_page = web.get(f"/queues/{QUEUE}/live").text
        overview = web.get("/fragments/overview").text
    assert 'id="paging-facts"' in queue_page and f"{out:,}" in queue_page
    assert 'id="memory-facts"' in overview and "of 4 " in overview
    assert 'id="node-read-cache"' in overview and "16.0 MiB" in overview
    assert "from the read cache" in queue_page
