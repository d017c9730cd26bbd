"""Which cluster a data directory belongs to, and as which node.

Rule: a cluster node's data directory holds ``cluster.json`` (cluster id, node id, and
the members the cluster was formed with), written once, atomically (temporary file,
fsync, rename, fsync of the directory), by the first start of that node: the cluster's
formation, like etcd's ``--initial-cluster-state new``. From then on the file is the
truth: every later start checks its settings against it before binding any port, and
refuses (``IdentityRefused``, exit status 3, one line) a data directory of another
cluster or another node. The cluster id the node announces to its peers is the file's,
so a node whose directory belongs to another cluster is also refused by its peers.

The cluster id is ``QUORRA_CLUSTER_ID`` when given. Otherwise each node derives it at
formation from what every node of a new cluster is given alike: the HMAC-SHA256, under
the cluster secret, of the sorted member ids (this node and its peers; not addresses,
since a node may listen on 0.0.0.0 where its peers dial 10.0.0.1). Nodes formed with the
same secret and the same members agree without a generated value to copy around; nodes
started with different member lists or secrets get different ids and refuse each other
at the handshake, which is the point. Two clusters that share both a secret and their
node ids would get the same id: give such clusters a ``QUORRA_CLUSTER_ID`` each. A later
start does not derive again: members change after formation (and a secret may be
rotated), so only an explicitly given id is compared with the file's.

A node that joins a running cluster (``--join host:port``, on its first start) does not
form anything: it asks that node, over the cluster port and proving the secret
(``engine.runtime.tcp_join``), to record it in the cluster's metadata, and writes the
answer: the cluster's id and its nodes, with ``"joined": true``. From then on it starts
like any node (``--join`` again is a plain restart from the file; ``--peers`` may be
given instead), its peers the nodes it was told and those given, then those the
metadata records. A join the cluster refuses (another node of that name elsewhere, the
wrong secret) is an ``IdentityRefused``; a node it cannot reach, ``JoinFailed``.

A data directory without ``cluster.json`` that a single-node server has used (its WAL
or queues exist) stays single-node: started with peers, it is refused, because its
queues' Raft groups have this node as their only member; turning a single-node server
into a cluster node is not supported. Users and tokens made with ``quorra user add``
before the first start do not count as use.

A node starts on the cluster address it formed or joined with (``--cluster-listen``, as
``cluster.json`` records it): its peers and the cluster's metadata know it there, and
the metadata records a node's address once. Another address is refused at start; moving
a node means forgetting it and joining a new one.

``cluster.json`` also holds the data directory's ``incarnation``, random, made with the
file (and added to a file from before it had one). The node names it to its peers, and
the metadata records it once the node runs: a node that lost its data directory and
forms again from an empty one comes with another id, and its peers refuse it
(``engine.cluster.rejoin``) rather than let it vote with an empty log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.cluster_settings import (
    ClusterSettings,
    StartRefused,
    check_node_id,
    format_address,
    parse_address,
)
from app.settings import Settings
from engine.limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from engine.runtime.routing import Joined

CLUSTER_FILE = "cluster.json"
CLUSTER_FILE_VERSION = 1
CLUSTER_ID_LABEL = b"quorra/cluster-id/v1\n"
CLUSTER_ID_HEX_DIGITS = 20
INCARNATION_BYTES = 12
SINGLE_NODE_MARKERS = ("wal", "queues")
"""What the engine creates in a data directory at its first start."""


class IdentityRefused(StartRefused):
    """The data directory belongs to another cluster or another node."""

    exit_status = 3


class JoinFailed(StartRefused):
    """The node to join could not answer (unreachable, no metadata leader): try again."""

    exit_status = 1


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    cluster_id: str
    node_id: str
    initial_members: dict[str, str]
    """The members the cluster was formed with: node id to ``host:port``; for a node
    that joined, the nodes the cluster had when it joined (itself included)."""
    joined: bool = False
    incarnation: str = ""
    """The id of this data directory (see the module's rule)."""


def derive_cluster_id(secret: bytes, members: list[str]) -> str:
    """The id of a new cluster of ``members`` when none is given (see the module's rule)."""
    assert members == sorted(set(members))
    digest = hmac.new(secret, CLUSTER_ID_LABEL + "\n".join(members).encode(), "sha256")
    return "qc-" + digest.hexdigest()[:CLUSTER_ID_HEX_DIGITS]


def settled_settings(settings: Settings) -> Settings:
    """The settings with a cluster node's identity settled against its data directory
    (which is created if need be) and its cluster id filled in; ``IdentityRefused``
    when they do not match it."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    identity = settle_identity(settings.data_dir, settings.cluster, settings.limits)
    if identity is None:
        return settings
    assert settings.cluster is not None
    cluster = dataclasses.replace(settings.cluster, cluster_id=identity.cluster_id)
    if identity.joined:
        known = {
            name: parse_address(address, CLUSTER_FILE)
            for name, address in identity.initial_members.items()
            if name != identity.node_id
        }
        cluster = dataclasses.replace(cluster, peers={**known, **cluster.peers}, joined=True)
    cluster = dataclasses.replace(cluster, incarnation=identity.incarnation)
    return dataclasses.replace(settings, cluster=cluster)


def settle_identity(
    data_dir: Path, cluster: ClusterSettings | None, limits: Limits = DEFAULT_LIMITS
) -> ClusterIdentity | None:
    """The identity this start runs with: the data directory's, after checking that the
    settings agree with it; formed (or joined) and written on a cluster node's first
    start; ``None`` for a single-node server."""
    recorded = read_identity(data_dir)
    if cluster is None:
        if recorded is not None:
            raise IdentityRefused(
                f"{data_dir} belongs to node {recorded.node_id} of cluster"
                f" {recorded.cluster_id}: start it with --node-id {recorded.node_id}"
                " and its --peers, or use another data directory"
            )
        return None
    if recorded is None and cluster.join is not None:
        return join_cluster(data_dir, cluster, limits)
    if recorded is None:
        return form_cluster(data_dir, cluster)
    if recorded.node_id != cluster.node_id:
        raise IdentityRefused(
            f"{data_dir} belongs to node {recorded.node_id}, not to --node-id"
            f" {cluster.node_id}: use that node's own data directory"
        )
    if cluster.cluster_id is not None and cluster.cluster_id != recorded.cluster_id:
        raise IdentityRefused(
            f"{data_dir} belongs to cluster {recorded.cluster_id}, not to the cluster id"
            f" given, {cluster.cluster_id}: use a data directory of that cluster, or an"
            " empty one to form a new cluster"
        )
    _check_listen(recorded, cluster)
    if not recorded.incarnation:
        recorded = dataclasses.replace(recorded, incarnation=new_incarnation())
        write_identity(data_dir, recorded)
    return recorded


def _check_listen(recorded: ClusterIdentity, cluster: ClusterSettings) -> None:
    """Refuse a start on another cluster address than the one the node formed or joined
    with: its peers and the cluster's metadata know it there (``AddNode`` records an
    address once; a node may not move under the same name, see the module's rule)."""
    known = recorded.initial_members.get(recorded.node_id)
    given = format_address(cluster.listen)
    if known is None or known == given:
        return
    raise IdentityRefused(
        f"node {recorded.node_id} is known to its cluster at {known} (its {CLUSTER_FILE}"
        f" and the cluster's metadata), not at --cluster-listen {given}: start it with"
        f" --cluster-listen {known}; to move it, forget it"
        f" (POST /api/v1/cluster/nodes/{recorded.node_id}/forget) and join a new node at"
        " the new address from an empty data directory"
    )


def new_incarnation() -> str:
    return secrets.token_hex(INCARNATION_BYTES)


def form_cluster(data_dir: Path, cluster: ClusterSettings) -> ClusterIdentity:
    """A cluster node's first start: refuse a single-node server's data directory, then
    write the identity."""
    _check_unused(data_dir)
    members = cluster.members
    identity = ClusterIdentity(
        cluster_id=cluster.cluster_id or derive_cluster_id(cluster.secret, members),
        node_id=cluster.node_id,
        initial_members={
            cluster.node_id: format_address(cluster.listen),
            **{name: format_address(address) for name, address in cluster.peers.items()},
        },
        incarnation=new_incarnation(),
    )
    write_identity(data_dir, identity)
    return identity


def _check_unused(data_dir: Path) -> None:
    used = [name for name in SINGLE_NODE_MARKERS if (data_dir / name).exists()]
    if used:
        raise IdentityRefused(
            f"{data_dir} holds a single-node server's data ({', '.join(used)}) and no"
            f" {CLUSTER_FILE}: a cluster node starts from an empty data directory"
            " (run this one without --peers or --join to keep it single-node)"
        )


def join_cluster(data_dir: Path, cluster: ClusterSettings, limits: Limits) -> ClusterIdentity:
    """A joining node's first start: ask the node of ``--join`` to record it in the
    cluster's metadata, then write the identity it answered."""
    from engine.errors import Conflict, QuorraError, ValidationFailed
    from engine.runtime.tcp_conn import describe
    from engine.runtime.tcp_frames import FrameError
    from engine.runtime.tcp_handshake import HandshakeRefused

    _check_unused(data_dir)
    assert cluster.join is not None
    where = format_address(cluster.join)
    try:
        joined = asyncio.run(_ask_to_join(cluster, limits))
    except (HandshakeRefused, Conflict, ValidationFailed) as e:
        raise IdentityRefused(f"joining through {where} was refused: {e}") from None
    except (OSError, TimeoutError, FrameError, QuorraError) as e:
        why = describe(e) if isinstance(e, OSError | TimeoutError) else str(e)
        raise JoinFailed(f"could not join through {where}: {why}; try again") from None
    if cluster.cluster_id is not None and cluster.cluster_id != joined.cluster_id:
        raise IdentityRefused(
            f"{where} belongs to cluster {joined.cluster_id}, not to the cluster id given,"
            f" {cluster.cluster_id}"
        )
    identity = ClusterIdentity(
        cluster_id=joined.cluster_id,
        node_id=cluster.node_id,
        initial_members={**joined.members, cluster.node_id: format_address(cluster.listen)},
        joined=True,
        incarnation=new_incarnation(),
    )
    write_identity(data_dir, identity)
    return identity


async def _ask_to_join(cluster: ClusterSettings, limits: Limits) -> Joined:
    from engine.ids import NodeName
    from engine.runtime.routing import JoinCall
    from engine.runtime.tcp_frames import limits_fingerprint
    from engine.runtime.tcp_handshake import Identity, TlsConfig
    from engine.runtime.tcp_join import request_join

    assert cluster.join is not None
    me = Identity(NodeName(cluster.node_id), "", cluster.secret, limits_fingerprint(limits))
    call = JoinCall(cluster.node_id, format_address(cluster.listen))
    files = cluster.tls
    tls = None
    if files is not None:
        tls = TlsConfig(str(files.cert_file), str(files.key_file), str(files.ca_file))
    return await request_join(cluster.join, me, call, limits, tls)


def write_identity(data_dir: Path, identity: ClusterIdentity) -> None:
    """Write ``cluster.json`` so that a crash leaves either no file or the whole file."""
    data_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "version": CLUSTER_FILE_VERSION,
        "cluster_id": identity.cluster_id,
        "node_id": identity.node_id,
        "initial_members": dict(sorted(identity.initial_members.items())),
    }
    if identity.joined:
        body["joined"] = True
    if identity.incarnation:
        body["incarnation"] = identity.incarnation
    path = data_dir / CLUSTER_FILE
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(body, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


def read_identity(data_dir: Path) -> ClusterIdentity | None:
    """``cluster.json``, checked; ``None`` when there is none."""
    path = data_dir / CLUSTER_FILE
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise IdentityRefused(f"{path} is unreadable ({e}); restore it from a backup") from None
    identity = _identity(body)
    if identity is None:
        raise IdentityRefused(
            f"{path} is not a Quorra cluster file of version {CLUSTER_FILE_VERSION}"
        )
    return identity


def _identity(body: object) -> ClusterIdentity | None:
    """The identity in ``cluster.json``'s JSON, or ``None`` when anything is off."""
    if not isinstance(body, dict) or body.get("version") != CLUSTER_FILE_VERSION:
        return None
    cluster_id, node_id, members = (
        body.get("cluster_id"),
        body.get("node_id"),
        body.get("initial_members"),
    )
    if not (isinstance(cluster_id, str) and isinstance(node_id, str)):
        return None
    if not isinstance(members, dict) or node_id not in members:
        return None
    joined = body.get("joined", False)
    incarnation = body.get("incarnation", "")
    if not isinstance(joined, bool) or not isinstance(incarnation, str):
        return None
    if incarnation and not (len(incarnation) <= 64 and incarnation.isalnum()):
        return None
    try:
        for name, address in members.items():
            check_node_id(name, "member")
            if not isinstance(address, str):
                return None
            parse_address(address, "member", port_zero_ok=True)
        check_node_id(cluster_id, "cluster_id")
        check_node_id(node_id, "node_id")
    except StartRefused:
        return None
    return ClusterIdentity(cluster_id, node_id, dict(members), joined, incarnation)
