"""Idle queues sleep and wake (engine/runtime/hibernation.py) on a real node: each kind
of request wakes a sleeping queue and gets what it would have got awake; stats are read
without waking it; a crash or a stop while it sleeps loses nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from engine.errors import QueueFull, QueueNotFound
from engine.runtime import Node
from engine.runtime.api import QueueArgs
from engine.runtime.replica import Replica
from tests.engine.runtime.util import FAST, drain, eventually, msgs, run, started

SLEEPY = dataclasses.replace(FAST, queue_sleep_idle_ms=100, queue_sleep_sweep_ms=20)
BODIES = [b"one", b"two", b"three"]


def rep_of(node: Node, name: str) -> Replica:
    return node.context.replicas[name]


def asleep(node: Node, name: str) -> bool:
    return rep_of(node, name).dormant is not None


async def all_asleep(node: Node, names: list[str]) -> None:
    await eventually(lambda: all(asleep(node, n) for n in names), what=f"{names} asleep")


async def filled(node: Node, names: list[str]) -> None:
    for name in names:
        await node.create_queue(name, QueueArgs())
        await node.publish(name, msgs(*BODIES))


def test_a_sleeping_queue_serves_its_stats_without_waking(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path, SLEEPY)
        try:
            await filled(node, ["s"])
            awake = node.stats("s")
            await all_asleep(node, ["s"])
            woken = node.context.hibernation.woken
            stats = node.stats("s")
            summary = node.summary("s")
            fresh = await node.fresh_stats("s")
            assert node.memory()["queues"] == 1
            assert node.leader_of("s") == node.name
            assert [q.name for q in node.queues()] == ["s"]
            assert node.segments("s") is not None
            assert node.context.hibernation.woken == woken and asleep(node, "s")
            for key in ("messages_ready", "bytes_ready", "published", "checkpoint", "log"):
                assert stats[key] == awake[key] == fresh[key], key
            raft, was = stats["raft"], awake["raft"]
            assert isinstance(raft, dict) and isinstance(was, dict)
            assert (raft["role"], raft["term"], raft["leader"]) == (
                was["role"],
                was["term"],
                was["leader"],
            )
            assert summary["messages_ready"] == 3 and summary["publish_rate"] == 0.0
        finally:
            await node.stop()

    run(body())


def test_each_kind_of_request_wakes_a_sleeping_queue(tmp_path: Path) -> None:
    names = ["pub", "recv", "browse", "policy", "purge", "cp", "compact", "delete"]

    async def body() -> None:
        node = await started(tmp_path, SLEEPY)
        try:
            await filled(node, names)
            await all_asleep(node, names)
            hib = node.context.hibernation
            woken = hib.woken

            # Concurrent requests during one wake: one wake, every publish answered.
            ids = await asyncio.gather(*[node.publish("pub", msgs(b"four")) for _ in range(4)])
            assert len({i for batch in ids for i in batch}) == 4
            assert hib.woken == woken + 1 and not asleep(node, "pub")
            assert await drain(node, "pub") == [*BODIES, *[b"four"] * 4]

            got = await node.receive(
                "recv", consumer="c", max_messages=10, wait_ms=0, lease_ms=None
            )
            assert [m.body for m in got] == BODIES
            assert (await node.ack("recv", [m.receipt for m in got])).settled == 3

            page = await node.browse("browse", after=None, limit=10)
            assert [m.body for m in page] == BODIES

            info = await node.update_policy("policy", {"max_length": 3})
            assert info.args.max_length == 3

            assert await node.purge("purge") == 3
            applied = rep_of(node, "cp").applied_index  # read from the record
            assert (await node.checkpoint("cp")).index == applied
            await node.compact("compact", phase="auto")
            await node.delete_queue("delete")
            with pytest.raises(QueueNotFound):
                await node.browse("delete", after=None, limit=1)
            assert hib.woken >= woken + 7

            # Awake again, they sleep again once idle, and wake as before.
            await all_asleep(node, ["pub", "recv", "browse", "policy"])
            await node.publish("browse", msgs(b"four"))
            assert await drain(node, "browse") == [*BODIES, b"four"]
            with pytest.raises(QueueFull):  # its policy slept and woke with it
                await node.publish("policy", msgs(b"four"))
        finally:
            await node.stop()

    run(body())


def test_a_busy_queue_does_not_sleep(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path, SLEEPY)
        try:
            await filled(node, ["leased", "polled", "idle"])
            got = await node.receive(
                "leased", consumer="c", max_messages=1, wait_ms=0, lease_ms=None
            )
            await drain(node, "polled")
            poll = asyncio.ensure_future(
                node.receive("polled", consumer="c", max_messages=1, wait_ms=2_000, lease_ms=None)
            )
            await all_asleep(node, ["idle"])
            await asyncio.sleep(0.3)
            assert not asleep(node, "leased") and not asleep(node, "polled")
            await node.publish("polled", msgs(b"late"))
            assert [m.body for m in await poll] == [b"late"]
            await node.ack("leased", [m.receipt for m in got])
        finally:
            await node.stop()

    run(body())


@pytest.mark.parametrize("crash", [True, False])
def test_a_crash_or_a_stop_while_asleep_loses_nothing(tmp_path: Path, crash: bool) -> None:
    async def body() -> None:
        node = await started(tmp_path, SLEEPY)
        await filled(node, ["a", "b"])
        got = await node.receive("b", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
        await node.ack("b", [m.receipt for m in got])
        await all_asleep(node, ["a", "b"])
        await (node.halt() if crash else node.stop())
        node = await started(tmp_path, SLEEPY)
        try:
            assert await drain(node, "a") == BODIES
            assert await drain(node, "b") == BODIES[1:]
            await all_asleep(node, ["a", "b"])  # after a restart they sleep again
            await node.publish("a", msgs(b"after"))
            assert await drain(node, "a") == [b"after"]
        finally:
            await node.stop()

    run(body())


def _log_files(data_dir: Path) -> int:
    """Segment and checkpoint files of the node's queues."""
    return sum(1 for p in data_dir.rglob("*") if p.suffix in (".seg", ".chk"))


@pytest.mark.parametrize("restart", [False, True])
def test_a_queue_woken_again_and_again_keeps_a_bounded_log(tmp_path: Path, restart: bool) -> None:
    """Each wake writes entries of its own (its election, a receive, an ack) that reach a
    segment of their own: 15 wakes, asleep or restarted between them, once left 15 more
    files; the queue is checkpointed and compacted before it sleeps or stops once it
    wrote ``queue_sleep_segments_max`` of them, and delivers what it held as before."""
    limits = dataclasses.replace(SLEEPY, wal_idle_roll_ms=50)
    bodies = [b"m%d" % i for i in range(20)]
    bound = limits.queue_sleep_segments_max + 4  # plus the newest, a checkpoint, the bodies

    async def body() -> None:
        node = await started(tmp_path, limits)
        await node.create_queue("q", QueueArgs())
        await node.publish("q", msgs(*bodies))
        got_bodies: list[bytes] = []
        try:
            for _ in range(15):
                # Asleep before the stop too: a queue still busy at a stop (its definition
                # being written, say, on a loaded machine) restarts awake, which is right
                # but not what this counts.
                await all_asleep(node, ["q"])
                if restart:
                    await node.stop()
                    node = await started(tmp_path, limits)
                assert asleep(node, "q")  # back asleep after the restart too
                got = await node.receive(
                    "q", consumer="c", max_messages=1, wait_ms=0, lease_ms=None
                )
                await node.ack("q", [m.receipt for m in got])
                got_bodies += [m.body for m in got]
                await asyncio.sleep(0.15)  # the WAL rolls: the wake's entries reach a segment
                assert _log_files(tmp_path) <= bound
            assert got_bodies + await drain(node, "q") == bodies
        finally:
            await node.stop()

    run(body())


def test_a_queue_falling_asleep_leaves_the_read_cache(tmp_path: Path) -> None:
    """The blocks its deliveries read from segments are dropped when it sleeps (it reads
    nothing until it wakes); a wake reads them again."""
    limits = dataclasses.replace(SLEEPY, wal_idle_roll_ms=50)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            bodies = [b"%d" % n * 200 for n in range(3)]  # past what a WAL roll carries
            await node.create_queue("q", QueueArgs())
            await node.publish("q", msgs(*bodies))
            await eventually(lambda: node.memory()["mem_table_bytes"] == 0, what="flushed")
            got = await node.receive("q", consumer="c", max_messages=1, wait_ms=0, lease_ms=None)
            await node.ack("q", [m.receipt for m in got])
            assert node.memory()["read_cache_blocks"] == 1  # read from its segment
            await all_asleep(node, ["q"])
            assert node.memory()["read_cache_blocks"] == 0
            assert node.memory()["read_cache_bytes"] == 0
            assert await drain(node, "q") == bodies[1:]
        finally:
            await node.stop()

    run(body())


def test_a_sleeping_queue_keeps_its_log_packed_and_is_read_so(tmp_path: Path) -> None:
    """Asleep, its storage log is packed (its last entries too, in its mem table until
    the WAL's idle roll flushes or carries them); stats, segments and the node's memory
    read it without unpacking it, and a wake unpacks it as it was."""
    limits = dataclasses.replace(SLEEPY, wal_idle_roll_ms=300)

    async def body() -> None:
        node = await started(tmp_path, limits)
        storage = node.context.storage
        try:
            await filled(node, ["s"])
            uid = rep_of(node, "s").uid
            await all_asleep(node, ["s"])
            assert storage.log_packed(uid)
            await asyncio.sleep(0.6)  # a WAL roll and its flush
            stats, segments = node.stats("s"), node.segments("s")
            assert node.memory()["queues"] == 1 and node.summary("s")["messages_ready"] == 3
            assert segments is not None
            assert storage.log_packed(uid) and asleep(node, "s")
            await node.publish("s", msgs(b"four"))
            assert not storage.log_packed(uid)
            log, was = node.stats("s")["log"], stats["log"]
            assert isinstance(log, dict) and isinstance(was, dict)
            assert log["snapshot_index"] == was["snapshot_index"]
            assert log["last_index"] > was["last_index"]
            assert await drain(node, "s") == [*BODIES, b"four"]
        finally:
            await node.stop()

    run(body())


def test_a_sweep_that_hit_its_cap_runs_again_soon(tmp_path: Path) -> None:
    """Idle queues beyond ``queue_sleep_sweep_max`` a run are put to sleep by runs that
    follow after ``queue_sleep_catch_up_ms``, not a whole ``queue_sleep_sweep_ms`` later
    (a burst of woken queues would stay awake, and their memory held, for many runs)."""
    limits = dataclasses.replace(
        FAST,
        queue_sleep_idle_ms=50,
        queue_sleep_sweep_ms=1_000,
        queue_sleep_sweep_max=2,
        queue_sleep_catch_up_ms=10,
    )
    names = [f"q{n}" for n in range(8)]

    async def body() -> None:
        node = await started(tmp_path, limits)
        hibernation = node.context.hibernation
        sweep = hibernation.sweep
        runs: list[tuple[float, int]] = []

        def recorded(now_ms: int) -> int:
            slept = sweep(now_ms)
            runs.append((asyncio.get_running_loop().time(), slept))
            return slept

        hibernation.sweep = recorded  # type: ignore[method-assign]
        try:
            await filled(node, names)
            await all_asleep(node, names)
            capped = [i for i, (_, slept) in enumerate(runs[:-1]) if slept == 2]
            assert len(capped) >= 3, runs  # eight queues, two a run
            for i in capped:
                assert runs[i + 1][0] - runs[i][0] < 0.5, runs  # not the 1 s of a sweep
        finally:
            await node.stop()

    run(body())


@pytest.mark.parametrize("least", [3, 100])
def test_queues_falling_asleep_together_are_followed_by_a_trim(tmp_path: Path, least: int) -> None:
    """A sweep that put at least ``bulk_free_trim_min`` queues to sleep has the C
    allocator's free memory given back at once (``Node.trim_memory_with``); fewer do not."""
    limits = dataclasses.replace(SLEEPY, bulk_free_trim_min=least, queue_sleep_sweep_ms=1_000)
    names = [f"q{n}" for n in range(4)]

    async def body() -> None:
        node = await started(tmp_path, limits)
        trims: list[int] = []
        node.trim_memory_with(lambda: trims.append(1))
        try:
            await filled(node, names)
            await all_asleep(node, names)
            await asyncio.sleep(0.1)  # the trim runs on a worker
            if least == 3:
                await eventually(lambda: len(trims) >= 1, what="a trim")
            else:
                assert trims == []
        finally:
            await node.stop()

    run(body())
