"""The emulated network of a local run, built inside namespaces that die with it.

``python -m mlbench.network.netns WORKERS SETTINGS_JSON`` is started by the launcher under
``unshare --mount --net`` (as root) or ``unshare --user --map-root-user --mount --net`` (as any
other user, the way rootless containers get their network: user_namespaces(7)). That process is
the *holder*: its own network namespace is the switch, and inside its private mount namespace
it creates one named network namespace per worker (``ip netns add wR``, on a tmpfs over
/run/netns that nobody outside sees), each joined to the switch by a veth pair:

    worker R's namespace wR              the holder's namespace (the switch)
      mlb0  10.99.0.(R+1)/16  <--veth-->  mlbpR --- bridge mlbsw --- mlbp0, mlbp1, ...

and shapes both directions of every link (:mod:`mlbench.network.tc`). Workers join their
namespace with ``nsenter --target HOLDER --mount [--user] -- ip netns exec wR ...``.

Nothing of this exists outside the holder's namespaces: no name on the host (so concurrent runs
cannot collide, and the short names fit IFNAMSIZ), no address on the host's network. When the
holder and the workers have exited, the kernel frees the namespaces and with them every link
and qdisc: a crash or a SIGKILL of the supervisor cannot leave anything behind, because the
holder and the workers die with it (PR_SET_PDEATHSIG) and nothing else refers to the
namespaces.

The holder prints one JSON line (``{"ready": ...}`` or ``{"error": ...}``) and then waits for
its standard input to close. ``--check`` builds the same network for one worker and exits: the
launcher's test that this machine can shape at all, done before a run is recorded.

``python -m mlbench.network.netns --loopback [--check]``, started under ``unshare [--user
--map-root-user] --net``, holds a network namespace whose only interface is its own loopback,
brought up here: the private network of a local run whose framework's servers listen on every
interface (TensorFlow's gRPC servers, :class:`mlbench.network.emulation.PrivateLoopback`).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys

from mlbench.network.settings import NetworkSettings
from mlbench.network.tc import receive_qdiscs, transmit_qdiscs

SUBNET = ipaddress.IPv4Network("10.99.0.0/16")
BRIDGE = "mlbsw"
WORKER_IF = "mlb0"
RENDEZVOUS_PORT = 29500
NETNS_DIR = "/run/netns"
MAX_WORKERS = SUBNET.num_addresses - 2


class ShapingError(Exception):
    """A command that builds the network failed; the message is what the user can act on."""


def worker_netns(rank: int) -> str:
    return f"w{rank}"


def port(rank: int) -> str:
    """The switch side of worker ``rank``'s veth pair (at most 15 characters: IFNAMSIZ)."""
    return f"mlbp{rank}"


def address(rank: int) -> str:
    return str(SUBNET[rank + 1])


def run_command(*argv: str, check: bool = True) -> None:
    """Run ip/tc/mount; a failure (when checked) is a ShapingError that says what to enable."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ShapingError(_explain(argv, (proc.stderr or proc.stdout).strip()))


def _explain(argv: tuple[str, ...], message: str) -> str:
    """tc's and ip's errors, with what to enable when the kernel lacks a feature."""
    kind = next((k for k in ("netem", "htb", "veth", "bridge") if k in argv), None)
    if "unknown" in message.lower() or "not supported" in message.lower():
        if kind == "netem":
            return ("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM, module sch_netem), so "
                    "--latency, --jitter and --loss cannot be emulated here; load it with "
                    "`modprobe sch_netem`, or give --bandwidth alone")
        if kind:
            return (f"this kernel has no {kind} support, which network emulation needs; load it "
                    f"with `modprobe {'sch_' if kind == 'htb' else ''}{kind}`")
    detail = message.splitlines()[-1] if message else "no output"
    return f"building the emulated network failed: `{' '.join(argv)}`: {detail}"


def _private_netns_dir() -> None:
    """A tmpfs for the named namespaces, visible only in this (private) mount namespace.

    Where /run/netns does not exist and cannot be created (a user without root), the tmpfs goes
    over /run instead; the workers then see an empty /run, which they do not use.
    """
    try:
        os.makedirs(NETNS_DIR, exist_ok=True)
        target = NETNS_DIR
    except OSError:
        target = os.path.dirname(NETNS_DIR)
    run_command("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "mlbench-netns", target)
    os.makedirs(NETNS_DIR, exist_ok=True)


def build(workers: int, settings: NetworkSettings) -> None:
    """Create the switch, the workers' namespaces and links, and shape every link."""
    _private_netns_dir()
    run_command("ip", "link", "set", "lo", "up")
    run_command("ip", "link", "add", BRIDGE, "type", "bridge")
    run_command("ip", "link", "set", BRIDGE, "up")
    for rank in range(workers):
        ns = worker_netns(rank)
        run_command("ip", "netns", "add", ns)
        run_command("ip", "link", "add", port(rank), "type", "veth", "peer", "name", WORKER_IF, "netns", ns)
        run_command("ip", "link", "set", port(rank), "master", BRIDGE, "up")
        run_command("ip", "-n", ns, "link", "set", "lo", "up")
        run_command("ip", "-n", ns, "addr", "add", f"{address(rank)}/{SUBNET.prefixlen}", "dev", WORKER_IF)
        run_command("ip", "-n", ns, "link", "set", WORKER_IF, "up")
        for command in transmit_qdiscs(WORKER_IF, settings):
            run_command("tc", "-n", ns, *command)
        for command in receive_qdiscs(port(rank), settings):
            run_command("tc", *command)


_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring this network namespace's ``lo`` up (a new namespace starts with it down), by the
    ioctl ``ip link set lo up`` makes, so that a private loopback needs no iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def hold_loopback(check: bool) -> int:
    """The holder of a private loopback: ``lo`` up, one JSON line, then wait (unless ``check``)."""
    try:
        loopback_up()
    except OSError as err:
        print(json.dumps({"error": f"cannot bring up the private namespace's loopback: {err}"}), flush=True)
        return 1
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    if not check:
        sys.stdin.read()  # until the launcher closes it, or dies
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--loopback"]:
        return hold_loopback(check=argv[1:] == ["--check"])
    check = argv[:1] == ["--check"]
    args = argv[1:] if check else argv
    try:
        workers = 1 if check else int(args[0])
        settings = NetworkSettings.from_dict(json.loads(args[-1]))
        if not 1 <= workers <= MAX_WORKERS:
            raise ShapingError(f"an emulated network holds 1 to {MAX_WORKERS} workers, not {workers}")
        build(workers, settings)
    except (ShapingError, OSError, ValueError, IndexError) as err:
        print(json.dumps({"error": str(err)}), flush=True)
        return 1
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    if not check:
        sys.stdin.read()  # until the launcher closes it, or dies
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
