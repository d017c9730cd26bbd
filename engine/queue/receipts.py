"""Receipts: what a consumer gets with each delivered message and sends back to ack, nack
or extend it.

Rule of this module: a receipt is ``(delivery tag, ref)`` sealed for one queue, printed
as 64 lowercase hex digits: the tag (16), the ref (16), then a MAC (32, 128 bits). The
MAC is keyed BLAKE2b, under the node's receipt key, over the queue's uid, the tag and the
ref. So only the node makes receipts, a receipt is good on the one queue that made it,
and a queue deleted and created again (a new uid) refuses the receipts of the old one.
``ReceiptSeal.open`` answers ``None`` for any text it did not make (forged, altered, of
another queue); the runtime reports that receipt as stale, exactly as a receipt whose
lease ended, so a guess settles nothing and says nothing about other leases.

The delivery tag is unique per delivery, never reused: a message handed out again gets
a new tag, so a receipt stops matching as soon as its lease ended (settled, returned,
expired). The MAC is computed when a message is delivered and checked when the receipt
comes back, never stored: the machine's packed state keeps its size. The key is the
caller's (``engine.node_key.receipt_key``): this module stays pure.

A delivery's receipts come as ``SealedReceipts``: a list that names the seal that made
it. Receipts given back in such a list, naming the very seal that opens them, are the
texts it made (whoever builds that list vouches for it: the stream connection, for the
receipts it delivered itself), so ``open_many`` reads their tags and refs without
checking each MAC again. A stale one stays stale (the machine finds no lease of its
tag); a forged text cannot be in such a list. The seal is named by identity, in the
process only: a queue made again has a new seal, and a list sent to a peer arrives as a
plain list, whose MACs are checked.
"""

from __future__ import annotations

import hmac
import re
import struct
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import cast

from engine.errors import InvalidRequest

RECEIPT_CHARS = 64
MAC_BYTES = 16
"""128 bits: guessing a MAC takes 2**127 tries on average."""
RECEIPT_KEY_BYTES_MIN = 32
_PERSON = b"quorra.receipt"
_U64_MAX = (1 << 64) - 1
_PAIR = struct.Struct(">QQ")
"""A receipt's tag and ref, as they are sealed and printed."""
_OPENED = struct.Struct(">QQ16s")
"""A receipt's bytes: tag, ref, MAC."""
_RECEIPT_TEXT = re.compile(f"[0-9a-f]{{{RECEIPT_CHARS}}}")
"""Matched in full: five times faster than comparing the set of its characters, and it
runs for every receipt of every ack and every receive carrying acks."""


class ReceiptSeal:
    """Makes and checks the receipts of one queue (one incarnation: its uid)."""

    __slots__ = ("_key", "_mac", "_uid")

    def __init__(self, key: bytes, queue_uid: str) -> None:
        assert RECEIPT_KEY_BYTES_MIN <= len(key) <= 64, "BLAKE2b takes a key of 32-64 bytes"
        assert 1 <= len(queue_uid.encode("utf-8")) <= 255
        self._key = key
        """The node's key, one object shared by every queue's seal."""
        self._uid = queue_uid
        """The queue's uid as its definition holds it (one string for both), encoded
        only when the keyed state is made."""
        self._mac: blake2b | None = None
        """The keyed state after the uid, copied per receipt: one copy and one short
        update per receipt instead of re-keying (about half the cost). Made by the first
        receipt: its ~450 bytes are not spent on queues that are never consumed from."""

    def _keyed(self) -> blake2b:
        mac = self._mac
        if mac is None:
            uid = self._uid.encode("utf-8")
            key = self._key
            mac = self._mac = blake2b(
                bytes([len(uid)]) + uid, key=key, digest_size=MAC_BYTES, person=_PERSON
            )
        return mac

    def forget(self) -> None:
        """Drop the keyed state (a queue that falls asleep): the next receipt makes it
        again, the receipts it made stay valid."""
        self._mac = None

    def seal(self, tag: int, ref: int) -> str:
        assert 1 <= tag <= _U64_MAX and 1 <= ref <= _U64_MAX
        raw = (tag << 64 | ref).to_bytes(16, "big")
        mac = self._keyed().copy()
        mac.update(raw)
        return raw.hex() + mac.hexdigest()

    def seal_many(self, tags: Sequence[int], refs: Sequence[int]) -> SealedReceipts:
        """``seal`` of each ``(tag, ref)``, in order, exactly its texts: a delivery's
        receipts made in one loop (a quarter cheaper than a ``seal`` call each), naming
        this seal."""
        assert len(tags) == len(refs)
        # Checked once for the batch: ``pack`` refuses what is no uint64 (struct.error).
        assert not tags or (min(tags) >= 1 and min(refs) >= 1)
        pack, copy = _PAIR.pack, self._keyed().copy
        out: list[str] = []
        for tag, ref in zip(tags, refs, strict=True):
            raw = pack(tag, ref)
            mac = copy()
            mac.update(raw)
            out.append((raw + mac.digest()).hex())
        return SealedReceipts(out, self)

    def open(self, receipt: str) -> tuple[int, int] | None:
        """``(tag, ref)`` of a receipt this seal made; ``None`` for any other text."""
        if len(receipt) != RECEIPT_CHARS:
            return None
        try:
            raw = bytes.fromhex(receipt)
        except ValueError:
            return None
        if len(raw) != RECEIPT_CHARS // 2:  # fromhex skips whitespace
            return None
        mac = self._keyed().copy()
        mac.update(raw[:16])
        if not hmac.compare_digest(mac.digest(), raw[16:]):
            return None
        both = int.from_bytes(raw[:16], "big")
        return both >> 64, both & _U64_MAX

    def open_many(self, receipts: list[str]) -> list[tuple[int, int] | None]:
        """``open`` of each receipt, in order. The hex of a whole batch is decoded at
        once and its tags and refs read in one go, which makes it about four times
        cheaper per receipt (an ack or a receive carries up to a thousand); a batch that does not decode whole (a receipt of
        another length, a character that is no hex digit) is opened one by one."""
        if type(receipts) is SealedReceipts and receipts.seal is self:
            return _unsealed(receipts)
        n = len(receipts)
        if any(len(r) != RECEIPT_CHARS for r in receipts):
            return [self.open(r) for r in receipts]
        try:
            raw = bytes.fromhex("".join(receipts))
        except ValueError:
            return [self.open(r) for r in receipts]
        if len(raw) != n * (RECEIPT_CHARS // 2):  # fromhex skips whitespace
            return [self.open(r) for r in receipts]
        copy = self._keyed().copy
        macs: list[bytes] = []
        for at in range(0, len(raw), RECEIPT_CHARS // 2):
            mac = copy()
            mac.update(raw[at : at + 16])
            macs.append(mac.digest())
        opened = list(_OPENED.iter_unpack(raw))
        # Usually every receipt is good: one comparison of all the MACs at once.
        if hmac.compare_digest(b"".join(macs), b"".join([got for _t, _r, got in opened])):
            return [(tag, ref) for tag, ref, _got in opened]
        same = hmac.compare_digest
        return [
            (tag, ref) if same(mac, got) else None
            for (tag, ref, got), mac in zip(opened, macs, strict=True)
        ]


class SealedReceipts(list[str]):
    """Receipts, each made by ``seal``: a list like any other (and a plain list on the
    wire), which ``seal.open_many`` opens without checking their MACs again."""

    __slots__ = ("seal",)

    def __init__(self, receipts: Iterable[str], seal: ReceiptSeal) -> None:
        super().__init__(receipts)
        self.seal = seal


def _unsealed(receipts: SealedReceipts) -> list[tuple[int, int] | None]:
    """The tag and ref of each receipt its seal made (their MACs checked when made)."""
    raw = bytes.fromhex("".join(receipts))
    assert len(raw) == len(receipts) * (RECEIPT_CHARS // 2), "receipts its seal made"
    return [(tag, ref) for tag, ref, _mac in _OPENED.iter_unpack(raw)]


def check_receipt_text(receipt: str) -> None:
    """``InvalidRequest`` unless ``receipt`` has a receipt's shape (64 lowercase hex
    digits). Whether it is a receipt of the queue only its ``ReceiptSeal`` can say."""
    if _RECEIPT_TEXT.fullmatch(receipt) is None:
        raise InvalidRequest("malformed receipt")


def are_receipt_texts(values: list[object]) -> bool:
    """Whether each value has a receipt's shape (``check_receipt_text``), decided for
    them all at once: their text joined decodes as hex (no other character), is
    twice as long as what it decodes to (no whitespace, which ``fromhex`` skips), and
    has no capital letter. Some ten times cheaper than a match per receipt, and a
    body of a thousand receipts is checked on every ack and receive carrying acks."""
    if not all(type(r) is str and len(r) == RECEIPT_CHARS for r in values):
        return False
    joined = "".join(cast(list[str], values))
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        return False
    return 2 * len(raw) == len(joined) and joined == joined.lower()


def check_receipt_texts(receipts: list[str]) -> None:
    """``check_receipt_text`` of each receipt (``are_receipt_texts``, at once)."""
    if not are_receipt_texts(cast(list[object], receipts)):
        raise InvalidRequest("malformed receipt")


__all__ = [
    "MAC_BYTES",
    "RECEIPT_CHARS",
    "ReceiptSeal",
    "SealedReceipts",
    "are_receipt_texts",
    "check_receipt_text",
    "check_receipt_texts",
]
