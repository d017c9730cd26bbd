"""Ports for servers that the tests, the benches and ``quorra pipeline demo`` start on
127.0.0.1.

A port from the kernel's ephemeral range (what a bind to port 0 gives) can be taken,
between the probe that found it free and the server's own bind, by any outgoing
connection on the machine: a node of a test cluster dialling another, a client of a
server started just before. The server then fails with "address already in use". A port
below that range is never handed out as a connection's source port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
BELOW_EPHEMERAL_SPAN = 12_000
"""How far below the ephemeral range a port is drawn from."""


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32,768 when it cannot be read)."""
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A port free now, below the ephemeral range; from the range itself only if 100
    draws below it all found a port in use."""
    low = ephemeral_low()
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(max(1024, low - BELOW_EPHEMERAL_SPAN), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
