"""The KV machine: values stay in the log, live indexes name exactly the current values."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.raft.kv import KvMachine, encode_delete, encode_put
from engine.raft.state_machine import ApplyMeta


def _apply_all(m: KvMachine, commands: list[bytes]) -> dict[int, bytes]:
    log = {}
    for i, c in enumerate(commands, start=1):
        log[i] = c
        m.apply(ApplyMeta(i, 1, 0), c)
    return log


def test_put_get_delete_and_live_indexes() -> None:
    m = KvMachine()
    log = _apply_all(m, [encode_put("a", b"1"), encode_put("b", b"2"), encode_put("a", b"3")])
    assert m.get("a", log.__getitem__) == b"3" and m.get("b", log.__getitem__) == b"2"
    assert list(m.live_indexes()) == [2, 3]
    reply, effects = m.apply(ApplyMeta(4, 1, 0), encode_delete("b"))
    assert reply == ("ok", 4) and effects == []
    assert m.get("b", log.__getitem__) is None and list(m.live_indexes()) == [3]


def test_a_malformed_command_gets_an_error_reply_and_changes_nothing() -> None:
    m = KvMachine()
    for n, bad in enumerate([b"\xc1", b"\x01", encode_put("a", b"x")[:-1]], start=1):
        reply, _ = m.apply(ApplyMeta(n, 1, 0), bad)
        assert reply == ("error", "malformed command")
    assert m.keys == {}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.binary(max_size=4)))
    )
)
def test_machine_matches_a_dict_and_survives_snapshot_restore(
    ops: list[tuple[str, bytes | None]],
) -> None:
    model: dict[str, bytes] = {}
    commands = []
    for key, value in ops:
        if value is None:
            model.pop(key, None)
            commands.append(encode_delete(key))
        else:
            model[key] = value
            commands.append(encode_put(key, value))
    m = KvMachine()
    log = _apply_all(m, commands)
    restored = KvMachine()
    restored.restore(m.snapshot())
    for machine in (m, restored):
        assert {k: machine.get(k, log.__getitem__) for k in model} == model
        assert set(machine.live_indexes()) == set(machine.keys.values())
        assert len(machine.live_indexes()) == len(model)
