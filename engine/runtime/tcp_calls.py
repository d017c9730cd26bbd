"""Calls between nodes over the TCP transport: multiplexed by id, each with a deadline.

Rule: a call goes on the bulk lane of its peer's connection under an id unique on this
node, and waits for the item of the same id (an answer or a failure) until its deadline
(``call_deadline_ms``); a passed deadline, or the connection dropping (``Conn.close``),
raises ``OutcomeUnknown``: the call may have run. A peer's call runs as a task of the
connection it came on (cancelled if it closes), bounded per peer; its answer, or its
error, goes back on that connection. Nothing a peer sends raises out of here: a bug
serving a call answers a generic failure and is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from engine.errors import Backpressure, MessageTooLarge, NoLeader, OutcomeUnknown, QuorraError
from engine.ids import NodeName
from engine.limits import Limits
from engine.runtime.rate_log import RateLimitedLog
from engine.runtime.routing import (
    PROPOSING_CALL_TYPES,
    HistoryCall,
    NodeCall,
    ReceiveCall,
    StatsCall,
)
from engine.runtime.tcp_conn import Conn
from engine.runtime.tcp_frames import Kind, encode_item, item_fits
from engine.runtime.transport import Peer


def call_deadline_ms(call: NodeCall, limits: Limits) -> int:
    """How long a call may take, by method. A client operation forwarded to the leader's
    node is bounded by what the leader itself allows it (a leader to appear, then its
    proposal), plus a long-poll receive's wait: past that the answer is lost (a frame
    dropped), and the client hears so then rather than at the default deadline, which
    covers the administrative calls (a membership change creates a replica first). Stats
    asked of a leader have a short one of their own: the asking node has a copy to show
    in their place (``engine.runtime.leader_stats``, ``forwarding``); so has a queue's
    history (``engine.runtime.leader_history``)."""
    if isinstance(call, StatsCall):
        return limits.leader_stats_deadline_ms
    if isinstance(call, HistoryCall):
        return limits.leader_history_deadline_ms
    if isinstance(call, PROPOSING_CALL_TYPES):
        wait_ms = call.wait_ms if isinstance(call, ReceiveCall) else 0
        return limits.leader_wait_ms + limits.proposal_timeout_ms + wait_ms
    return limits.cluster_call_deadline_ms


class Calls:
    """The calls this node sends and serves (see the module's rule)."""

    def __init__(
        self,
        name: NodeName,
        limits: Limits,
        rate_log: RateLimitedLog,
        receiver: Callable[[], Peer | None],
    ) -> None:
        self.name = name
        self.limits = limits
        self.rate_log = rate_log
        self._receiver = receiver
        """The node that serves calls, if one is attached."""
        self._next_call_id = 1

    async def send(self, conn: Conn, call: NodeCall, deadline: float, deadline_ms: int) -> object:
        """``call`` sent on ``conn``: its answer or its operating error; ``OutcomeUnknown``
        past ``deadline`` (the loop's time; ``deadline_ms`` names it) or if ``conn`` drops."""
        dst = conn.link.name
        if len(conn.calls) >= self.limits.cluster_calls_inflight_per_peer_max:
            raise Backpressure(f"node {dst}: too many calls in flight")
        call_id = self._next_call_id
        self._next_call_id += 1
        item = encode_item(Kind.CALL, call_id, call)
        if not item_fits(item, self.limits.cluster_frame_bytes_max):
            raise MessageTooLarge(f"a call of {len(item)} bytes fits no frame")
        if not conn.enqueue(item):
            raise Backpressure(f"node {dst}: too many bytes waiting to be sent")
        future: asyncio.Future[object] = conn.loop.create_future()
        conn.calls[call_id] = future
        try:
            async with asyncio.timeout_at(deadline):
                return await future
        except TimeoutError:
            what = type(call).__name__
            raise OutcomeUnknown(f"node {dst}: no answer to {what} in {deadline_ms} ms") from None
        finally:
            conn.calls.pop(call_id, None)

    def settle(self, conn: Conn, kind: Kind, call_id: int, value: object) -> None:
        """An answer (or a failure) arrived on ``conn`` for the call ``call_id``."""
        future = conn.calls.pop(call_id, None)
        if future is not None and not future.done():
            if kind is Kind.ANSWER:
                future.set_result(value)
            else:
                future.set_exception(cast(QuorraError, value))

    def serve(self, conn: Conn, call_id: int, call: NodeCall) -> None:
        """Run the peer's ``call`` and answer it on ``conn``, or refuse it if the peer has
        too many running."""
        if len(conn.serving) >= self.limits.cluster_calls_inflight_per_peer_max:
            busy = Backpressure(f"node {self.name}: too many calls from {conn.link.name}")
            conn.answer(encode_item(Kind.FAILURE, call_id, busy))
            return
        task = conn.loop.create_task(self._run(conn, call_id, call))
        conn.serving.add(task)
        task.add_done_callback(conn.serving.discard)

    async def _run(self, conn: Conn, call_id: int, call: NodeCall) -> None:
        what = type(call).__name__
        receiver = self._receiver()
        try:
            if receiver is None:
                raise NoLeader(f"node {self.name} is not serving")
            answer = await receiver.on_call(conn.link.name, call)
            item = encode_item(Kind.ANSWER, call_id, answer)
        except QuorraError as e:
            item = encode_item(Kind.FAILURE, call_id, e)
        except Exception:
            self.rate_log.log(logging.ERROR, "call-bug", "serving %s", what, exc_info=True)
            failed = QuorraError(f"node {self.name} failed on {what}; see its log")
            item = encode_item(Kind.FAILURE, call_id, failed)
        if not item_fits(item, self.limits.cluster_frame_bytes_max):
            large = MessageTooLarge(f"the answer to {what} is {len(item)} bytes: too large")
            item = encode_item(Kind.FAILURE, call_id, large)
        conn.answer(item)


__all__ = ["Calls", "call_deadline_ms"]
