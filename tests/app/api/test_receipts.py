"""Receipts cannot be guessed and do not cross queues, against a real server: a receipt
the queue did not make (another queue's, an earlier incarnation's, altered, guessed) is
answered as a stale one and settles nothing; the real consumer's ack still succeeds."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import msgpack
import pytest

from tests.app.api.conftest import MSGPACK, assert_problem, new_queue, stats
from tests.app.api.test_messages import publish, receive, settle

pytestmark = pytest.mark.integration


def receipts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["receipt"] for m in messages]


def test_a_receipt_of_one_queue_settles_nothing_on_another(admin: httpx.Client) -> None:
    ra, rb = new_queue(admin, "ra"), new_queue(admin, "rb")
    publish(admin, ra, {"body": "a"})
    publish(admin, rb, {"body": "b"})
    of_a, of_b = receive(admin, ra, 1), receive(admin, rb, 1)
    crossed = settle(admin, rb, "ack", receipts(of_a))
    assert assert_problem(crossed, 409, "stale-receipt")["stale"] == receipts(of_a)
    assert stats(admin, rb)["messages_unacked"] == 1
    assert settle(admin, rb, "ack", receipts(of_b)).json() == {"settled": 1, "stale": []}
    assert settle(admin, ra, "ack", receipts(of_a)).json() == {"settled": 1, "stale": []}


def test_a_queue_created_again_refuses_the_old_receipts(admin: httpx.Client) -> None:
    q = new_queue(admin, "again")
    publish(admin, q, {"body": "old"})
    old = receive(admin, q, 1)
    assert admin.delete(f"/api/v1/queues/{q}").status_code == 204
    assert admin.put(f"/api/v1/queues/{q}").status_code == 201
    publish(admin, q, {"body": "new"})
    new = receive(admin, q, 1)
    assert_problem(settle(admin, q, "ack", receipts(old)), 409, "stale-receipt")
    assert settle(admin, q, "ack", receipts(new)).json()["settled"] == 1


def test_an_altered_receipt_is_stale_and_its_position_reported(admin: httpx.Client) -> None:
    q = new_queue(admin, "alter")
    publish(admin, q, {"body": "x"}, {"body": "y"})
    got = receipts(receive(admin, q, 2))
    for position in (0, 20, 40, 63):  # in the tag, the ref and the MAC
        text = got[0]
        digit = "0" if text[position] != "0" else "1"
        altered = text[:position] + digit + text[position + 1 :]
        mixed = settle(admin, q, "extend", [altered, got[1]], lease_ms=60_000)
        assert mixed.json() == {"settled": 1, "stale": [altered]}, position
    assert settle(admin, q, "ack", got).json() == {"settled": 2, "stale": []}


def test_guessing_receipts_settles_nothing(admin: httpx.Client) -> None:
    """The probe of issue 13: a reader guesses 200 receipts near its own while another
    consumer holds 5 leases. Even knowing their tags and refs (the receipts' first half)
    it cannot make their MACs; the consumer's own ack then succeeds."""
    q = new_queue(admin, "guess")
    publish(admin, q, *[{"body": f"m{i}"} for i in range(6)])
    held = receipts(receive(admin, q, 5, consumer="victim", lease_ms=60_000))
    own = receipts(receive(admin, q, 1, consumer="reader", lease_ms=60_000))[0]
    guesses = []
    for receipt in held:
        guesses.append(receipt[:32] + own[32:])  # the victim's tag and ref, the reader's MAC
        guesses += [receipt[:32] + secrets.token_hex(16) for _ in range(39)]
    assert len(guesses) == 200
    answer = admin.post(
        f"/api/v1/queues/{q}/messages/ack",
        content=msgpack.packb({"receipts": guesses}),
        headers={"Content-Type": MSGPACK, "Accept": MSGPACK},
    )
    assert assert_problem(answer, 409, "stale-receipt")["settled"] == 0
    assert stats(admin, q)["messages_unacked"] == 6
    assert settle(admin, q, "ack", held).json() == {"settled": 5, "stale": []}
    assert settle(admin, q, "ack", [own]).json() == {"settled": 1, "stale": []}
