"""How a segment flush cuts a server's entries into segment files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.storage.flush import segment_chunks as _chunks
from tests.engine.storage.conftest import entries, small_limits


@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    entries_max=st.integers(1, 8),
    bytes_max=st.integers(1, 1200),
)
def test_chunks_keep_order_and_respect_both_limits(
    sizes: list[int], entries_max: int, bytes_max: int
) -> None:
    limits = small_limits(segment_entries_max=entries_max, segment_file_bytes_max=bytes_max)
    stored = [e for k, size in enumerate(sizes) for e in entries(k + 1, 1, size=max(size, 8))]
    chunks = _chunks(stored, limits)
    assert [e for chunk in chunks for e in chunk] == stored
    for k, chunk in enumerate(chunks):
        assert 1 <= len(chunk) <= entries_max
        size = sum(len(e.data) for e in chunk)
        assert size <= bytes_max or len(chunk) == 1
        if k + 1 < len(chunks):  # a chunk is cut only where the next entry would not fit
            following = chunks[k + 1][0]
            assert len(chunk) == entries_max or size + len(following.data) > bytes_max
