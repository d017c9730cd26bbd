"""Quorra's Python client: the REST message endpoints and streams, blocking or asyncio.

    from quorra.client import Client

    with Client("http://127.0.0.1:8000", token) as client:
        ids = client.publish("orders", [b"hello", "world"])        # durable on a quorum
        for d in client.receive("orders", max_messages=10, wait_ms=1000):
            client.ack("orders", [d.receipt])
        with client.stream("orders") as stream:                     # one WebSocket
            seq = stream.publish([b"x"])                            # windowed
            stream.flush()                                          # every publish confirmed
            stream.consume(prefetch=100)
            batch = stream.receive(timeout_s=1.0)
            stream.ack([d.receipt for d in batch])

``AsyncClient`` and ``AsyncStream`` are the same with ``await``. Errors from the server
are ``Problem`` (its RFC 9457 fields); refused publishes of a stream ``PublishFailed``.
"""

from quorra.client._columns import DeliveredColumns
from quorra.client._ledger import BODY_MAP_HEAD, PublishFailed
from quorra.client._rest import AsyncClient, Client
from quorra.client._stream import AsyncStream, Stream
from quorra.client._types import Delivery, Message, Problem, Publishable, Settled

__all__ = [
    "BODY_MAP_HEAD",
    "AsyncClient",
    "AsyncStream",
    "Client",
    "DeliveredColumns",
    "Delivery",
    "Message",
    "Problem",
    "PublishFailed",
    "Publishable",
    "Settled",
    "Stream",
]
