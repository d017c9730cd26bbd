"""A single node: every call of QueueEngine against real files under tmp_path."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from engine.errors import (
    Backpressure,
    MessageTooLarge,
    QueueConflict,
    QueueFull,
    QueueNotFound,
    RecoveryRefused,
    StorageFailed,
    ValidationFailed,
)
from engine.raft.entry import Entry
from engine.runtime import Node
from engine.runtime.api import (
    CheckpointRecord,
    CompactionRecord,
    OutgoingMessage,
    QueueArgs,
)
from engine.storage import ServerLog
from tests.engine.runtime.util import (
    FAST,
    drain,
    eventually,
    msgs,
    rolling,
    run,
    started,
    started_recording,
)


def test_publish_receive_ack(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            info, created = await node.create_queue("orders", QueueArgs())
            assert created and info.args.replicas == 1
            again, created = await node.create_queue("orders", QueueArgs())
            assert (again, created) == (info, False)
            with pytest.raises(QueueConflict):
                await node.create_queue("orders", QueueArgs(lease_ms=5))
            ids = await node.publish("orders", msgs("a", "b", "c", headers={"k": "v"}))
            assert len(set(ids)) == 3
            got = await node.receive(
                "orders", consumer="c1", max_messages=2, wait_ms=0, lease_ms=None
            )
            assert [m.body for m in got] == [b"a", b"b"]
            assert [m.id for m in got] == ids[:2]
            assert got[0].headers == {"k": "v"} and got[0].delivery_count == 1
            stats = node.stats("orders")
            assert stats["messages_ready"] == 1 and stats["messages_unacked"] == 2
            assert stats["consumers"] == {"c1": 2}
            res = await node.ack("orders", [m.receipt for m in got])
            assert (res.settled, res.stale) == (2, ())
            again_res = await node.ack("orders", [got[0].receipt])
            assert again_res.stale == (0,)
            assert await drain(node, "orders") == [b"c"]
            assert [q.name for q in node.queues()] == ["orders"]
        finally:
            await node.stop()

    run(body())


def test_errors_for_bad_input(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            for bad in ("", "a/b", "../x", "x" * 201, "sp ace"):
                with pytest.raises(ValidationFailed):
                    await node.create_queue(bad, QueueArgs())
            with pytest.raises(ValidationFailed):
                await node.create_queue("q", QueueArgs(replicas=3))
            with pytest.raises(ValidationFailed):
                await node.create_queue("q", QueueArgs(priorities=0))
            with pytest.raises(QueueNotFound):
                await node.publish("nope", msgs("x"))
            await node.create_queue("q", QueueArgs(max_message_bytes=10, max_length=2))
            with pytest.raises(MessageTooLarge):
                await node.publish("q", msgs("x" * 11))
            with pytest.raises(MessageTooLarge):
                await node.publish("q", msgs(*["x"] * 1001))
            await node.publish("q", msgs("1", "2"))
            with pytest.raises(QueueFull):
                await node.publish("q", msgs("3"))
            with pytest.raises(ValidationFailed):
                await node.receive("q", consumer="c", max_messages=0, wait_ms=0, lease_ms=None)
            assert node.stats("q")["messages_ready"] == 2
        finally:
            await node.stop()

    run(body())


def test_on_durable_runs_once_in_the_apply_before_publish_returns(tmp_path: Path) -> None:
    """A stream's confirm rides on it: called once the batch applies (so it is durable),
    before the publishing call resumes; never for a batch the machine refused."""

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("q", QueueArgs(max_length=2))
            seen: list[str] = []
            ids = await node.publish("q", msgs("a", "b"), lambda: seen.append("durable"))
            seen.append("returned")
            assert seen == ["durable", "returned"] and len(ids) == 2
            with pytest.raises(QueueFull):
                await node.publish("q", msgs("c"), lambda: seen.append("refused"))
            assert seen == ["durable", "returned"]
            assert node.stats("q")["messages_ready"] == 2
        finally:
            await node.stop()

    run(body())


def test_plain_and_other_messages_are_checked_alike(tmp_path: Path) -> None:
    """A message with every field at its default, whether given as its body alone
    (``bytes``, a ``PublishItem``) or whole, takes a shorter check than one with
    headers; all refuse the same way, and a refused message keeps its whole batch out."""

    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("q", QueueArgs(max_message_bytes=10))
            plain = OutgoingMessage(b"x" * 11, {}, 0, None, 0, None)
            headed = OutgoingMessage(b"x" * 11, {"h": ""}, 0, None, 0, None)
            for big in (b"x" * 11, plain, headed):
                with pytest.raises(MessageTooLarge) as refused:
                    await node.publish("q", [*msgs("ok"), big])
                assert "larger than 10 bytes" in refused.value.detail
            for bad in (
                OutgoingMessage(b"x", {}, False, None, 0, None),
                OutgoingMessage(b"x", {}, 0, None, False, None),
            ):
                with pytest.raises(ValidationFailed):
                    await node.publish("q", [*msgs("ok"), bad])
            assert node.stats("q")["messages_ready"] == 0
            ids = await node.publish(
                "q", [*msgs("a"), OutgoingMessage(b"b", {"k": "v"}, 0, None, 0, None), b"c"]
            )
            got = await node.receive("q", consumer="c", max_messages=3, wait_ms=0, lease_ms=None)
            assert [(m.id, m.body, m.headers, m.priority) for m in got] == [
                (ids[0], b"a", {}, 0),
                (ids[1], b"b", {"k": "v"}, 0),
                (ids[2], b"c", {}, 0),
            ]
        finally:
            await node.stop()

    run(body())


def test_nack_requeue_discard_and_dead_letter(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("dlq", QueueArgs())
            await node.create_queue("work", QueueArgs(dead_letter_queue="dlq"))
            await node.publish("work", msgs("m1", "m2"))
            got = await node.receive("work", consumer="c", max_messages=2, wait_ms=0, lease_ms=None)
            res = await node.nack("work", [got[0].receipt], requeue=True)
            assert res.settled == 1
            res = await node.nack("work", [got[1].receipt], requeue=False)
            assert res.settled == 1
            again = await node.receive(
                "work", consumer="c", max_messages=5, wait_ms=0, lease_ms=None
            )
            assert [(m.body, m.delivery_count) for m in again] == [(b"m1", 2)]
            dead = await node.receive(
                "dlq", consumer="d", max_messages=5, wait_ms=2000, lease_ms=None
            )
            assert [m.body for m in dead] == [b"m2"]
            assert dead[0].headers["x-death-reason"] == "rejected"
            assert dead[0].headers["x-death-queue"] == "work"
            await eventually_stat(node, "work", "messages_dead_lettering", 0)
        finally:
            await node.stop()

    run(body())


async def eventually_stat(node: Node, name: str, key: str, value: object) -> None:
    for _ in range(200):
        if node.stats(name)[key] == value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name}.{key} = {node.stats(name)[key]!r}, wanted {value!r}")


def test_lease_expiry_extend_and_delivery_limit(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("dead", QueueArgs())
            args = QueueArgs(lease_ms=150, delivery_limit=2, dead_letter_queue="dead")
            await node.create_queue("q", args)
            await node.publish("q", msgs("once", "keep"))
            first = await node.receive("q", consumer="c", max_messages=2, wait_ms=0, lease_ms=None)
            ext = await node.extend("q", [first[1].receipt], 5000)
            assert ext.settled == 1
            # "once" is handed out again when its lease ends, by the leader's timer command.
            second = await node.receive(
                "q", consumer="c", max_messages=5, wait_ms=2000, lease_ms=None
            )
            assert [(m.body, m.delivery_count) for m in second] == [(b"once", 2)]
            stale = await node.ack("q", [first[0].receipt])
            assert stale.stale == (0,)
            # The second lease ends too: the delivery limit sends it to the dead-letter queue.
            dead = await node.receive(
                "dead", consumer="d", max_messages=5, wait_ms=3000, lease_ms=None
            )
            assert [m.body for m in dead] == [b"once"]
            assert dead[0].headers["x-death-reason"] == "delivery_limit"
            assert (await node.ack("q", [first[1].receipt])).settled == 1
        finally:
            await node.stop()

    run(body())


def test_priorities_ttl_delay_dedup(tmp_path: Path) -> None:
    # Queue TTL is measured from samples of the leader clock taken at this resolution.
    limits = dataclasses.replace(FAST, enqueue_time_resolution_ms=10)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("p", QueueArgs(priorities=3))
            await node.publish("p", msgs("low1", "low2", priority=0))
            await node.publish("p", msgs("high", priority=2) + msgs("mid", priority=1))
            assert await drain(node, "p") == [b"high", b"mid", b"low1", b"low2"]

            await node.create_queue("t", QueueArgs(message_ttl_ms=100))
            await node.publish("t", msgs("old"))
            await node.publish("t", [OutgoingMessage(b"short", ttl_ms=50)])
            await asyncio.sleep(0.3)
            await node.publish("t", msgs("new"))
            assert await drain(node, "t") == [b"new"]
            assert node.stats("t")["expired"] == 2

            await node.create_queue("d", QueueArgs())
            await node.publish("d", [OutgoingMessage(b"later", delay_ms=300)])
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert (
                await node.receive("d", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
                == []
            )
            got = await node.receive("d", consumer="c", max_messages=1, wait_ms=3000, lease_ms=None)
            assert [m.body for m in got] == [b"later"] and 0.2 < loop.time() - t0 < 2

            await node.create_queue("u", QueueArgs())
            ids1 = await node.publish("u", msgs("x", dedup_id="k1"))
            ids2 = await node.publish("u", msgs("x", dedup_id="k1") + msgs("y", dedup_id="k2"))
            assert ids2[0] == ids1[0]
            assert await drain(node, "u") == [b"x", b"y"]

            # Messages given as (dedup id, body), as batch writers send them: a batch
            # past the few that are encoded one by one, then repeated in part.
            await node.create_queue("k", QueueArgs())
            first = await node.publish("k", [(f"row-{i}", b"r%d" % i) for i in range(40)])
            again = await node.publish("k", [(f"row-{i}", b"new") for i in range(30, 50)])
            assert again[:10] == first[30:] and len(set(again[10:]) - set(first)) == 10
            rows = [b"r%d" % i for i in range(40)] + [b"new"] * 10
            assert await drain(node, "k") == rows
            with pytest.raises(ValidationFailed, match="dedup_id"):
                await node.publish("k", [("", b"x")])
            with pytest.raises(MessageTooLarge):
                await node.publish("k", [("big", b"x" * (1 << 22))])
        finally:
            await node.stop()

    run(body())


def test_long_poll_returns_when_messages_arrive(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("lp", QueueArgs())
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            waiting = asyncio.create_task(
                node.receive("lp", consumer="c", max_messages=10, wait_ms=5000, lease_ms=None)
            )
            await asyncio.sleep(0.2)
            await node.publish("lp", msgs("ping"))
            got = await waiting
            assert [m.body for m in got] == [b"ping"]
            assert loop.time() - t0 < 1.5
            t0 = loop.time()
            none = await node.receive(
                "lp", consumer="c", max_messages=1, wait_ms=200, lease_ms=None
            )
            assert none == [] and 0.15 < loop.time() - t0 < 1.5
        finally:
            await node.stop()

    run(body())


def test_purge_browse_policy_delete(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("b", QueueArgs())
            await node.publish("b", msgs(*[f"m{i}" for i in range(5)]))
            page = await node.browse("b", after=None, limit=3)
            assert [m.body for m in page] == [b"m0", b"m1", b"m2"]
            rest = await node.browse("b", after=page[-1].cursor, limit=10)
            assert [m.body for m in rest] == [b"m3", b"m4"]
            assert node.stats("b")["messages_ready"] == 5
            info = await node.update_policy("b", {"max_length": 5, "lease_ms": 1000})
            assert info.args.max_length == 5 and info.args.lease_ms == 1000
            with pytest.raises(QueueFull):
                await node.publish("b", msgs("over"))
            with pytest.raises(ValidationFailed):
                await node.update_policy("b", {"priorities": 4})
            with pytest.raises(ValidationFailed):
                await node.update_policy("b", {"nonsense": 1})
            assert await node.purge("b") == 5
            assert node.stats("b")["messages_ready"] == 0
            await node.delete_queue("b")
            assert node.queues() == []
            assert not (tmp_path / "queues" / info.uid).exists()
            with pytest.raises(QueueNotFound):
                await node.publish("b", msgs("x"))
            await node.create_queue("b", QueueArgs())
            assert await drain(node, "b") == []
        finally:
            await node.stop()
        node = await started(tmp_path)
        try:
            assert [(q.name, q.args.max_length) for q in node.queues()] == [("b", None)]
        finally:
            await node.stop()

    run(body())


def test_restart_keeps_confirmed_messages_and_definitions(tmp_path: Path) -> None:
    limits = rolling()

    async def body() -> None:
        node = await started(tmp_path, limits)
        await node.create_queue("r", QueueArgs(priorities=2, lease_ms=60_000))
        await node.create_queue("s", QueueArgs(max_length=1000))
        ids = []
        for k in range(40):
            ids += await node.publish("r", msgs(*[f"r{k}-{i}".ljust(1500, ".") for i in range(20)]))
        got = await node.receive("r", consumer="c", max_messages=30, wait_ms=0, lease_ms=None)
        await node.ack("r", [m.receipt for m in got[:10]])
        await node.update_policy("s", {"max_length": 7})
        await node.stop()
        assert list((tmp_path / "queues").glob("*/segments/*.seg")), "the WAL rolled"

        node = await started(tmp_path, limits)
        try:
            assert {q.name: q.args.max_length for q in node.queues()} == {"r": None, "s": 7}
            stats = node.stats("r")
            assert stats["messages_unacked"] == 20 and stats["messages_ready"] == 770
            bodies = await drain(node, "r")
            assert len(bodies) == 770
            # A lease taken before the restart still holds its receipt.
            assert (await node.ack("r", [got[15].receipt])).settled == 1
        finally:
            await node.stop()

    run(body())


def test_checkpoints_compaction_and_listener(tmp_path: Path) -> None:
    limits = rolling(checkpoint_bytes_min=4096, segment_entries_max=16)

    async def body() -> None:
        node, records = await started_recording(tmp_path, limits)
        try:
            await node.create_queue("c", QueueArgs())
            manual = await node.checkpoint("c")
            assert manual.trigger == "manual" and manual.bytes > 0
            for k in range(60):
                await node.publish("c", msgs(*[f"{k}-{i}".ljust(4000, "x") for i in range(5)]))
                await drain(node, "c")
            await node.publish("c", msgs("survivor"))
            autos = [r for r in records if isinstance(r, CheckpointRecord)]
            assert autos and all(r.trigger == "auto" for r in autos)
            auto_runs = [r for r in records if isinstance(r, CompactionRecord)]
            # Compaction follows each automatic checkpoint, and says which phases ran.
            assert auto_runs and all(r.trigger == "auto" for r in auto_runs)
            assert all(r.phase != "none" and r.phase.startswith("1") for r in auto_runs)
            stats = node.stats("c")
            assert stats["checkpoint"]["index"] > 0  # type: ignore[index]
            record = await node.compact("c")
            assert record.segments_after <= record.segments_before
            assert record.bytes_after <= record.bytes_before
            none = await node.compact("c", phase=3)
            assert none.phase == "none"
            assert all(s.first_index <= s.last_index for s in node.segments("c"))
        finally:
            await node.stop()
        node = await started(tmp_path, limits)
        try:
            assert await drain(node, "c") == [b"survivor"]
        finally:
            await node.stop()

    run(body())


def test_backpressure_on_publish_bytes_in_flight(tmp_path: Path) -> None:
    limits = dataclasses.replace(FAST, inflight_publish_bytes_per_queue_max=64 * 1024)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("bp", QueueArgs())
            batch = msgs(*["x" * 20_000] * 2)
            results = await asyncio.gather(
                *(node.publish("bp", batch) for _ in range(10)), return_exceptions=True
            )
            refused = [r for r in results if isinstance(r, Backpressure)]
            done = [r for r in results if isinstance(r, list)]
            assert refused and done and len(refused) + len(done) == 10
            assert node.stats("bp")["messages_ready"] == 2 * len(done)
        finally:
            await node.stop()

    run(body())


def test_disk_error_fails_that_queue_and_the_node_stays_up(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("bad", QueueArgs())
            await node.create_queue("good", QueueArgs())
            await node.publish("bad", msgs("kept"))
            wal_file = node.context.storage.wal._file
            real_sync = wal_file.sync

            failures = [OSError(28, "No space left on device")]

            def full_disk_once() -> None:
                if failures:
                    raise failures.pop()
                real_sync()

            wal_file.sync = full_disk_once  # type: ignore[method-assign]
            with pytest.raises(StorageFailed):
                await node.publish("bad", msgs("refused"))
            assert await node.publish("good", msgs("fine"))
            with pytest.raises(StorageFailed):
                await node.publish("bad", msgs("still refused"))
            assert node.stats("bad")["status"] == "failed"
            assert node.stats("good")["status"] == "ok"
        finally:
            await node.stop()
        node = await started(tmp_path)
        try:
            assert await drain(node, "bad") == [b"kept"]
            assert await drain(node, "good") == [b"fine"]
        finally:
            await node.stop()

    run(body())


def test_backpressure_on_requests_in_flight(tmp_path: Path) -> None:
    limits = dataclasses.replace(FAST, inflight_requests_per_node_max=2)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("polls", QueueArgs())
            polls = [
                asyncio.create_task(
                    node.receive("polls", consumer="c", max_messages=1, wait_ms=3000, lease_ms=None)
                )
                for _ in range(2)
            ]
            await asyncio.sleep(0.1)
            with pytest.raises(Backpressure):
                await node.publish("polls", msgs("one"))
            for task in polls:
                task.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
            assert await node.publish("polls", msgs("two"))
        finally:
            await node.stop()

    run(body())


def test_unrecoverable_queue_is_refused_and_the_others_serve(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            broken, _ = await node.create_queue("broken", QueueArgs())
            await node.create_queue("fine", QueueArgs())
            await node.publish("broken", msgs("x"))
            await node.publish("fine", msgs("y"))
        finally:
            await node.stop()
        segments = sorted((tmp_path / "queues" / broken.uid / "segments").glob("*.seg"))
        assert segments, "a clean stop writes segments"
        with open(segments[0], "r+b") as f:
            f.write(b"garbage!")
        node = await started(tmp_path)
        try:
            assert sorted(q.name for q in node.queues()) == ["broken", "fine"]
            assert node.stats("broken")["status"] == "failed"
            with pytest.raises(RecoveryRefused, match="no other member to repair it from"):
                await node.publish("broken", msgs("z"))
            assert segments[0].read_bytes()[:8] == b"garbage!", "its files are left alone"
            assert await drain(node, "fine") == [b"y"]
        finally:
            await node.stop()

    run(body())


def test_raft_uncommitted_bytes_limit_is_backpressure(tmp_path: Path) -> None:
    limits = dataclasses.replace(FAST, uncommitted_bytes_max=64 * 1024)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("u", QueueArgs())
            batch = msgs(*["x" * 10_000] * 4)
            # Proposed on one turn of the loop, before anything commits.
            results = await asyncio.gather(
                *(node.publish("u", batch) for _ in range(4)), return_exceptions=True
            )
            assert any(isinstance(r, Backpressure) for r in results)
            assert any(isinstance(r, list) for r in results)
        finally:
            await node.stop()

    run(body())


def test_replay_after_restart_does_not_repeat_leader_effects(tmp_path: Path) -> None:
    # A dedup window too short to hide a repeated dead-letter publish.
    limits = dataclasses.replace(FAST, dedup_window_ms=1)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("dlq", QueueArgs())
            await node.create_queue("src", QueueArgs(dead_letter_queue="dlq"))
            await node.publish("src", msgs("doomed"))
            got = await node.receive("src", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
            await node.nack("src", [got[0].receipt], requeue=False)
            dead = await node.receive(
                "dlq", consumer="d", max_messages=5, wait_ms=2000, lease_ms=None
            )
            assert [m.body for m in dead] == [b"doomed"]
            await node.ack("dlq", [dead[0].receipt])
        finally:
            await node.stop()
        node = await started(tmp_path, limits)
        try:
            await asyncio.sleep(0.3)
            assert node.stats("dlq")["published"] == 1
            assert await drain(node, "dlq") == []
        finally:
            await node.stop()

    run(body())


def test_restart_after_a_promoted_snapshot_reads_no_live_payload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        await node.create_queue("deep", QueueArgs())
        for k in range(20):
            await node.publish("deep", msgs(*[f"{k}-{i}" for i in range(100)]))
        await node.checkpoint("deep")
        await node.compact("deep")
        await node.publish("deep", msgs("tail-1", "tail-2"))
        snapshot_index = node.stats("deep")["log"]["snapshot_index"]  # type: ignore[index]
        assert snapshot_index > 20  # one entry per published batch
        await node.stop()

        reads: list[int] = []
        read = ServerLog.read

        def counting(self: ServerLog, index: int) -> Entry:
            reads.append(index)
            return read(self, index)

        monkeypatch.setattr(ServerLog, "read", counting)
        node = await started(tmp_path)
        try:
            assert [i for i in reads if i <= snapshot_index] == [], "no live entry was read"
            rep = node.context.replicas["deep"]
            assert rep.raft.snapshot is None and rep.raft.log.snapshot_index == snapshot_index
            assert node.stats("deep")["messages_ready"] == 2002
            bodies = await drain(node, "deep")
            assert len(bodies) == 2002 and bodies[0] == b"0-0" and bodies[-1] == b"tail-2"
        finally:
            await node.stop()

    run(body())


def test_a_queue_whose_messages_all_stay_checkpoints_so_a_restart_replays_little(
    tmp_path: Path,
) -> None:
    """No message is settled, so no dead byte asks for a checkpoint; the replay bound
    (``Limits.replay_bytes_max``) does, and the restart applies only the log after it."""
    entry_bytes = 10 * 1024
    limits = rolling(replay_bytes_max=8 * entry_bytes)

    async def body() -> None:
        node, records = await started_recording(tmp_path, limits)
        await node.create_queue("deep", QueueArgs())
        for k in range(40):
            await node.publish("deep", msgs(*[f"{k}-{i}".ljust(1024, "x") for i in range(10)]))
        await eventually(lambda: any(isinstance(r, CheckpointRecord) for r in records))
        assert all(r.trigger == "auto" for r in records)
        last = node.stats("deep")["log"]["last_index"]  # type: ignore[index]
        await node.stop()
        node = await started(tmp_path, limits)
        try:
            rep = node.context.replicas["deep"]
            assert last - rep.base_index <= 8 + 1  # at most the bound's worth applied again
            assert node.stats("deep")["messages_ready"] == 400
        finally:
            await node.stop()

    run(body())


def test_a_clean_stop_checkpoints_so_the_next_start_applies_nothing_again(
    tmp_path: Path,
) -> None:
    limits = rolling(replay_bytes_max=64 << 20)  # no checkpoint while publishing

    async def body() -> None:
        node = await started(tmp_path, limits)
        await node.create_queue("deep", QueueArgs())
        for k in range(20):
            await node.publish("deep", msgs(*[f"{k}-{i}".ljust(1024, "x") for i in range(100)]))
        await node.publish("deep", msgs("last"))
        assert node.stats("deep")["checkpoint"]["index"] == 0  # type: ignore[index]
        last = node.stats("deep")["log"]["last_index"]  # type: ignore[index]
        await node.stop()
        node = await started(tmp_path, limits)
        try:
            assert node.context.replicas["deep"].base_index == last
            bodies = await drain(node, "deep")
            assert len(bodies) == 2001 and bodies[-1] == b"last"
        finally:
            await node.stop()

    run(body())


def test_creates_at_once_write_their_definitions_together_within_the_queue_limit(
    tmp_path: Path,
) -> None:
    """Creates run at once (their definitions' writes overlap), yet the node's queue
    limit counts those under way: of 12 creates at once on a node of at most 8 queues,
    8 succeed and 4 are refused; the same replica created twice at once is one."""
    limits = dataclasses.replace(FAST, queues_per_node_max=8)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            names = [f"q{n:02d}" for n in range(12)]
            got = await asyncio.gather(
                *(node.create_queue(name, QueueArgs()) for name in names),
                return_exceptions=True,
            )
            made = [name for name, g in zip(names, got, strict=True) if isinstance(g, tuple)]
            refused = [g for g in got if isinstance(g, ValidationFailed)]
            assert len(made) == 8 and len(refused) == 4, got
            assert sorted(q.name for q in node.queues()) == sorted(made)
            catalog = node.context.catalog
            meta = node.context.replica(made[0]).meta
            await node.delete_queue(made[0])
            await asyncio.gather(catalog.create_replica(meta), catalog.create_replica(meta))
            assert node.context.replica(made[0]).meta == meta and not catalog.creating
        finally:
            await node.stop()
        node = await started(tmp_path, limits)
        try:
            assert sorted(q.name for q in node.queues()) == sorted(made)
        finally:
            await node.stop()

    run(body())


def test_a_summary_is_the_stats_counts_and_memory_without_the_log(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path)
        try:
            await node.create_queue("q", QueueArgs())
            await node.publish("q", msgs("a", "b", "c"))
            await node.receive("q", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
            summary, stats = node.summary("q"), node.stats("q")
            assert set(summary) < set(stats) and "log" not in summary
            rates = {"publish_rate", "deliver_rate", "ack_rate"}
            assert {k: v for k, v in summary.items() if k not in rates} == {
                k: stats[k] for k in summary if k not in rates
            }
            assert summary["messages_ready"] == 2 and summary["consumers"] == {"c": 1}
        finally:
            await node.stop()

    run(body())
