"""The closed set of operating errors.

An operating error is something a correct program meets in production: bad input, a full
disk, no quorum. Each kind is one class here, with the HTTP status and the RFC 9457
problem type the app maps it to. Programmer errors (a broken invariant) are not here:
they are ``AssertionError`` and crash loudly.
"""

from __future__ import annotations

from typing import ClassVar


class QuorraError(Exception):
    """Base of every operating error. ``detail`` is safe to show to a client."""

    status: ClassVar[int] = 500
    problem: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    retry_after_s: int | None = None

    def __init__(self, detail: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s

    @property
    def problem_type(self) -> str:
        return f"/problems/{self.problem}"


class InvalidRequest(QuorraError):
    status, problem, title = 400, "invalid-request", "Malformed request"


class ValidationFailed(QuorraError):
    status, problem, title = 422, "validation-failed", "Validation failed"


class WireError(ValidationFailed):
    """Bytes from a peer that do not decode to what the node protocol allows, or a call
    whose fields are not of their declared types (``engine.runtime.wire``)."""


class QueueNotFound(QuorraError):
    status, problem, title = 404, "queue-not-found", "Queue not found"


class NotFound(QuorraError):
    status, problem, title = 404, "not-found", "Not found"


class QueueConflict(QuorraError):
    """A queue exists with other arguments, or the request conflicts with its state."""

    status, problem, title = 409, "queue-conflict", "Conflicting queue definition"


class Conflict(QuorraError):
    """A change conflicts with the cluster's metadata: a node, user or token that exists
    otherwise, or a change made against a generation that has moved on."""

    status, problem, title = 409, "conflict", "Conflicting change"


class StaleReceipt(QuorraError):
    status, problem, title = 409, "stale-receipt", "Stale receipt"


class MessageTooLarge(QuorraError):
    status, problem, title = 413, "message-too-large", "Message or batch too large"


class QueueFull(QuorraError):
    """``max_length``/``max_bytes`` reached with ``overflow = reject-publish``."""

    status, problem, title = 429, "queue-full", "Queue full"
    retry_after_s = 1


class Backpressure(QuorraError):
    """An in-flight limit of the queue or node is reached; retry later."""

    status, problem, title = 429, "backpressure", "Too many requests in flight"
    retry_after_s = 1


class MemoryAlarm(Backpressure):
    """The node's engine memory would pass ``Limits.engine_memory_bytes_max``: publishes
    are refused until consumers (or a purge) bring it down; it clears by itself."""

    status, problem, title = 429, "memory-alarm", "Node memory limit reached"
    retry_after_s = 1


class NoLeader(QuorraError):
    """No leader or no quorum for the queue right now; retry later."""

    status, problem, title = 503, "no-leader", "No leader or no quorum"
    retry_after_s = 1


class OutcomeUnknown(NoLeader):
    """An operation was sent but no answer can come: a call to another node whose
    connection dropped or whose deadline passed, or a proposal whose leader stepped down
    before it committed. It may or may not take effect; the client retries (a publish
    with its dedup id). A kind of ``NoLeader``: code that tolerates an
    unreachable node (deleting a replica on a node that is down) tolerates this too."""

    status, problem, title = 503, "outcome-unknown", "Outcome unknown"
    retry_after_s = 1


class StorageFailed(QuorraError):
    """The disk refused a write (full, I/O error). The queue refuses writes; data is intact."""

    status, problem, title = 503, "storage-failed", "Storage unavailable"
    retry_after_s = 5


class EntryDamaged(StorageFailed):
    """A stored entry, or the index of the segment holding it, fails its CRC32C check.
    ``index`` is the first index that cannot be trusted (a damaged segment index makes
    its whole range untrusted); the replica repairs it from its peers."""

    def __init__(self, detail: str, *, index: int = 0, retry_after_s: int | None = None) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.index = index


class PageDamaged(StorageFailed):
    """A spilled page of a queue's ready index (``engine.queue.paging``) fails its CRC32C
    check or is missing from the page store. ``handle`` names it. The machine rebuilds
    it from the log where it can; where it cannot, the replica is repaired from its
    peers, as for a damaged entry."""

    def __init__(self, detail: str, *, handle: int = 0, retry_after_s: int | None = None) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.handle = handle


class RecoveryRefused(QuorraError):
    """The data on disk cannot be recovered safely; the server refuses to serve it."""

    status, problem, title = 503, "recovery-refused", "Data cannot be recovered safely"


__all__ = [
    "Backpressure",
    "Conflict",
    "EntryDamaged",
    "InvalidRequest",
    "MessageTooLarge",
    "NoLeader",
    "NotFound",
    "OutcomeUnknown",
    "PageDamaged",
    "QueueConflict",
    "QueueFull",
    "QueueNotFound",
    "QuorraError",
    "RecoveryRefused",
    "StaleReceipt",
    "StorageFailed",
    "ValidationFailed",
    "WireError",
]
