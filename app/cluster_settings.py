"""The cluster settings of ``quorra serve``: who this node is and whom it talks to.

Rule: every cluster setting comes from a ``quorra serve`` flag or, when the flag is not
given, from its environment variable, and is checked here, once, before anything binds
a port or touches the data directory. A bad value is a ``SettingsError`` whose message
is one line naming the flag or variable; ``quorra serve`` prints it and exits with
status 2. Without peers (``--peers``) or a node to join (``--join``) there is no cluster
(``ClusterSettings`` is ``None``) and the server runs single-node exactly as before, so the settings that only mean something in
a cluster are refused without peers rather than ignored: a node of a cluster started
without ``--peers`` by mistake must not quietly become a single-node server.

The cluster secret authenticates the nodes to each other. It is never a command-line
value (``ps`` shows those to every user of the machine): ``QUORRA_CLUSTER_SECRET``, or a
file named by ``--cluster-secret-file``/``QUORRA_CLUSTER_SECRET_FILE``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLUSTER_SECRET_BYTES_MIN = 16
NODE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
"""Node ids and cluster ids: safe in URL paths, headers, file names and log lines."""
_NODE_ID = re.compile(NODE_ID_PATTERN)
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
HOSTNAME_CHARS_MAX = 253

Address = tuple[str, int]
"""A host (a name, an IPv4 address, or an IPv6 address without brackets) and a port."""


class StartRefused(Exception):
    """The server refuses to start: a one-line message for the operator, and the exit
    status ``quorra serve`` ends with."""

    exit_status = 2


class SettingsError(StartRefused):
    """A setting is malformed or contradicts another."""

    exit_status = 2


@dataclass(frozen=True, slots=True)
class ClusterFlags:
    """What ``quorra serve`` was given on its command line; ``None``: not given, the
    environment variable decides."""

    node_id: str | None = None
    listen: str | None = None
    peers: str | None = None
    join: str | None = None
    cluster_id: str | None = None
    secret_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The files of the cluster port's TLS (PEM)."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    """Every peer's certificate must chain to it, both ways (mutual TLS)."""


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """This node of a cluster: its id, where it listens for its peers, and theirs."""

    node_id: str
    listen: Address
    peers: Mapping[str, Address]
    """Every other node of the cluster, by node id (never this node): as given, and
    once start-up settled the identity of a node that joined, the nodes it learned."""
    secret: bytes = field(repr=False)
    cluster_id: str | None = None
    """As given (``QUORRA_CLUSTER_ID``); ``None`` until start-up settles it
    (app/cluster_identity.py): the data directory's, or derived at formation."""
    tls: TlsFiles | None = None
    join: Address | None = None
    """``--join``: a node of the running cluster this node joins on its first start."""
    joined: bool = False
    """This node joined a running cluster (settled from its data directory)."""
    incarnation: str = ""
    """The id of this node's data directory (settled from it): a node that lost its data
    directory comes back with another one, which its peers refuse."""

    def __post_init__(self) -> None:
        assert (self.peers or self.join) and self.node_id not in self.peers
        assert len(self.secret) >= CLUSTER_SECRET_BYTES_MIN

    @property
    def members(self) -> list[str]:
        """Every node id of the cluster, this one included, sorted."""
        return sorted([self.node_id, *self.peers])


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, what: str, *, port_zero_ok: bool = False) -> Address:
    """``host:port`` (``[v6]:port`` for an IPv6 address); port 0 (any free port) only
    where ``port_zero_ok``."""
    host, colon, port_text = text.strip().rpartition(":")
    if not colon or not host or not port_text:
        raise SettingsError(f"{what}: {text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ip(host, 6):
            raise SettingsError(f"{what}: {host!r} in {text!r} is no IPv6 address")
    elif ":" in host:
        raise SettingsError(f"{what}: an IPv6 address goes in brackets, as in [::1]:7001")
    elif not _is_host(host):
        raise SettingsError(f"{what}: {host!r} in {text!r} is no host name or IPv4 address")
    if not port_text.isdigit() or not (0 if port_zero_ok else 1) <= int(port_text) <= 65535:
        low = 0 if port_zero_ok else 1
        raise SettingsError(f"{what}: the port of {text!r} is not a number in {low}..65535")
    return host, int(port_text)


def _is_ip(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host).version == version
    except ValueError:
        return False


def _is_host(host: str) -> bool:
    if re.fullmatch(r"[0-9.]+", host):  # all digits and dots: only an IPv4 address
        return _is_ip(host, 4)
    return len(host) <= HOSTNAME_CHARS_MAX and _HOSTNAME.fullmatch(host) is not None


def check_node_id(node_id: str, what: str) -> str:
    if _NODE_ID.fullmatch(node_id) is None:
        raise SettingsError(
            f"{what}: {node_id!r} is no node id (1 to 63 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit)"
        )
    return node_id


def parse_peers(text: str, what: str) -> dict[str, Address]:
    """``n2@host:port,n3@host:port``: node ids and addresses, each named once."""
    peers: dict[str, Address] = {}
    seen: dict[Address, str] = {}
    for item in text.split(","):
        name, at, address_text = item.strip().partition("@")
        if not at:
            raise SettingsError(f"{what}: {item.strip()!r} is not node@host:port")
        check_node_id(name, what)
        address = parse_address(address_text, f"{what} ({name})")
        if name in peers:
            raise SettingsError(f"{what}: node {name!r} is named twice")
        if address in seen:
            raise SettingsError(
                f"{what}: {seen[address]!r} and {name!r} have the same address"
                f" {format_address(address)}"
            )
        peers[name], seen[address] = address, name
    return peers


class _Sources:
    """Each setting from its flag, else its environment variable, with the name of the
    one it came from (for error messages)."""

    def __init__(self, flags: ClusterFlags, env: Mapping[str, str]) -> None:
        self.flags, self.env = flags, env

    def get(self, attribute: str, flag: str | None, variable: str) -> tuple[str | None, str]:
        value = getattr(self.flags, attribute) if flag is not None else None
        if value is not None and value != "":
            assert flag is not None
            return value, flag
        return self.env.get(variable) or None, variable


def given_node_id(flags: ClusterFlags, env: Mapping[str, str], node_name: str | None) -> str | None:
    """``--node-id`` or ``QUORRA_NODE_ID``, checked; it names a single node too.
    ``node_name`` is ``QUORRA_NODE_NAME`` when set: it may not contradict the node id."""
    node_id, node_id_from = _Sources(flags, env).get("node_id", "--node-id", "QUORRA_NODE_ID")
    if node_id is not None:
        check_node_id(node_id, node_id_from)
        if node_name is not None and node_name != node_id:
            raise SettingsError(
                f"QUORRA_NODE_NAME {node_name!r} and {node_id_from} {node_id!r} differ"
            )
    return node_id


def cluster_settings(
    flags: ClusterFlags, env: Mapping[str, str], node_name: str | None
) -> ClusterSettings | None:
    """The cluster settings, or ``None`` for a single-node server (``node_name`` as for
    ``given_node_id``)."""
    sources = _Sources(flags, env)
    peers_text, peers_from = sources.get("peers", "--peers", "QUORRA_PEERS")
    join_text, join_from = sources.get("join", "--join", "QUORRA_CLUSTER_JOIN")
    node_id = given_node_id(flags, env, node_name)
    given = _cluster_only(sources)
    if peers_text is None and join_text is None:
        if given:
            raise SettingsError(
                f"{', '.join(given)}: only for a node of a cluster, which needs --peers"
                " or --join (without them the server runs single-node)"
            )
        return None
    what = peers_from if peers_text is not None else join_from
    if node_id is None:
        raise SettingsError(f"{what} needs --node-id (or QUORRA_NODE_ID)")
    peers = {} if peers_text is None else parse_peers(peers_text, peers_from)
    if node_id in peers:
        raise SettingsError(f"{peers_from} names this node ({node_id!r}): list only the others")
    listen_text, listen_from = sources.get("listen", "--cluster-listen", "QUORRA_CLUSTER_LISTEN")
    if listen_text is None:
        raise SettingsError(f"{what} needs --cluster-listen (or QUORRA_CLUSTER_LISTEN)")
    listen = parse_address(listen_text, listen_from, port_zero_ok=True)
    for name, address in peers.items():
        if address == listen:
            raise SettingsError(f"{peers_from}: {name!r} has this node's address {listen_text}")
    join = None
    if join_text is not None:
        join = _join(join_text, join_from, listen, listen_text, listen_from)
    cluster_id, cluster_id_from = sources.get("cluster_id", "--cluster-id", "QUORRA_CLUSTER_ID")
    return ClusterSettings(
        node_id=node_id,
        listen=listen,
        peers=peers,
        secret=_secret(sources),
        cluster_id=None if cluster_id is None else check_node_id(cluster_id, cluster_id_from),
        tls=_tls(sources),
        join=join,
    )


def _join(text: str, what: str, listen: Address, listen_text: str, listen_from: str) -> Address:
    """The node to join; this node's listener must be where its new peers dial it,
    since the cluster records that address."""
    join = parse_address(text, what)
    if join == listen:
        raise SettingsError(f"{what}: {text} is this node's own {listen_from}")
    host, port = listen
    if port == 0 or host in ("0.0.0.0", "::"):
        raise SettingsError(
            f"{what} needs {listen_from} to be the address its peers dial (the cluster"
            f" records it), not {listen_text}"
        )
    return join


_TLS_SETTINGS = (
    ("tls_cert", "--cluster-tls-cert", "QUORRA_CLUSTER_TLS_CERT"),
    ("tls_key", "--cluster-tls-key", "QUORRA_CLUSTER_TLS_KEY"),
    ("tls_ca", "--cluster-tls-ca", "QUORRA_CLUSTER_TLS_CA"),
)
_CLUSTER_ONLY_SETTINGS = (
    ("listen", "--cluster-listen", "QUORRA_CLUSTER_LISTEN"),
    ("cluster_id", "--cluster-id", "QUORRA_CLUSTER_ID"),
    ("secret", None, "QUORRA_CLUSTER_SECRET"),
    ("secret_file", "--cluster-secret-file", "QUORRA_CLUSTER_SECRET_FILE"),
    *_TLS_SETTINGS,
)


def _cluster_only(sources: _Sources) -> list[str]:
    """The names of the cluster-only settings given."""
    given = []
    for attribute, flag, variable in _CLUSTER_ONLY_SETTINGS:
        value, name = sources.get(attribute, flag, variable)
        if value is not None:
            given.append(name)
    return given


def _secret(sources: _Sources) -> bytes:
    value, _ = sources.get("secret", None, "QUORRA_CLUSTER_SECRET")
    path, path_from = sources.get(
        "secret_file", "--cluster-secret-file", "QUORRA_CLUSTER_SECRET_FILE"
    )
    if value is not None and path is not None:
        raise SettingsError(f"QUORRA_CLUSTER_SECRET and {path_from}: give the cluster secret once")
    if value is None and path is None:
        raise SettingsError(
            "a cluster node needs the cluster secret: QUORRA_CLUSTER_SECRET,"
            " or a file named by --cluster-secret-file or QUORRA_CLUSTER_SECRET_FILE"
        )
    if path is not None:
        try:
            # A trailing line break is the editor's, not the secret's: a file and the
            # variable holding the same text are the same secret.
            secret = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as e:
            raise SettingsError(f"{path_from}: cannot read {path}: {e.strerror}") from None
        what = f"the cluster secret in {path}"
    else:
        assert value is not None
        secret, what = value.encode(), "QUORRA_CLUSTER_SECRET"
    if len(secret) < CLUSTER_SECRET_BYTES_MIN:
        raise SettingsError(
            f"{what} is {len(secret)} bytes; it needs at least {CLUSTER_SECRET_BYTES_MIN}"
            " (e.g. openssl rand -hex 32)"
        )
    return secret


def _tls(sources: _Sources) -> TlsFiles | None:
    files: dict[str, Path] = {}
    for attribute, flag, variable in _TLS_SETTINGS:
        value, value_from = sources.get(attribute, flag, variable)
        if value is not None:
            if not Path(value).is_file():
                raise SettingsError(f"{value_from}: {value} is not a file")
            files[attribute] = Path(value)
    if not files:
        return None
    if len(files) != len(_TLS_SETTINGS):
        raise SettingsError(
            "cluster TLS needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca"
            " (or QUORRA_CLUSTER_TLS_CERT, _KEY and _CA): peers verify each other"
        )
    return TlsFiles(files["tls_cert"], files["tls_key"], files["tls_ca"])
