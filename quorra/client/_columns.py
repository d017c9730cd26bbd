"""A columnar ``deliver`` frame (a consumer that asked for ``columns``): its messages as
numpy arrays and one buffer of bodies, no object per message.

Rule: ``DeliveredColumns.of(frame)`` checks that every array holds ``count`` items and
that the offsets stay within their data, and raises ``Problem`` otherwise; the arrays
are views into the frame's own bytes (read-only), converted to the machine's byte order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from quorra.client._types import Delivery, Problem

RECEIPT_CHARS = 64


def _bad(detail: str) -> Problem:
    return Problem(400, "about:blank", "The server sent a bad deliver frame", detail)


def _array(frame: dict[str, Any], key: str, dtype: str, count: int) -> np.ndarray[Any, Any]:
    data = frame.get(key)
    if not isinstance(data, bytes):
        raise _bad(f"{key} is not binary")
    width = np.dtype(dtype).itemsize
    if len(data) != count * width:
        raise _bad(f"{key} holds {len(data)} bytes, not {count} x {width}")
    return np.frombuffer(data, dtype).astype(np.dtype(dtype).newbyteorder("="), copy=False)


def _offsets(frame: dict[str, Any], key: str, count: int, end: int) -> np.ndarray[Any, Any]:
    offsets = _array(frame, key, "<u4", count + 1)
    if offsets[0] != 0 or offsets[-1] != end:
        raise _bad(f"{key} do not run from 0 to {end}")
    if np.any(offsets[1:] < offsets[:-1]):
        raise _bad(f"{key} go down")
    return offsets


@dataclass(frozen=True, slots=True)
class DeliveredColumns:
    """The messages of one columnar deliver frame, in delivery order."""

    ids: np.ndarray[Any, np.dtype[np.uint64]]
    receipts: bytes
    """``RECEIPT_CHARS`` ASCII bytes per message, back to back."""
    bodies: bytes
    body_offsets: np.ndarray[Any, np.dtype[np.uint32]]
    """``count + 1``: body ``k`` is ``bodies[body_offsets[k]:body_offsets[k + 1]]``."""
    priorities: np.ndarray[Any, np.dtype[np.uint8]]
    delivery_counts: np.ndarray[Any, np.dtype[np.uint64]]
    published_at_ms: np.ndarray[Any, np.dtype[np.uint64]]
    lease_expires_at_ms: int
    header_offsets: np.ndarray[Any, np.dtype[np.uint32]] | None
    """``count + 1`` into ``header_keys`` and ``header_values``; None: no headers."""
    header_keys: list[str]
    header_values: list[str]

    @classmethod
    def of(cls, frame: dict[str, Any]) -> DeliveredColumns:
        count = frame.get("count")
        if type(count) is not int or count < 0:
            raise _bad("count is no count")
        receipts = frame.get("receipts")
        if not isinstance(receipts, bytes) or len(receipts) != count * RECEIPT_CHARS:
            raise _bad(f"receipts are not {count} x {RECEIPT_CHARS} bytes")
        bodies = frame.get("bodies")
        if not isinstance(bodies, bytes):
            raise _bad("bodies is not binary")
        expires = frame.get("lease_expires_at_ms")
        if type(expires) is not int:
            raise _bad("lease_expires_at_ms is no integer")
        header_offsets = None
        keys: list[str] = []
        values: list[str] = []
        if "header_offsets" in frame:
            keys, values = frame.get("header_keys"), frame.get("header_values")  # type: ignore[assignment]
            if (
                not isinstance(keys, list)
                or not isinstance(values, list)
                or len(keys) != len(values)
                or not all(type(x) is str for x in keys)
                or not all(type(x) is str for x in values)
            ):
                raise _bad("header_keys and header_values are not lists of text alike")
            header_offsets = _offsets(frame, "header_offsets", count, len(keys))
        return cls(
            ids=_array(frame, "ids", "<u8", count),
            receipts=receipts,
            bodies=bodies,
            body_offsets=_offsets(frame, "body_offsets", count, len(bodies)),
            priorities=_array(frame, "priorities", "u1", count),
            delivery_counts=_array(frame, "delivery_counts", "<u8", count),
            published_at_ms=_array(frame, "published_at_ms", "<u8", count),
            lease_expires_at_ms=expires,
            header_offsets=header_offsets,
            header_keys=keys,
            header_values=values,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def receipt_list(self) -> list[str]:
        """Each message's receipt as text."""
        text = self.receipts.decode("ascii")
        return [text[i : i + RECEIPT_CHARS] for i in range(0, len(text), RECEIPT_CHARS)]

    def deliveries(self) -> list[Delivery]:
        """The messages as ``Delivery`` values (one object per message: for callers
        that want them one at a time)."""
        bounds = self.body_offsets.tolist()
        if self.header_offsets is None:
            heads = [0] * (len(self) + 1)
        else:
            heads = self.header_offsets.tolist()
        keys, values = self.header_keys, self.header_values
        return [
            Delivery(
                id=id_,
                receipt=receipt,
                body=self.bodies[bounds[k] : bounds[k + 1]],
                headers=dict(
                    zip(keys[heads[k] : heads[k + 1]], values[heads[k] : heads[k + 1]], strict=True)
                ),
                priority=priority,
                delivery_count=count,
                published_at_ms=published,
                lease_expires_at_ms=self.lease_expires_at_ms,
            )
            for k, (id_, receipt, priority, count, published) in enumerate(
                zip(
                    self.ids.tolist(),
                    self.receipt_list(),
                    self.priorities.tolist(),
                    self.delivery_counts.tolist(),
                    self.published_at_ms.tolist(),
                    strict=True,
                )
            )
        ]
