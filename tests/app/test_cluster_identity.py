"""A cluster node's identity in its data directory (``cluster.json``): formed at the
first start, checked at every later one before any port is bound; and the node's
network started around the node."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from app import cluster_identity
from app.cluster_identity import (
    CLUSTER_FILE,
    ClusterIdentity,
    IdentityRefused,
    JoinFailed,
    derive_cluster_id,
    read_identity,
    settle_identity,
    settled_settings,
    write_identity,
)
from app.cluster_settings import ClusterSettings, TlsFiles
from app.engine_seam import make_node
from app.main import StartupReport, create_app
from app.settings import Settings
from engine.errors import Conflict, NoLeader
from engine.ids import NodeName
from engine.runtime.node import Node
from engine.runtime.routing import JoinCall, Joined
from engine.runtime.tcp_handshake import HandshakeRefused
from engine.runtime.tcp_transport import TcpTransport, TlsConfig
from engine.runtime.transport import LocalTransport, Peer
from tests.app.conftest import QUORRA, ROOT, Server, free_port

SECRET = b"a-cluster-secret-of-32-bytes-xyz"


def cluster(node_id: str = "n1", cluster_id: str | None = None) -> ClusterSettings:
    others = {n: ("127.0.0.1", 7000 + int(n[1:])) for n in ("n1", "n2", "n3") if n != node_id}
    listen = ("127.0.0.1", 7000 + int(node_id[1:]))
    return ClusterSettings(node_id, listen, others, SECRET, cluster_id)


# --- the identity file ---------------------------------------------------------------------


def test_the_nodes_of_a_new_cluster_derive_the_same_id(tmp_path: Path) -> None:
    ids = {settle_identity(tmp_path / n, cluster(n)).cluster_id for n in ("n1", "n2", "n3")}  # type: ignore[union-attr]
    assert len(ids) == 1 and ids.pop().startswith("qc-")
    assert derive_cluster_id(SECRET, ["n1", "n2", "n3"]) != derive_cluster_id(
        SECRET + b"!", ["n1", "n2", "n3"]
    )
    assert derive_cluster_id(SECRET, ["n1", "n2", "n3"]) != derive_cluster_id(
        SECRET, ["n1", "n2", "n4"]
    )


def test_first_start_writes_the_identity_and_later_starts_read_it(tmp_path: Path) -> None:
    formed = settle_identity(tmp_path, cluster("n1", cluster_id="prod"))
    assert formed is not None and len(formed.incarnation) == 24
    assert formed == ClusterIdentity(
        "prod",
        "n1",
        {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"},
        incarnation=formed.incarnation,
    )
    assert json.loads((tmp_path / CLUSTER_FILE).read_text())["cluster_id"] == "prod"
    assert not list(tmp_path.glob("*.tmp"))
    # Later starts keep the file's id, whether or not an id is given.
    assert settle_identity(tmp_path, cluster("n1")) == formed
    assert settle_identity(tmp_path, cluster("n1", cluster_id="prod")) == formed
    assert read_identity(tmp_path) == formed


def test_each_data_directory_gets_an_id_of_its_own_kept_across_starts(tmp_path: Path) -> None:
    first = settle_identity(tmp_path / "a", cluster("n1"))
    again = settle_identity(tmp_path / "b", cluster("n1"))
    assert first is not None and again is not None
    assert first.incarnation != again.incarnation  # a lost directory comes back as another
    assert settle_identity(tmp_path / "a", cluster("n1")) == first
    # A file from before the id existed gets one, written, and keeps it.
    path = tmp_path / "a" / CLUSTER_FILE
    body = json.loads(path.read_text())
    del body["incarnation"]
    path.write_text(json.dumps(body))
    added = settle_identity(tmp_path / "a", cluster("n1"))
    assert added is not None and added.incarnation and added.incarnation != first.incarnation
    assert read_identity(tmp_path / "a") == added
    given = Settings(data_dir=tmp_path / "a", cluster=cluster("n1"), node_name="n1")
    settings = settled_settings(given)
    assert settings.cluster is not None and settings.cluster.incarnation == added.incarnation


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (cluster("n2"), "belongs to node n1, not to --node-id n2"),
        (cluster("n1", cluster_id="other"), "belongs to cluster prod, not to the cluster id given"),
        (None, "belongs to node n1 of cluster prod: start it with --node-id n1"),
        (
            dataclasses.replace(cluster("n1"), listen=("127.0.0.1", 7999)),
            "node n1 is known to its cluster at 127.0.0.1:7001 .*, not at --cluster-listen"
            " 127.0.0.1:7999: start it with --cluster-listen 127.0.0.1:7001; to move it,"
            " forget it",
        ),
    ],
)
def test_a_data_directory_of_another_node_or_cluster_is_refused(
    tmp_path: Path, settings: ClusterSettings | None, expected: str
) -> None:
    settle_identity(tmp_path, cluster("n1", cluster_id="prod"))
    with pytest.raises(IdentityRefused, match=expected) as refused:
        settle_identity(tmp_path, settings)
    assert refused.value.exit_status == 3


def test_a_single_node_data_directory_stays_single_node(tmp_path: Path) -> None:
    assert settle_identity(tmp_path, None) is None
    (tmp_path / "meta.sqlite3").write_bytes(b"")  # `quorra user add` before a first start
    (tmp_path / "secret.key").write_bytes(b"")
    (tmp_path / "wal").mkdir()  # an engine has run here
    with pytest.raises(IdentityRefused, match=r"single-node server's data \(wal\)"):
        settle_identity(tmp_path, cluster("n1"))
    assert not (tmp_path / CLUSTER_FILE).exists()
    assert settle_identity(tmp_path, None) is None


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[]",
        '{"version": 2, "cluster_id": "c", "node_id": "n1", "initial_members": {"n1": "h:1"}}',
        '{"version": 1, "cluster_id": "c", "node_id": "n1", "initial_members": {"n2": "h:1"}}',
        '{"version": 1, "cluster_id": "c c", "node_id": "n1", "initial_members": {"n1": "h:1"}}',
        '{"version": 1, "cluster_id": "c", "node_id": "n1", "initial_members": {"n1": 1}}',
        '{"version": 1, "cluster_id": "c", "node_id": "n1", "initial_members": {"n1": "h"}}',
    ],
)
def test_a_damaged_identity_file_is_refused(tmp_path: Path, body: str) -> None:
    (tmp_path / CLUSTER_FILE).write_text(body)
    with pytest.raises(IdentityRefused, match=CLUSTER_FILE):
        settle_identity(tmp_path, cluster("n1"))


JOINER = ClusterSettings("n4", ("127.0.0.1", 7004), {}, SECRET, join=("127.0.0.1", 7001))
MEMBERS = {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"}


def asked(monkeypatch: pytest.MonkeyPatch, answer: Joined | Exception) -> list[JoinCall]:
    """Stand in for the node of ``--join``: the calls it got; answers ``answer``."""
    calls: list[JoinCall] = []

    async def ask(cluster: ClusterSettings, limits: object) -> Joined:
        calls.append(JoinCall(cluster.node_id, f"{cluster.listen[0]}:{cluster.listen[1]}"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(cluster_identity, "_ask_to_join", ask)
    return calls


def test_a_joining_node_writes_what_the_cluster_answered_and_restarts_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = asked(monkeypatch, Joined("qc-prod", {**MEMBERS, "n4": "127.0.0.1:7004"}))
    identity = settle_identity(tmp_path, JOINER)
    assert calls == [JoinCall("n4", "127.0.0.1:7004")]
    assert identity is not None and identity.incarnation
    assert identity == ClusterIdentity(
        "qc-prod",
        "n4",
        {**MEMBERS, "n4": "127.0.0.1:7004"},
        joined=True,
        incarnation=identity.incarnation,
    )
    assert json.loads((tmp_path / CLUSTER_FILE).read_text())["joined"] is True
    assert read_identity(tmp_path) == identity
    # --join again is a plain restart: nobody is asked, the file decides.
    assert settle_identity(tmp_path, JOINER) == identity
    assert len(calls) == 1
    # The settled settings carry the peers it was told, and say it joined.
    given = Settings(data_dir=tmp_path, cluster=JOINER, node_name="n4")
    settled = settled_settings(given).cluster
    assert settled is not None and settled.joined and settled.cluster_id == "qc-prod"
    assert settled.peers == {n: ("127.0.0.1", 7000 + int(n[1:])) for n in MEMBERS}
    # Another cluster's id given: its data directory is refused, as any node's is.
    with pytest.raises(IdentityRefused, match="belongs to cluster qc-prod"):
        settle_identity(tmp_path, dataclasses.replace(JOINER, cluster_id="other"))


@pytest.mark.parametrize(
    ("answer", "refused", "expected"),
    [
        (Conflict("node n4 is known at 127.0.0.1:9"), IdentityRefused, "known at 127.0.0.1:9"),
        (HandshakeRefused("bad MAC: the cluster secret differs"), IdentityRefused, "secret"),
        (ConnectionRefusedError(111, "Connection refused"), JoinFailed, "try again"),
        (NoLeader("no leader yet"), JoinFailed, "no leader yet; try again"),
    ],
)
def test_a_join_refused_or_failed_says_why_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answer: Exception,
    refused: type[Exception],
    expected: str,
) -> None:
    asked(monkeypatch, answer)
    with pytest.raises(refused, match=expected) as failed:
        settle_identity(tmp_path, JOINER)
    prefix = "joining through" if refused is IdentityRefused else "could not join through"
    assert str(failed.value).startswith(f"{prefix} 127.0.0.1:7001")
    assert not (tmp_path / CLUSTER_FILE).exists()


# --- the node and its network in the app ---------------------------------------------------


class FakeNetwork(LocalTransport):
    """A transport with a life of its own, recording what happens to it."""

    def __init__(self, name: str, events: list[str]) -> None:
        super().__init__(name)
        self.events = events

    async def start(self) -> None:
        self.events.append("network.start")

    async def close(self) -> None:
        self.events.append("network.close")

    @property
    def listen_port(self) -> int:
        return 7777

    def attach(self, name: NodeName, peer: Peer) -> None:
        self.events.append("node.start")

    def detach(self, name: NodeName) -> None:
        self.events.append("node.stop")


def test_the_network_starts_before_the_node_and_closes_after_it(tmp_path: Path) -> None:
    events: list[str] = []
    reports: list[StartupReport] = []
    settings = Settings(
        data_dir=tmp_path / "d",
        admin_password="admin-password",
        node_name="n1",
        cluster=ClusterSettings("n1", ("127.0.0.1", 0), {"n2": ("h", 1)}, SECRET, "c1"),
    )
    app = create_app(
        settings,
        node_factory=lambda s: Node(
            s.data_dir, node_name="n1", transport=FakeNetwork("n1", events)
        ),
        announce=reports.append,
    )

    async def run() -> None:
        async with app.router.lifespan_context(app):
            assert events == ["network.start", "node.start"]

    anyio.run(run)
    assert events == ["network.start", "node.start", "node.stop", "network.close"]
    cluster_report = reports[0].cluster
    assert cluster_report is not None
    assert (cluster_report.node_id, cluster_report.cluster_id) == ("n1", "c1")
    assert cluster_report.listen == "127.0.0.1:7777" and cluster_report.members == ["n1", "n2"]


def test_a_cluster_node_is_built_on_the_tcp_transport(tmp_path: Path) -> None:
    """The cluster's transport with the settled cluster id, TLS files as the transport
    reads them (construction only: nothing binds until the lifespan starts it)."""
    tls = TlsFiles(tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem")
    base = cluster("n1")
    settings = Settings(
        data_dir=tmp_path,
        node_name="n1",
        cluster=ClusterSettings("n1", base.listen, base.peers, SECRET, "c1", tls),
    )
    node = make_node(settings)
    assert isinstance(node, Node) and node.name == "n1"
    transport = node.transport
    assert isinstance(transport, TcpTransport)
    assert transport.nodes() == ["n1", "n2", "n3"]
    assert transport.identity.cluster_id == "c1" and transport.identity.secret == SECRET
    assert transport._tls == TlsConfig(
        cert_file=str(tls.cert_file), key_file=str(tls.key_file), ca_file=str(tls.ca_file)
    )


def test_settled_settings_carry_the_cluster_id(tmp_path: Path) -> None:
    env = {"QUORRA_CLUSTER_SECRET": SECRET.decode(), "QUORRA_NODE_ID": "n2",
           "QUORRA_CLUSTER_LISTEN": "127.0.0.1:7002",
           "QUORRA_PEERS": "n1@127.0.0.1:7001,n3@127.0.0.1:7003"}  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = settled_settings(Settings.from_env(tmp_path / "d"))
    assert settings.cluster is not None
    assert settings.cluster.cluster_id == derive_cluster_id(SECRET, ["n1", "n2", "n3"])


# --- real `quorra serve` processes ---------------------------------------------------------


def serve(
    data_dir: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``quorra serve`` that is expected to refuse to start (and so to end by itself)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
    environ.update(env or {})
    command = [QUORRA, "serve", "--data-dir", str(data_dir), "--port", str(free_port()), *flags]
    return subprocess.run(
        command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )


def node_flags(node_id: str, peers: str = "n2@127.0.0.1:7002,n3@127.0.0.1:7003") -> list[str]:
    return ["--node-id", node_id, "--cluster-listen", f"127.0.0.1:{free_port()}", "--peers", peers]


def assert_refused(run: subprocess.CompletedProcess[str], status: int, expected: str) -> None:
    assert run.returncode == status, run.stderr
    assert run.stderr.startswith("quorra serve: ") and run.stderr.count("\n") == 1, run.stderr
    assert expected in run.stderr
    assert "Started server process" not in run.stdout + run.stderr  # nothing was bound


@pytest.mark.integration
def test_serve_refuses_another_clusters_or_nodes_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    members = {"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002", "n3": "127.0.0.1:7003"}
    write_identity(data, ClusterIdentity("alpha", "n1", members))
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    env = {"QUORRA_CLUSTER_SECRET_FILE": str(secret_file)}
    wrong_cluster = serve(data, *node_flags("n1"), "--cluster-id", "beta", env=env)
    assert_refused(wrong_cluster, 3, f"{data} belongs to cluster alpha, not to the cluster id")
    wrong_node = serve(data, *node_flags("n2", "n1@127.0.0.1:7001,n3@127.0.0.1:7003"), env=env)
    assert_refused(wrong_node, 3, f"{data} belongs to node n1, not to --node-id n2")
    no_peers = serve(data)
    assert_refused(no_peers, 3, "start it with --node-id n1 and its --peers")
    moved = serve(data, *node_flags("n1"), env=env)  # on a free port, not 7001
    assert_refused(moved, 3, "node n1 is known to its cluster at 127.0.0.1:7001")


@pytest.mark.integration
def test_serve_refuses_a_cluster_node_without_its_secret(tmp_path: Path) -> None:
    run = serve(tmp_path / "data", *node_flags("n1"))
    assert_refused(run, 2, "a cluster node needs the cluster secret: QUORRA_CLUSTER_SECRET")
    short = serve(tmp_path / "data", *node_flags("n1"), env={"QUORRA_CLUSTER_SECRET": "short"})
    assert_refused(short, 2, "QUORRA_CLUSTER_SECRET is 5 bytes; it needs at least 16")
    assert not (tmp_path / "data" / CLUSTER_FILE).exists()


@pytest.mark.integration
def test_a_single_node_data_directory_is_not_turned_into_a_cluster_node(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Server(data).start().stop()
    env = {"QUORRA_CLUSTER_SECRET": SECRET.decode()}
    run = serve(data, *node_flags("n1"), env=env)
    assert_refused(run, 3, "holds a single-node server's data")
    assert not (data / CLUSTER_FILE).exists()
    Server(data).start().stop()  # and it still serves single-node


MIRROR_WAIT_MS = 500
"""A node whose peers never start waits this long for the metadata's users (10 s by
default), then turns ready without them."""


class ClusterServer(Server):
    def __init__(self, data_dir: Path, flags: list[str]) -> None:
        env = {
            "QUORRA_CLUSTER_SECRET": SECRET.decode(),
            "QUORRA_METADATA_MIRROR_WAIT_MS": str(MIRROR_WAIT_MS),
        }
        super().__init__(data_dir, env=env)
        self.flags = flags

    def command(self) -> list[str]:
        return [*super().command(), *self.flags]


@pytest.mark.integration
def test_first_start_forms_the_cluster_and_a_restart_keeps_it(tmp_path: Path) -> None:
    """One node of three, its peers not running: it serves its API all the same."""
    data = tmp_path / "data"
    server = ClusterServer(data, node_flags("n1")).start()
    server.stop()
    identity = read_identity(data)
    assert identity is not None and identity.node_id == "n1"
    assert identity.cluster_id == derive_cluster_id(SECRET, ["n1", "n2", "n3"])
    assert f"Cluster {identity.cluster_id}: node n1" in server.output()
    assert "ready before the cluster metadata's users reached SQLite" in server.output()
    server.start()  # the same settings: the same cluster
    server.stop()
    assert read_identity(data) == identity
    refused = serve(data, *node_flags("n1"), "--cluster-id", "other", env=server.env)
    assert_refused(refused, 3, f"belongs to cluster {identity.cluster_id}")
