"""Sealed receipts: a seal opens what it made, and nothing else (another queue's, another
incarnation's, another key's, any altered character, any malformed text)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import InvalidRequest
from engine.queue.receipts import (
    RECEIPT_CHARS,
    ReceiptSeal,
    SealedReceipts,
    check_receipt_text,
    check_receipt_texts,
)

KEY = bytes(range(32))
UID = "0123456789abcdef0123456789abcdef"
U64 = st.integers(1, (1 << 64) - 1)
HEX = "0123456789abcdef"


@given(tag=U64, ref=U64, uid=st.text(min_size=1, max_size=40), key=st.binary(min_size=32))
def test_a_seal_opens_what_it_made(tag: int, ref: int, uid: str, key: bytes) -> None:
    seal = ReceiptSeal(key[:64], uid)
    text = seal.seal(tag, ref)
    assert len(text) == RECEIPT_CHARS and set(text) <= set(HEX)
    check_receipt_text(text)
    assert seal.open(text) == (tag, ref)


@given(tag=U64, ref=U64)
def test_a_seal_that_forgot_its_keyed_state_makes_and_opens_the_same_receipts(
    tag: int, ref: int
) -> None:
    seal = ReceiptSeal(KEY, UID)
    text = seal.seal(tag, ref)
    seal.forget()  # what a queue falling asleep does
    assert seal.open(text) == (tag, ref)
    seal.forget()
    assert seal.seal(tag, ref) == text


@given(tag=U64, ref=U64, position=st.integers(0, RECEIPT_CHARS - 1), digit=st.sampled_from(HEX))
def test_any_changed_character_is_refused(tag: int, ref: int, position: int, digit: str) -> None:
    seal = ReceiptSeal(KEY, UID)
    text = seal.seal(tag, ref)
    changed = text[:position] + digit + text[position + 1 :]
    assert seal.open(changed) == ((tag, ref) if changed == text else None)


@given(tag=U64, ref=U64)
def test_a_receipt_is_good_on_its_own_queue_and_key_only(tag: int, ref: int) -> None:
    text = ReceiptSeal(KEY, UID).seal(tag, ref)
    assert ReceiptSeal(KEY, "f" * 32).open(text) is None  # another queue (or incarnation)
    assert ReceiptSeal(bytes(32), UID).open(text) is None  # another node's key
    unsealed = f"{tag:016x}{ref:016x}"  # the old format, and its MAC guessed as zeros
    assert ReceiptSeal(KEY, UID).open(unsealed + "0" * 32) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "xyz",
        "0" * 32,
        "g" * 64,
        "A" * 64,
        "1" * 63,
        "1" * 65,
        " " * 64,
        "00 " * 21 + "0",
        "0" * 64 + "\n",
        "\u0660" * 64,
    ],
)
def test_malformed_receipts(text: str) -> None:
    with pytest.raises(InvalidRequest):
        check_receipt_text(text)
    assert ReceiptSeal(KEY, UID).open(text) is None


TEXTS = st.one_of(
    st.sampled_from(["", "xyz", "g" * 64, "A" * 64, "1" * 63, " " * 64, "00 " * 21 + "0"]),
    st.text(alphabet=HEX + " G", min_size=60, max_size=68),
)


@given(
    pairs=st.lists(st.tuples(U64, U64), max_size=20),
    others=st.lists(st.tuples(st.integers(0, 20), TEXTS), max_size=4),
    changed=st.lists(st.tuples(st.integers(0, 19), st.integers(0, 63)), max_size=3),
)
def test_a_batch_opens_as_each_receipt_alone(
    pairs: list[tuple[int, int]],
    others: list[tuple[int, str]],
    changed: list[tuple[int, int]],
) -> None:
    """``open_many`` answers what ``open`` answers for each receipt, whatever the batch
    mixes: receipts of the seal, altered ones, malformed text of any length."""
    seal = ReceiptSeal(KEY, UID)
    texts = [seal.seal(tag, ref) for tag, ref in pairs]
    for k, position in changed:
        if k < len(texts):
            digit = "0" if texts[k][position] != "0" else "1"
            texts[k] = texts[k][:position] + digit + texts[k][position + 1 :]
    for at, text in others:
        texts.insert(min(at, len(texts)), text)
    assert seal.open_many(texts) == [seal.open(t) for t in texts]


@given(
    pairs=st.lists(st.tuples(U64, U64), max_size=10),
    others=st.lists(st.tuples(st.integers(0, 10), TEXTS), max_size=2),
)
def test_a_batch_is_checked_as_each_receipt_alone(
    pairs: list[tuple[int, int]], others: list[tuple[int, str]]
) -> None:
    texts = [ReceiptSeal(KEY, UID).seal(tag, ref) for tag, ref in pairs]
    for at, text in others:
        texts.insert(min(at, len(texts)), text)
    alone = True
    try:
        for text in texts:
            check_receipt_text(text)
    except InvalidRequest:
        alone = False
    try:
        check_receipt_texts(texts)
    except InvalidRequest:
        assert not alone
    else:
        assert alone


@given(pairs=st.lists(st.tuples(U64, U64), max_size=20), uid=st.text(min_size=1, max_size=40))
def test_a_batch_is_sealed_as_each_receipt_alone(pairs: list[tuple[int, int]], uid: str) -> None:
    seal = ReceiptSeal(KEY, uid)
    texts = seal.seal_many([tag for tag, _ref in pairs], [ref for _tag, ref in pairs])
    assert texts == [ReceiptSeal(KEY, uid).seal(tag, ref) for tag, ref in pairs]
    assert seal.open_many(texts) == pairs


@given(pairs=st.lists(st.tuples(U64, U64), min_size=1, max_size=5))
def test_a_fresh_seal_opens_a_batch_made_before(pairs: list[tuple[int, int]]) -> None:
    """A restarted node's seal opens the receipts its predecessor made, in a batch, before
    it has sealed anything itself (its keyed state is made on first use)."""
    texts = [ReceiptSeal(KEY, UID).seal(tag, ref) for tag, ref in pairs]
    assert ReceiptSeal(KEY, UID).open_many(texts) == pairs


@given(pairs=st.lists(st.tuples(U64, U64), max_size=20))
def test_receipts_given_back_sealed_open_as_the_same_texts_checked(
    pairs: list[tuple[int, int]],
) -> None:
    """A delivery's receipts name their seal; given back so, they open (without their
    MACs checked again) exactly as the same texts in a plain list, whose MACs are."""
    seal = ReceiptSeal(KEY, UID)
    texts = seal.seal_many([tag for tag, _ref in pairs], [ref for _tag, ref in pairs])
    assert type(texts) is SealedReceipts and texts.seal is seal
    assert seal.open_many(texts) == seal.open_many(list(texts)) == pairs


@given(pairs=st.lists(st.tuples(U64, U64), min_size=1, max_size=5))
def test_receipts_naming_another_seal_are_checked(pairs: list[tuple[int, int]]) -> None:
    """Only the seal named opens without checking: the queue made again (a new uid) or
    any other seal checks each MAC, and refuses what it did not make."""
    made = ReceiptSeal(KEY, UID).seal_many([t for t, _r in pairs], [r for _t, r in pairs])
    again = ReceiptSeal(KEY, UID + "-again")
    assert again.open_many(made) == [None] * len(pairs)
    assert ReceiptSeal(KEY, UID).open_many(made) == pairs
    forged = SealedReceipts([t[:-1] + ("0" if t[-1] != "0" else "1") for t in made], again)
    assert ReceiptSeal(KEY, UID).open_many(forged) == [None] * len(pairs)
