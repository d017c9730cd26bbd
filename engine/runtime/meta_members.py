"""The cluster's nodes as the metadata records them: whom the transport reaches.

Rule: the metadata's node records are the truth about the cluster's nodes; the peers
given at start only bootstrap it. On every replica, each applied change of the nodes
(and a snapshot) tells the transport (``PeerBook``) every node's address: a node that
joined later is reached, a forgotten one no longer (a node the metadata does not know
yet stays: an initial member is known before its ``AddNode`` applies).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.cluster import MetaChanged
from engine.ids import NodeName
from engine.runtime.transport import PeerBook

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


def split_address(text: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as the metadata records it; ``None`` if malformed."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    return host, int(port)


class MetaMembers:
    """Follows the metadata's nodes (see the module's rule)."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def on_change(self, change: MetaChanged | None) -> None:
        """A metadata listener."""
        if change is None or change.nodes:
            self.learn_peers()

    def learn_peers(self) -> None:
        ctx = self.ctx
        group = ctx.meta_group
        transport = ctx.transport
        if group is None or group.driver is None or not isinstance(transport, PeerBook):
            return
        peers: dict[NodeName, tuple[str, int]] = {}
        gone: list[NodeName] = []
        for name, rec in sorted(group.machine.nodes.items()):
            address = split_address(rec.address)
            if rec.state == "forgotten":
                gone.append(NodeName(name))
            elif address is not None and name != ctx.name:
                peers[NodeName(name)] = address
        transport.learn_peers(peers, gone)


__all__ = ["MetaMembers", "split_address"]
