"""The cluster settings of ``quorra serve``: flags and environment, parsed and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cluster_settings import (
    ClusterFlags,
    SettingsError,
    TlsFiles,
    format_address,
    parse_address,
)
from app.settings import Settings

SECRET = "a-cluster-secret-of-32-bytes-xyz"
PEERS = "n2@127.0.0.1:7002,n3@node-3.example.com:7003"
CLUSTER = ClusterFlags(node_id="n1", listen="127.0.0.1:7001", peers=PEERS)


def settings(
    tmp_path: Path, flags: ClusterFlags = CLUSTER, env: dict[str, str] | None = None
) -> Settings:
    environ = {"QUORRA_CLUSTER_SECRET": SECRET} if env is None else env
    return Settings.from_env(tmp_path / "d", environ=environ, cluster_flags=flags)


def refusal(
    tmp_path: Path, flags: ClusterFlags = CLUSTER, env: dict[str, str] | None = None
) -> str:
    with pytest.raises(SettingsError) as refused:
        settings(tmp_path, flags, env)
    assert refused.value.exit_status == 2
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_cluster_node_from_flags(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert s.cluster is not None and s.node_name == "n1"
    assert s.cluster.node_id == "n1" and s.cluster.listen == ("127.0.0.1", 7001)
    assert s.cluster.peers == {"n2": ("127.0.0.1", 7002), "n3": ("node-3.example.com", 7003)}
    assert s.cluster.members == ["n1", "n2", "n3"]
    assert s.cluster.secret == SECRET.encode() and s.cluster.cluster_id is None
    assert s.cluster.tls is None
    assert SECRET not in repr(s)  # settings may be logged; the secret never is


def test_a_cluster_node_from_the_environment_and_flags_win(tmp_path: Path) -> None:
    env = {
        "QUORRA_CLUSTER_SECRET": SECRET,
        "QUORRA_NODE_ID": "n2",
        "QUORRA_CLUSTER_LISTEN": "[::1]:7002",
        "QUORRA_PEERS": " n1@[::1]:7001 , n3@[::1]:7003 ",
        "QUORRA_CLUSTER_ID": "prod-eu",
    }
    s = settings(tmp_path, ClusterFlags(), env)
    assert s.cluster is not None and s.node_name == "n2" and s.cluster.cluster_id == "prod-eu"
    assert s.cluster.listen == ("::1", 7002) and s.cluster.peers["n3"] == ("::1", 7003)
    flags = ClusterFlags(node_id="n3", peers="n1@[::1]:7001,n2@[::1]:7002", cluster_id="c2")
    s = settings(tmp_path, flags, {**env, "QUORRA_CLUSTER_LISTEN": "[::1]:7003"})
    assert s.cluster is not None and s.node_name == "n3" and s.cluster.cluster_id == "c2"
    assert s.cluster.members == ["n1", "n2", "n3"]


def test_without_peers_the_server_is_single_node(tmp_path: Path) -> None:
    s = settings(tmp_path, ClusterFlags(), {})
    assert s.cluster is None and s.node_name  # the host name, as before
    named = settings(tmp_path, ClusterFlags(node_id="alone"), {})
    assert named.cluster is None and named.node_name == "alone"
    legacy = settings(tmp_path, ClusterFlags(), {"QUORRA_NODE_NAME": "old.host"})
    assert legacy.cluster is None and legacy.node_name == "old.host"


def test_the_secret_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    from_file = settings(
        tmp_path, ClusterFlags(**{**_fields(CLUSTER), "secret_file": str(path)}), {}
    )
    from_env = settings(tmp_path, CLUSTER, {"QUORRA_CLUSTER_SECRET_FILE": str(path)})
    for s in (from_file, from_env):
        assert s.cluster is not None and s.cluster.secret == SECRET.encode()  # no line break


def _fields(flags: ClusterFlags) -> dict[str, str | None]:
    return {name: getattr(flags, name) for name in ClusterFlags.__dataclass_fields__}


def with_flags(**changes: str | None) -> ClusterFlags:
    return ClusterFlags(**{**_fields(CLUSTER), **changes})


JOIN = ClusterFlags(node_id="n4", listen="127.0.0.1:7004", join="127.0.0.1:7001")


def with_join(**changes: str | None) -> ClusterFlags:
    return ClusterFlags(**{**_fields(JOIN), **changes})


def test_a_node_that_joins_from_flags_or_the_environment(tmp_path: Path) -> None:
    s = settings(tmp_path, JOIN)
    assert s.cluster is not None and s.cluster.node_id == "n4"
    assert s.cluster.join == ("127.0.0.1", 7001) and s.cluster.peers == {}
    assert not s.cluster.joined, "settled from the data directory at start"
    env = {"QUORRA_CLUSTER_SECRET": SECRET, "QUORRA_CLUSTER_JOIN": "n1.example:7001"}
    s = settings(tmp_path, with_join(join=None, peers=PEERS.replace("n1", "n9")), env)
    assert s.cluster is not None and s.cluster.join == ("n1.example", 7001)
    assert sorted(s.cluster.peers) == ["n2", "n3"]


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (with_flags(node_id=None), None, "--peers needs --node-id"),
        (with_flags(listen=None), None, "--peers needs --cluster-listen"),
        (CLUSTER, {}, "a cluster node needs the cluster secret"),
        (CLUSTER, {"QUORRA_CLUSTER_SECRET": "15-bytes-secret"}, "15 bytes; it needs at least 16"),
        (with_flags(secret_file="/nonexistent/secret"), {}, "--cluster-secret-file: cannot read"),
        (
            with_flags(secret_file="/etc/hostname"),
            None,
            "QUORRA_CLUSTER_SECRET and --cluster-secret-file: give the cluster secret once",
        ),
        (with_flags(peers="n2@127.0.0.1:7002,n1@127.0.0.1:7009"), None, "names this node ('n1')"),
        (with_flags(peers="n2@127.0.0.1:7002,n2@127.0.0.1:7003"), None, "'n2' is named twice"),
        (with_flags(peers="n2@127.0.0.1:7002,n3@127.0.0.1:7002"), None, "the same address"),
        (with_flags(peers="n2@127.0.0.1:7001"), None, "'n2' has this node's address"),
        (with_flags(peers="n2@127.0.0.1:7002,"), None, "'' is not node@host:port"),
        (with_flags(peers="127.0.0.1:7002"), None, "'127.0.0.1:7002' is not node@host:port"),
        (with_flags(peers="n 2@127.0.0.1:7002"), None, "'n 2' is no node id"),
        (with_flags(node_id="-n1"), None, "--node-id: '-n1' is no node id"),
        (with_flags(node_id="n" * 64), None, "is no node id"),
        (with_flags(node_id="n1/../x"), None, "is no node id"),
        (with_flags(cluster_id="prod eu"), None, "--cluster-id: 'prod eu' is no node id"),
        (with_flags(listen="127.0.0.1"), None, "--cluster-listen: '127.0.0.1' is not host:port"),
        (with_flags(listen=":7001"), None, "is not host:port"),
        (with_flags(listen="::1:7001"), None, "an IPv6 address goes in brackets"),
        (with_flags(listen="[zz]:7001"), None, "'zz' in '[zz]:7001' is no IPv6 address"),
        (with_flags(listen="999.1.1.1:7001"), None, "'999.1.1.1' in"),
        (with_flags(listen="bad_host:7001"), None, "'bad_host' in"),
        (with_flags(listen="host:70001"), None, "is not a number in 0..65535"),
        (with_flags(peers="n2@host:0"), None, "--peers (n2): the port of 'host:0'"),
        (with_flags(peers="n2@host:x"), None, "is not a number in 1..65535"),
        (
            ClusterFlags(listen="127.0.0.1:7001"),
            None,
            "--cluster-listen, QUORRA_CLUSTER_SECRET: only for a node of a cluster",
        ),
        (ClusterFlags(), {"QUORRA_CLUSTER_ID": "c1"}, "QUORRA_CLUSTER_ID: only for a node"),
        (CLUSTER, {"QUORRA_CLUSTER_SECRET": SECRET, "QUORRA_NODE_NAME": "n9"}, "differ"),
        (with_flags(tls_cert="/nonexistent.pem"), None, "--cluster-tls-cert: /nonexistent.pem"),
        (JOIN, {}, "a cluster node needs the cluster secret"),
        (with_join(node_id=None), None, "--join needs --node-id"),
        (with_join(listen=None), None, "--join needs --cluster-listen"),
        (with_join(join="127.0.0.1"), None, "--join: '127.0.0.1' is not host:port"),
        (with_join(join="127.0.0.1:7004"), None, "is this node's own --cluster-listen"),
        (with_join(listen="127.0.0.1:0"), None, "--join needs --cluster-listen to be the address"),
        (with_join(listen="0.0.0.0:7004"), None, "the address its peers dial"),
    ],
)
def test_bad_settings_are_refused_with_one_line_naming_them(
    tmp_path: Path, flags: ClusterFlags, env: dict[str, str] | None, expected: str
) -> None:
    assert expected in refusal(tmp_path, flags, env)


def test_tls_files(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    for path in (cert, key, ca):
        path.write_text("PEM")
    env = {"QUORRA_CLUSTER_SECRET": SECRET, "QUORRA_CLUSTER_TLS_CA": str(ca)}
    s = settings(tmp_path, with_flags(tls_cert=str(cert), tls_key=str(key)), env)
    assert s.cluster is not None and s.cluster.tls == TlsFiles(cert, key, ca)
    needs = "needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca"
    assert needs in refusal(tmp_path, with_flags(tls_cert=str(cert), tls_key=str(key)))
    assert needs in refusal(tmp_path, with_flags(tls_cert=str(cert)))
    assert needs in refusal(tmp_path, with_flags(tls_key=str(key)), env)


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:7001", ("127.0.0.1", 7001)),
        ("[::1]:7001", ("::1", 7001)),
        ("[2001:db8::2]:1", ("2001:db8::2", 1)),
        ("node-1.example.com:65535", ("node-1.example.com", 65535)),
        ("localhost:8000", ("localhost", 8000)),
    ],
)
def test_addresses_round_trip(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text, "x") == address
    assert format_address(address) == text


def test_port_zero_only_where_any_port_will_do() -> None:
    assert parse_address("127.0.0.1:0", "x", port_zero_ok=True) == ("127.0.0.1", 0)
    with pytest.raises(SettingsError, match=r"1\.\.65535"):
        parse_address("127.0.0.1:0", "x")
