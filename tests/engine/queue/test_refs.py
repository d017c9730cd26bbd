"""Packed refs, sealed pages and the paged FIFO: round trips at every boundary."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.queue.pages import TAIL_REFS_MIN, FrozenRefs, RefFifo, SealedPage
from engine.queue.refs import (
    INDEX_LIMIT_LONG,
    INDEX_LIMIT_SHORT,
    SIZE_LIMIT,
    SLOT_LIMIT_SHORT,
    SLOTS_PER_ENTRY_MAX,
    FallbackTable,
    RefParts,
    indexes_of,
    is_fallback,
    message_id,
    message_id_parts,
    pack_batch,
    sizes_of,
    slot_runs,
    total_size,
    try_pack,
    unpack_compact,
)

INDEXES = [
    1,
    2,
    INDEX_LIMIT_LONG - 1,
    INDEX_LIMIT_LONG,
    INDEX_LIMIT_SHORT - 1,
    INDEX_LIMIT_SHORT,
    1 << 62,
]
SIZES = [0, 1, SIZE_LIMIT - 1, SIZE_LIMIT, 16 << 20]
BATCHES = [1, 2, SLOT_LIMIT_SHORT, SLOT_LIMIT_SHORT + 1, SLOTS_PER_ENTRY_MAX]


def _expected_form(index: int, size: int, batch: int) -> str:
    if size >= SIZE_LIMIT:
        return "fallback"
    if batch <= SLOT_LIMIT_SHORT and index < INDEX_LIMIT_SHORT:
        return "short"
    if index < INDEX_LIMIT_LONG:
        return "long"
    return "fallback"


def _form(ref: int) -> str:
    if ref >> 63 == 0:
        return "short"
    return "fallback" if is_fallback(ref) else "long"


@pytest.mark.parametrize("index", INDEXES)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("batch", BATCHES)
def test_pack_round_trip_at_every_boundary(index: int, size: int, batch: int) -> None:
    table = FallbackTable()
    for slot in sorted({0, batch // 2, batch - 1}):
        ref = table.pack(index, slot, size, batch)
        assert 0 < ref < 1 << 64
        assert _form(ref) == _expected_form(index, size, batch)
        assert table.unpack(ref) == RefParts(index, slot, size)
        assert table.place(ref) == (index, slot)
        if not is_fallback(ref):
            assert unpack_compact(ref) == RefParts(index, slot, size)
            assert try_pack(index, slot, size, batch) == ref


def test_the_compact_form_of_a_single_message_entry() -> None:
    ref = try_pack(INDEX_LIMIT_SHORT - 1, 0, SIZE_LIMIT - 1)
    assert ref == ((INDEX_LIMIT_SHORT - 1) << 19) | ((SIZE_LIMIT - 1) << 4)
    assert ref >> 63 == 0


def test_fallback_refs_are_released() -> None:
    table = FallbackTable()
    big = table.pack(5, 0, SIZE_LIMIT)
    small = table.pack(5, 1, 10, 2)
    assert len(table) == 1
    table.release(small)
    table.release(big)
    assert len(table) == 0
    again = table.pack(5, 0, SIZE_LIMIT)
    assert again != big, "handles are never reused"


COMPACT_SIZES = [0, 1, SIZE_LIMIT - 1]
BIG_SIZES = [SIZE_LIMIT, SIZE_LIMIT + 1, 1 << 30]
"""The boundaries a batch's sizes are drawn at, besides the values in between."""


@settings(max_examples=200, deadline=None)
@given(
    index=st.integers(1, (1 << 63) - 1),
    batch=st.integers(1, SLOTS_PER_ENTRY_MAX),
    head=st.lists(st.one_of(st.integers(0, SIZE_LIMIT + 5), st.integers(0, 1 << 30)), max_size=16),
    big_share=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
    seed=st.integers(0, (1 << 32) - 1),
)
def test_pack_batch_agrees_with_scalar_packing(
    index: int, batch: int, head: list[int], big_share: float, seed: int
) -> None:
    # A batch holds up to 1,024 sizes: hypothesis draws the first few (its boundaries and
    # shrinking), a Random of a drawn seed the rest (drawn one by one, they took seconds an
    # example).
    rnd = random.Random(seed)
    sizes = head[:batch] + [_batch_size(rnd, big_share) for _ in range(batch - len(head))]
    vec_table, scalar_table = FallbackTable(), FallbackTable()
    refs = pack_batch(index, np.array(sizes, dtype=np.uint64), vec_table)
    scalar = [scalar_table.pack(index, k, s, batch) for k, s in enumerate(sizes)]
    assert refs.tolist() == scalar
    assert len(set(scalar)) == batch, "every message of a batch has its own ref"
    assert indexes_of(refs, vec_table).tolist() == [index] * batch
    assert sizes_of(refs, vec_table).tolist() == sizes
    wire = FallbackTable.from_wire(vec_table.to_wire())
    assert [wire.unpack(r) for r in scalar] == [RefParts(index, k, s) for k, s in enumerate(sizes)]


def _batch_size(rnd: random.Random, big_share: float) -> int:
    """A size too big for a compact ref ``big_share`` of the time, else one that fits;
    one time in eight a boundary (``COMPACT_SIZES``, ``BIG_SIZES``)."""
    big = rnd.random() < big_share
    if rnd.random() < 0.125:
        return rnd.choice(BIG_SIZES if big else COMPACT_SIZES)
    return rnd.randint(SIZE_LIMIT, 1 << 30) if big else rnd.randint(0, SIZE_LIMIT - 1)


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(
        st.tuples(
            st.sampled_from([1, 2, 7, INDEX_LIMIT_LONG - 1, INDEX_LIMIT_LONG, 1 << 50]),
            st.sampled_from([1, 2, SLOT_LIMIT_SHORT, SLOT_LIMIT_SHORT + 1, 100]),
            st.integers(0, 99),
            st.sampled_from([0, 1024, SIZE_LIMIT]),
        ),
        max_size=60,
    )
)
def test_slot_runs_are_the_places_of_the_refs_in_order(
    messages: list[tuple[int, int, int, int]],
) -> None:
    """Every form of ref (short, long, fallback), mixed: the runs list each ref's
    (index, slot) in order, and no two neighbouring runs could have been one."""
    table = FallbackTable()
    refs: list[int] = []
    places: list[tuple[int, int]] = []
    for index, batch, slot, size in messages:
        slot %= batch
        refs.append(table.pack(index, slot, size, batch))
        places.append((index, slot))
    runs = slot_runs(refs, table)
    assert [(i, first + k) for i, first, count in runs for k in range(count)] == places
    assert all(count >= 1 for _i, _first, count in runs)
    for (i, first, count), (j, nxt, _n) in itertools.pairwise(runs):
        assert (i, first + count) != (j, nxt)


@given(index=st.integers(1, 1 << 50), slot=st.integers(0, SLOTS_PER_ENTRY_MAX - 1))
def test_message_id_round_trip(index: int, slot: int) -> None:
    assert message_id_parts(message_id(index, slot)) == (index, slot)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, (1 << 64) - 1), min_size=16, max_size=64),
    st.integers(0, 1 << 40),
    st.integers(-(1 << 20), 1 << 20),
)
def test_sealed_pages_round_trip(values: list[int], start: int, step: int) -> None:
    random_page = np.array(values, dtype=np.uint64)
    sealed = SealedPage.maybe_seal(random_page)
    if sealed is not None:
        assert sealed.expand().tolist() == values
    run = [(start + k * step) % (1 << 64) or 1 for k in range(len(values))]
    run_page = np.array(run, dtype=np.uint64)
    sealed_run = SealedPage.maybe_seal(run_page)
    assert sealed_run is not None or 0 in [
        (start + k * step) % (1 << 64) for k in range(len(values))
    ]
    if sealed_run is not None:
        assert sealed_run.expand().tolist() == run


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.booleans()), max_size=60))
def test_ref_fifo_is_a_fifo(ops: list[tuple[bool, int, bool]]) -> None:
    fifo = RefFifo(16)
    model: list[int] = []
    counter = 1 << 63
    for push, n, compressible in ops:
        if push:
            if compressible:
                values = [counter + (k << 15) for k in range(n)]
            else:
                values = [(counter * (k + 7)) % (1 << 64) or 1 for k in range(n)]
            counter += n << 15
            if n == 1:
                fifo.push(values[0])
            else:
                fifo.push_many(np.array(values, dtype=np.uint64))
            model += values
        else:
            popped = fifo.pop_many(n).tolist()
            assert popped == model[: len(popped)]
            model = model[len(popped) :]
        fifo.check()
        assert fifo.to_array().tolist() == model
        assert fifo.slice_from(fifo.head_pos + 3, 5).tolist() == model[3:8]
    pos = fifo.head_pos
    assert fifo.clear().tolist() == model
    assert fifo.head_pos == pos + len(model) and len(fifo) == 0


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from([16, 64, 256]),
    st.lists(st.tuples(st.booleans(), st.integers(1, 300)), max_size=40),
)
def test_a_short_tail_page_grows_and_frozen_refs_keep_their_moment(
    page_refs: int, ops: list[tuple[bool, int]]
) -> None:
    """The tail page starts short and doubles; refs frozen before it grew (or before
    a pop) are still the refs of that moment; an emptied FIFO goes back to no pages."""
    fifo = RefFifo(page_refs)
    model: list[int] = []
    frozen: list[tuple[FrozenRefs, list[int]]] = []
    counter = 1
    for push, n in ops:
        if push:
            values = list(range(counter, counter + n))
            counter += n
            for k in range(0, n, 7):  # single pushes and batches, both growing the tail
                chunk = values[k : k + 7]
                if len(chunk) == 1:
                    fifo.push(chunk[0])
                else:
                    fifo.push_many(np.array(chunk, dtype=np.uint64))
            model += values
        else:
            popped = fifo.pop_many(n).tolist()
            assert popped == model[: len(popped)]
            model = model[len(popped) :]
        fifo.check()
        assert fifo.to_array().tolist() == model
        frozen.append((fifo.freeze(), list(model)))
        if not model:
            assert fifo.nbytes() == 0
    for refs, then in frozen:
        assert refs.to_array().tolist() == then


def test_an_idle_fifo_holds_a_short_page_not_a_whole_one() -> None:
    fifo = RefFifo(4096)
    assert fifo.nbytes() == 0
    fifo.push_many(np.arange(1, 11, dtype=np.uint64))
    assert fifo.nbytes() <= TAIL_REFS_MIN * 8 + 200, "10 refs cost a short page"
    fifo.push_many(np.arange(11, 5000, dtype=np.uint64))
    assert fifo.to_array().tolist() == list(range(1, 5000))
    fifo.check()
    fifo.pop_many(4999)
    assert fifo.nbytes() == 0 and len(fifo) == 0
    fifo.check()


def test_full_pages_behind_the_head_are_sealed_to_four_bytes() -> None:
    fifo = RefFifo(4096)
    refs = (np.uint64(1 << 63) + np.arange(100_000, dtype=np.uint64) * np.uint64(1 << 15)).astype(
        np.uint64
    )
    fifo.push_many(refs)
    assert fifo.nbytes() < 100_000 * 4 + 2 * 4096 * 8 + 25 * 200, "head and tail pages stay hot"
    assert fifo.pop_many(50_000).tolist() == refs[:50_000].tolist()
    assert fifo.to_array().tolist() == refs[50_000:].tolist()


@given(
    st.lists(
        st.tuples(st.integers(1, INDEX_LIMIT_SHORT + 5), st.integers(0, SIZE_LIMIT + 5)),
        max_size=40,
    ),
    st.sampled_from([1, 2, 17]),
    st.integers(0, 3),
)
def test_total_size_is_the_sum_of_sizes(
    parts: list[tuple[int, int]], batch: int, repeat: int
) -> None:
    table = FallbackTable()
    refs = np.array(
        [table.pack(index, 0, size, batch) for index, size in parts] * (1 << repeat),
        dtype=np.uint64,
    )
    assert total_size(refs, table) == int(sizes_of(refs, table).sum())
    # One form across a chunk boundary, as a restored deep lane has.
    many = np.full(40_000, table.pack(7, 0, 33, batch), dtype=np.uint64)
    assert total_size(many, table) == 40_000 * 33


@given(
    st.lists(
        st.tuples(
            st.integers(1, INDEX_LIMIT_SHORT + 5),
            st.integers(0, SIZE_LIMIT + 5),
            st.sampled_from([1, 2, SLOT_LIMIT_SHORT + 1]),
        ),
        max_size=40,
    )
)
def test_vectorised_indexes_and_sizes_agree_with_unpack(
    parts: list[tuple[int, int, int]],
) -> None:
    """Uniform arrays (one form) take a one-operation path, mixed ones the masked path;
    both give what unpacking each ref gives."""
    table = FallbackTable()
    refs = np.array(
        [table.pack(index, 0, size, batch) for index, size, batch in parts], dtype=np.uint64
    )
    unpacked = [table.unpack(int(r)) for r in refs]
    assert indexes_of(refs, table).tolist() == [u.index for u in unpacked]
    assert sizes_of(refs, table).tolist() == [u.size for u in unpacked]
    assert [table.place(int(r)) for r in refs] == [(u.index, u.slot) for u in unpacked]
