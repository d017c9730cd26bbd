"""The stream reader's lease and settle logic, driven by hand against a real server on
127.0.0.1 (no Spark): the calls are the ones Spark makes, the queue's own counts say
what was acked, what is leased and what is ready."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from pipeline import queues
from pipeline.localserver import LocalServer
from pipeline.offsets import make_offset, offset_ids
from pipeline.options import Options
from pipeline.streaming import LeaseStreamReader, stream_count
from quorra.client import Client

pytestmark = [pytest.mark.integration]


@pytest.fixture
def readers() -> Iterator[list[LeaseStreamReader]]:
    """Readers a test made: stopped at its end, whatever happened."""
    made: list[LeaseStreamReader] = []
    yield made
    for r in made:
        r.stop()


def publish(client: Client, queue: str, n: int, start: int = 0) -> list[int]:
    return client.publish(queue, [b"m-%d" % i for i in range(start, start + n)])


def stats(client: Client, queue: str) -> dict[str, Any]:
    return dict(queues.queue_info(client, queue)["stats"])


def reader(
    server: LocalServer, queue: str, made: list[LeaseStreamReader], **extra: str
) -> LeaseStreamReader:
    raw = {"url": server.url, "token": server.token, "queue": queue, "waitMs": "2000"}
    r = LeaseStreamReader(Options.parse(raw | {"leaseMs": "30000"} | extra))
    made.append(r)
    return r


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def ids_of(partitions: list[Any]) -> list[int]:
    return [i for p in partitions for i in p.batch.column(0).to_pylist()]


def test_batches_are_acked_once_spark_moves_past_them(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    publish(client, queue, 25)
    r = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    assert end["seq"] == 10 and len(offset_ids(end)) == len(set(offset_ids(end))) == 10
    assert end["runs"] == [[offset_ids(end)[0], offset_ids(end)[-1]]]  # 10 consecutive ids
    assert ids_of(r.partitions(start, end)) == offset_ids(end)
    assert stats(client, queue)["acked"] == 0  # not committed yet
    following = r.latestOffset(end, ReadMaxRows(10))  # batch ``end`` is committed
    eventually(lambda: stats(client, queue)["acked"] == 10)
    assert len(offset_ids(following)) == 10
    assert not set(offset_ids(following)) & set(offset_ids(end))
    r.commit(following)
    eventually(lambda: stats(client, queue)["acked"] == 20)
    r.stop()
    now = stats(client, queue)  # the rest was returned when the connections closed
    eventually(lambda: stats(client, queue)["messages_ready"] == 5)
    assert now["acked"] == 20 and stats(client, queue)["messages_unacked"] == 0


def test_a_reader_of_some_columns_ships_and_reads_only_those(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    publish(client, queue, 20)
    raw = {"url": quorra_server.url, "token": quorra_server.token, "queue": queue}
    r = LeaseStreamReader(Options.parse(raw | {"waitMs": "2000"}), ("body_text", "id"))
    readers.append(r)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(20))
    partitions = r.partitions(start, end)
    assert all(p.batch.schema.names == ["id", "body"] for p in partitions)  # no headers
    rows = [row for p in partitions for batch in r.read(p) for row in batch.to_pylist()]
    assert [sorted(row) for row in rows] == [["body_text", "id"]] * 20
    assert sorted(row["body_text"] for row in rows) == sorted(f"m-{i}" for i in range(20))


def test_the_credit_covers_two_micro_batches() -> None:
    assert stream_count(20_000, 10_000) == 2
    assert stream_count(100, 10_000) == 1
    assert stream_count(10_000_000, 10_000) == 8  # STREAMS_MAX


def test_a_restarted_reader_replays_the_same_batch(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    publish(client, queue, 30)
    first = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10")
    start = first.initialOffset()
    end = first.latestOffset(start, ReadMaxRows(10))
    # The driver dies: no stop(); its connections drop, the server returns the leases.
    first._stopping.set()
    for stream in first._streams:
        assert stream is not None
        stream.close()
    eventually(lambda: stats(client, queue)["messages_unacked"] == 0)

    second = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10")
    assert ids_of(second.partitions(start, end)) == offset_ids(end)
    following = second.latestOffset(end, ReadMaxRows(10))
    assert len(offset_ids(following)) == 10
    assert not set(offset_ids(following)) & set(offset_ids(end))
    eventually(lambda: stats(client, queue)["acked"] == 10)


def test_a_checkpoint_offset_listing_every_id_is_replayed(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    """Offsets written before id runs list every id; a restart from such a checkpoint
    replays that batch and settles it."""
    ids = publish(client, queue, 15)
    end = {"seq": 10, "ids": list(reversed(ids[:10]))}
    r = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10")
    start = r.initialOffset()
    assert ids_of(r.partitions(start, end)) == ids[:10]
    following = r.latestOffset(end, ReadMaxRows(10))
    assert offset_ids(following) == ids[10:]
    eventually(lambda: stats(client, queue)["acked"] == 10)


def test_an_expired_lease_does_not_emit_a_message_twice(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    publish(client, queue, 10)
    r = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10", leaseMs="1000")
    r._extend_once = lambda: None  # type: ignore[method-assign]  # the driver stalls
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    # Every lease ends: the messages are delivered again, here, with new receipts.
    eventually(lambda: stats(client, queue)["delivered"] >= 20)
    publish(client, queue, 5, start=10)
    following = r.latestOffset(end, ReadMaxRows(10))
    assert not set(offset_ids(following)) & set(offset_ids(end))
    assert len(offset_ids(following)) == 5
    eventually(lambda: stats(client, queue)["acked"] == 10)  # acked with the new receipts


def test_a_dropped_connection_is_reopened_and_its_messages_are_not_emitted_twice(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    publish(client, queue, 15)
    r = reader(quorra_server, queue, readers, maxMessagesPerTrigger="10")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(10))
    eventually(lambda: stats(client, queue)["messages_ready"] == 0)  # 5 more spare
    dropped = r._streams[0]
    assert dropped is not None and len(r._streams) == 1
    dropped.close()  # the server returns its 15 leases; they come back on a new one
    eventually(lambda: stats(client, queue)["delivered"] >= 30)
    eventually(lambda: r._streams[0] is not None and r._streams[0] is not dropped)
    following = r.latestOffset(end, ReadMaxRows(10))
    assert len(offset_ids(following)) == 5
    assert not set(offset_ids(following)) & set(offset_ids(end))
    eventually(lambda: stats(client, queue)["acked"] == 10)  # with the new receipts
    r.commit(following)
    eventually(lambda: stats(client, queue)["acked"] == 15)


def test_a_redelivered_settled_message_is_acked_and_dropped(
    quorra_server: LocalServer, client: Client, queue: str, readers: list[LeaseStreamReader]
) -> None:
    ids = publish(client, queue, 6)
    r = reader(quorra_server, queue, readers, waitMs="500")
    # A restart after a batch of the first four committed (an earlier run's acks lost):
    # Spark plans the next batch from that offset, and the four are delivered again.
    start = make_offset(4, ids[:4])
    batch = r.latestOffset(start, ReadMaxRows(10))
    assert offset_ids(batch) == ids[4:]
    assert ids_of(r.partitions(start, batch)) == ids[4:]
    eventually(lambda: stats(client, queue)["acked"] == 4)


def test_options_need_token_and_queue() -> None:
    with pytest.raises(ValueError, match="queue"):
        Options.parse({"token": "t"})
    with pytest.raises(ValueError, match="leasems"):
        Options.parse({"token": "t", "queue": "q", "leaseMs": "5"})
    assert Options.parse({"token": "t", "queue": "q", "batchSize": "5000"}).batch_size == 1000
