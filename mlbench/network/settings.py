"""What a run's network is: bandwidth, latency, jitter and loss of every worker's link.

The semantics (docs/network.md): each worker behaves as a machine with its own network
interface, joined to the others by a non-blocking switch. ``bandwidth_bps`` is that interface's
rate in each direction (bits per second, what it sends and what it receives are limited
separately, as on a full-duplex Ethernet port); ``latency_s`` is the one-way delay between any
two workers (a ping between two workers takes twice that); ``jitter_s`` varies that delay
uniformly by up to +/- jitter; ``loss_percent`` drops that share of the packets on each path.

Values are spelled as tc(8) spells them: rates ``100mbit``, ``1gbit``, ``10gbit`` (``bit``,
``kbit``, ``mbit``, ``gbit``, ``tbit`` are powers of 1000; ``kibit``... powers of 1024; ``bps``,
``kbps``... are *bytes* per second, as in tc), times ``5ms``, ``0.5ms``, ``500us``, ``1s``, loss
``0.1%``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mlbench.errors import UsageError, about_option

#: How a run's settings are applied. ``tc``: real qdiscs on every worker's link (network
#: namespaces locally, an init container on Kubernetes); ``cni``: the CNI bandwidth plugin's pod
#: annotations on Kubernetes (rate only).
SHAPING = ("tc", "cni")

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "kibit": 2.0**10, "mibit": 2.0**20, "gibit": 2.0**30, "tibit": 2.0**40,
               "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
               "us": 1e-6, "usec": 1e-6, "usecs": 1e-6}
_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)"
MIN_RATE_BPS, MAX_RATE_BPS = 1e3, 1e12
MAX_LATENCY_S = 10.0


@dataclass(frozen=True)
class NetworkSettings:
    """One network to run on; ``None`` bandwidth means the link's own speed (no rate limit)."""

    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss_percent: float = 0.0
    shaping: str = "tc"

    @property
    def needs_netem(self) -> bool:
        """Delay, jitter and loss need the netem qdisc; a rate alone does not."""
        return self.latency_s > 0 or self.jitter_s > 0 or self.loss_percent > 0

    def label(self) -> str:
        """One line for status, compare and charts, e.g. ``1 Gbit/s, 0.5 ms``."""
        parts = [format_rate(self.bandwidth_bps) if self.bandwidth_bps else "full rate"]
        delay = format_time(self.latency_s)
        if self.jitter_s:
            delay += f" +/- {format_time(self.jitter_s)}"
        if self.latency_s or self.jitter_s:
            parts.append(delay)
        if self.loss_percent:
            parts.append(f"{self.loss_percent:g}% loss")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkSettings:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def to_args(self) -> list[str]:
        """The command-line options that give these settings back (``python -m ...shape``)."""
        args = []
        if self.bandwidth_bps:
            args += ["--bandwidth", f"{self.bandwidth_bps:.0f}bit"]
        if self.latency_s:
            args += ["--latency", f"{self.latency_s * 1e6:.6g}us"]
        if self.jitter_s:
            args += ["--jitter", f"{self.jitter_s * 1e6:.6g}us"]
        if self.loss_percent:
            args += ["--loss", f"{self.loss_percent:g}%"]
        return args


def _split(option: str, text: str, units: dict[str, float], example: str) -> tuple[float, str]:
    match = re.fullmatch(_NUMBER + r"\s*([a-z]*)(/s)?", (text or "").strip().lower())
    if not match:
        raise UsageError(f"{option} {text!r}: expected a number and a unit, e.g. {example}")
    number, unit = float(match.group(1)), match.group(2)
    if not math.isfinite(number):
        raise UsageError(f"{option} {text!r}: expected a finite number, e.g. {example}")
    if unit and unit not in units:
        raise UsageError(f"{option} {text!r}: unknown unit {unit!r}; use one of "
                         f"{', '.join(units)} (e.g. {example})")
    return number, unit


def parse_rate(text: str, option: str = "--bandwidth") -> float:
    """``100mbit`` -> 1e8 bits per second (tc's units)."""
    number, unit = _split(option, text, _RATE_UNITS, "100mbit, 1gbit or 10gbit")
    if number <= 0:
        raise UsageError(f"{option} {text!r}: a bandwidth must be more than 0 (e.g. 100mbit)")
    if not unit:
        raise UsageError(f"{option} {text!r}: give a unit, e.g. {text.strip()}mbit or {text.strip()}gbit")
    rate = float(round(number * _RATE_UNITS[unit]))  # whole bits per second
    if not MIN_RATE_BPS <= rate <= MAX_RATE_BPS:
        raise UsageError(f"{option} {text!r}: choose a bandwidth from 1kbit to 1tbit")
    return rate


def parse_time(text: str, option: str) -> float:
    """``0.5ms`` / ``500us`` / ``0`` -> seconds (tc's units; 0 needs none)."""
    number, unit = _split(option, text, _TIME_UNITS, "5ms, 0.5ms or 500us")
    if number < 0:
        raise UsageError(f"{option} {text!r}: a time cannot be negative")
    if not unit and number != 0:
        raise UsageError(f"{option} {text!r}: give a unit, e.g. {text.strip()}ms or {text.strip()}us")
    seconds = round(number * _TIME_UNITS[unit], 9) if unit else 0.0  # whole nanoseconds
    if seconds > MAX_LATENCY_S:
        raise UsageError(f"{option} {text!r}: at most {MAX_LATENCY_S:g}s")
    return seconds


def parse_loss(text: str) -> float:
    """``0.1%`` or ``0.1`` -> 0.1 (percent of packets)."""
    match = re.fullmatch(_NUMBER + r"\s*(%?)", (text or "").strip())
    if not match or not math.isfinite(float(match.group(1))):
        raise UsageError(f"--loss {text!r}: expected a percentage, e.g. 0.1%", option="loss")
    percent = float(match.group(1))
    if not 0 <= percent < 100:
        raise UsageError(f"--loss {text!r}: a loss is a percentage from 0% to below 100%", option="loss")
    return percent


def _parsed(parse: Callable[[str, str], float], text: str | None, option: str) -> float:
    """``parse(text, its flag)`` (0 for no text); a mistake names the option it concerns."""
    if text is None:
        return 0.0
    try:
        return parse(text, f"--{option}")
    except UsageError as err:
        raise about_option(err, option) from None


def network_options(bandwidth: str | None, latency: str | None, jitter: str | None,
                    loss: str | None, shaping: str = "tc") -> list[NetworkSettings] | list[None]:
    """The networks `mlbench run` was asked for: one per ``--bandwidth`` item, or ``[None]``.

    ``--bandwidth 100mbit,1gbit`` gives one run per rate, each with the same latency, jitter and
    loss. No option at all gives ``[None]``: the workers talk over loopback, unshaped.
    """
    if shaping not in SHAPING:
        raise UsageError(f"--shaping {shaping}: choose tc or cni", option="shaping")
    if bandwidth is None and latency is None and jitter is None and loss is None:
        return [None]
    delay = _parsed(parse_time, latency, "latency")
    spread = _parsed(parse_time, jitter, "jitter")
    if spread and not delay:
        raise UsageError(f"--jitter {jitter} varies the latency: give --latency too (e.g. --latency 1ms)",
                         option="jitter")
    if spread > delay:
        raise UsageError(f"--jitter {jitter} is more than the latency ({format_time(delay)}): a "
                         "packet cannot arrive before it was sent; give a larger --latency", option="jitter")
    dropped = _parsed(lambda text, _flag: parse_loss(text), loss, "loss")
    items = [b for b in (bandwidth.split(",") if bandwidth is not None else [None])]
    if bandwidth is not None and not all(b and b.strip() for b in items):
        raise UsageError(f"--bandwidth {bandwidth!r}: expected rates separated by commas, e.g. 100mbit,1gbit",
                         option="bandwidth")
    rates = [parse_rate(b) if b is not None else None for b in items]
    if len(set(rates)) < len(rates):
        raise UsageError(f"--bandwidth {bandwidth}: a rate is given twice", option="bandwidth")
    networks = [NetworkSettings(rate, delay, spread, dropped, shaping) for rate in rates]
    if shaping == "cni" and networks[0].needs_netem:
        raise UsageError("--shaping cni: the CNI bandwidth plugin limits the rate only; drop "
                         "--latency, --jitter and --loss, or use --shaping tc", option="shaping")
    if shaping == "cni" and bandwidth is None:
        raise UsageError("--shaping cni limits the rate: give --bandwidth", option="shaping")
    return networks


def format_rate(bps: float) -> str:
    """1e9 -> ``1 Gbit/s``; 2.5e8 -> ``250 Mbit/s``."""
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.4g} bit/s"


def format_time(seconds: float) -> str:
    """0.0005 -> ``0.5 ms``; 5e-05 -> ``50 us``; 2 -> ``2 s``."""
    if seconds >= 1:
        return f"{seconds:.4g} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"


def network_label(network: dict[str, Any] | None) -> str:
    """run.json's ``network`` in one line (``""`` for a run on the network as it is)."""
    return NetworkSettings.from_dict(network).label() if network else ""


def describe_network(network: dict[str, Any] | None) -> str:
    """The network a run ran on and how it was emulated, for `mlbench status`."""
    if not network:
        return "as it is (not emulated)"
    how = network.get("mechanism", "?")
    if network.get("detail"):
        how += f": {network['detail']}"
    return f"{network_label(network)}, emulated ({how})"
