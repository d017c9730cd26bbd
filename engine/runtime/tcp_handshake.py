"""Who may talk to this node: the authenticated handshake, and TLS under it.

Rule: a connection carries nothing but handshake frames until both sides have proven
that they know the cluster secret (``engine.runtime.tcp_frames`` describes the frames
and the MACs). The dialer says which cluster, node and lane it means and with which
limits; the acceptor checks all of it and who may dial it (a peer of the cluster with a
lower name: ``engine.runtime.tcp_transport``), proves itself first over the dialer's
nonce, then checks the dialer's proof over its own. Any mismatch is a ``refused`` frame
with the reason, then ``HandshakeRefused`` on the side that found it (and on the other,
which reads the refusal), so that both nodes can log and show why.

A node joining the cluster (``quorra serve --join``) knows neither the cluster's id nor
the name of the node it dials: its hello names neither (both empty), any node accepts
it from any name, and the connection then carries the one call of
``engine.runtime.tcp_join``. The secret is proven both ways all the same.

A node the cluster forgot is told so, by a MAC'd ``forgotten`` frame (so that nobody
without the secret can tell a node that): in place of the welcome when it dials a node
that knows it was forgotten, in place of the proof when such a node dials it (only to
tell it). Its side raises ``HandshakeRefused`` with ``forgotten`` set.

A node that comes back from another data directory than the one the metadata records
for it (it lost its data, ``engine.cluster.rejoin.lost_data_refusal``) is told so the
same way, by a MAC'd ``lost_data`` frame: each side names its data directory (the
hello, the challenge) and the other checks it (``Identity.stale``, this node's view of
the metadata) before it goes on. Its side raises ``HandshakeRefused`` with
``lost_data`` set: the node must not serve, and exits.

TLS, when configured, is under the handshake, never instead of it: certificates must
chain to the cluster's CA, and with ``mutual`` the listener requires one from the
dialer too. Host names are not checked (peers are often addressed by IP); the node's
name is proven by the handshake.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from engine.ids import NodeName
from engine.runtime.tcp_frames import (
    HANDSHAKE_FRAME_BYTES_MAX,
    NONCE_BYTES,
    PROTOCOL_VERSION,
    FrameDecoder,
    FrameError,
    Hello,
    Lane,
    decode_handshake,
    encode_handshake,
    encode_hello,
    hello_of,
    mac,
    mac_ok,
    printable,
    transcript,
)

READ_BYTES = 256 * 1024
"""Bytes asked of the socket per read, during and after the handshake."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Paths of this node's certificate and key and of the cluster's CA (PEM files)."""

    cert_file: str
    key_file: str
    ca_file: str
    mutual: bool = True
    """The listener requires a client certificate signed by the CA."""

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.mutual:
            context.load_verify_locations(self.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(self.ca_file)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclass(frozen=True, slots=True)
class Identity:
    """What this node claims and proves in a handshake."""

    name: NodeName
    cluster_id: str
    secret: bytes = field(repr=False)
    fingerprint: str
    """Of its limits (``limits_fingerprint``)."""
    incarnation: str = ""
    """The id of this node's data directory (``cluster.json``)."""
    stale: Callable[[str, str], str | None] = field(default=lambda _name, _inc: None)
    """Why a peer named so, from that data directory, is refused (``lost_data_refusal``
    over this node's metadata), or ``None``."""


class HandshakeRefused(Exception):
    """The handshake failed for a reason worth telling: ``peer`` is the known peer it
    concerns, if any (a stranger's attempt concerns none)."""

    def __init__(
        self,
        reason: str,
        peer: NodeName | None = None,
        *,
        forgotten: bool = False,
        lost_data: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.peer = peer
        self.forgotten = forgotten
        """The peer proved that the cluster forgot this node."""
        self.lost_data = lost_data
        """The peer proved that the cluster knows this node from another data directory."""


async def read_frame(reader: asyncio.StreamReader, decoder: FrameDecoder) -> bytes:
    while (payload := decoder.next_frame()) is None:
        data = await reader.read(READ_BYTES)
        if not data:
            raise ConnectionResetError("the connection closed during the handshake")
        decoder.feed(data)
    return payload


async def dial(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    decoder: FrameDecoder,
    me: Identity,
    peer: NodeName,
    lane: Lane,
    *,
    tell_forgotten: bool = False,
) -> None:
    """Prove ``me`` to ``peer`` and check its proof; returns once it welcomed us. With
    ``tell_forgotten``, tell ``peer`` that the cluster forgot it instead of proving
    ``me``, and return (the connection is good for nothing else)."""
    hello = Hello(
        PROTOCOL_VERSION, me.cluster_id, me.name, peer, int(lane), me.fingerprint, _nonce(),
        me.incarnation,
    )  # fmt: skip
    writer.write(encode_hello(hello))
    tag, fields = decode_handshake(await read_frame(reader, decoder))
    if tag == "refused":
        raise HandshakeRefused(f"refused by {peer}: {printable(fields['reason'])}", peer)
    if tag != "challenge" or len(fields["nonce"]) != NONCE_BYTES:
        raise FrameError(f"{peer}: expected a challenge, got {tag}")
    text = transcript(hello, fields["nonce"], fields["incarnation"])
    if not mac_ok(me.secret, "accept", text, fields["mac"]):
        _refuse(writer, "bad MAC: the cluster secret differs")
        raise HandshakeRefused(f"{peer} failed to prove the cluster secret (bad MAC)", peer)
    stale = None if tell_forgotten else me.stale(peer, fields["incarnation"])
    if stale is not None:
        writer.write(encode_handshake("lost_data", mac=mac(me.secret, "lost-data-dial", text)))
        await writer.drain()
        raise HandshakeRefused(f"told {peer} that {stale}", peer)
    if tell_forgotten:
        writer.write(encode_handshake("forgotten", mac=mac(me.secret, "forgotten-dial", text)))
        await writer.drain()
        return
    writer.write(encode_handshake("proof", mac=mac(me.secret, "dial", text)))
    tag, fields = decode_handshake(await read_frame(reader, decoder))
    if tag == "forgotten" and mac_ok(me.secret, "forgotten-accept", text, fields["mac"]):
        raise HandshakeRefused(_forgotten_by(peer, me.name), peer, forgotten=True)
    if tag == "lost_data" and mac_ok(me.secret, "lost-data-accept", text, fields["mac"]):
        raise HandshakeRefused(_lost_data_by(peer, me.name), peer, lost_data=True)
    if tag == "refused":
        raise HandshakeRefused(f"refused by {peer}: {printable(fields['reason'])}", peer)
    if tag != "welcome":
        raise FrameError(f"{peer}: expected a welcome, got {tag}")


async def accept(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    decoder: FrameDecoder,
    me: Identity,
    dialers: Collection[str],
    forgotten: Collection[str] = (),
) -> tuple[NodeName, Lane, bool]:
    """Check a dialer, one of ``dialers`` (or any joining node), prove ``me`` and check
    its proof: the peer, the lane of the connection, and whether the peer joins. A
    dialer in ``forgotten`` is told so once it proved itself, and refused."""
    tag, fields = decode_handshake(await read_frame(reader, decoder))
    if tag != "hello":
        raise FrameError(f"expected a hello, got {tag}")
    if fields["version"] != PROTOCOL_VERSION:
        version = fields["version"]
        reason = f"protocol version {version}, this node speaks {PROTOCOL_VERSION}"
        _refuse(writer, reason)
        raise HandshakeRefused(reason)
    hello = hello_of(fields)
    joining = is_join(hello)
    peer = NodeName(hello.src) if hello.src in dialers or joining else None
    told = hello.src in forgotten and hello.cluster_id == me.cluster_id and hello.dst == me.name
    why = None if told else _check_hello(hello, me, dialers)
    if why is not None:
        _refuse(writer, why)
        raise HandshakeRefused(f"refused {printable(hello.src)!r}: {why}", peer)
    nonce = _nonce()
    text = transcript(hello, nonce, me.incarnation)
    writer.write(
        encode_handshake(
            "challenge",
            nonce=nonce,
            incarnation=me.incarnation,
            mac=mac(me.secret, "accept", text),
        )
    )
    tag, fields = decode_handshake(await read_frame(reader, decoder))
    if tag == "refused":
        raise HandshakeRefused(f"refused by {hello.src}: {printable(fields['reason'])}", peer)
    if tag == "forgotten" and mac_ok(me.secret, "forgotten-dial", text, fields["mac"]):
        raise HandshakeRefused(_forgotten_by(hello.src, me.name), peer, forgotten=True)
    if tag == "lost_data" and mac_ok(me.secret, "lost-data-dial", text, fields["mac"]):
        raise HandshakeRefused(_lost_data_by(hello.src, me.name), peer, lost_data=True)
    if tag != "proof":
        raise FrameError(f"expected a proof, got {tag}")
    if not mac_ok(me.secret, "dial", text, fields["mac"]):
        reason = "bad MAC: the cluster secret differs"
        _refuse(writer, reason)
        raise HandshakeRefused(f"refused {hello.src}: {reason}", peer)
    if told:
        writer.write(encode_handshake("forgotten", mac=mac(me.secret, "forgotten-accept", text)))
        raise HandshakeRefused(f"told {printable(hello.src)} that the cluster forgot it")
    stale = None if joining else me.stale(hello.src, hello.incarnation)
    if stale is not None:
        writer.write(encode_handshake("lost_data", mac=mac(me.secret, "lost-data-accept", text)))
        raise HandshakeRefused(f"told {printable(hello.src)} that {stale}", peer)
    writer.write(encode_handshake("welcome"))
    assert peer is not None
    return peer, Lane(hello.lane), joining


def is_join(hello: Hello) -> bool:
    """A joining node's hello: it names no cluster and no node to reach."""
    return hello.cluster_id == "" and hello.dst == ""


async def tell_forgotten(
    address: tuple[str, int], me: Identity, peer: NodeName, tls: ssl.SSLContext | None
) -> None:
    """Connect to forgotten node ``peer`` only to tell it so (see the module's rule)."""
    decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
    reader, writer = await asyncio.open_connection(*address, ssl=tls, limit=READ_BYTES)
    try:
        await dial(reader, writer, decoder, me, peer, Lane.CONTROL, tell_forgotten=True)
    finally:
        writer.close()


def _check_hello(hello: Hello, me: Identity, dialers: Collection[str]) -> str | None:
    """Why this hello is refused, or None. Says nothing of this node's own cluster id or
    limits beyond their fingerprint: the dialer is not authenticated yet."""
    if is_join(hello):
        if not hello.src or hello.src == me.name:
            return f"a joining node named {printable(hello.src)!r}"
    elif hello.cluster_id != me.cluster_id:
        return f"cluster id {printable(hello.cluster_id)!r} is not this node's cluster"
    elif hello.dst != me.name:
        return f"this is node {me.name}, not {printable(hello.dst)!r}"
    elif hello.src not in dialers:
        return f"{printable(hello.src)!r} is not a peer that dials {me.name}"
    if hello.lane not in Lane._value2member_map_:
        return f"no lane {hello.lane}"
    if len(hello.nonce) != NONCE_BYTES:
        return f"a nonce of {len(hello.nonce)} bytes"
    if hello.limits != me.fingerprint:
        return f"engine limits differ (fingerprint {printable(hello.limits)!r}, here {me.fingerprint!r})"
    return None


def _forgotten_by(peer: str, me: str) -> str:
    return f"{printable(peer)} says the cluster forgot node {me} (its replicas were replaced)"


def _lost_data_by(peer: str, me: str) -> str:
    return (
        f"{printable(peer)} says the cluster knows node {me} from another data directory:"
        f" this one would vote with an empty log. Restore its data directory, or forget"
        f" the node (POST /api/v1/cluster/nodes/{me}/forget) and start it again from an"
        f" empty data directory with --join"
    )


def _refuse(writer: asyncio.StreamWriter, reason: str) -> None:
    writer.write(encode_handshake("refused", reason=reason))


def _nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


__all__ = [
    "READ_BYTES",
    "HandshakeRefused",
    "Identity",
    "TlsConfig",
    "accept",
    "dial",
    "is_join",
    "read_frame",
    "tell_forgotten",
]
