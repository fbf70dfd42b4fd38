"""``python -m mlbench.network.shape --device eth0 --bandwidth 1gbit --latency 0.5ms``.

Shapes one interface of the network namespace it runs in, both ways, with the same qdiscs as a
local run's links (:mod:`mlbench.network.tc`): on Kubernetes, a worker pod's init container (with
NET_ADMIN, in the pod's own network namespace) runs it before the worker starts. What the pod
sends is shaped on the device's egress; what it receives is redirected from the device's ingress
to an ifb device (``tc filter ... action mirred egress redirect``, tc-mirred(8)) and shaped on
that device's egress, so that the delay, jitter and loss sit on the receiving side as locally.
Both directions are shaped in the pod itself; no other pod or node setting is needed.

Running it again replaces what an earlier run of it set up. Exit status 0 when shaped, 1 (with
one line on stderr) when the kernel or the privileges do not allow it.
"""

from __future__ import annotations

import argparse
import sys

from mlbench.errors import UsageError
from mlbench.network.netns import ShapingError, run_command
from mlbench.network.settings import NetworkSettings, network_options
from mlbench.network.tc import describe, receive_qdiscs, transmit_qdiscs

IFB = "mlbifb0"


def shape(device: str, settings: NetworkSettings) -> None:
    """Replace ``device``'s qdiscs by the link's: egress shaped there, ingress through an ifb."""
    run_command("tc", "qdisc", "del", "dev", device, "root", check=False)
    run_command("tc", "qdisc", "del", "dev", device, "ingress", check=False)
    run_command("ip", "link", "del", IFB, check=False)
    for command in transmit_qdiscs(device, settings):
        run_command("tc", *command)
    receive = receive_qdiscs(IFB, settings)
    if not receive:
        return
    run_command("ip", "link", "add", IFB, "type", "ifb")
    run_command("ip", "link", "set", IFB, "up")
    run_command("tc", "qdisc", "add", "dev", device, "handle", "ffff:", "ingress")
    run_command("tc", "filter", "add", "dev", device, "parent", "ffff:", "protocol", "all", "u32",
         "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", IFB)
    for command in receive:
        run_command("tc", *command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlbench.network.shape", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="eth0", help="the interface to shape [eth0]")
    for option in ("--bandwidth", "--latency", "--jitter", "--loss"):
        parser.add_argument(option)
    args = parser.parse_args(argv)
    try:
        (settings,) = network_options(args.bandwidth, args.latency, args.jitter, args.loss)
        if settings is None:
            raise UsageError("nothing to shape: give --bandwidth, --latency, --jitter or --loss")
        shape(args.device, settings)
    except (UsageError, ShapingError) as err:
        print(f"mlbench.network.shape: {err}", file=sys.stderr)
        return 1
    print(f"Shaped {args.device}: {settings.label()} ({describe(settings)}; ingress through {IFB})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
