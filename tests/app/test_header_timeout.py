"""A real server closes a connection that is slow to send a request's headers
(``QUORRA_HEADER_READ_TIMEOUT_S``), and only such a connection: a slow but complete
request, and a request answered after longer than the timeout, still work."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.app.api.conftest import new_queue
from tests.app.conftest import ADMIN_PASSWORD, Server, make_token

pytestmark = pytest.mark.integration

TIMEOUT_S = 1.0
SLACK_S = 3.0
"""A loaded machine's scheduling, on top of the timeout."""
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: quorra\r\n\r\n"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"QUORRA_HEADER_READ_TIMEOUT_S": str(TIMEOUT_S)}
    srv = Server(tmp_path_factory.mktemp("quorra-headers") / "data", env=env).start()
    try:
        yield srv
    finally:
        srv.stop()


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(TIMEOUT_S + SLACK_S + 2)
    return sock


def closed_after_s(sock: socket.socket) -> float:
    """Seconds until the server closed ``sock`` without answering."""
    started = time.monotonic()
    try:
        data = sock.recv(4096)
    except TimeoutError:
        pytest.fail("the server kept the connection open")
    assert data == b"", data
    return time.monotonic() - started


def answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return data


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /heal", b"GET /healthz HTTP/1.1\r\nHost: quorra\r\n"],
    ids=["nothing", "part-of-request-line", "headers-without-end"],
)
def test_a_connection_without_complete_headers_is_closed(quick: Server, sent: bytes) -> None:
    with connect(quick) as sock:
        sock.sendall(sent)
        assert closed_after_s(sock) < TIMEOUT_S + SLACK_S


def test_the_clock_starts_again_after_each_response(quick: Server) -> None:
    with connect(quick) as sock:
        sock.sendall(REQUEST)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(REQUEST[:20])
        assert closed_after_s(sock) < TIMEOUT_S + SLACK_S


def test_slow_but_complete_requests_are_answered(quick: Server) -> None:
    with connect(quick) as sock:
        for _ in range(2):  # each request within the timeout, the two together beyond it
            for i in range(0, len(REQUEST), 10):
                sock.sendall(REQUEST[i : i + 10])
                time.sleep(TIMEOUT_S * 0.6 / (len(REQUEST) / 10))
            assert answer(sock).startswith(b"HTTP/1.1 200")


def test_a_request_answered_after_the_timeout_is_not_cut(quick: Server) -> None:
    token = make_token(quick, "admin", ADMIN_PASSWORD)
    with quick.client(token) as client:
        queue = new_queue(client, "poll")
        started = time.monotonic()
        wait_ms = int(TIMEOUT_S * 2000)
        response = client.post(
            f"/api/v1/queues/{queue}/messages/receive", json={"wait_ms": wait_ms}
        )
        assert response.status_code == 200 and response.json() == {"messages": []}
        assert time.monotonic() - started >= wait_ms / 1000
        assert client.get("/healthz").status_code == 200  # the same connection, kept alive
    with httpx.Client(base_url=quick.url) as fresh:
        assert fresh.get("/healthz").status_code == 200
