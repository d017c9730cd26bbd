"""A sole voter rebuilt from storage leads again in its durable term without an election
(``RaftServer.resume_as_sole_leader``, what a sleeping queue's wake uses), and only when
the core can tell that its term, vote and log are the ones it led with."""

from __future__ import annotations

import random

from engine.raft.config import Configuration
from engine.raft.events import HardState, Propose, Receive, Tick
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.sim.storage import MemStorage
from tests.engine.raft.harness import LIMITS, Cluster, sid, vote_request


def rebuilt(storage: MemStorage, name: str = "a", voters: tuple[str, ...] = ("a",)) -> RaftServer:
    """A core made from what ``storage`` holds, as a wake or a restart makes it."""
    hs, snap = storage.recover()
    options = RaftOptions(sid(name), random.Random(5), LIMITS)
    config = Configuration(tuple(sid(v) for v in voters))
    return RaftServer(options, storage, hs, snap.meta if snap else None, config, 1000)


def led_alone(proposals: int = 3) -> Cluster:
    """A lone voter that led and committed ``proposals`` commands, everything stored."""
    c = Cluster(["a"])
    c.elect("a")
    for n in range(proposals):
        c.step("a", Propose(n + 1, (f"set k {n}".encode(),)))
    a = c["a"]
    assert a.role is Role.LEADER and a.commit == a.log.last_index() == proposals + 1
    return c


def test_a_sole_voter_that_led_leads_again_in_its_term_without_an_entry() -> None:
    c = led_alone()
    before = c["a"]
    woken = rebuilt(c.nodes["a"].storage)
    assert woken.resume_as_sole_leader()
    woken.check_invariants()
    assert woken.role is Role.LEADER and woken.leader == sid("a")
    assert woken.term == before.term and woken.vote == sid("a")
    assert woken.log.last_index() == before.log.last_index(), "no entry appended"
    assert woken.commit == woken.log.last_index(), "its stored entries are committed"
    rd = woken.ready()
    assert rd.hard_state is None and not rd.entries_to_persist, "nothing to write"
    # Its next entry is of the same term, after the last one, and commits once stored.
    woken.step(Propose(10, (b"set k x",)))
    rd = woken.ready()
    (entry,) = rd.entries_to_persist
    assert (entry.index, entry.term) == (before.log.last_index() + 1, before.term)
    assert woken.commit == entry.index - 1, "not committed before it is stored"


def test_it_does_not_resume_where_the_core_cannot_tell_it_led() -> None:
    # Never led: an empty log, no vote.
    assert not rebuilt(MemStorage()).resume_as_sole_leader()
    # Another voter in the configuration.
    c = led_alone()
    assert not rebuilt(c.nodes["a"].storage, voters=("a", "b")).resume_as_sole_leader()
    # Stepped since it was made: it campaigned for a new term, not durable yet.
    woken = rebuilt(c.nodes["a"].storage)
    woken.step(Tick(woken.election_deadline_ms + 1))
    assert woken.role is Role.LEADER and woken.term == 2
    assert not woken.resume_as_sole_leader()


def test_it_does_not_resume_a_term_it_only_voted_in() -> None:
    """Its vote went to another server in its last term, or its log ends with an entry of
    an older term: it did not lead that term (or no entry says so), so it campaigns."""
    c = Cluster(["a", "b"], voters=["a"], pre_vote=False)
    c.step("a", Receive(vote_request("b", "a", 1)))  # granted: b is as up to date
    assert c["a"].vote == sid("b")
    assert not rebuilt(c.nodes["a"].storage).resume_as_sole_leader()
    led = led_alone()
    storage = led.nodes["a"].storage
    term, vote, commit = led["a"].term, led["a"].vote, led["a"].commit
    storage.write(HardState(term + 1, vote, commit), None, [])
    storage.sync()
    assert not rebuilt(storage).resume_as_sole_leader(), "no entry of its term"


def test_a_resumed_leader_campaigns_again_after_a_crash() -> None:
    """What it appended after resuming and lost at a crash is not confirmed; the restart
    (not a wake) campaigns for a higher term, so no index is written twice in one term."""
    c = led_alone()
    storage = c.nodes["a"].storage
    woken = rebuilt(storage)
    assert woken.resume_as_sole_leader()
    term, last = woken.term, woken.log.last_index()
    woken.step(Propose(20, (b"set k lost",)))
    rd = woken.ready()
    storage.write(rd.hard_state, None, rd.entries_to_persist)  # written, never synced
    assert woken.commit == last, "nothing confirmed before it is durable"
    storage.crash(random.Random(1), tear=False)
    restarted = rebuilt(storage)
    assert restarted.log.last_index() == last
    restarted.step(Tick(restarted.election_deadline_ms + 1))
    assert restarted.role is Role.LEADER and restarted.term == term + 1
