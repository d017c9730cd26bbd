"""Joining a running cluster through its cluster port: one connection, one call.

Rule: a node that joins (``quorra serve --join host:port``) knows the cluster secret and
the address of one node, nothing more. It dials that address with a join hello (no
cluster id, no node name: ``engine.runtime.tcp_handshake``), both sides prove the
secret, and the connection then carries exactly one ``JoinCall`` naming the joining
node and its one answer (``Joined``, or the operating error that refused it), then
closes. The accepting node runs the call as any peer's (``Router.join``: the node is
recorded in the metadata, through its leader); anything else on a join connection is a
bad frame. Both sides bound the whole exchange by ``Limits.cluster_call_deadline_ms``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from engine.errors import QuorraError
from engine.ids import NodeName
from engine.limits import Limits
from engine.runtime import tcp_handshake as handshake
from engine.runtime.routing import JoinCall, Joined, NodeCall
from engine.runtime.tcp_frames import (
    HANDSHAKE_FRAME_BYTES_MAX,
    FrameDecoder,
    FrameError,
    Item,
    Kind,
    Lane,
    decode_items,
    encode_item,
    frames_of,
)
from engine.runtime.tcp_handshake import READ_BYTES, Identity, TlsConfig

CALL_ID = 1
"""The id of the one call of a join connection."""


async def request_join(
    address: tuple[str, int],
    me: Identity,
    call: JoinCall,
    limits: Limits,
    tls: TlsConfig | None = None,
) -> Joined:
    """Ask the node at ``address`` to add ``call.node`` to its cluster; the cluster's id
    and nodes, or the error that refused it (``OSError``, ``TimeoutError``,
    ``HandshakeRefused`` or ``FrameError`` when the exchange itself failed)."""
    assert call.node == me.name, "a node joins as itself"
    host, port = address
    joining = dataclasses.replace(me, cluster_id="")
    decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
    context = None if tls is None else tls.client_context()
    async with asyncio.timeout(limits.cluster_call_deadline_ms / 1000):
        reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=READ_BYTES)
        try:
            await handshake.dial(reader, writer, decoder, joining, NodeName(""), Lane.BULK)
            decoder.frame_bytes_max = limits.cluster_frame_bytes_max
            item = encode_item(Kind.CALL, CALL_ID, call)
            writer.writelines(frames_of([item], limits.cluster_frame_bytes_max)[0].parts)
            answer = _only_item(decode_items(await handshake.read_frame(reader, decoder)))
        finally:
            writer.close()
    kind, key, value = answer
    if key != CALL_ID:
        raise FrameError(f"an answer to call {key!r}, not to the join")
    if kind is Kind.FAILURE:
        assert isinstance(value, QuorraError)  # decode_items checked it
        raise value
    if kind is not Kind.ANSWER or not isinstance(value, Joined):
        raise FrameError(f"a join answered with {type(value).__name__}")
    return value


async def serve_join(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    decoder: FrameDecoder,
    joiner: NodeName,
    limits: Limits,
    on_call: Callable[[NodeName, NodeCall], Awaitable[object]],
) -> None:
    """Serve the one call of a join connection from ``joiner`` (authenticated)."""
    decoder.frame_bytes_max = limits.cluster_frame_bytes_max
    async with asyncio.timeout(limits.cluster_call_deadline_ms / 1000):
        kind, key, call = _only_item(decode_items(await handshake.read_frame(reader, decoder)))
        if kind is not Kind.CALL or not isinstance(call, JoinCall) or call.node != joiner:
            raise FrameError("a join connection carries one JoinCall, naming the node joining")
        try:
            item = encode_item(Kind.ANSWER, key, await on_call(joiner, call))
        except QuorraError as e:
            item = encode_item(Kind.FAILURE, key, e)
        writer.writelines(frames_of([item], limits.cluster_frame_bytes_max)[0].parts)
        await writer.drain()


def _only_item(items: list[Item]) -> Item:
    if len(items) != 1:
        raise FrameError(f"a join frame holds one item, not {len(items)}")
    return items[0]


__all__ = ["CALL_ID", "request_join", "serve_join"]
