"""Which network interface the backends use when a run spans machines.

Gloo and NCCL pick an interface by themselves from the host name, which on a cluster node often
resolves to a management network, a container bridge or the loopback. Both take the interface
from the environment (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``: PyTorch's documentation,
"Distributed communication package", "Choosing the network interface to use"). mlbench sets them
from ``--iface`` when given; otherwise, when the user has not set them either, it gives gloo the
interface through which this machine reaches rank 0, which is the network the run's traffic
takes anyway. The local launcher keeps everything on the loopback (see launch/local.py).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from collections.abc import MutableMapping

from mlbench.errors import UsageError

_SIOCGIFADDR = 0x8915  # Linux <linux/sockios.h>: the IPv4 address of an interface


def interface_address(name: str) -> str:
    """The IPv4 address of interface ``name`` (Linux)."""
    if name not in {n for _, n in socket.if_nameindex()}:
        names = ", ".join(n for _, n in socket.if_nameindex())
        raise UsageError(f"--iface {name}: no such network interface on {socket.gethostname()} "
                         f"(it has {names})")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            raise UsageError(f"--iface {name}: the interface has no IPv4 address") from None
    return socket.inet_ntoa(packed[20:24])


def interface_towards(host: str) -> str | None:
    """The interface whose address this machine uses to reach ``host`` (None if unknown)."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))  # UDP: no packet is sent, the kernel only picks a route
            local = sock.getsockname()[0]
    except OSError:
        return None
    if local.startswith("127."):
        return next((n for _, n in socket.if_nameindex() if n in ("lo", "lo0")), None)
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == local:
                return name
        except UsageError:
            continue
    return None


def choose_interfaces(iface: str | None, master_addr: str | None, backend: str,
                      env: MutableMapping[str, str] | None = None) -> str | None:
    """Set the backends' interface variables for a run across machines; returns gloo's choice."""
    env = os.environ if env is None else env
    if iface:
        interface_address(iface)  # a typo is one line here, not a hang in the rendezvous
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
        return iface
    if backend == "gloo" and not env.get("GLOO_SOCKET_IFNAME") and master_addr:
        chosen = interface_towards(master_addr)
        if chosen:
            env["GLOO_SOCKET_IFNAME"] = chosen
    return env.get("GLOO_SOCKET_IFNAME")
