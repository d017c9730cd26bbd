"""A receive carrying acks (``Node.ack_and_receive``) on real nodes: forwarded from a
follower's node it settles and leases on the leader's, its batch crossing the wire; a
long poll whose acks settled answers with them when leadership moved during the wait
(a replica that stops leading lets its long polls run out), rather than an error that
would make the client send them again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.runtime.api import SettleResult
from tests.engine.runtime.test_receiving import pair
from tests.engine.runtime.util import msgs, run


def test_a_forwarded_receive_settles_and_leases_on_the_leader(tmp_path: Path) -> None:
    async def go() -> None:
        async with pair(tmp_path) as (leader, follower):
            await follower.publish("q", msgs("a", "b", "c"))
            first = await follower.receive(
                "q", consumer="c", max_messages=2, wait_ms=0, lease_ms=None
            )
            assert [m.body for m in first] == [b"a", b"b"]
            forged = "0" * 64
            batch = await follower.ack_and_receive(
                "q",
                ack=[first[0].receipt, forged, first[1].receipt],
                consumer="c",
                max_messages=5,
                wait_ms=0,
                lease_ms=None,
            )
            assert batch.settled == SettleResult(2, (1,))
            assert batch.bodies == [b"c"] and batch.delivery_counts == [1]
            assert [m.body for m in batch.messages] == [b"c"]
            stats = leader.stats("q")
            assert (stats["messages_ready"], stats["messages_unacked"]) == (0, 1)

    run(go())


def test_settled_acks_are_answered_when_leadership_moves_during_the_wait(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        async with pair(tmp_path) as (leader, follower):
            await leader.publish("q", msgs("a"))
            [got] = await leader.receive(
                "q", consumer="c", max_messages=1, wait_ms=0, lease_ms=None
            )
            polling = asyncio.ensure_future(
                leader.ack_and_receive(
                    "q",
                    ack=[got.receipt],
                    consumer="c",
                    max_messages=1,
                    wait_ms=2000,
                    lease_ms=None,
                )
            )
            await asyncio.sleep(0.3)
            assert not polling.done()
            await leader.transfer_leadership("q", "n2")
            await follower.publish("q", msgs("b"))
            batch = await asyncio.wait_for(polling, 10)
            assert batch.settled == SettleResult(1, ()) and batch.ids == []
            assert follower.stats("q")["messages_unacked"] == 0

    run(go())
