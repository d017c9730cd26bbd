"""Invariant checkers. Raft's safety properties (Raft paper, figure 3) are checked as the
simulation runs; the KV history is checked for linearizability at the end.

A checker is an ``Observer`` (see ``engine.sim.world``): it sees every ``Ready`` a server
produces and every entry it applies, and reports violations as short sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.raft.entry import Entry
from engine.raft.events import Ready
from engine.raft.messages import AppendResponse, Message, VoteResponse
from engine.raft.server import Role

if TYPE_CHECKING:
    from engine.sim.world import SimNode, World


class Observer:
    """Hooks the world calls; every one may do nothing."""

    def on_ready(self, world: World, node: SimNode, rd: Ready) -> None:
        """Called before ``rd`` is acted on."""

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        """Called for every committed entry a server applies (all kinds)."""

    def on_send(self, world: World, node: SimNode, message: Message) -> None:
        """Called for every message a server sends, as it leaves."""

    def on_crash(self, world: World, node: SimNode) -> None:
        pass

    def on_role(self, world: World, node: SimNode) -> None:
        """Called when a server's role or term changed, once its ``Ready`` was acted on."""

    def after_step(self, world: World) -> None:
        pass

    def violations(self) -> list[str]:
        return []


class DurableBeforePromised(Observer):
    """Nothing is promised before it is durable: a server grants its vote, or tells the
    leader of its term that it holds entries up to an index, only once its disk holds
    that vote and those entries, so a crash cannot take the promise back. (The replica
    driver's ordering; a response of an older term may have been overtaken since.)"""

    def __init__(self) -> None:
        self.found: list[str] = []

    def on_send(self, world: World, node: SimNode, message: Message) -> None:
        if message.term != node.raft.term or len(self.found) >= 10:
            return
        hard_state, last = node.storage.durable()
        if isinstance(message, VoteResponse) and message.granted and not message.pre:
            vote = None if hard_state is None else (hard_state.term, hard_state.vote)
            if vote != (message.term, message.dst):
                self.found.append(
                    f"t={world.now_ms} {node.id} granted its vote in term {message.term} to "
                    f"{message.dst} before it was durable (durable: {vote})"
                )
        elif isinstance(message, AppendResponse) and message.success and message.match_index > last:
            self.found.append(
                f"t={world.now_ms} {node.id} acknowledged entries up to {message.match_index} "
                f"with {last} durable"
            )

    def violations(self) -> list[str]:
        return list(self.found)


class TermsNeverBack(Observer):
    """A server's term never goes below one its disk held: not across a crash, a restart
    or a wake (``SimConfig.sleeps``), whatever its role. (A term not yet durable may be
    lost at a crash: nothing depending on it went out. Not for damaged disks: the world
    leaves it out then, as a repair may start from a lower term than the disk held.)"""

    def __init__(self) -> None:
        self.durable: dict[ServerId, int] = {}
        self.found: list[str] = []

    def on_role(self, world: World, node: SimNode) -> None:
        term = node.raft.term
        held = self.durable.get(node.id, 0)
        if term < held and len(self.found) < 10:
            self.found.append(
                f"t={world.now_ms} {node.id} is in term {term} after its disk held {held}"
            )
        hard_state = node.storage.durable()[0]
        if hard_state is not None and hard_state.term > held:
            self.durable[node.id] = hard_state.term

    def violations(self) -> list[str]:
        return list(self.found)


class RaftSafety(Observer):
    """Election safety, log matching, leader completeness and state machine safety."""

    def __init__(self) -> None:
        self.leaders: dict[int, ServerId] = {}
        self.appended: dict[tuple[int, int], tuple[bytes, int]] = {}
        """(index, term) -> (data, term of index - 1) of every entry any server appended."""
        self.applied: dict[int, tuple[int, bytes]] = {}
        self.committed_max = 0
        self.found: list[str] = []

    def _fail(self, world: World, text: str) -> None:
        if len(self.found) < 10:
            self.found.append(f"t={world.now_ms} {text}")

    def on_ready(self, world: World, node: SimNode, rd: Ready) -> None:
        entries = rd.entries_to_persist
        if not entries:
            return
        prev_term = node.raft.log.term(entries[0].index - 1)
        for e in entries:
            key = (e.index, e.term)
            seen = self.appended.get(key)
            if seen is None:
                self.appended[key] = (e.data, prev_term if prev_term is not None else -1)
            elif seen[0] != e.data or (prev_term is not None and seen[1] not in (-1, prev_term)):
                self._fail(world, f"log matching: {node.id} index {e.index} term {e.term}")
            prev_term = e.term

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        seen = self.applied.get(entry.index)
        if seen is None:
            self.applied[entry.index] = (entry.term, entry.data)
            self.committed_max = max(self.committed_max, entry.index)
        elif seen != (entry.term, entry.data):
            self._fail(
                world,
                f"state machine safety: {node.id} applied index {entry.index} term "
                f"{entry.term}, another server applied term {seen[0]} there",
            )

    def on_role(self, world: World, node: SimNode) -> None:
        """A server becomes leader only in a step that changes its role or term, so
        checking at each change sees every leader of every term."""
        raft = node.raft
        if raft.role is not Role.LEADER:
            return
        holder = self.leaders.get(raft.term)
        if holder is None:
            self.leaders[raft.term] = node.id
            self._check_completeness(world, node)
        elif holder != node.id:
            self._fail(world, f"election safety: {holder} and {node.id} lead term {raft.term}")

    def _check_completeness(self, world: World, node: SimNode) -> None:
        log = node.raft.log
        for index in range(log.snapshot_index + 1, self.committed_max + 1):
            seen = self.applied.get(index)
            if seen is not None and log.term(index) != seen[0]:
                self._fail(
                    world,
                    f"leader completeness: {node.id} leads term {node.raft.term} without "
                    f"committed entry {index} (term {seen[0]})",
                )
                return

    def violations(self) -> list[str]:
        return list(self.found)


# --- linearizability -----------------------------------------------------------------

INFINITY = 1 << 62


@dataclass(slots=True)
class RegisterOp:
    """One client operation on one key. ``kind`` is ``put`` or ``get``; ``value`` is what
    was written or read (``None``: the key had no value); ``ret_ms`` is ``None`` while the
    outcome is unknown (a put that may or may not have happened)."""

    client: int
    kind: str
    value: bytes | None
    call_ms: int
    ret_ms: int | None


def check_register(ops: list[RegisterOp]) -> bool:
    """Wing & Gong's search with Lowe's memo: is there a linearization of ``ops`` on one
    register that starts empty? Puts write unique values; an unknown put that no get
    observed may be left out, as it may never have happened."""
    read = {op.value for op in ops if op.kind == "get"}
    ops = [op for op in ops if op.ret_ms is not None or (op.kind == "put" and op.value in read)]
    # A call and a return at the same millisecond are treated as concurrent.
    events: list[tuple[int, int, int]] = []
    for n, op in enumerate(ops):
        events.append((op.call_ms, 0, n))
        events.append((INFINITY if op.ret_ms is None else op.ret_ms, 1, n))
    events.sort()
    size = len(events)
    nxt = list(range(1, size + 2))
    prv = list(range(-1, size))
    # Node k (0..size-1) is events[k]; node size is the tail; -1 is the head.
    head_next = 0
    call_node: dict[int, int] = {}
    ret_node: dict[int, int] = {}
    for k, (_t, kind, n) in enumerate(events):
        (ret_node if kind else call_node)[n] = k

    def link_next(k: int) -> int:
        return head_next if k < 0 else nxt[k]

    def unlink(k: int) -> None:
        nonlocal head_next
        p, q = prv[k], nxt[k]
        if p < 0:
            head_next = q
        else:
            nxt[p] = q
        if q < size:
            prv[q] = p

    def relink(k: int) -> None:
        nonlocal head_next
        p, q = prv[k], nxt[k]
        if p < 0:
            head_next = k
        else:
            nxt[p] = k
        if q < size:
            prv[q] = k

    state: bytes | None = None
    linearized = 0
    seen: set[tuple[int, bytes | None]] = set()
    stack: list[tuple[int, bytes | None]] = []
    k = head_next
    while head_next < size:
        _t, kind, n = events[k]
        if kind == 0:
            op = ops[n]
            ok = op.kind == "put" or op.value == state
            new_state = op.value if op.kind == "put" else state
            mask = linearized | (1 << n)
            if ok and (mask, new_state) not in seen:
                seen.add((mask, new_state))
                stack.append((n, state))
                state, linearized = new_state, mask
                unlink(ret_node[n])
                unlink(call_node[n])
                k = head_next
                continue
            k = link_next(k)
        else:
            if not stack:
                return False
            n, state = stack.pop()
            linearized &= ~(1 << n)
            relink(call_node[n])
            relink(ret_node[n])
            k = link_next(call_node[n])
    return True


__all__ = [
    "INFINITY",
    "Observer",
    "RaftSafety",
    "RegisterOp",
    "TermsNeverBack",
    "check_register",
]
