"""Receipts: what a consumer gets with each delivered message and sends back to ack, nack
or extend it.

Rule of this module: a receipt is exactly ``(delivery tag, ref)``, printed as 32 lowercase
hex digits (tag then ref, 16 each). The delivery tag is unique per delivery, never reused:
a message handed out again gets a new tag. So a receipt stops matching as soon as its
lease ended (settled, returned, expired): the machine then finds no live lease under that
tag and reports the receipt as stale (HTTP 409 per receipt). The ref is the check value:
the lease under the tag must hold that very message, so a mistyped or forged tag cannot
settle another message.
"""

from __future__ import annotations

from engine.errors import InvalidRequest

RECEIPT_CHARS = 32
_HEX = frozenset("0123456789abcdef")


def encode_receipt(tag: int, ref: int) -> str:
    assert 1 <= tag < 1 << 64 and 1 <= ref < 1 << 64
    return f"{tag:016x}{ref:016x}"


def decode_receipt(receipt: str) -> tuple[int, int]:
    """``(tag, ref)``; ``InvalidRequest`` if the text is not a receipt."""
    if len(receipt) != RECEIPT_CHARS or not set(receipt) <= _HEX:
        raise InvalidRequest("malformed receipt")
    tag, ref = int(receipt[:16], 16), int(receipt[16:], 16)
    if tag == 0 or ref == 0:
        raise InvalidRequest("malformed receipt")
    return tag, ref


__all__ = ["RECEIPT_CHARS", "decode_receipt", "encode_receipt"]
