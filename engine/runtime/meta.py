"""The durable definition of a queue replica, and the checks on what clients send.

Rule: a replica's definition is one file, ``queues/<uid>/queue.meta``, written atomically
(temporary name, fsync, rename, directory fsync) before any other file of the queue, and
removed first when the queue is deleted: a queue directory without it is an orphan that
the node removes at start. The file is msgpack: name, uid, arguments, creation time, and
the Raft members the group was bootstrapped with. Policy changes rewrite it after they
apply, so the file follows the log (the log is the source of truth).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import msgpack

from engine.errors import MessageTooLarge, ValidationFailed
from engine.limits import Limits
from engine.names import check_queue_name
from engine.queue import POLICY_FIELDS, QueuePolicy
from engine.runtime.api import OutgoingMessage, QueueArgs
from engine.shared_empty import shared
from engine.storage.disk import Disk, write_file_atomic

META_FILE = "queue.meta"
_META_VERSION = 1
UID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A queue's uid names its directory: no dot, no slash."""
CONSUMER_BYTES_MAX = 255
DEDUP_ID_BYTES_MAX = 255


@dataclass(frozen=True, slots=True)
class QueueMeta:
    name: str
    uid: str
    args: QueueArgs
    created_at_ms: int
    members: tuple[str, ...]
    """Node names holding a replica, sorted; the bootstrap configuration of the group."""


def queue_meta(
    name: str, uid: str, args: QueueArgs, created_at_ms: int, members: tuple[str, ...]
) -> QueueMeta:
    """A ``QueueMeta`` whose arguments and members are the objects of every other queue
    with equal ones: thousands of queues made from the same defaults held a copy each
    (about 350 bytes: the arguments, their strings, the member tuple and names)."""
    return QueueMeta(name, uid, shared(args), created_at_ms, shared(members))


def meta_path(uid: str) -> str:
    return f"queues/{uid}/{META_FILE}"


def encode_meta(meta: QueueMeta) -> bytes:
    args = {f.name: getattr(meta.args, f.name) for f in dataclasses.fields(QueueArgs)}
    body = [_META_VERSION, meta.name, meta.uid, args, meta.created_at_ms, list(meta.members)]
    return bytes(msgpack.packb(body, use_bin_type=True))


def decode_meta(data: bytes) -> QueueMeta | None:
    try:
        version, name, uid, args, created, members = msgpack.unpackb(data, raw=False)
        if version != _META_VERSION:
            return None
        return queue_meta(name, uid, QueueArgs(**args), int(created), tuple(members))
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def write_meta(disk: Disk, meta: QueueMeta) -> None:
    disk.makedirs(f"queues/{meta.uid}")
    write_file_atomic(disk, meta_path(meta.uid), encode_meta(meta))


def read_meta(disk: Disk, uid: str) -> QueueMeta | None:
    try:  # one read rather than a check first: a start reads every queue's
        data = disk.read(meta_path(uid))
    except FileNotFoundError:
        return None
    meta = decode_meta(data)
    return meta if meta is not None and meta.uid == uid else None


# --- validation ------------------------------------------------------------------------


def check_uid(uid: str) -> None:
    if not UID_RE.match(uid):
        raise ValidationFailed("a queue uid is 1-64 letters, digits, '_' or '-'")


def check_meta(meta: QueueMeta, limits: Limits) -> None:
    """A definition a peer sends (``CreateReplica``): what the node that created the
    queue checked, and a uid that names a directory of ``queues/`` and nothing else."""
    check_queue_name(meta.name)
    check_uid(meta.uid)
    if not meta.members or list(meta.members) != sorted(set(meta.members)):
        raise ValidationFailed("a queue's members are node names, sorted and unique")
    policy_of(meta.args, limits)


def policy_of(args: QueueArgs, limits: Limits) -> QueuePolicy:
    """The machine policy for ``args``; ``ValidationFailed`` when they are invalid."""
    fields = {name: getattr(args, name) for name in POLICY_FIELDS}
    for name, value in fields.items():
        if isinstance(value, bool):
            raise ValidationFailed(f"{name} must not be a boolean")
    policy = QueuePolicy(**fields)
    why = policy.check(limits.lease_ms_max, limits.priorities_max, limits.message_bytes_max_ceiling)
    if why:
        raise ValidationFailed(why)
    if policy.dead_letter_queue is not None:
        check_queue_name(policy.dead_letter_queue)
    return policy


def check_args(args: QueueArgs, limits: Limits, nodes: int) -> QueueArgs:
    """``args`` checked, with ``replicas`` resolved to a number of nodes."""
    replicas = args.replicas
    if replicas is None:
        replicas = min(3, nodes)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= nodes:
        raise ValidationFailed(f"replicas must be 1..{nodes} (nodes in the cluster)")
    policy_of(args, limits)
    return dataclasses.replace(args, replicas=replicas)


def args_with(args: QueueArgs, changes: dict[str, object], limits: Limits) -> QueueArgs:
    """``args`` after a policy change; ``ValidationFailed`` for a bad or unknown field."""
    unknown = sorted(set(changes) - set(POLICY_FIELDS))
    if unknown:
        raise ValidationFailed(f"not a policy field: {', '.join(unknown)}")
    if "priorities" in changes and changes["priorities"] != args.priorities:
        raise ValidationFailed("priorities is fixed when the queue is created")
    try:
        new = dataclasses.replace(args, **changes)  # type: ignore[arg-type]
    except TypeError as e:
        raise ValidationFailed(str(e)) from e
    policy_of(new, limits)
    return new


def encode_headers(headers: dict[str, str]) -> bytes:
    if not headers:
        return b""
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValidationFailed("headers are string pairs")
    return bytes(msgpack.packb(headers, use_bin_type=True))


def decode_headers(raw: memoryview | bytes) -> dict[str, str]:
    if not len(raw):
        return {}
    value = msgpack.unpackb(raw, raw=False)
    assert isinstance(value, dict)
    return value


def check_message(m: OutgoingMessage, policy: QueuePolicy, limits: Limits) -> bytes:
    """Checks one message of a batch; returns its encoded headers."""
    if not isinstance(m.body, bytes | bytearray):
        raise ValidationFailed("a message body is bytes")
    headers = encode_headers(m.headers)
    if len(headers) > limits.headers_bytes_max:
        raise MessageTooLarge(f"headers are larger than {limits.headers_bytes_max} bytes")
    if len(m.body) + len(headers) > policy.max_message_bytes:
        raise MessageTooLarge(f"a message is larger than {policy.max_message_bytes} bytes")
    if isinstance(m.priority, bool) or not 0 <= m.priority <= 255:
        raise ValidationFailed("priority must be 0..255")
    if m.ttl_ms is not None and (isinstance(m.ttl_ms, bool) or not 0 <= m.ttl_ms < 1 << 62):
        raise ValidationFailed("ttl_ms must be a non-negative integer")
    if isinstance(m.delay_ms, bool) or not 0 <= m.delay_ms < 1 << 62:
        raise ValidationFailed("delay_ms must be a non-negative integer")
    if m.dedup_id is not None and not 1 <= len(m.dedup_id.encode()) <= DEDUP_ID_BYTES_MAX:
        raise ValidationFailed(f"dedup_id must be 1..{DEDUP_ID_BYTES_MAX} bytes")
    if m.frame_count and (type(m.frame_count) is not int or m.frame_count < 0):
        raise ValidationFailed("frame_count must be a non-negative integer")
    if m.frame_count and m.dedup_id is None:
        raise ValidationFailed("a frame has a dedup_id")
    return headers


__all__ = [
    "DEDUP_ID_BYTES_MAX",
    "META_FILE",
    "QueueMeta",
    "args_with",
    "check_args",
    "check_message",
    "check_meta",
    "check_uid",
    "decode_headers",
    "decode_meta",
    "encode_headers",
    "encode_meta",
    "meta_path",
    "policy_of",
    "read_meta",
    "write_meta",
]
