"""A publish/receive loop in a process of its own, for tests that load a server from the
test process: latencies measured there would include waits for the test's own GIL.

``python -m tests.app.message_loop URL TOKEN QUEUE`` publishes one message and receives
one, over and over, until a line arrives on stdin; then prints each call's latency in
milliseconds as a JSON list.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx


def main(url: str, token: str, queue: str) -> None:
    stopped = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stopped.set()), daemon=True).start()
    base = f"/api/v1/queues/{queue}/messages"
    calls = ((base, {"messages": [{"body": "x"}]}), (f"{base}/receive", {"max_messages": 1}))
    latencies_ms: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10.0) as client:
        print("started", flush=True)
        while not stopped.is_set():
            for path, body in calls:
                started = time.perf_counter()
                response = client.post(path, json=body)
                latencies_ms.append((time.perf_counter() - started) * 1000)
                assert response.status_code in (200, 201), response.text
    print(json.dumps(latencies_ms), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
