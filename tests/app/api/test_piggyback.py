"""A receive carrying the previous batch's receipts (``"ack": [...]``), against a real
server: one Raft entry settles them and leases the next batch, answered once durable;
stale and forged receipts are reported per receipt as ``ack`` reports them (but with
200: the receive took place); a malformed receipt is 422 and nothing is applied."""

from __future__ import annotations

import secrets
import time
from typing import Any

import httpx
import msgpack
import pytest

from tests.app.api.conftest import MSGPACK, assert_problem, new_queue, stats
from tests.app.api.test_messages import bodies, publish, receive

pytestmark = pytest.mark.integration


def receive_acking(
    client: httpx.Client, queue: str, ack: list[str], n: int = 10, **extra: Any
) -> dict[str, Any]:
    body = {"max_messages": n, "ack": ack, **extra}
    response = client.post(f"/api/v1/queues/{queue}/messages/receive", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def receipts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["receipt"] for m in messages]


def commit_index(client: httpx.Client, queue: str) -> int:
    index: int = stats(client, queue)["raft"]["commit_index"]
    return index


def test_the_acks_settle_and_the_next_batch_is_leased_by_one_entry(admin: httpx.Client) -> None:
    q = new_queue(admin, "piggy")
    publish(admin, q, *[{"body": f"m{k}"} for k in range(5)])
    first = receive(admin, q, 2)
    before = commit_index(admin, q)
    answer = receive_acking(admin, q, receipts(first), 2)
    assert commit_index(admin, q) == before + 1
    assert (answer["settled"], answer["stale"]) == (2, [])
    assert bodies(answer["messages"]) == ["m2", "m3"]
    assert [m["delivery_count"] for m in answer["messages"]] == [1, 1]
    s = stats(admin, q)
    assert (s["messages_ready"], s["messages_unacked"]) == (1, 2)
    last = receive_acking(admin, q, receipts(answer["messages"]), 10)
    assert (last["settled"], last["stale"], bodies(last["messages"])) == (2, [], ["m4"])
    done = receive_acking(admin, q, receipts(last["messages"]))
    assert done == {"messages": [], "settled": 1, "stale": []}
    s = stats(admin, q)
    assert (s["messages_ready"], s["messages_unacked"]) == (0, 0)


def test_stale_and_forged_receipts_are_reported_in_their_places(admin: httpx.Client) -> None:
    q, other = new_queue(admin, "piggy-stale"), new_queue(admin, "piggy-other")
    publish(admin, q, {"body": "a"}, {"body": "b"}, {"body": "c"})
    publish(admin, other, {"body": "x"})
    got = receipts(receive(admin, q, 2))
    of_other = receipts(receive(admin, other, 1))
    assert receive_acking(admin, q, got[:1], 1)["settled"] == 1
    forged = got[1][:32] + secrets.token_hex(16)
    ack = [got[0], forged, got[1], *of_other]
    answer = receive_acking(admin, q, ack)
    assert (answer["settled"], answer["stale"]) == (1, [got[0], forged, *of_other])
    assert bodies(answer["messages"]) == []  # "c" is leased by the receive before
    all_stale = receive_acking(admin, q, [got[0], got[1]])
    assert all_stale == {"messages": [], "settled": 0, "stale": [got[0], got[1]]}
    assert stats(admin, other)["messages_unacked"] == 1


def test_an_ended_lease_is_stale_and_its_message_comes_back(admin: httpx.Client) -> None:
    q = new_queue(admin, "piggy-lease")
    publish(admin, q, {"body": "a"})
    first = receive(admin, q, 1, lease_ms=200)
    time.sleep(0.6)  # the leader's timer ends the lease
    answer = receive_acking(admin, q, receipts(first), 1, wait_ms=3000)
    assert (answer["settled"], answer["stale"]) == (0, receipts(first))
    assert bodies(answer["messages"]) == ["a"]
    assert answer["messages"][0]["delivery_count"] == 2


@pytest.mark.parametrize(
    "ack",
    [["XYZ"], ["0" * 64 + "\n"], "0" * 64, [1], ["0" * 64] * 1001],
    ids=["short", "newline", "not a list", "not text", "too many"],
)
def test_a_malformed_ack_is_422_and_nothing_is_applied(admin: httpx.Client, ack: Any) -> None:
    q = new_queue(admin, "piggy-bad")
    publish(admin, q, {"body": "a"}, {"body": "b"})
    held = receipts(receive(admin, q, 1))
    body = {"max_messages": 5, "ack": [*held, *ack] if isinstance(ack, list) else ack}
    answer = admin.post(f"/api/v1/queues/{q}/messages/receive", json=body)
    assert_problem(answer, 422, "validation-failed")
    s = stats(admin, q)
    assert (s["messages_ready"], s["messages_unacked"]) == (1, 1)


def test_msgpack_both_ways(admin: httpx.Client) -> None:
    q = new_queue(admin, "piggy-msgpack")
    publish(admin, q, {"body": "a"}, {"body": "b"})
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    path = f"/api/v1/queues/{q}/messages/receive"
    first = msgpack.unpackb(
        admin.post(path, content=msgpack.packb({"max_messages": 1}), headers=headers).content
    )
    asked = msgpack.packb({"max_messages": 5, "ack": receipts(first["messages"])})
    answer = admin.post(path, content=asked, headers=headers)
    assert answer.status_code == 200 and answer.headers["content-type"] == MSGPACK
    got = msgpack.unpackb(answer.content)
    assert (got["settled"], got["stale"]) == (1, [])
    assert [m["body"] for m in got["messages"]] == [b"b"]


def test_a_long_poll_carrying_acks_settles_them_at_once(admin: httpx.Client) -> None:
    """The acks are settled by the first entry, before the wait: another consumer
    sees them gone while the long poll still waits."""
    q = new_queue(admin, "piggy-poll")
    publish(admin, q, {"body": "a"})
    held = receipts(receive(admin, q, 1))
    started = time.monotonic()
    answer = receive_acking(admin, q, held, 1, wait_ms=400)
    assert answer == {"messages": [], "settled": 1, "stale": []}
    assert time.monotonic() - started >= 0.35
    assert stats(admin, q)["messages_unacked"] == 0


def test_an_empty_ack_is_a_plain_receive_with_the_settle_fields(admin: httpx.Client) -> None:
    q = new_queue(admin, "piggy-empty")
    publish(admin, q, {"body": "a"})
    answer = receive_acking(admin, q, [], 1)
    assert (answer["settled"], answer["stale"], bodies(answer["messages"])) == (0, [], ["a"])
    plain = admin.post(f"/api/v1/queues/{q}/messages/receive", json={"max_messages": 1})
    assert plain.json() == {"messages": []}
