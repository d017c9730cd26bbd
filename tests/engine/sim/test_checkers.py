"""The checkers themselves: linearizability against a brute-force model, and the Raft
safety observer on hand-made violations."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.raft.entry import Entry, EntryKind
from engine.raft.server import Role
from engine.sim.checkers import RaftSafety, RegisterOp, check_register


def R(client: int, kind: str, value: bytes | None, call: int, ret: int | None) -> RegisterOp:
    return RegisterOp(client, kind, value, call, ret)


def test_a_read_after_a_completed_write_must_see_it() -> None:
    assert not check_register([R(0, "put", b"1", 0, 10), R(1, "get", None, 20, 30)])
    assert check_register([R(0, "put", b"1", 0, 10), R(1, "get", b"1", 20, 30)])


def test_a_stale_read_after_an_overwrite_is_caught() -> None:
    ops = [R(0, "put", b"1", 0, 10), R(0, "put", b"2", 11, 15), R(1, "get", b"1", 20, 30)]
    assert not check_register(ops)


def test_concurrent_operations_may_take_effect_in_either_order() -> None:
    ops = [R(0, "put", b"1", 0, 100), R(1, "get", b"1", 20, 30), R(2, "get", None, 10, 15)]
    assert check_register(ops)
    ops = [R(0, "put", b"1", 0, 100), R(1, "get", b"1", 20, 30), R(2, "get", None, 40, 50)]
    assert not check_register(ops), "once seen, a write cannot be undone"


def test_an_unknown_write_may_or_may_not_have_happened() -> None:
    assert check_register([R(0, "put", b"1", 0, None), R(1, "get", None, 20, 30)])
    assert check_register([R(0, "put", b"1", 0, None), R(1, "get", b"1", 20, 30)])
    ops = [R(0, "put", b"1", 0, None), R(1, "get", b"1", 20, 30), R(1, "get", None, 40, 50)]
    assert not check_register(ops)


def _brute_force(ops: list[RegisterOp]) -> bool:
    """Try every order of every subset that keeps all known operations."""
    known = [op for op in ops if op.ret_ms is not None]
    unknown = [op for op in ops if op.ret_ms is None]
    for r in range(len(unknown) + 1):
        for extra in itertools.combinations(unknown, r):
            chosen = known + list(extra)
            for order in itertools.permutations(chosen):
                if _legal(order):
                    return True
    return False


def _legal(order: tuple[RegisterOp, ...]) -> bool:
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if b.ret_ms is not None and b.ret_ms < a.call_ms:
                return False  # b finished before a began, yet comes after it
    state = None
    for op in order:
        if op.kind == "put":
            state = op.value
        elif op.value != state:
            return False
    return True


@st.composite
def histories(draw: st.DrawFn) -> list[RegisterOp]:
    n = draw(st.integers(1, 5))
    ops = []
    for i in range(n):
        call = draw(st.integers(0, 20))
        length = draw(st.integers(0, 10))
        ret = None if draw(st.integers(0, 4)) == 0 else call + length
        if draw(st.booleans()):
            ops.append(R(i, "put", b"v%d" % i, call, ret))
        else:
            value = draw(st.sampled_from([None, *[b"v%d" % j for j in range(n)]]))
            ops.append(R(i, "get", value, call, call + length))
    return ops


@settings(max_examples=300, deadline=None)
@given(histories())
def test_the_search_agrees_with_brute_force(ops: list[RegisterOp]) -> None:
    assert check_register(list(ops)) == _brute_force(ops)


def _server(name: str, role: Role, term: int, log_terms: dict[int, int]) -> SimpleNamespace:
    log = SimpleNamespace(snapshot_index=0, term=log_terms.get)
    return SimpleNamespace(id=name, raft=SimpleNamespace(role=role, term=term, log=log))


def test_two_leaders_of_one_term_break_election_safety() -> None:
    world = SimpleNamespace(now_ms=7)
    safety = RaftSafety()
    safety.on_role(world, _server("a", Role.LEADER, 3, {}))  # type: ignore[arg-type]
    safety.on_role(world, _server("b", Role.FOLLOWER, 3, {}))  # type: ignore[arg-type]
    safety.on_role(world, _server("a", Role.LEADER, 3, {}))  # type: ignore[arg-type]
    assert not safety.found
    safety.on_role(world, _server("b", Role.LEADER, 3, {}))  # type: ignore[arg-type]
    assert safety.found == ["t=7 election safety: a and b lead term 3"]


def test_a_leader_without_a_committed_entry_breaks_leader_completeness() -> None:
    world = SimpleNamespace(now_ms=9)
    safety = RaftSafety()
    entry = Entry(index=1, term=2, kind=EntryKind.COMMAND, now_ms=0, data=b"x")
    safety.on_applied(world, _server("a", Role.FOLLOWER, 2, {1: 2}), entry, None)  # type: ignore[arg-type]
    safety.on_role(world, _server("b", Role.LEADER, 3, {1: 2}))  # type: ignore[arg-type]
    assert not safety.found
    safety.on_role(world, _server("c", Role.LEADER, 4, {1: 1}))  # type: ignore[arg-type]
    assert safety.found and "leader completeness: c leads term 4" in safety.found[0]
