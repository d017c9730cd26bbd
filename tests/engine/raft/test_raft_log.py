"""RaftLog (unstable tail over stable storage) against a plain list model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.raft.entry import Entry, EntryKind
from engine.raft.raft_log import RaftLog
from engine.sim.storage import MemStorage

_actions = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 4)),
        st.tuples(st.just("persist"), st.integers(0, 10), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_actions)
def test_the_log_reads_like_a_list_whatever_is_persisted(actions: list) -> None:
    storage = MemStorage()
    log = RaftLog(storage, 0, 0)
    model: list[Entry] = []
    term = 1
    for action, a, b in actions:
        if action == "append":
            term += 1
            first = max(1, len(model) + 1 - a)
            entries = [Entry(first + k, term, EntryKind.COMMAND, 0, b"%d" % term) for k in range(b)]
            log.append(entries)
            del model[first - 1 :]
            model.extend(entries)
        else:
            written = log.take_unpersisted()
            if written:
                storage.write(None, None, written)
            index = min(a, len(model))
            if index:
                storage.sync()
                log.maybe_persisted(index, model[index - 1].term)
        assert log.last_index() == len(model)
        assert [log.term(i) for i in range(1, len(model) + 1)] == [e.term for e in model]
        assert log.entries(1, len(model) + 1, 1 << 40, 1 << 40) == model
        assert log.stable_last <= len(model)
        for e in model[: log.stable_last]:
            assert storage.term(e.index) == e.term, "what is called stable is in storage"
