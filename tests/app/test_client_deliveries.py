"""The stream client's deliveries: built from a ``deliver`` frame's maps without the
dataclass's ``__init__``, they must be the values that ``Delivery(...)`` builds."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorra.client import Delivery
from quorra.client._types import deliveries_of

_delivered = st.fixed_dictionaries(
    {
        "id": st.integers(0, 2**63 - 1),
        "receipt": st.text(max_size=40),
        "body": st.binary(max_size=64),
        "delivery_count": st.integers(1, 1000),
        "published_at_ms": st.integers(0, 2**48),
        "lease_expires_at_ms": st.integers(0, 2**48),
    },
    optional={
        "headers": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
        "priority": st.integers(0, 255),
    },
)


@given(st.lists(_delivered, max_size=20))
def test_deliveries_of_a_frame_are_what_the_constructor_builds(
    items: list[dict[str, Any]],
) -> None:
    # Through msgpack, as the client reads them.
    frame = msgpack.unpackb(msgpack.packb({"op": "deliver", "messages": items}))
    got = deliveries_of(frame["messages"])
    want = [
        Delivery(
            id=m["id"],
            receipt=m["receipt"],
            body=m["body"],
            headers=m.get("headers") or {},
            priority=m.get("priority", 0),
            delivery_count=m["delivery_count"],
            published_at_ms=m["published_at_ms"],
            lease_expires_at_ms=m["lease_expires_at_ms"],
        )
        for m in items
    ]
    assert got == want
    assert [dataclasses.astuple(d) for d in got] == [dataclasses.astuple(d) for d in want]


def test_a_delivery_stays_frozen_and_owns_its_headers() -> None:
    a, b = deliveries_of([_minimal(1), _minimal(2)])
    assert a.headers == {} and a.headers is not b.headers
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.id = 5  # type: ignore[misc]
    assert a.id == 1


def _minimal(n: int) -> dict[str, object]:
    return dict(
        id=n, receipt=f"r{n}", body=b"", delivery_count=1, published_at_ms=0, lease_expires_at_ms=0
    )
