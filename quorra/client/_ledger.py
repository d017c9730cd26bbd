"""The client side of a stream's frames, without I/O: what is unconfirmed, what failed,
what was delivered. ``Stream`` and ``AsyncStream`` feed it every frame they read.

Rule: a publish is outstanding from the frame sent until its ``confirm`` (cumulative:
every outstanding seq up to it) or its own ``error`` frame; the window counts the
messages of outstanding publishes. Nothing here blocks or reads a clock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from quorra.client._columns import DeliveredColumns
from quorra.client._types import (
    Delivery,
    Problem,
    Publishable,
    Settled,
    deliveries_of,
    message_map,
)

PROBLEMS_KEPT = 100
"""Errors of consume and settle frames kept for ``problems`` (the oldest are dropped)."""
ANSWERS_KEPT = 10_000
"""Answers to settle frames sent with a ``ref``, kept until taken (the oldest dropped)."""
SETTLE_OPS = frozenset({"ack", "nack", "extend"})
BODY_MAP_HEAD = b"\x81\xa4body\xc6"
"""The MessagePack of a message that is its body alone, up to the body's length: a map of
one entry, the key "body", and a bin 32 (the body's length, a big-endian u32, follows)."""
_ARRAY_32 = b"\xdd"


def stream_url(base_url: str, queue: str) -> str:
    """``ws://`` (or ``wss://``) address of ``queue``'s stream on the server at ``base_url``."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return f"{base}/api/v1/queues/{queue}/stream"


class _Packer(threading.local):
    """This thread's packer: ``msgpack.packb`` makes (and frees) a packer and its buffer
    for every frame, one per publish."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True, autoreset=True)


_PACKER = _Packer()


def pack(frame: dict[str, object]) -> bytes:
    packed: bytes = _PACKER.packer.pack(frame)
    return packed


def unpack(data: bytes | str) -> dict[str, Any]:
    if isinstance(data, str):
        raise Problem(400, "about:blank", "The server sent a text frame")
    frame = msgpack.unpackb(data, raw=False)
    if not isinstance(frame, dict):
        raise Problem(400, "about:blank", "The server sent a frame that is no map")
    return frame


class PublishFailed(Exception):
    """Publishes the server refused: ``failures`` maps their seq to the problem."""

    def __init__(self, failures: dict[int, Problem]) -> None:
        first = next(iter(failures.items()))
        super().__init__(f"{len(failures)} publish(es) refused; seq {first[0]}: {first[1]}")
        self.failures = failures


class Ledger:
    def __init__(self, ready: dict[str, Any], window_messages: int | None) -> None:
        if ready.get("op") != "ready":
            raise Problem.of(ready, int(ready.get("status", 500)))
        server_window = int(ready["window_messages"])
        self.window = min(window_messages or server_window, server_window)
        self.batch_messages_max = int(ready["batch_messages_max"])
        self.prefetch_max = int(ready["prefetch_max"])
        self.seq = 0
        self.outstanding: OrderedDict[int, int] = OrderedDict()
        """seq -> messages, oldest first."""
        self.outstanding_messages = 0
        self.confirmed_seq = 0
        self.failures: dict[int, Problem] = {}
        self.deliveries: deque[Delivery] = deque()
        self.delivered_columns: deque[DeliveredColumns] = deque()
        """Columnar deliver frames (``consume`` with ``columns``), until taken."""
        self.problems: deque[Problem] = deque(maxlen=PROBLEMS_KEPT)
        self.settled = 0
        self.stale: deque[str] = deque(maxlen=PROBLEMS_KEPT)
        self.answers: OrderedDict[int | str, Settled | Problem] = OrderedDict()
        """The answer of each settle frame sent with a ``ref``, by ref, until taken."""

    def room_for(self, count: int) -> bool:
        """Whether ``count`` more messages fit the window (one frame always does when
        nothing is outstanding)."""
        return not self.outstanding or self.outstanding_messages + count <= self.window

    def _next_publish(self, count: int) -> None:
        """Number the next publish frame, of ``count`` messages, and count them
        outstanding until confirmed."""
        if not 1 <= count <= self.batch_messages_max:
            raise ValueError(f"a publish holds 1..{self.batch_messages_max} messages")
        self.seq += 1
        self.outstanding[self.seq] = count
        self.outstanding_messages += count

    def publish_frame(
        self, messages: Sequence[Publishable], dedup_id: str | None = None
    ) -> tuple[int, bytes]:
        return self.publish_frame_of_maps([message_map(m) for m in messages], dedup_id)

    def publish_frame_of_maps(
        self, maps: Sequence[Mapping[str, object]], dedup_id: str | None = None
    ) -> tuple[int, bytes]:
        """As ``publish_frame`` for messages already in their wire form (``message_map``'s
        shape; a body may be any bytes-like object, e.g. a view into an Arrow buffer):
        callers with many messages skip a ``Message`` per message. The server validates
        each map as it does any frame. A ``dedup_id`` is the frame's, for all its
        messages (which then have none of their own)."""
        self._next_publish(len(maps))
        out: dict[str, object] = {"op": "publish", "seq": self.seq, "messages": maps}
        if dedup_id is not None:
            out["dedup_id"] = dedup_id
        frame = pack(out)
        return self.seq, frame

    def publish_frame_of_packed(
        self, count: int, packed: Sequence[bytes | memoryview], dedup_id: str | None = None
    ) -> tuple[int, bytes]:
        """As ``publish_frame_of_maps`` for ``count`` messages already packed: the pieces
        ``packed``, joined, are the MessagePack encodings of the messages' maps one after
        another (a map ``{"body": bin}`` is ``BODY_MAP_HEAD``, the body's length as a
        big-endian u32, then the body). A batch writer packs a column of bodies at once
        (``pipeline.source``), without an object per message; the server reads the frame
        as any other."""
        self._next_publish(count)
        fields: list[object] = ["op", "publish", "seq", self.seq]
        if dedup_id is not None:
            fields += ["dedup_id", dedup_id]
        # The frame's map: its fields, then "messages": an array (32-bit count) of them.
        packer = _PACKER.packer
        head = [packer.pack_map_header(len(fields) // 2 + 1), *map(packer.pack, fields)]
        head += [packer.pack("messages"), _ARRAY_32 + count.to_bytes(4, "big")]
        return self.seq, b"".join([*head, *packed])

    def on_frame(self, frame: dict[str, Any]) -> None:
        op = frame.get("op")
        if op == "deliver":
            if frame.get("columns"):
                self.delivered_columns.append(DeliveredColumns.of(frame))
            else:
                self.deliveries.extend(deliveries_of(frame["messages"]))
        elif op == "confirm":
            self._confirm(int(frame["seq"]))
        elif op == "settled":
            self.settled += int(frame["settled"])
            self.stale.extend(frame["stale"])
            if "ref" in frame:
                self._answer(frame["ref"], Settled(int(frame["settled"]), list(frame["stale"])))
        elif op == "error":
            self._error(frame)

    def _confirm(self, upto: int) -> None:
        while self.outstanding:
            seq, count = next(iter(self.outstanding.items()))
            if seq > upto:
                break
            del self.outstanding[seq]
            self.outstanding_messages -= count
        self.confirmed_seq = max(self.confirmed_seq, upto)

    def _error(self, frame: dict[str, Any]) -> None:
        problem = Problem.of(frame, int(frame.get("status", 500)))
        seq = frame.get("seq")
        if frame.get("of") == "publish" and isinstance(seq, int) and seq in self.outstanding:
            self.outstanding_messages -= self.outstanding.pop(seq)
            self.failures[seq] = problem
            return
        if frame.get("of") in SETTLE_OPS and "ref" in frame:
            self._answer(frame["ref"], problem)
            return
        self.problems.append(problem)

    def _answer(self, ref: int | str, answer: Settled | Problem) -> None:
        self.answers[ref] = answer
        while len(self.answers) > ANSWERS_KEPT:
            self.answers.popitem(last=False)

    def done(self, seq: int) -> bool:
        """Whether publish ``seq`` has its answer (confirmed or failed)."""
        return seq not in self.outstanding

    def take_failures(self) -> None:
        """Raise ``PublishFailed`` for the publishes refused so far (then forgotten)."""
        if self.failures:
            failures, self.failures = self.failures, {}
            raise PublishFailed(failures)

    def settle_frame(
        self,
        how: str,
        receipts: list[str],
        *,
        requeue: bool = True,
        lease_ms: int = 0,
        ref: int | str | None = None,
    ) -> bytes:
        """An ack, nack or extend frame; with a ``ref``, its answer lands in ``answers``."""
        frame: dict[str, object] = {"op": how, "receipts": receipts}
        if ref is not None:
            frame["ref"] = ref
        if how == "nack":
            frame["requeue"] = requeue
        elif how == "extend":
            frame["lease_ms"] = lease_ms
        return pack(frame)


def consume_frame(
    prefetch: int, lease_ms: int | None, consumer: str | None, columns: bool = False
) -> bytes:
    frame: dict[str, object] = {"op": "consume", "prefetch": prefetch}
    if columns:
        frame["columns"] = True
    if lease_ms is not None:
        frame["lease_ms"] = lease_ms
    if consumer is not None:
        frame["consumer"] = consumer
    return pack(frame)
