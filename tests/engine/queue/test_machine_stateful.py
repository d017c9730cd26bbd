"""The queue machine against the plain model, over every command and the passing of time.

After every step: replies, dead-letter effects, stats, the order of ready messages
(browse), leases, live indexes and the machine's own invariants agree with the model;
a snapshot restored into a fresh machine behaves the same from then on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.errors import MessageTooLarge, QueueFull
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    DeadLetter,
    DeadLetterConfirmed,
    Enqueued,
    Expired,
    MessagesAvailable,
    NewMessage,
    Purged,
    QueueMachine,
    QueuePolicy,
    Rejected,
    Settled,
    SettledCheckedOut,
    encode_checkout,
    encode_dead_letter_confirm,
    encode_discard,
    encode_enqueue,
    encode_expire,
    encode_extend,
    encode_policy,
    encode_purge,
    encode_return,
    encode_settle,
    encode_settle_checkout,
    message_id,
)
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, ReleaseCursor
from tests.engine.queue.model import Model, Policy

LIMITS = Limits(
    page_refs=16,
    enqueue_time_resolution_ms=10,
    dedup_ids_max=6,
    dead_letter_retry_ms=1000,
    checkpoint_bytes_min=256,
    dedup_window_ms=4000,
)
START = dict(priorities=3, delivery_limit=3, lease_ms=1000, max_message_bytes=50_000)

small = st.integers(0, 200)
sizes = st.one_of(small, small, small, small, st.sampled_from([32_767, 32_768, 40_000]))
message_specs = st.tuples(
    sizes,
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(0, 3000)),
    st.one_of(st.just(0), st.just(0), st.integers(1, 3000)),
    st.one_of(st.none(), st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e"])),
)
batches = st.one_of(
    st.lists(message_specs, min_size=1, max_size=1),
    st.lists(message_specs, min_size=1, max_size=4),
    st.lists(message_specs, min_size=1, max_size=20),
)
"""Single messages and small batches take the machine's scalar path (up to
``ENQUEUE_FEW_MAX``), larger ones its numpy path."""
policy_changes = st.fixed_dictionaries(
    {},
    optional={
        "max_length": st.one_of(st.none(), st.integers(0, 15)),
        "max_bytes": st.one_of(st.none(), st.integers(0, 100_000)),
        "overflow": st.sampled_from(["reject-publish", "drop-head"]),
        "delivery_limit": st.one_of(st.none(), st.integers(1, 4)),
        "dead_letter_queue": st.one_of(st.none(), st.just("dlq")),
        "message_ttl_ms": st.one_of(st.none(), st.integers(0, 4000)),
        "lease_ms": st.integers(1, 3000),
    },
)


class QueueMachineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = QueueMachine(QueuePolicy(**START), LIMITS)  # type: ignore[arg-type]
        self.model = Model(
            Policy(**START),  # type: ignore[arg-type]
            lease_ms_max=LIMITS.lease_ms_max,
            dedup_window_ms=LIMITS.dedup_window_ms,
            dedup_ids_max=LIMITS.dedup_ids_max,
            batch_messages_max=LIMITS.batch_messages_max,
            receive_messages_max=LIMITS.receive_messages_max,
            dead_letter_retry_ms=LIMITS.dead_letter_retry_ms,
            enqueue_time_resolution_ms=LIMITS.enqueue_time_resolution_ms,
        )
        self.index = 0
        self.now = 1_000
        self.receipts: list[tuple[int, int, int]] = []
        """(tag, ref, mid) of deliveries seen, stale ones included."""
        self.dlx_refs: dict[int, int] = {}
        """mid -> ref of messages handed to dead-lettering."""

    # --- driving ------------------------------------------------------------------

    def step(self, command: bytes, on_model: Callable[[], Any], gap: int = 1) -> tuple[Any, Any]:
        """Apply ``command`` to the machine and ``on_model`` to the model, at the same
        index and time; check the effects; return (machine reply, model result)."""
        self.index += gap
        self.model.now = self.now
        ready_before = self.model.ready_count()
        expected = on_model()
        reply, effects = self.machine.apply(ApplyMeta(self.index, 1, self.now), command)
        self._check_effects(effects, ready_before)
        return reply, expected

    def _check_effects(self, effects: list[Any], ready_before: int) -> None:
        got: list[tuple[str, int]] = []
        for e in effects:
            if isinstance(e, DeadLetter):
                assert e.target == "dlq"
                for ref in e.refs:
                    parts = self.machine.ref_parts(ref)
                    mid = message_id(parts.index, parts.slot)
                    self.dlx_refs[mid] = ref
                    got.append((e.reason, mid))
            elif isinstance(e, CheckpointRequest):
                assert e.index == self.index
            elif isinstance(e, ReleaseCursor):
                live = self.model.live_indexes()
                assert e.index == (min(live) if live else self.index + 1)
            else:
                assert isinstance(e, MessagesAvailable)
        assert got == self.model.dead_letters, (got, self.model.dead_letters)
        self.model.dead_letters.clear()
        available = [e for e in effects if isinstance(e, MessagesAvailable)]
        expect = ready_before == 0 < self.model.ready_count()
        assert bool(available) == expect

    def receipts_for_model(self, chosen: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        return [(tag, mid) for tag, _ref, mid in chosen]

    # --- rules --------------------------------------------------------------------

    @rule(ms=st.one_of(st.integers(0, 12), st.integers(0, 2500)))
    def clock_moves(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: self.machine.next_deadline_ms() is not None)
    @rule(early=st.sampled_from([0, 0, 1]))
    def clock_moves_to_the_next_deadline(self, early: int) -> None:
        """Expire exactly at (or 1 ms before) the time the leader would propose it."""
        due = self.machine.next_deadline_ms()
        assert due is not None
        self.now = max(self.now, due - early)
        reply, expected = self.step(encode_expire(), self.model.expire)
        assert reply == Expired(*expected)

    @rule(specs=batches, gap=st.integers(1, 3))
    def publish(self, specs: list[Any], gap: int) -> None:
        self._publish(specs, gap)

    @rule(specs=st.lists(message_specs, min_size=1, max_size=3))
    def publish_too_large(self, specs: list[Any]) -> None:
        self._publish([*specs, (60_000, 0, None, 0, None)], 1)

    def _publish(self, specs: list[Any], gap: int) -> None:
        messages = [
            NewMessage(
                body=b"x" * (size - min(size, 3)),
                headers=b"h" * min(size, 3),
                priority=prio,
                ttl_ms=ttl,
                delay_ms=delay,
                dedup_id=key,
            )
            for size, prio, ttl, delay, key in specs
        ]
        reply, (outcome, ids, dup) = self.step(
            encode_enqueue(messages), lambda: self.model.enqueue(self.index, list(specs)), gap
        )
        if outcome == "ok":
            assert reply == Enqueued(tuple(ids or ()), tuple(dup or ()))
        else:
            assert isinstance(reply, Rejected)
            assert (
                reply.error is {"QueueFull": QueueFull, "MessageTooLarge": MessageTooLarge}[outcome]
            )

    @rule(
        consumer=st.sampled_from(["c1", "c2"]),
        n=st.one_of(st.integers(1, 8), st.integers(17, 24)),
        lease_ms=st.one_of(st.just(0), st.integers(1, 3000)),
    )
    def checkout(self, consumer: str, n: int, lease_ms: int) -> None:
        reply, expected = self.step(
            encode_checkout(consumer, n, lease_ms),
            lambda: self.model.checkout(consumer, n, lease_ms),
        )
        assert isinstance(reply, CheckedOut)
        got = []
        for d in reply.deliveries:
            parts = self.machine.ref_parts(d.ref)
            mid = message_id(parts.index, parts.slot)
            got.append((d.tag, mid, d.priority, d.delivery_count))
            self.receipts.append((d.tag, d.ref, mid))
        assert got == expected
        del self.receipts[:-60]

    @rule(
        data=st.data(),
        consumer=st.sampled_from(["c1", "c2"]),
        n=st.one_of(st.integers(1, 8), st.integers(17, 24)),
        lease_ms=st.one_of(st.just(0), st.integers(1, 3000)),
    )
    def settle_checkout(self, data: st.DataObject, consumer: str, n: int, lease_ms: int) -> None:
        """A receive carrying acks: the model settles, then checks out, at one index."""
        chosen = self._receipts(data) if self.receipts else []
        pairs = [(tag, ref) for tag, ref, _mid in chosen]
        model_receipts = self.receipts_for_model(chosen)

        def on_model() -> tuple[list[bool], list[tuple[int, int, int, int]]]:
            return self.model.settle(model_receipts), self.model.checkout(consumer, n, lease_ms)

        reply, (ok, expected) = self.step(
            encode_settle_checkout(pairs, consumer, n, lease_ms), on_model
        )
        assert isinstance(reply, SettledCheckedOut)
        stale = tuple(k for k, good in enumerate(ok) if not good)
        assert reply.settled == Settled(sum(ok), stale)
        got = []
        for d in reply.checked_out.deliveries:
            parts = self.machine.ref_parts(d.ref)
            mid = message_id(parts.index, parts.slot)
            got.append((d.tag, mid, d.priority, d.delivery_count))
            self.receipts.append((d.tag, d.ref, mid))
        assert got == expected
        del self.receipts[:-60]

    def _receipts(self, data: st.DataObject) -> list[tuple[int, int, int]]:
        receipts = st.sampled_from(self.receipts)
        chosen = data.draw(
            st.one_of(st.lists(receipts, max_size=6), st.lists(receipts, min_size=17, max_size=20))
        )
        if data.draw(st.booleans()):
            tag, ref, _mid = data.draw(st.sampled_from(self.receipts))
            chosen.append((tag, ref ^ 1, -1))  # a forged receipt: right tag, wrong message
        return chosen

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), verb=st.sampled_from(["settle", "return", "discard", "extend"]))
    def settle_like(self, data: st.DataObject, verb: str) -> None:
        chosen = self._receipts(data)
        pairs = [(tag, ref) for tag, ref, _mid in chosen]
        model_receipts = self.receipts_for_model(chosen)
        if verb == "settle":
            reply, ok = self.step(encode_settle(pairs), lambda: self.model.settle(model_receipts))
        elif verb == "return":
            reply, ok = self.step(encode_return(pairs), lambda: self.model.return_(model_receipts))
        elif verb == "discard":
            reply, ok = self.step(encode_discard(pairs), lambda: self.model.discard(model_receipts))
        else:
            lease_ms = data.draw(st.one_of(st.just(0), st.integers(1, 3000)))
            reply, ok = self.step(
                encode_extend(pairs, lease_ms), lambda: self.model.extend(model_receipts, lease_ms)
            )
        stale = tuple(k for k, good in enumerate(ok) if not good)
        assert reply == Settled(sum(ok), stale)

    @rule()
    def tick(self) -> None:
        reply, expected = self.step(encode_expire(), self.model.expire)
        assert reply == Expired(*expected)

    @rule()
    def purge(self) -> None:
        reply, count = self.step(encode_purge(), self.model.purge)
        assert reply == Purged(count)

    @rule(changes=policy_changes)
    def change_policy(self, changes: dict[str, Any]) -> None:
        reply, _ = self.step(encode_policy(changes), lambda: self.model.set_policy(changes))
        assert not isinstance(reply, Rejected), reply

    @precondition(lambda self: self.model.dlx)
    @rule(data=st.data())
    def confirm_dead_letters(self, data: st.DataObject) -> None:
        mids = data.draw(st.lists(st.sampled_from(sorted(self.model.dlx)), min_size=1))
        refs = [self.dlx_refs[mid] for mid in mids]
        reply, expected = self.step(
            encode_dead_letter_confirm(refs), lambda: self.model.confirm(mids)
        )
        assert reply == DeadLetterConfirmed(expected)

    @rule()
    def snapshot_and_restore(self) -> None:
        data = self.machine.snapshot()
        fresh = QueueMachine(QueuePolicy(), LIMITS)
        fresh.restore(data)
        assert fresh.snapshot() == data
        self.machine = fresh

    # --- invariants ---------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        m, model = self.machine, self.model
        m.check_invariants()
        s = m.stats()
        ready = model.ready_order()
        assert s.messages_ready == len(ready)
        assert s.messages_delayed == len(model.delayed)
        assert s.messages_unacked == len(model.pending)
        assert s.messages_dead_lettering == len(model.dlx)
        held = len(ready) + len(model.delayed) + len(model.pending) + len(model.dlx)
        assert m.held() == held
        assert s.bytes_ready == sum(model.msgs[mid].size for mid, _l, _d in ready)
        assert s.bytes_unacked == sum(model.msgs[x.mid].size for x in model.pending.values())
        assert s.consumers == model.consumers()
        for name, value in model.counters.items():
            assert getattr(s, name) == value, name
        assert set(m.live_indexes()) == model.live_indexes()
        pending = [(tag, message_id(*_parts(m, ref))) for tag, ref in m.pending_items()]
        assert pending == [(tag, model.pending[tag].mid) for tag in sorted(model.pending)]

    @invariant()
    def next_deadline_is_exact(self) -> None:
        """The leader's timer is never late; it is early only for a lease extended out of
        its checkout's group, whose first expiry stays armed (a spurious expire command)."""
        got, expected = self.machine.next_deadline_ms(), self.model.next_deadline()
        if any(lease.overridden for lease in self.model.pending.values()):
            assert got is not None and expected is not None and got <= expected
        else:
            assert got == expected

    @invariant()
    def browse_is_the_ready_order(self) -> None:
        m = self.machine
        whole = [
            (message_id(*_parts(m, item.ref)), item.priority, item.delivery_count)
            for item in m.browse(None, 1000)
        ]
        assert whole == self.model.ready_order()
        paged: list[tuple[int, int, int]] = []
        after = None
        while True:
            page = m.browse(after, 3)
            if not page:
                break
            paged += [(message_id(*_parts(m, i.ref)), i.priority, i.delivery_count) for i in page]
            after = page[-1].cursor
        assert paged == whole


def _parts(m: QueueMachine, ref: int) -> tuple[int, int]:
    parts = m.ref_parts(ref)
    return parts.index, parts.slot


TestQueueMachineVsModel = QueueMachineVsModel.TestCase
TestQueueMachineVsModel.settings = settings(
    max_examples=int(os.environ.get("QUORRA_QUEUE_EXAMPLES", "150")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
