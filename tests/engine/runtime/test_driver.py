"""The replica driver's ordering rules, with a scripted core: what is written, what is
sent at once, what waits for the disk, and when a repair ends."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from engine.ids import ServerId
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Event, HardState, Persisted, Ready
from engine.raft.messages import AppendResponse, Message, VoteResponse
from engine.raft.options import Fault
from engine.raft.server import RaftServer
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import ApplyMeta, Machine, MachineEffect
from engine.runtime.driver import ReplicaDriver

A, B = ServerId("a"), ServerId("b")


class ScriptedCore:
    """Hands out the given ``Ready``s one by one and records what it is told."""

    def __init__(self, readies: list[Ready]) -> None:
        self.readies = list(readies)
        self.applied = 0
        self.stepped: list[Event] = []

    def has_ready(self) -> bool:
        return bool(self.readies)

    def ready(self) -> Ready:
        return self.readies.pop(0) if self.readies else Ready()

    def step(self, event: Event) -> None:
        self.stepped.append(event)


class Counter:
    """A machine that counts the commands it applies."""

    def __init__(self) -> None:
        self.applied: list[int] = []

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        self.applied.append(meta.index)
        return len(self.applied), []

    def restore(self, data: bytes) -> None:
        self.applied = []


class Host:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.sent: list[Message] = []

    def on_ready(self, rd: Ready) -> None:
        pass

    def write_hard_state(self, hs: HardState) -> None:
        self.log.append(f"write vote {hs.term}/{hs.vote}")

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        self.log.append(f"install {snapshot.index}")

    def append_entries(self, entries: list[Entry]) -> None:
        self.log.append(f"append {entries[0].index}..{entries[-1].index}")

    def writes_queued(self) -> None:
        self.log.append("flush")

    def send(self, message: Message) -> None:
        self.sent.append(message)
        self.log.append(f"send {type(message).__name__} term {message.term}")

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        self.log.append(f"applied {entry.index}")

    def passed(self, entry: Entry) -> None:
        self.log.append(f"passed {entry.index}")

    def accepted(self, accepted: object) -> None: ...

    def rejected(self, rejected: object) -> None: ...

    def completed(self, completed: object) -> None: ...

    def read_ready(self, read: object) -> None: ...

    def repaired(self) -> None:
        self.log.append("repaired")


def _vote(term: int) -> VoteResponse:
    return VoteResponse(src=A, dst=B, term=term, granted=True, pre=False)


def _entry(index: int, kind: EntryKind = EntryKind.COMMAND) -> Entry:
    return Entry(index, 1, kind, 0, b"x")


def _driver(readies: list[Ready], **kwargs: object) -> tuple[ReplicaDriver, Host, Counter]:
    host, machine = Host(), Counter()
    core = cast(RaftServer, ScriptedCore(readies))
    driver = ReplicaDriver(core, cast(Machine, machine), host, **kwargs)  # type: ignore[arg-type]
    return driver, host, machine


def test_a_vote_goes_out_only_once_it_is_durable() -> None:
    rd = Ready(hard_state=HardState(2, B, 0), messages_after_persist=[_vote(2)])
    driver, host, _ = _driver([rd])
    driver.process()
    assert host.log == ["write vote 2/b", "flush"]
    driver.written(None)
    assert host.log[-1] == "send VoteResponse term 2"


def test_a_change_of_commit_alone_is_not_written() -> None:
    rd = Ready(hard_state=HardState(2, B, 7), messages_after_persist=[_vote(2)])
    driver, host, _ = _driver([rd], hard_state_written=(2, "b"))
    driver.process()
    assert host.log == ["send VoteResponse term 2"]  # nothing pending: sent at once


def test_messages_wait_for_every_write_queued_before_them_in_order() -> None:
    first = Ready(entries_to_persist=[_entry(1)], messages_after_persist=[_vote(1)])
    second = Ready(entries_to_persist=[_entry(2)], messages_after_persist=[_vote(2)])
    driver, host, _ = _driver([first, second])
    driver.process()
    assert not [line for line in host.log if line.startswith("send")]
    driver.written(Persisted(1, 1))
    assert host.log[-1] == "send VoteResponse term 1"
    driver.written(Persisted(2, 1))
    assert host.log[-1] == "send VoteResponse term 2"
    assert not driver.writes_pending()


def _ack(match_index: int, term: int = 1, success: bool = True) -> AppendResponse:
    return AppendResponse(
        src=A,
        dst=B,
        term=term,
        success=success,
        match_index=match_index if success else 0,
        rejected_prev_index=0 if success else match_index,
        conflict_term=0,
        conflict_index=0,
    )


def _appending(held: list[Message]) -> tuple[ReplicaDriver, Host]:
    """A driver with one append queued per message of ``held``, each holding it."""
    readies = [
        Ready(entries_to_persist=[_entry(n + 1)], messages_after_persist=[message])
        for n, message in enumerate(held)
    ]
    driver, host, _ = _driver(readies)
    driver.process()
    assert not host.sent
    return driver, host


def test_acknowledgements_made_durable_by_one_write_go_as_the_last() -> None:
    driver, host = _appending([_ack(1), _ack(2), _ack(3)])
    driver.written_all([Persisted(1, 1), Persisted(2, 1), Persisted(3, 1)])
    assert host.sent == [_ack(3)]
    assert [type(e) for e in cast(ScriptedCore, driver.raft).stepped] == [Persisted] * 3
    assert not driver.writes_pending()


def test_acknowledgements_made_durable_one_by_one_go_one_by_one() -> None:
    driver, host = _appending([_ack(1), _ack(2)])
    driver.written(Persisted(1, 1))
    driver.written(Persisted(2, 1))
    assert host.sent == [_ack(1), _ack(2)]


def test_an_acknowledgement_is_kept_unless_the_next_message_says_all_of_it() -> None:
    # A vote after it, another term, a refusal: nothing says what the one before said.
    held: list[Message] = [_ack(1), _vote(2), _ack(2), _ack(3, term=2), _ack(4, success=False)]
    held.append(_ack(5))
    driver, host = _appending(held)
    driver.written_all([None] * len(held))
    assert host.sent == held


def test_an_acknowledgement_is_left_out_only_for_a_later_one_at_least_as_far() -> None:
    held: list[Message] = [_ack(1), _ack(3), _ack(2), _vote(2), _ack(4), _ack(4)]
    driver, host = _appending(held)
    driver.written_all([None] * 4)
    assert host.sent == [_ack(3), _ack(2), _vote(2)]
    driver.written_all([None, None])
    assert host.sent == [_ack(3), _ack(2), _vote(2), _ack(4)]


def test_a_repair_ends_once_the_vote_it_wrote_is_durable() -> None:
    rd = Ready(hard_state=HardState(3, B, 0), repaired=True)
    driver, host, _ = _driver([rd])
    driver.process()
    assert "repaired" not in host.log
    driver.written(None)
    assert host.log[-1] == "repaired"


def test_entries_held_by_the_restored_state_are_not_applied_again() -> None:
    entries = [_entry(1), _entry(2, EntryKind.CONFIG), _entry(3), _entry(4)]
    driver, host, machine = _driver([Ready(committed_entries=entries)], base_index=3)
    driver.process()
    assert machine.applied == [4]
    assert host.log == ["passed 1", "passed 2", "passed 3", "applied 4"]
    assert (driver.applied_index, driver.applied_term) == (4, 1)


def test_the_test_only_fault_sends_before_the_disk() -> None:
    rd = Ready(hard_state=HardState(2, B, 0), messages_after_persist=[_vote(2)])
    driver, host, _ = _driver([rd], fault=Fault.SEND_BEFORE_DURABLE)
    driver.process()
    assert host.log[-1] == "send VoteResponse term 2"


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30), st.data())
def test_no_message_leaves_before_the_writes_queued_before_it(
    script: list[tuple[bool, bool]], data: st.DataObject
) -> None:
    """Random Readys (with or without a write, with or without a held message) and
    writes completing at random moments: a held message leaves exactly when every write
    queued before it is done, and in the order the messages were held."""
    readies, index = [], 0
    for n, (writes, holds) in enumerate(script):
        entries = [_entry(index := index + 1)] if writes else []
        held = [_vote(n + 1)] if holds else []
        readies.append(Ready(entries_to_persist=entries, messages_after_persist=held))
    driver, host, _ = _driver([])
    core = cast(ScriptedCore, driver.raft)
    queued_before: dict[int, int] = {}
    for n, rd in enumerate(readies):
        core.readies.append(rd)
        driver.process()
        if rd.messages_after_persist:
            queued_before[n + 1] = driver.ops_submitted
        while driver.writes_pending() and data.draw(st.booleans()):
            driver.written(None)
            _check(host, driver, queued_before)
    while driver.writes_pending():
        driver.written(None)
    _check(host, driver, queued_before)
    assert [int(line.rsplit(" ", 1)[1]) for line in host.log if line.startswith("send")] == sorted(
        queued_before
    )


def _check(host: Host, driver: ReplicaDriver, queued_before: dict[int, int]) -> None:
    sent = {int(line.rsplit(" ", 1)[1]) for line in host.log if line.startswith("send")}
    for term, ops in queued_before.items():
        assert (term in sent) == (driver.ops_done >= ops), (term, ops, driver.ops_done)
