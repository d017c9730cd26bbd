"""Memory per message and apply throughput of the queue machine.

``quorra bench machine [--json] [--quick] [--ready N,N] [--pending N,N] [--ops-messages N]``.

Memory is measured with ``tracemalloc`` (numpy reports its buffers to it), as the traced
bytes the machine holds after the workload minus those of the same machine empty,
divided by the number of messages: everything the state keeps (pages, page headers,
deques, groups, dicts), not an estimate. Throughput is wall time around ``apply`` of
pre-encoded commands, each carrying a batch of 100 messages or receipts, and, separately,
enqueues of one message per command; the CPU time of the process is reported too, as
the cores may be shared with other work.

``live_set_ms`` is the wall time of ``live_indexes`` on each filled machine: the set of
log entries still holding a message, which stats and compaction count against, built on
the event loop (see ``engine.runtime.observe.LIVE_SET_COST_FACTOR``). Of a checkpoint,
``checkpoint_freeze_ms`` is the part on the event loop (``QueueMachine.freeze``) and
``checkpoint_encode_ms`` the part a worker does (encode and live set), in ``details``.
``--quick``: depths of 20,000 and 100,000 ready, 20,000 pending, 20,000 ops messages.

JSON keys (``JSON_KEYS``), the headline being ``bytes_per_ready_message``:

* ``bench``: "machine";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``body_bytes``: bytes per message body;
* ``batch_messages``: messages per command;
* ``bytes_per_ready_message``: the headline: bytes per ready message at the largest
  depth measured (``--ready``);
* ``bytes_per_ready_message_by_depth``: the same at each depth;
* ``bytes_per_pending_message``: bytes per checked-out message at the largest depth
  measured (``--pending``);
* ``bytes_per_pending_message_by_depth``: the same at each depth;
* ``bytes_per_ready_message_single_entries``: bytes per ready message, one per entry;
* ``live_set_ms``: the live set's build time, for each filled machine;
* ``ops_per_s``: enqueue, checkout and settle throughput, batches of 100;
* ``single_enqueue_ops_per_s``: enqueues of one message per command;
* ``details``: every measured machine's figures;
* ``targets``: the engineering goals for the two memory figures.
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import bench
from engine.queue import (
    CheckedOut,
    NewMessage,
    QueueMachine,
    encode_checkout,
    encode_enqueue,
    encode_settle,
)
from engine.queue.machine import FrozenMachine
from engine.raft.state_machine import ApplyMeta

JSON_KEYS = (
    "bench",
    "machine",
    "body_bytes",
    "batch_messages",
    "bytes_per_ready_message",
    "bytes_per_ready_message_by_depth",
    "bytes_per_pending_message",
    "bytes_per_pending_message_by_depth",
    "bytes_per_ready_message_single_entries",
    "live_set_ms",
    "ops_per_s",
    "single_enqueue_ops_per_s",
    "details",
    "targets",
)
HEADLINE_KEY = "bytes_per_ready_message"
QUICK_READY = "20000,100000"
QUICK_PENDING = "20000"
QUICK_MESSAGES = 20_000
BATCH = 100
BODY = b"x" * 100


class _Driver:
    """Applies commands with increasing indexes and a clock that moves 1 ms per entry."""

    def __init__(self) -> None:
        self.machine = QueueMachine()
        self.index = 0

    def apply(self, command: bytes) -> object:
        self.index += 1
        reply, _effects = self.machine.apply(ApplyMeta(self.index, 1, self.index), command)
        return reply


def _fill(driver: _Driver, messages: int, batch: int = BATCH) -> None:
    command = encode_enqueue([NewMessage(BODY) for _ in range(batch)])
    for _ in range(messages // batch):
        driver.apply(command)


def _checkout_all(driver: _Driver, messages: int) -> list[list[tuple[int, int]]]:
    command = encode_checkout("bench-consumer", BATCH, 3_600_000)
    batches: list[list[tuple[int, int]]] = []
    for _ in range(messages // BATCH):
        reply = driver.apply(command)
        assert isinstance(reply, CheckedOut)
        batches.append(list(zip(reply.tags, reply.refs, strict=True)))
    return batches


def _traced_bytes_per_message(messages: int, pending: bool, batch: int = BATCH) -> dict[str, Any]:
    gc.collect()
    tracemalloc.start()
    driver = _Driver()
    base = tracemalloc.get_traced_memory()[0]
    _fill(driver, messages, batch)
    if pending:
        command = encode_checkout("bench-consumer", BATCH, 3_600_000)
        for _ in range(messages // BATCH):
            driver.apply(command)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    stats = driver.machine.stats()
    assert (stats.messages_unacked if pending else stats.messages_ready) == messages
    live_s, _ = _timed(driver.machine.live_indexes)
    frozen: list[FrozenMachine] = []
    freeze_s, _ = _timed(lambda: frozen.append(driver.machine.freeze()))
    encode_s, _ = _timed(lambda: (frozen[0].encode(), frozen[0].live_indexes()))
    return {
        "messages": messages,
        "messages_per_entry": batch,
        "live_set_ms": round(live_s * 1000, 1),
        "checkpoint_freeze_ms": round(freeze_s * 1000, 3),
        "checkpoint_encode_ms": round(encode_s * 1000, 1),
        "traced_bytes": held,
        "bytes_per_message": round(held / messages, 3),
        "machine_estimate_bytes": stats.memory_bytes,
    }


def _timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) spent in ``action``."""
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def _ops(messages: int) -> dict[str, Any]:
    driver = _Driver()
    command = encode_enqueue([NewMessage(BODY) for _ in range(BATCH)])
    n = messages // BATCH

    def enqueue() -> None:
        for _ in range(n):
            driver.apply(command)

    batches: list[list[tuple[int, int]]] = []
    enqueue_s = _timed(enqueue)
    checkout_s = _timed(lambda: batches.extend(_checkout_all(driver, messages)))
    settles = [encode_settle(b) for b in batches]

    def settle() -> None:
        for s in settles:
            driver.apply(s)

    settle_s = _timed(settle)
    assert driver.machine.stats().acked == messages

    def figures(seconds: tuple[float, float]) -> dict[str, float]:
        wall, cpu = seconds
        return {
            "commands_per_s": round(n / wall),
            "messages_per_s": round(messages / wall),
            "messages_per_cpu_s": round(messages / cpu),
        }

    return {
        "batch": BATCH,
        "messages": messages,
        "enqueue": figures(enqueue_s),
        "checkout": figures(checkout_s),
        "settle": figures(settle_s),
    }


def _single_enqueue_ops(messages: int) -> dict[str, Any]:
    """One message per command (a publish of one message is one log entry): what the
    replay of a recovery tail costs per entry."""
    driver = _Driver()
    commands = [encode_enqueue([NewMessage(BODY)]) for _ in range(messages)]

    def enqueue() -> None:
        for command in commands:
            driver.apply(command)

    wall, cpu = _timed(enqueue)
    assert driver.machine.stats().messages_ready == messages
    return {
        "messages": messages,
        "commands_per_s": round(messages / wall),
        "commands_per_cpu_s": round(messages / cpu),
        "cpu_us_per_command": round(cpu / messages * 1e6, 2),
    }


def main(argv: list[str]) -> int:
    parser = bench.parser("machine", __doc__)
    parser.add_argument(
        "--ready", default="1000000,10000000", help="comma-separated ready-queue depths"
    )
    parser.add_argument(
        "--pending", default="50000,200000", help="comma-separated checked-out depths"
    )
    parser.add_argument(
        "--ops-messages", type=int, default=200_000, help="messages of the throughput runs"
    )
    parser.add_argument(
        "--single",
        type=int,
        default=200_000,
        help="ready messages published one per entry (the single-message ref form)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.ready, args.pending = QUICK_READY, QUICK_PENDING
        args.ops_messages = args.single = QUICK_MESSAGES
    ready_depths = sorted(int(n) for n in args.ready.split(",") if n)
    pending_depths = sorted(int(n) for n in args.pending.split(",") if n)
    if not ready_depths or not pending_depths or args.single < 1:
        parser.error("--ready, --pending and --single need at least one depth each")
    result = bench.header("machine")
    ready = [_traced_bytes_per_message(n, False) for n in ready_depths]
    pending = [_traced_bytes_per_message(n, True) for n in pending_depths]
    single = _traced_bytes_per_message(args.single, False, 1)
    result |= {
        "body_bytes": len(BODY),
        "batch_messages": BATCH,
        "bytes_per_ready_message": ready[-1]["bytes_per_message"],
        "bytes_per_ready_message_by_depth": _by_depth(ready),
        "bytes_per_pending_message": pending[-1]["bytes_per_message"],
        "bytes_per_pending_message_by_depth": _by_depth(pending),
        "bytes_per_ready_message_single_entries": single["bytes_per_message"],
        "live_set_ms": {
            **{f"ready {r['messages']}": r["live_set_ms"] for r in ready},
            **{f"pending {r['messages']}": r["live_set_ms"] for r in pending},
            f"ready {single['messages']} one per entry": single["live_set_ms"],
        },
        "ops_per_s": _ops(args.ops_messages),
        "single_enqueue_ops_per_s": _single_enqueue_ops(args.ops_messages),
        "details": {"ready": ready, "pending": pending, "ready_single_entries": single},
        "targets": {"bytes_per_ready_message": 8, "bytes_per_pending_message": 16},
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _by_depth(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {str(r["messages"]): r["bytes_per_message"] for r in runs}
