"""Cluster metadata commands: typed frozen values, one msgpack encoding, checked decoding.

Rule of this module: a command is a frozen dataclass; ``encode_command`` writes it as the
msgpack array ``[FORMAT_VERSION, tag, {field: value}]`` (keyword fields, so that a field
added later is a new format version, never a silent shift), and ``decode_command`` reads
it back checking the version, the tag, the exact set of fields and each field's type and
bounds. Anything else is ``InvalidRequest``: the machine answers it as an error, the
same on every replica, and never raises.

Decoding checks shapes only; what a value means (a node that exists, a legal state
change, a policy within the limits) is the machine's to check when it applies it.
Queue names are not matched against the API's pattern here: the runtime checks them
before it proposes, and a name never reaches the file system (directories are named by
the uid the machine assigns).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from engine.errors import InvalidRequest
from engine.queue import POLICY_FIELDS, QueuePolicy

FORMAT_VERSION = 1
INT_MAX = (1 << 63) - 1
NAME_CHARS_MAX = 200
"""Node, queue, user and token names; cluster ids and uids."""
TEXT_CHARS_MAX = 500
"""Permission patterns, password hashes, addresses."""
_TEXT_FIELDS = frozenset({"configure", "write", "read", "password_hash", "address"})


class MetaCommand:
    """Base of the commands; ``TAG`` names the kind in the encoding."""

    TAG: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Bootstrap(MetaCommand):
    """Name the cluster; the first command of its metadata log (the same id again: no-op)."""

    TAG: ClassVar[str] = "bootstrap"
    cluster_id: str


@dataclass(frozen=True, slots=True)
class AddNode(MetaCommand):
    """A node joins (again, as a new node, if its name was forgotten)."""

    TAG: ClassVar[str] = "add_node"
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class SetNodeState(MetaCommand):
    """Drain a node, declare it lost, bring it back, forget it (``NODE_MOVES``)."""

    TAG: ClassVar[str] = "set_node_state"
    name: str
    state: str


@dataclass(frozen=True, slots=True)
class NodeStarted(MetaCommand):
    """A node runs from data directory ``incarnation`` (set once per node record)."""

    TAG: ClassVar[str] = "node_started"
    name: str
    incarnation: str


@dataclass(frozen=True, slots=True)
class CreateQueue(MetaCommand):
    """Define a queue; the machine assigns its uid and places its replicas."""

    TAG: ClassVar[str] = "create_queue"
    name: str
    replicas: int
    policy: QueuePolicy


@dataclass(frozen=True, slots=True)
class DeleteQueue(MetaCommand):
    """Begin deleting a queue; ``uid`` (``""``: whichever is current) guards against
    deleting a newer queue of the same name."""

    TAG: ClassVar[str] = "delete_queue"
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class SetQueuePolicy(MetaCommand):
    """The queue's policy after a change applied in its own log (the registry follows)."""

    TAG: ClassVar[str] = "set_queue_policy"
    uid: str
    policy: QueuePolicy


@dataclass(frozen=True, slots=True)
class SetQueueLeader(MetaCommand):
    """Another member should lead (a leadership move, a drain)."""

    TAG: ClassVar[str] = "set_queue_leader"
    uid: str
    node: str


@dataclass(frozen=True, slots=True)
class AddMember(MetaCommand):
    """Place a replica on ``node``, if the members are still at ``generation``."""

    TAG: ClassVar[str] = "add_member"
    uid: str
    node: str
    generation: int


@dataclass(frozen=True, slots=True)
class RemoveMember(MetaCommand):
    """Take the replica off ``node``, if the members are still at ``generation``."""

    TAG: ClassVar[str] = "remove_member"
    uid: str
    node: str
    generation: int


@dataclass(frozen=True, slots=True)
class ReplicaCreated(MetaCommand):
    """``node`` holds its replica of ``uid`` durably (reported by its reconcile loop)."""

    TAG: ClassVar[str] = "replica_created"
    node: str
    uid: str


@dataclass(frozen=True, slots=True)
class ReplicaDropped(MetaCommand):
    """``node`` holds nothing of ``uid`` any more (reported by its reconcile loop)."""

    TAG: ClassVar[str] = "replica_dropped"
    node: str
    uid: str


@dataclass(frozen=True, slots=True)
class PutUser(MetaCommand):
    """Create a user, or change its password hash and role (permissions stay)."""

    TAG: ClassVar[str] = "put_user"
    name: str
    password_hash: str
    role: str


@dataclass(frozen=True, slots=True)
class SetPermissions(MetaCommand):
    TAG: ClassVar[str] = "set_permissions"
    user: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class DeleteUser(MetaCommand):
    """Delete a user and its tokens."""

    TAG: ClassVar[str] = "delete_user"
    name: str


@dataclass(frozen=True, slots=True)
class PutToken(MetaCommand):
    """Record a token by its digest; ``id`` is chosen by the proposer."""

    TAG: ClassVar[str] = "put_token"
    id: str
    user: str
    digest: str
    prefix: str
    name: str


@dataclass(frozen=True, slots=True)
class DeleteToken(MetaCommand):
    TAG: ClassVar[str] = "delete_token"
    id: str


COMMANDS: tuple[type[MetaCommand], ...] = (
    Bootstrap,
    AddNode,
    SetNodeState,
    NodeStarted,
    CreateQueue,
    DeleteQueue,
    SetQueuePolicy,
    SetQueueLeader,
    AddMember,
    RemoveMember,
    ReplicaCreated,
    ReplicaDropped,
    PutUser,
    SetPermissions,
    DeleteUser,
    PutToken,
    DeleteToken,
)
_BY_TAG: dict[str, type[MetaCommand]] = {cls.TAG: cls for cls in COMMANDS}
assert len(_BY_TAG) == len(COMMANDS) and "" not in _BY_TAG


def encode_command(command: MetaCommand) -> bytes:
    assert dataclasses.is_dataclass(command) and type(command) in _FIELDS, command
    body: dict[str, Any] = {}
    for name, _check in _FIELDS[type(command)]:
        value = getattr(command, name)
        body[name] = value.to_wire() if isinstance(value, QueuePolicy) else value
    return bytes(msgpack.packb([FORMAT_VERSION, command.TAG, body], use_bin_type=True))


def decode_command(data: bytes) -> MetaCommand:
    """The command ``data`` encodes; ``InvalidRequest`` for anything malformed."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several kinds on garbage
        raise InvalidRequest("malformed metadata command") from e
    if type(doc) is not list or len(doc) != 3 or type(doc[2]) is not dict:
        raise InvalidRequest("malformed metadata command")
    version, tag, body = doc
    if type(version) is not int or version != FORMAT_VERSION:
        raise InvalidRequest(f"unknown metadata command format {version!r}")
    cls = _BY_TAG.get(tag) if type(tag) is str else None
    if cls is None:
        raise InvalidRequest(f"unknown metadata command {tag!r}")
    spec = _FIELDS[cls]
    if set(body) != {name for name, _check in spec}:
        raise InvalidRequest(f"{tag}: fields must be {sorted(name for name, _ in spec)}")
    values = {name: check(name, body[name]) for name, check in spec}
    return cls(**values)


# --- field checks --------------------------------------------------------------------


def _str(name: str, value: object) -> str:
    limit = TEXT_CHARS_MAX if name in _TEXT_FIELDS else NAME_CHARS_MAX
    if type(value) is not str or len(value) > limit:
        raise InvalidRequest(f"{name} must be a string of at most {limit} characters")
    return value


def _int(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= INT_MAX:
        raise InvalidRequest(f"{name} must be a non-negative integer")
    return value


def _optional_int(name: str, value: object) -> int | None:
    return None if value is None else _int(name, value)


def _optional_str(name: str, value: object) -> str | None:
    return None if value is None else _str(name, value)


_POLICY_CHECKS = {
    "int": _int,
    "int | None": _optional_int,
    "str": _str,
    "str | None": _optional_str,
}
_POLICY_SPEC = [(f.name, _POLICY_CHECKS[str(f.type)]) for f in dataclasses.fields(QueuePolicy)]
assert [name for name, _check in _POLICY_SPEC] == list(POLICY_FIELDS)


def _policy(name: str, value: object) -> QueuePolicy:
    if type(value) is not dict or set(value) != set(POLICY_FIELDS):
        raise InvalidRequest(f"{name} must hold exactly the fields {list(POLICY_FIELDS)}")
    checked: dict[str, Any] = {field: check(field, value[field]) for field, check in _POLICY_SPEC}
    return QueuePolicy(**checked)


_CHECKS = {"str": _str, "int": _int, "QueuePolicy": _policy}
_FIELDS = {
    cls: [(f.name, _CHECKS[str(f.type)]) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for cls in COMMANDS
}


__all__ = [
    "COMMANDS",
    "FORMAT_VERSION",
    "NAME_CHARS_MAX",
    "TEXT_CHARS_MAX",
    "AddMember",
    "AddNode",
    "Bootstrap",
    "CreateQueue",
    "DeleteQueue",
    "DeleteToken",
    "DeleteUser",
    "MetaCommand",
    "NodeStarted",
    "PutToken",
    "PutUser",
    "RemoveMember",
    "ReplicaCreated",
    "ReplicaDropped",
    "SetNodeState",
    "SetPermissions",
    "SetQueueLeader",
    "SetQueuePolicy",
    "decode_command",
    "encode_command",
]
