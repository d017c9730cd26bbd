"""``iso_ms``: the times of message answers (``published_at``, ``lease_expires_at``),
ISO 8601 in UTC to the millisecond, exactly as ``datetime`` writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.api.messages import iso_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@given(st.integers(min_value=0, max_value=253_402_300_799_999))
def test_iso_ms_is_datetimes_text(epoch_ms: int) -> None:
    expected = (EPOCH + timedelta(milliseconds=epoch_ms)).isoformat(timespec="milliseconds")
    assert iso_ms(epoch_ms) == expected.replace("+00:00", "Z")


def test_iso_ms_examples() -> None:
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_764_397_522_123) == "2025-11-29T06:25:22.123Z"
    assert iso_ms(1_764_397_522_999) == "2025-11-29T06:25:22.999Z"
    assert iso_ms(1_764_397_523_000) == "2025-11-29T06:25:23.000Z"
