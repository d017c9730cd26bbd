"""A sleeping queue's record (engine.runtime.sleeping): put to sleep and woken at random
points, a machine delivers, settles and snapshots exactly as one that never slept (the
queue machine's model test, with sleeping as one more step); its stats are read from the
record; and the record is a fraction of the machine it replaces."""

from __future__ import annotations

import dataclasses
import gc
import os
import tracemalloc

from hypothesis import HealthCheck, settings
from hypothesis.stateful import precondition, rule

from engine.queue import NewMessage, QueueMachine, encode_checkout, encode_enqueue
from engine.raft.state_machine import ApplyMeta
from engine.runtime.sleeping import (
    may_sleep,
    put_to_sleep,
    raft_positions,
    summary_fields,
    wake,
)
from tests.engine.queue.test_machine_stateful import LIMITS, QueueMachineVsModel
from tests.engine.raft.harness import Cluster, sid


class SleepingVsModel(QueueMachineVsModel):
    """Every check of the model test holds after each wake (its invariants run after
    every step, deliveries and receipts included)."""

    @precondition(lambda self: may_sleep(self.machine))
    @rule()
    def sleep_and_wake(self) -> None:
        before = self.machine.snapshot()
        stats = self.machine.stats()
        record = put_to_sleep(self.machine)
        assert record.stats == stats, "stats are served from the record as they were"
        assert summary_fields(record.packed_stats) == (
            stats.messages_ready,
            stats.messages_unacked,
            stats.bytes_ready,
            dict(stats.consumers),
            stats.memory_bytes,
            dataclasses.asdict(stats.memory),
        )
        self.machine = wake(record, LIMITS)
        assert self.machine.snapshot() == before


TestSleepingVsModel = SleepingVsModel.TestCase
TestSleepingVsModel.settings = settings(
    max_examples=int(os.environ.get("QUORRA_QUEUE_EXAMPLES", "100")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _idle_machine(n: int) -> QueueMachine:
    m = QueueMachine()
    msgs = [NewMessage(body=b"m" * 64, headers=b"") for _ in range(10)]
    m.apply(ApplyMeta(n + 1, 1, 1_000), encode_enqueue(msgs))
    return m


def test_a_leased_or_delayed_queue_does_not_sleep() -> None:
    m = _idle_machine(0)
    assert may_sleep(m)
    m.apply(ApplyMeta(2, 1, 1_000), encode_checkout("c", 1, 1_000))
    assert not may_sleep(m)
    d = QueueMachine()
    d.apply(ApplyMeta(1, 1, 1_000), encode_enqueue([NewMessage(b"x", b"", delay_ms=5)]))
    assert not may_sleep(d)


SLEEPING_BYTES_MAX = 500
"""An idle queue of 10 messages as a record: its snapshot less the policy it shares with
the other records, the record and its packed stats, about 310 B by tracemalloc (450 B
before the records shared their policies); its machine alone holds about 1.7 KB."""


def test_a_sleeping_queue_is_a_fraction_of_its_machine() -> None:
    queues = 200
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        machines = [_idle_machine(n) for n in range(queues)]
        awake = (tracemalloc.get_traced_memory()[0] - base) / queues
        records = [put_to_sleep(m) for m in machines]
        del machines
        gc.collect()
        asleep = (tracemalloc.get_traced_memory()[0] - base) / queues
    finally:
        tracemalloc.stop()
    assert len(records) == queues
    assert asleep <= SLEEPING_BYTES_MAX, (asleep, awake)
    assert asleep < awake / 2, (asleep, awake)


def test_the_record_keeps_a_lone_leaders_raft_positions() -> None:
    c = Cluster(["a"])
    c.elect("a")
    a = c["a"]
    got = raft_positions(a)
    assert (got.term, got.vote, got.commit) == (a.term, sid("a"), a.commit)
    assert got.applied == a.applied and got.last_index == a.log.last_index() >= 1
    assert got.last_term == a.term and got.configuration == a.config
    assert put_to_sleep(_idle_machine(0), got).raft == got


def test_records_of_one_policy_share_their_snapshot_head() -> None:
    """The policy is most of a small queue's snapshot and the same for most queues of a
    node: one copy of it serves every record, and each record gives back its whole
    snapshot."""
    machines = [_idle_machine(n) for n in range(3)]
    records = [put_to_sleep(m) for m in machines]
    assert records[0].head is records[1].head is records[2].head
    for m, r in zip(machines, records, strict=True):
        assert r.snapshot == m.snapshot()
        assert len(r.rest) < len(r.snapshot) / 2
        assert wake(r).snapshot() == m.snapshot()
