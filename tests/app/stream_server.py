"""A Quorra server for the stream tests: ``create_app`` on the real engine, with a small
stream window and a publish gate. Run as ``python -m tests.app.stream_server DATA_DIR
PORT``; SIGINT stops it.

The gate: while the file ``DATA_DIR/../publish-gate-closed`` exists, every publish waits
before it reaches the engine (so a test can hold publishes unconfirmed and watch the
window fill); removing the file lets them through.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import uvicorn

from app.engine_seam import make_node
from app.http_protocol import http_protocol
from app.main import create_app
from app.server import tune_malloc, websocket_options
from app.settings import Settings
from engine.limits import DEFAULT_LIMITS
from engine.runtime.api import PublishItem, QueueEngine

STREAM_LIMITS = replace(
    DEFAULT_LIMITS,
    batch_messages_max=4,
    stream_unconfirmed_messages_max=8,
    stream_receive_wait_ms=300,
)
GATE_POLL_S = 0.01


def gate_path(data_dir: Path) -> Path:
    return data_dir.parent / "publish-gate-closed"


class GatedNode:
    """The engine node, with every publish held while the gate file exists."""

    def __init__(self, node: QueueEngine, gate: Path) -> None:
        self._node, self._gate = node, gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)

    async def publish(
        self,
        name: str,
        messages: Sequence[PublishItem],
        on_durable: Callable[[], None] | None = None,
    ) -> list[int]:
        while self._gate.exists():
            await asyncio.sleep(GATE_POLL_S)
        return await self._node.publish(name, messages, on_durable)


def main(argv: list[str]) -> None:
    data_dir, port = Path(argv[0]).resolve(), int(argv[1])
    settings = replace(
        Settings.from_env(data_dir=data_dir, port=port),
        limits=STREAM_LIMITS,
        node_name="stream-test-node",
    )

    def node_factory(s: Settings) -> QueueEngine | None:
        node = make_node(s)
        assert node is not None
        return cast(QueueEngine, GatedNode(node, gate_path(data_dir)))

    tune_malloc()
    app = create_app(settings, node_factory=node_factory)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        http=http_protocol(settings.header_read_timeout_s),
        **websocket_options(settings),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
