"""The process a kill -9 test kills: a Node publishing and consuming on real files.

Prints ``P <body>`` for each message whose publish returned (confirmed), ``R <body>`` for
each one received and ``A <body>`` for each whose ack returned, flushing after every
line, until it is killed. Given ``lone`` after the data directory, it only publishes,
one message at a time (each written to the WAL alone, by the loop itself).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from engine.runtime import Node
from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.util import FAST


def say(lines: list[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


async def publisher(node: Node, worker: int) -> None:
    n = 0
    while True:
        bodies = [f"w{worker}-{n + i}" for i in range(10)]
        n += 10
        await node.publish("crash", [OutgoingMessage(b.encode()) for b in bodies])
        say([f"P {b}" for b in bodies])


async def lone_publisher(node: Node) -> None:
    """One message at a time, nothing else running: each goes to the WAL alone."""
    n = 0
    while True:
        body = f"lone-{n}"
        n += 1
        await node.publish("crash", [OutgoingMessage(body.encode())])
        say([f"P {body}"])


async def consumer(node: Node) -> None:
    while True:
        got = await node.receive("crash", consumer="c", max_messages=20, wait_ms=100, lease_ms=None)
        if got:
            say([f"R {m.body.decode()}" for m in got])
            await node.ack("crash", [m.receipt for m in got])
            say([f"A {m.body.decode()}" for m in got])


async def main(data_dir: Path, mode: str) -> None:
    node = Node(data_dir, limits=FAST)
    await node.start()
    await node.create_queue("crash", QueueArgs(lease_ms=300))
    say(["READY"])
    if mode == "lone":
        await lone_publisher(node)
    await asyncio.gather(*(publisher(node, w) for w in range(4)), consumer(node))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "load"))
