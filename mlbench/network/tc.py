"""The tc(8) qdiscs of one worker's link, the same for a local run and a pod.

A worker's link has two directions, each shaped where its packets leave a device:

- **transmit** (what the worker sends): an HTB class at the link rate on the worker's own
  interface;
- **receive** (what reaches the worker): netem for the one-way delay, its jitter and the loss,
  under an HTB class at the link rate, on the device whose egress delivers to the worker (the
  switch's port locally, an ifb device that the pod's ingress is redirected to on Kubernetes).

The delay sits on the receiving side on purpose: a netem queue on the sender's own interface
holds packets that its socket still owns, and TCP Small Queues then throttles the sender far
below the link rate (tcp(7), tcp_limit_output_bytes); after the veth or the ifb redirect the
packet no longer belongs to any socket of the sender. Every path between two workers therefore
crosses one rate limiter per side and one netem, so it has the given one-way latency, jitter and
loss exactly once. HTB (tc-htb(8)) rather than TBF, because HTB computes a burst that lets one
TCP stream reach the rate on kernels with a coarse timer (a TBF with a small burst reached 43%
of 1 Gbit/s here), and netem as HTB's leaf is the combination netem's documentation shows.
"""

from __future__ import annotations

import math

from mlbench.network.settings import NetworkSettings

#: The netem queue must hold every packet in flight through the delay line (tc-netem(8),
#: "limit"): bandwidth-delay product in full-size frames, doubled, at least netem's default.
FRAME_BYTES = 1514
#: The rate assumed for the queue size when no bandwidth is given (a fast veth).
UNLIMITED_BPS = 40e9
#: HTB's quantum only shares a rate between classes; one class per link needs none, and this
#: value keeps tc from warning that the default (rate / 10) is too big.
QUANTUM = 200_000


def netem_limit(settings: NetworkSettings) -> int:
    """Packets netem must be able to hold: 2 x the bandwidth-delay product, at least 1000."""
    rate = settings.bandwidth_bps or UNLIMITED_BPS
    in_flight = rate / 8 * (settings.latency_s + settings.jitter_s) / FRAME_BYTES
    return max(1000, math.ceil(2 * in_flight))


def _rate(bps: float) -> str:
    return f"{bps:.0f}bit"


def _usec(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}us"


def netem_args(settings: NetworkSettings) -> list[str]:
    """netem's options: delay [jitter], loss, queue limit."""
    args = ["netem", "limit", str(netem_limit(settings))]
    if settings.latency_s or settings.jitter_s:
        args += ["delay", _usec(settings.latency_s)]
        if settings.jitter_s:
            args.append(_usec(settings.jitter_s))
    if settings.loss_percent:
        args += ["loss", "random", f"{settings.loss_percent:g}%"]
    return args


def transmit_qdiscs(dev: str, settings: NetworkSettings) -> list[list[str]]:
    """tc commands (without ``tc``) that shape what ``dev`` sends: the link rate, if any."""
    if not settings.bandwidth_bps:
        return []
    return _htb(dev, settings.bandwidth_bps)


def receive_qdiscs(dev: str, settings: NetworkSettings) -> list[list[str]]:
    """tc commands that shape what leaves ``dev`` towards the worker: netem under the rate."""
    commands = _htb(dev, settings.bandwidth_bps) if settings.bandwidth_bps else []
    if settings.needs_netem:
        parent = ["parent", "1:1", "handle", "10:"] if settings.bandwidth_bps else ["root", "handle", "10:"]
        commands.append(["qdisc", "add", "dev", dev, *parent, *netem_args(settings)])
    return commands


def _htb(dev: str, bps: float) -> list[list[str]]:
    rate = _rate(bps)
    return [["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate,
             "ceil", rate, "quantum", str(QUANTUM)]]


def describe(settings: NetworkSettings) -> str:
    """The qdiscs in words, for run.json's ``mechanism``."""
    parts = []
    if settings.bandwidth_bps:
        parts.append("htb rate on both directions")
    if settings.needs_netem:
        what = [w for w, on in (("delay", settings.latency_s), ("jitter", settings.jitter_s),
                                ("loss", settings.loss_percent)) if on]
        parts.append(f"netem {'/'.join(what)} on the receiving side")
    return ", ".join(parts) or "no qdisc (nothing to shape)"
