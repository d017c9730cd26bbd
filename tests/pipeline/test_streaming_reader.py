"""The stream reader's lease and settle logic, driven by hand against the in-process
fake of the message endpoints (no Spark): the calls are the ones Spark makes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from pipeline.client import QuorraClient
from pipeline.options import Options
from pipeline.streaming import LeaseStreamReader
from tests.pipeline.fake_server import FakeQueue, FakeQuorra, serve


@pytest.fixture
def fake() -> Iterator[tuple[FakeQuorra, str]]:
    state = FakeQuorra()
    state.queues["q"] = FakeQueue()
    server, url = serve(state)
    try:
        yield state, url
    finally:
        server.shutdown()
        server.server_close()


def publish(url: str, n: int, start: int = 0) -> None:
    with QuorraClient(url, "t") as client:
        client.publish("q", [{"body": b"m-%d" % i} for i in range(start, start + n)])


def reader(url: str, **extra: str) -> LeaseStreamReader:
    raw = {"url": url, "token": "t", "queue": "q", "waitMs": "50", "leaseMs": "1000"}
    return LeaseStreamReader(Options.parse(raw | extra))


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def ids_of(partitions: list[Any]) -> list[int]:
    return [i for p in partitions for i in p.batch.column(0).to_pylist()]


def test_batches_are_acked_once_spark_moves_past_them(fake: tuple[FakeQuorra, str]) -> None:
    state, url = fake
    publish(url, 25)
    r = reader(url, maxMessagesPerTrigger="10")
    try:
        start = r.initialOffset()
        r._start_fetcher()
        eventually(lambda: len(state.queues["q"].leases) >= 10)
        end = r.latestOffset(start, ReadMaxRows(10))
        assert end["seq"] == 10 and len(end["ids"]) == len(set(end["ids"])) == 10
        assert ids_of(r.partitions(start, end)) == end["ids"]
        assert state.queues["q"].acked == 0  # not committed yet
        following = r.latestOffset(end, ReadMaxRows(10))  # batch ``end`` is committed
        eventually(lambda: state.queues["q"].acked == 10)
        assert not set(following["ids"]) & set(end["ids"])
        r.commit(following)
        eventually(lambda: state.queues["q"].acked == 20)
    finally:
        r.stop()
    queue = state.queues["q"]
    assert queue.acked == 20 and len(queue.ready) == 5 and not queue.leases  # rest returned


def test_a_restarted_reader_replays_the_same_batch(fake: tuple[FakeQuorra, str]) -> None:
    state, url = fake
    publish(url, 30)
    first = reader(url, maxMessagesPerTrigger="10")
    start = first.initialOffset()
    first._start_fetcher()
    eventually(lambda: len(state.queues["q"].leases) >= 10)
    end = first.latestOffset(start, ReadMaxRows(10))
    first._stopping.set()  # the driver dies: no stop(), its leases stay until they expire
    state.advance(1500)

    second = reader(url, maxMessagesPerTrigger="10")
    try:
        assert ids_of(second.partitions(start, end)) == end["ids"]
        following = second.latestOffset(end, ReadMaxRows(10))
        assert len(following["ids"]) == 10 and not set(following["ids"]) & set(end["ids"])
        eventually(lambda: state.queues["q"].acked == 10)
    finally:
        second.stop()


def test_an_expired_lease_does_not_emit_a_message_twice(fake: tuple[FakeQuorra, str]) -> None:
    state, url = fake
    publish(url, 10)
    r = reader(url, maxMessagesPerTrigger="10")
    try:
        start = r.initialOffset()
        r._start_fetcher()
        eventually(lambda: len(state.queues["q"].leases) == 10)
        end = r.latestOffset(start, ReadMaxRows(10))
        state.advance(5000)  # every lease ends: the messages are handed out again
        eventually(lambda: not state.queues["q"].ready and len(state.queues["q"].leases) == 10)
        publish(url, 5, start=10)
        following = r.latestOffset(end, ReadMaxRows(10))
        assert not set(following["ids"]) & set(end["ids"])
        eventually(lambda: state.queues["q"].acked == 10)  # acked with the new receipts
    finally:
        r.stop()


def test_a_redelivered_settled_message_is_acked_and_dropped(fake: tuple[FakeQuorra, str]) -> None:
    state, url = fake
    publish(url, 6)
    r = reader(url)
    try:
        done = [m.id for m in state.queues["q"].ready][:4]
        for i in done:
            r._done[i] = None
        fresh = r._receive(10, 0)
        assert [m.body for m in fresh] == [b"m-4", b"m-5"]
        assert state.queues["q"].acked == 4
    finally:
        r.stop()


def test_options_need_token_and_queue() -> None:
    with pytest.raises(ValueError, match="queue"):
        Options.parse({"token": "t"})
    with pytest.raises(ValueError, match="leasems"):
        Options.parse({"token": "t", "queue": "q", "leaseMs": "5"})
    assert Options.parse({"token": "t", "queue": "q", "batchSize": "5000"}).batch_size == 1000
