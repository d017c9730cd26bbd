"""Load generators of ``quorra bench rest``'s stream phases: ``generator(spec, results)``
is a process of ``bench.rest.run_phase`` (its ``target``) that drives the server's
stream endpoint through ``quorra.client.AsyncStream`` and puts its counts on
``results``, in the shape of the REST generators' (``messages``, ``errors``,
``latencies_ms``, ``wall_s``, ``cpu_s``, ...).

The kinds (``spec["kind"]``):

* ``stream_publish``: ``spec["clients"]`` connections, each publishing frames of
  ``spec["frame_messages"]`` messages with up to ``spec["window"]`` messages
  unconfirmed; a message counts once its confirm arrived before the phase's end;
* ``stream_consume``: ``spec["clients"]`` connections, each consuming with a prefetch
  of ``spec["prefetch"]`` and acking every delivery frame's messages in one ack frame;
* ``stream_window1``: one connection, one publish of one message outstanding at a time,
  ``spec["count"]`` of them (or until the phase ends): the latency of each, from the
  send to its confirm.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from typing import Any

from quorra.client import AsyncStream

MESSAGE_BYTES = 1024
GRACE_S = 15.0


def _cpu_self_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _body() -> bytes:
    return (b"0123456789abcdef" * (MESSAGE_BYTES // 16 + 1))[:MESSAGE_BYTES]


async def _publisher(stream: AsyncStream, spec: dict[str, Any], until: float) -> int:
    frame = [_body()] * spec["frame_messages"]
    sent = 0
    while time.time() < until:
        await stream.publish(frame)
        sent += len(frame)
    return sent - stream.ledger.outstanding_messages


async def _consumer(stream: AsyncStream, spec: dict[str, Any], until: float) -> int:
    await stream.consume(spec["prefetch"])
    consumed = 0
    while (left := until - time.time()) > 0:
        try:
            batch = await asyncio.wait_for(stream.receive(), left)
        except TimeoutError:
            break
        await stream.ack([d.receipt for d in batch])
        consumed += len(batch)
    return consumed


async def _window1(stream: AsyncStream, spec: dict[str, Any], until: float, out: Any) -> int:
    body = [_body()]
    done = 0
    while done < spec["count"] and time.time() < until:
        started = time.perf_counter()
        await stream.wait(await stream.publish(body))
        out["latencies_ms"].append((time.perf_counter() - started) * 1000)
        done += 1
    return done


async def _run(spec: dict[str, Any], out: dict[str, Any]) -> None:
    url = f"http://{spec['host']}:{spec['port']}"
    kind = spec["kind"]
    clients = 1 if kind == "stream_window1" else spec["clients"]
    streams = [
        await AsyncStream.open(url, spec["token"], spec["queue"], window_messages=spec["window"])
        for _ in range(clients)
    ]
    # Ready after the agreed start (a late spawn on a loaded machine): a full window of
    # its own, as the REST generators do.
    start = max(spec["start_at"], time.time())
    until = start + spec["seconds"]
    await asyncio.sleep(max(0.0, start - time.time()))
    out["cpu0"] = _cpu_self_s()
    if kind == "stream_publish":
        counts = await asyncio.gather(*(_publisher(s, spec, until) for s in streams))
    elif kind == "stream_consume":
        counts = await asyncio.gather(*(_consumer(s, spec, until) for s in streams))
    else:
        counts = [await _window1(streams[0], spec, until, out)]
    out["wall_s"] = time.time() - start
    out["messages"] = sum(counts)
    for s in streams:
        await s.close()


def generator(spec: dict[str, Any], results: Any) -> None:
    """One load-generator process, bounded by a hard deadline (as the REST ones)."""
    out: dict[str, Any] = {
        "messages": 0,
        "errors": 0,
        "transport_errors": 0,
        "timed_out": 0,
        "not_sent": 0,
        "latencies_ms": [],
        "cpu0": _cpu_self_s(),
        "wall_s": 0.0,
    }

    async def bounded() -> None:
        deadline_s = max(0.0, spec["start_at"] - time.time()) + spec["seconds"] + GRACE_S
        work = asyncio.create_task(_run(spec, out))
        done, _ = await asyncio.wait({work}, timeout=deadline_s)
        if not done:
            out["timed_out"] += 1
        elif work.exception() is not None:
            out["errors"] += 1
            # stderr: the bench's stdout is its JSON
            print(f"stream generator: {work.exception()!r}", file=sys.stderr, flush=True)
        out["wall_s"] = out["wall_s"] or time.time() - spec["start_at"]
        out["cpu_s"] = _cpu_self_s() - out.pop("cpu0")
        results.put(out)
        results.close()
        results.join_thread()
        os._exit(0)

    try:
        import uvloop
    except ImportError:
        asyncio.run(bounded())
        return
    uvloop.run(bounded())
