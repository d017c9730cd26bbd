"""The real queue machine drives the real storage: priorities, delayed messages, returns
and acks in random order leave holes in the log; compaction after each checkpoint keeps
every entry the machine still needs and reclaims the rest down to the ratio."""

from __future__ import annotations

import random

import pytest

from engine.queue import read_message
from engine.queue.machine import QueueMachine
from engine.storage import FakeDisk
from tests.engine.storage.compaction.conftest import (
    UID,
    QueueDriver,
    assert_intact,
    dead_and_live,
    limits,
    reopen,
)

LIMITS = limits(wal_file_bytes_max=4096, wal_batch_bytes_max=2048)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_queue_workload_with_holes_compacts_and_keeps_every_live_message(seed: int) -> None:
    rng = random.Random(seed)
    disk = FakeDisk()
    driver = QueueDriver(reopen(disk, LIMITS), rng)
    driver.publish(20, delay_ms=10**9)  # delayed: live for the whole test, at the start
    phases: set[int] = set()
    for _ in range(6):
        driver.publish(rng.randrange(60, 120))
        driver.receive(rng.randrange(40, 100))
        driver.settle_random(rng.uniform(0.4, 0.9))
        driver.return_random(0.3)
        live = driver.checkpoint()
        result = driver.storage.compact(UID, "auto")
        assert result.snapshot_index == driver.index
        phases.update(result.phases)
        dead, live_n = dead_and_live(driver.storage)
        mem = driver.storage.log(UID).mem
        in_mem = live.range_cardinality(mem.lo, mem.hi + 1) if len(mem) else 0
        assert live_n + in_mem == len(live)
        assert dead * 100 <= LIMITS.compaction_dead_per_100_live_max * live_n
        assert_intact(driver.storage, live, driver.index, driver.data)
    assert min(live) <= 20  # the delayed messages pinned the head of the log
    assert phases == {1, 2, 3}, phases
    # restart: the checkpoint and the live entries are all a new replica needs
    storage = reopen(disk, LIMITS)
    assert_intact(storage, live, driver.index, driver.data)
    cp = storage.open_server(UID).checkpoint
    assert cp is not None and cp.live_indexes == live
    machine = QueueMachine(driver.machine.policy)
    machine.restore(bytes(cp.state))
    assert machine.live_indexes() == live
    for item in machine.browse(limit=10_000):
        parts = machine.ref_parts(item.ref)
        body = read_message(storage.log(UID).read(parts.index).data, parts.slot).body
        assert bytes(body).startswith(b"m")
