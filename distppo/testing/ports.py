"""Free loopback ports for a Ray head of a test's or the chaos soak's own (random, so that two
heads on one machine, or a head beside the test session's cluster, never collide)."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
