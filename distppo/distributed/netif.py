"""Which network interface the learners' collectives use.

gloo and NCCL open their own sockets for the allreduce, beside the rendezvous store: unless
told (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`), each picks an interface by its own rules
(gloo: the one the host name resolves to; NCCL: the first that is not loopback or docker),
which on a node with several networks may be a public one. The learners set both to the
interface that holds the node's address, the address the store listens on, so the gradients
travel where the store does. A value the user set is kept: they know their network.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from typing import MutableMapping, Optional

import psutil

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(addr: str) -> Optional[str]:
    """The name of the interface that holds the IP address `addr` (None when none does)."""
    wanted = ipaddress.ip_address(addr.split("%")[0])
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:  # IPv6 link-local addresses carry their scope: fe80::1%eth0
                if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def bind_collectives(addr: str, environ: MutableMapping[str, str] = os.environ) -> dict:
    """Set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, each where unset, to the interface of
    `addr`; before the process group starts, which is when gloo and NCCL read them. Returns
    what it set."""
    name = interface_of(addr)
    if name is None:
        return {}
    chosen = {var: name for var in IFNAME_VARS if not environ.get(var)}
    environ.update(chosen)
    return chosen
