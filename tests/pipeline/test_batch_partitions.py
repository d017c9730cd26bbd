"""A micro-batch's runs of deliveries become Spark partitions holding every message once,
in id order, each in buffers of its own (a pickled partition carries its rows only)."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.options import Options
from pipeline.source import to_record_batch
from pipeline.streaming import Run, partitions_of
from quorra.client import Delivery

BODY = 100


def run_of(ids: list[int]) -> Run:
    """A run whose rows are a slice of a larger batch (as the part of a frame left after
    a micro-batch took the rest)."""
    messages = [
        Delivery(i, f"{i:064d}", str(i).encode().ljust(BODY, b"."), {}, 0, 1, 0, 0)
        for i in [*ids, *range(-100, 0)]
    ]
    rows = to_record_batch(messages, text=False).slice(0, len(ids))
    return Run(np.array(ids, np.int64), [m.receipt for m in messages[: len(ids)]], rows, 0, 0.0)


@st.composite
def batches(draw: st.DrawFn) -> list[list[int]]:
    """Disjoint runs of ascending ids; in order, interleaved or shuffled."""
    ids = draw(st.lists(st.integers(0, 10**6), min_size=1, max_size=3000, unique=True))
    ids = sorted(ids) if draw(st.booleans()) else ids
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=8)))
    runs = [sorted(ids[a:b]) for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    return draw(st.permutations(runs))


@settings(deadline=None, max_examples=60)
@given(batches(), st.integers(1, 5))
def test_partitions_hold_each_message_once_in_id_order(runs: list[list[int]], parts: int) -> None:
    options = Options(url="http://x", token="t", queue="q", num_partitions=parts)
    partitions = partitions_of([run_of(r) for r in runs], options)
    everything = sorted(i for r in runs for i in r)
    assert len(partitions) == max(1, min(parts, len(everything) // 1000 or 1))
    ids = [i for p in partitions for i in p.batch.column(0).to_pylist()]
    assert ids == everything
    for p in partitions:
        bodies = p.batch.column(1).to_pylist()
        assert [b.rstrip(b".") for b in bodies] == [
            str(i).encode() for i in p.batch.column(0).to_pylist()
        ]
        assert len(pickle.dumps(p)) < p.batch.num_rows * (BODY + 40) + 4096  # its rows only
