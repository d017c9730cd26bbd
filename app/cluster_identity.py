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

A data directory without ``cluster.json`` that a single-node server has used (its WAL
or queues exist) stays single-node: started with peers, it is refused, because its
queues' Raft groups have this node as their only member; turning a single-node server
into a cluster node is not supported. Users and tokens made with ``quorra user add``
before the first start do not count as use.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path

from app.cluster_settings import (
    ClusterSettings,
    StartRefused,
    check_node_id,
    format_address,
    parse_address,
)
from app.settings import Settings

CLUSTER_FILE = "cluster.json"
CLUSTER_FILE_VERSION = 1
CLUSTER_ID_LABEL = b"quorra/cluster-id/v1\n"
CLUSTER_ID_HEX_DIGITS = 20
SINGLE_NODE_MARKERS = ("wal", "queues")
"""What the engine creates in a data directory at its first start."""


class IdentityRefused(StartRefused):
    """The data directory belongs to another cluster or another node."""

    exit_status = 3


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    cluster_id: str
    node_id: str
    initial_members: dict[str, str]
    """The members the cluster was formed with: node id to ``host:port``."""


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
    identity = settle_identity(settings.data_dir, settings.cluster)
    if identity is None:
        return settings
    assert settings.cluster is not None
    cluster = dataclasses.replace(settings.cluster, cluster_id=identity.cluster_id)
    return dataclasses.replace(settings, cluster=cluster)


def settle_identity(data_dir: Path, cluster: ClusterSettings | None) -> ClusterIdentity | None:
    """The identity this start runs with: the data directory's, after checking that the
    settings agree with it; formed and written on a cluster node's first start; ``None``
    for a single-node server."""
    recorded = read_identity(data_dir)
    if cluster is None:
        if recorded is not None:
            raise IdentityRefused(
                f"{data_dir} belongs to node {recorded.node_id} of cluster"
                f" {recorded.cluster_id}: start it with --node-id {recorded.node_id}"
                " and its --peers, or use another data directory"
            )
        return None
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
    return recorded


def form_cluster(data_dir: Path, cluster: ClusterSettings) -> ClusterIdentity:
    """A cluster node's first start: refuse a single-node server's data directory, then
    write the identity."""
    used = [name for name in SINGLE_NODE_MARKERS if (data_dir / name).exists()]
    if used:
        raise IdentityRefused(
            f"{data_dir} holds a single-node server's data ({', '.join(used)}) and no"
            f" {CLUSTER_FILE}: a cluster node starts from an empty data directory"
            " (run this one without --peers to keep it single-node)"
        )
    members = cluster.members
    identity = ClusterIdentity(
        cluster_id=cluster.cluster_id or derive_cluster_id(cluster.secret, members),
        node_id=cluster.node_id,
        initial_members={
            cluster.node_id: format_address(cluster.listen),
            **{name: format_address(address) for name, address in cluster.peers.items()},
        },
    )
    write_identity(data_dir, identity)
    return identity


def write_identity(data_dir: Path, identity: ClusterIdentity) -> None:
    """Write ``cluster.json`` so that a crash leaves either no file or the whole file."""
    data_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "version": CLUSTER_FILE_VERSION,
        "cluster_id": identity.cluster_id,
        "node_id": identity.node_id,
        "initial_members": dict(sorted(identity.initial_members.items())),
    }
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
    return ClusterIdentity(cluster_id, node_id, dict(members))
