"""free_port.py — how every test picks a rendezvous port: imported by
conftest.py and tests/faults/faults.py, run as a script (it prints one) by
tests/torchrun/test-torchrun.sh. The C tests' dt_free_port does the same.

A port free a moment ago on 127.0.0.1, chosen below the kernel's ephemeral
range, not in it: a port from that range can be handed to any process's
outgoing connection before the ranks bind it, and a rank that retries its
connection to it before rank 0 listens can be given it as its own local port
(a TCP self-connect: it talks to itself, and rank 0 cannot bind). Random,
checked by binding; leaves room for port + 1 and + 2 (a second store).
"""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    pick = random.Random()  # its own: a caller's seeded choices stay the seed's
    candidates = [pick.randrange(low - 10000, low - 3) for _ in range(200)] if low - 10000 >= 1024 else []
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


if __name__ == "__main__":
    print(free_port())
