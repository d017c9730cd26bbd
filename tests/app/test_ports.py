"""Ports for the servers that tests and benches start."""

from __future__ import annotations

import socket

from app.ports import ephemeral_low, free_port


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_ephemeral_range_starts_where_the_kernel_says() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        assert ephemeral_low() == int(f.read().split()[0])
