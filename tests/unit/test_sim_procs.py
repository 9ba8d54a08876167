"""sim.procs: the ports the fixtures and the demo give their daemons."""

from __future__ import annotations

import socket
from pathlib import Path

from sim.procs import free_port


def test_a_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    """Outgoing connections take their local ports from the ephemeral range: a daemon's port chosen there can be
    taken before the daemon binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports), sorted(ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
