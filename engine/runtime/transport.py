"""How the nodes of a cluster reach each other: Raft messages one way, requests with replies.

Rule: a node talks to its peers only through a ``Transport``. Two kinds of traffic:

* ``send(dst, uid, message)``: one Raft message of the group ``uid``, fire and forget.
  Raft tolerates loss, delay, reordering and repetition, so the transport promises none
  of these away.
* ``call(dst, call)``: a request to the node ``dst`` (create a replica, a client
  operation forwarded to the queue's leader), one typed call of
  ``engine.runtime.routing``, that returns the peer's answer or raises its operating
  error (``engine.errors``).

Every value crossing a transport is a frozen dataclass of ``engine.raft.messages``,
``engine.runtime.api`` or ``engine.runtime.routing``, or plain ints, strings, bytes,
lists and dicts: what a TCP transport with msgpack frames (a later issue) encodes.
``InMemoryNetwork`` joins several ``Node`` objects of one process and one event loop; it
delivers each message on a later turn of the loop (never re-entrantly), by default
through the bytes of ``engine.runtime.wire``, and can cut a node off to simulate a crash
or a partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.errors import NoLeader, QuorraError
from engine.ids import NodeName
from engine.raft.messages import Message
from engine.runtime import wire
from engine.runtime.routing import NodeCall


class Peer(Protocol):
    """What a transport delivers to: the receiving side of a ``Node``. ``src`` is the
    node that sent the message or call: the peer a network transport authenticated, or
    the sending node in memory. The receiver checks everything else (what the message
    says of its sender and receiver, its content): nothing a peer sends may raise out of
    ``on_raft_message``."""

    def on_raft_message(self, src: NodeName, uid: str, message: Message) -> None: ...

    async def on_call(self, src: NodeName, call: NodeCall) -> object: ...


@dataclass(frozen=True, slots=True)
class PeerHealth:
    """What a transport knows of its link to one peer (``GET /cluster``)."""

    connected: bool
    """Messages can flow both ways now."""
    last_heard_ms: int | None
    """How long ago anything arrived from the peer (monotonic); None if never."""
    drops: int = 0
    """Raft messages and answers dropped: buffer full, or the peer not connected."""
    buffered_bytes: int = 0
    """Bytes waiting to be written to the peer."""
    rtt_ms: float | None = None
    """Round trip of the last ping."""
    last_error: str | None = None
    """Why the last connection or attempt failed (a refused handshake says why), until
    the next one succeeds."""


class Transport(Protocol):
    def nodes(self) -> list[NodeName]:
        """Every node of the cluster, this one included, sorted."""
        ...

    def attach(self, name: NodeName, peer: Peer) -> None:
        """Start receiving for ``name`` (at ``Node.start``)."""
        ...

    def detach(self, name: NodeName) -> None:
        """Stop receiving (at ``Node.stop``, or a simulated crash)."""
        ...

    def send(self, dst: NodeName, uid: str, message: Message) -> None: ...

    async def call(self, dst: NodeName, call: NodeCall) -> object: ...

    def health(self) -> dict[NodeName, PeerHealth]:
        """Each peer's link, this node left out."""
        ...


@runtime_checkable
class PeerBook(Protocol):
    """A transport whose peers change while it runs (``TcpTransport``): the node tells
    it the cluster's nodes as its metadata records them, and hears from it when a peer
    says the cluster forgot this node, or knows it from another data directory
    (``on_forgotten``, with the reason)."""

    on_forgotten: Callable[[str], None] | None
    on_lost_data: Callable[[str], None] | None

    def learn_peers(
        self, peers: Mapping[NodeName, tuple[str, int]], gone: Collection[NodeName]
    ) -> None:
        """Reach ``peers`` (node -> host and port) from now on, and ``gone`` no more."""
        ...

    def refuse_stale(self, check: Callable[[str, str], str | None]) -> None:
        """From now on refuse a peer (node name, data directory id) when ``check`` gives
        the reason (``engine.cluster.rejoin.lost_data_refusal``)."""
        ...


class InMemoryNetwork:
    """Nodes of one process joined on one event loop. ``transport(name)`` for each node."""

    def __init__(self, names: list[str], *, wire: bool = True) -> None:
        """With ``wire``, every message, call, answer and error is encoded to bytes and
        decoded again (``engine.runtime.wire``), as a network transport would."""
        assert names and len(set(names)) == len(names)
        self.wire = wire
        self.names = sorted(NodeName(n) for n in names)
        self._peers: dict[NodeName, Peer] = {}
        self._cut: set[NodeName] = set()
        self.messages_sent = 0

    def transport(self, name: str) -> InMemoryTransport:
        assert name in self.names, name
        return InMemoryTransport(self, NodeName(name))

    def isolate(self, name: str) -> None:
        """Drop every message to and from ``name`` (a partition), until ``heal``."""
        self._cut.add(NodeName(name))

    def heal(self, name: str) -> None:
        self._cut.discard(NodeName(name))

    def _reachable(self, src: NodeName, dst: NodeName) -> Peer | None:
        if src in self._cut or dst in self._cut:
            return None
        return self._peers.get(dst)


class InMemoryTransport:
    def __init__(self, network: InMemoryNetwork, name: NodeName) -> None:
        self._network = network
        self._name = name

    def nodes(self) -> list[NodeName]:
        return list(self._network.names)

    def attach(self, name: NodeName, peer: Peer) -> None:
        assert name == self._name
        self._network._peers[name] = peer

    def detach(self, name: NodeName) -> None:
        self._network._peers.pop(name, None)

    def send(self, dst: NodeName, uid: str, message: Message) -> None:
        peer = self._network._reachable(self._name, dst)
        if peer is None:
            return
        self._network.messages_sent += 1
        if self._network.wire:
            message = wire.decode(wire.encode(message))
        asyncio.get_running_loop().call_soon(peer.on_raft_message, self._name, uid, message)

    async def call(self, dst: NodeName, call: NodeCall) -> object:
        peer = self._network._reachable(self._name, dst)
        if peer is None:
            raise NoLeader(f"node {dst} is unreachable")
        await asyncio.sleep(0)
        if not self._network.wire:
            return await peer.on_call(self._name, call)
        decoded = wire.decode(wire.encode(call))
        try:
            answer = await peer.on_call(self._name, decoded)
        except QuorraError as error:
            raise wire.decode(wire.encode(error)) from None
        return wire.decode(wire.encode(answer))

    def health(self) -> dict[NodeName, PeerHealth]:
        """A peer is connected while neither side is cut off and it is attached; the
        in-memory network keeps no timings."""
        net = self._network
        return {
            n: PeerHealth(connected=net._reachable(self._name, n) is not None, last_heard_ms=None)
            for n in net.names
            if n != self._name
        }


class LocalTransport:
    """The transport of a node alone: no peers."""

    def __init__(self, name: str) -> None:
        self._name = NodeName(name)

    def nodes(self) -> list[NodeName]:
        return [self._name]

    def attach(self, name: NodeName, peer: Peer) -> None:
        pass

    def detach(self, name: NodeName) -> None:
        pass

    def send(self, dst: NodeName, uid: str, message: Message) -> None:
        raise AssertionError(f"a single node sends no Raft message (to {dst})")

    async def call(self, dst: NodeName, call: NodeCall) -> object:
        raise NoLeader(f"node {dst} is not part of this cluster")

    def health(self) -> dict[NodeName, PeerHealth]:
        return {}


__all__ = [
    "InMemoryNetwork",
    "InMemoryTransport",
    "LocalTransport",
    "Peer",
    "PeerBook",
    "PeerHealth",
    "Transport",
]
