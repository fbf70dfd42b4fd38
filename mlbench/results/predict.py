"""``mlbench predict``: step time and time to the goal at any workers x network, from measurements.

The model is the alpha-beta (latency-bandwidth) model of collective communication (Hockney 1994;
Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in
MPICH"), the one nccl-tests' bus bandwidth rests on. A message of ``n`` bytes over one link costs
``alpha + n * beta``; a ring collective over ``N`` workers is ``hops(N)`` such steps in a row:

- all-reduce (reduce-scatter then all-gather): ``2 (N - 1) alpha + 2 (N - 1) / N * S * beta``;
- all-gather of ``S`` bytes from each rank: ``(N - 1) alpha + (N - 1) * S * beta``;
- gossip with ``p`` peers, sends in flight together: ``alpha + p * S * beta`` per round.

Each term's bytes are what a rank sends, so one formula prices all three:
``communication = collectives * hops(N) * alpha + wire_bytes(N) * beta`` per step, with the
collectives per step and the wire bytes per step measured by a run of the optimizer
(``comm/collectives``, ``comm/bytes``) at its worker count and carried to ``N`` by the
optimizer's declared collective (:data:`mlbench.optim.descriptors.COLLECTIVES`). ``alpha`` and
``beta`` come from task 0a's sweep at the network asked for (:func:`fit_link`: ``alpha`` from its
small messages, ``beta`` at each size from its fp32 times interpolated in log-log), or, where no
sweep at that rate exists, from the link's nominal rate and latency added to the sweep of the
machine's own network.

Compute per step is measured too: the median over logging intervals of a run's compute phases
(data, forward, backward, optimizer) per step, at the worker count asked for where a run of it
exists (on a machine whose cores the workers share, compute slows with the worker count, and
only a measurement says by how much), else at the nearest count below (each worker then has
resources of its own, as on a cluster), scaled by the task's micro-batches per step where it
fixes its global batch (task 5a). Steps to the goal come from runs of the same configuration at
that worker count that reached it; elsewhere they are unknown, never guessed. The step is
compute plus the communication that does not overlap it: what an optimizer's communication
runs beside is its declaration's (``OptimizerInfo.overlaps``: :func:`hidden_beside_backward`,
:func:`hidden_beside_steps`). docs/predict.md has the formulas, their sources and the validation.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mlbench.checkpoint_schedule import CheckpointRule
from mlbench.errors import UsageError
from mlbench.network.settings import NetworkSettings, format_rate, format_time, network_label
from mlbench.optim.descriptors import COLLECTIVES, INFO
from mlbench.optim.topology import parse_topology
from mlbench.results.compare import RunResult
from mlbench.results.faults import SLOW, periodic
from mlbench.results.store import FINISHED, RunRecord, RunStore
from mlbench.results.summary import COMPUTE_PHASES

#: Fingerprint keys a calibration run may differ in from the runs it predicts: the model carries
#: them (workers, network) or they do not change a step (how it stops, checkpoints, faults).
CARRIED_KEYS = ("workers", "network", "stop", "checkpoint_every", "faults", "resumed", "hardware", "seed")
#: Task 0a's rows the link is read from.
FIT_DTYPE = "fp32"
#: Messages up to this many bytes cost their latency only: their mean time gives alpha.
SMALL_MESSAGE = 1024


def hops(collective: str, workers: int) -> float:
    """Latency steps of one collective over ``workers`` ranks (0 on one worker: nothing travels)."""
    if workers <= 1:
        return 0.0
    if collective == "allreduce":
        return 2.0 * (workers - 1)
    if collective == "allgather":
        return float(workers - 1)
    if collective == "gossip":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


def wire_factor(collective: str, workers: int, peers: int = 2) -> float:
    """Bytes a rank sends per byte of its message: 2 (N - 1) / N for a ring all-reduce (the
    factor of nccl-tests' bus bandwidth), N - 1 for a ring all-gather, its peers for gossip."""
    if workers <= 1:
        return 0.0
    if collective == "allreduce":
        return 2.0 * (workers - 1) / workers
    if collective == "allgather":
        return float(workers - 1)
    if collective == "gossip":
        return float(peers)
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class Link:
    """One network as the model sees it, from task 0a's sweep on ``workers`` ranks: the time of
    an all-reduce of each message size (``sizes``, ``times``; ``slowest``: the slowest rank's),
    and ``alpha_s``, the latency of one message step (half of the small messages' mean time on
    two workers; in a calibration, one for all links of a rate only). The rest of a size's time
    is its per-byte cost there, which the model carries to other worker counts; ``extra_beta_s``
    and ``extra_alpha_s`` add a link's nominal rate and latency to the machine's own (a network
    no sweep measured). ``source`` names the sweep."""

    network: str
    workers: int
    sizes: tuple[float, ...]
    times: tuple[float, ...]
    slowest: tuple[float, ...]
    alpha_s: float
    source: str
    extra_alpha_s: float = 0.0
    extra_beta_s: float = 0.0

    @property
    def beta_s(self) -> float:
        """Seconds per byte of the largest message measured (its bandwidth, for one line)."""
        return self.per_byte(self.sizes[-1]) + self.extra_beta_s

    def _at(self, size: float, times: tuple[float, ...]) -> float:
        """The sweep's time at ``size``: log-log interpolation between measured sizes; constant
        below the smallest; above the largest, growing at the largest two sizes' slope."""
        xs, ys = self.sizes, times
        if size <= xs[0]:
            return ys[0]
        if size >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
            return ys[-1] + max(slope, 0.0) * (size - xs[-1])
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x0 <= size <= x1:
                share = (math.log(size) - math.log(x0)) / (math.log(x1) - math.log(x0))
                return math.exp(math.log(y0) + share * (math.log(y1) - math.log(y0)))
        return ys[-1]

    def per_byte(self, size: float, slowest: bool = False) -> float:
        """Seconds per byte a rank sends, for messages of ``size`` bytes, on the sweep's workers:
        the sweep's time less its latency steps, over the bytes a rank sends in it."""
        time = self._at(size, self.slowest if slowest else self.times)
        latency = hops("allreduce", self.workers) * self.alpha_s
        return max(time - latency, 0.0) / (wire_factor("allreduce", self.workers) * size)

    def seconds(self, collective: str, workers: int, size: float, slowest: bool = False, peers: int = 2) -> float:
        """One ``collective`` of ``size``-byte messages over ``workers`` ranks (gossip: to ``peers``)."""
        alpha = self.alpha_s + self.extra_alpha_s
        beta = self.per_byte(size, slowest) + self.extra_beta_s
        return hops(collective, workers) * alpha + wire_factor(collective, workers, peers) * size * beta

    def to_dict(self) -> dict[str, Any]:
        return {"network": self.network, "alpha_s": self.alpha_s + self.extra_alpha_s,
                "beta_s_per_byte": self.beta_s, "source": self.source, "workers": self.workers,
                "sizes": list(self.sizes), "times_s": list(self.times)}


def latency_steps(rows: Iterable[dict[str, Any]], workers: int) -> list[float]:
    """The latency step of each of task 0a's fp32 ``rows`` of 1 KB or less on ``workers``
    ranks: its time over the 2 (N - 1) steps of a ring all-reduce. A message of fewer elements
    than ranks is left out: some ranks' chunks of it are empty, and it took 0.2-0.3 ms on 2
    workers here against 0.5-1.9 ms for 3 to 1,000 elements, fewer steps than a ring's."""
    return [float(r["time_s"]) / hops("allreduce", workers) for r in rows
            if r.get("dtype") == FIT_DTYPE and 0 < float(r["bytes"]) <= SMALL_MESSAGE
            and int(r.get("elements", workers)) >= workers and float(r.get("time_s", 0)) > 0]


def fit_link(rows: Iterable[dict[str, Any]], workers: int, network: str, source: str) -> Link:
    """The link of task 0a's ``rows`` on ``workers`` ranks (their fp32 rows; the rows of
    several sweeps give each size the median of their times): ``alpha`` is the mean of
    :func:`latency_steps`, the expected latency (a step's collectives add up, so their mean
    counts: a few slow ones cost what they cost)."""
    rows = list(rows)
    by_size: dict[float, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("dtype") == FIT_DTYPE and float(r.get("time_s", 0)) > 0:
            by_size.setdefault(float(r["bytes"]), []).append(
                (float(r["time_s"]), float(r.get("time_max_s") or r["time_s"])))
    points = sorted((size, statistics.median(t for t, _ in times), statistics.median(max(t, m) for t, m in times))
                    for size, times in by_size.items())
    if len(points) < 2 or workers < 2:
        raise UsageError(f"the sweep {source} has {len(points)} timed {FIT_DTYPE} sizes on {workers} worker(s): "
                         "a link needs two or more sizes on two or more workers")
    steps = latency_steps(rows, workers)
    alpha = statistics.mean(steps) if steps else points[0][1] / hops("allreduce", workers)
    return Link(network, workers, tuple(p[0] for p in points), tuple(p[1] for p in points),
                tuple(p[2] for p in points), alpha, source)


def nominal_link(host: Link, settings: NetworkSettings) -> Link:
    """A link of ``settings``' rate and latency in series with the machine's own (``host``,
    a sweep without emulation): each byte pays both, each message step both latencies."""
    return dataclasses.replace(
        host, network=network_label(settings.to_dict()) or "not emulated", source=f"nominal, with {host.source}",
        extra_alpha_s=settings.latency_s or 0.0,
        extra_beta_s=8.0 / settings.bandwidth_bps if settings.bandwidth_bps else 0.0)


@dataclass(frozen=True)
class Traffic:
    """What one training step of an optimizer sends per rank, as a run at ``workers`` measured
    it: ``wire_bytes`` (the mean over ranks of ``comm/bytes`` per step), ``collectives`` (of
    ``comm/collectives`` per step; None where the run did not count them) and, for gossip,
    ``peers`` (the most neighbours a rank has in its topology at that count)."""

    collective: str
    workers: int
    wire_bytes: float
    collectives: float | None
    peers: int = 2

    def message_bytes(self) -> float:
        """The bytes of one rank's message per step, whatever the worker count."""
        factor = wire_factor(self.collective, self.workers, self.peers)
        return self.wire_bytes / factor if factor else 0.0

    def rounds(self) -> float:
        """Collectives per step (gossip: exchanges, a send and a receive per peer each); one
        where the run did not count them."""
        count = self.collectives if self.collectives is not None else 1.0
        if self.collective == "gossip":
            return count / (2 * max(self.peers, 1))
        return count

    def latency_seconds(self, link: Link, workers: int) -> float:
        """The latency steps' part of :meth:`seconds`: its collectives' ``hops x alpha``."""
        if workers <= 1:
            return 0.0
        return self.rounds() * hops(self.collective, workers) * (link.alpha_s + link.extra_alpha_s)

    def seconds(self, link: Link, workers: int, peers: int = 2, slowest: bool = False) -> float:
        """Communication per step on ``workers`` ranks over ``link`` (gossip: ``peers`` each):
        its collectives, each of an equal share of the step's message."""
        rounds = self.rounds()
        if workers <= 1 or rounds <= 0:
            return 0.0
        size = self.message_bytes() / rounds
        return rounds * link.seconds(self.collective, workers, max(size, 1.0), slowest, peers)


@dataclass(frozen=True)
class Measured:
    """One training run as the model reads it: its per-step medians over logging intervals."""

    run_id: str
    workers: int
    compute_s: float                 # median compute phases per step (mean over ranks)
    compute_range: tuple[float, float]   # the interquartile range of the same
    communication_s: float           # median communication phase per step
    step_s: float                    # median training seconds per step (train/time)
    samples_per_step: float
    traffic: Traffic
    network: str
    shared_cores: bool               # its workers' threads outnumbered the machine's cores
    steps_to_goal: int | None
    created_at: float
    machine: str
    backward_s: float = 0.0          # median backward phase per step (mean over ranks), of compute_s
    checkpoint_s: float | None = None    # median seconds of one checkpoint it wrote; None: it wrote none
    group: str | None = None         # the group of repeats it was one of (`mlbench run --repeat`)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def parsed_options(optimizer: str, options: dict[str, Any]) -> dict[str, Any]:
    """``optimizer``'s options as a run stored them (strings or values), parsed, with its
    defaults: what the model reads its topology, overlap and buckets from. A stored run's
    options that no longer parse (an optimizer changed since) read as the defaults."""
    info = INFO.get(optimizer)
    if info is None:
        return dict(options)
    try:
        return info.parse_options(dict(options), None, strict=False)
    except UsageError:
        return {name: option.default for name, option in info.options.items()}


def _peers(optimizer: str, options: dict[str, Any], workers: int) -> int:
    """The most neighbours a rank has in a gossip optimizer's topology at ``workers`` ranks."""
    if workers < 2:
        return 0
    text = str(options.get("topology", "ring"))
    try:
        topology = parse_topology(text, workers)
    except UsageError:
        return 2
    degree: dict[int, int] = {}
    for i, j in topology.edges:
        degree[i] = degree.get(i, 0) + 1
        degree[j] = degree.get(j, 0) + 1
    return max(degree.values(), default=0)


def measure_run(result: RunResult, events: list[dict[str, Any]]) -> Measured:
    """The per-step figures of one finished training run, from its events."""
    config = result.config
    if config is None:
        raise UsageError(f"run {result.record.id} has no readable run.json")
    info = INFO.get(config.optimizer)
    collective = info.collective if info is not None else "allreduce"
    intervals: dict[tuple[int, int], dict[str, float]] = {}
    last_time: dict[int, float] = {}
    written: dict[int, float] = {}   # checkpoint step -> rank 0's seconds to write it
    for e in events:
        name, rank = e.get("name", ""), int(e.get("rank", 0))
        if name == "checkpoint" and isinstance(e.get("value"), dict):
            written[int(e["value"].get("step", e.get("step", 0)))] = float(e["value"].get("seconds") or 0.0)
            continue
        if not (name.startswith(("time/", "comm/")) or name in ("train/steps", "train/time")):
            continue
        point = intervals.setdefault((rank, int(e.get("step", 0))), {})
        point[name] = point.get(name, 0.0) + float(e["value"])
    compute, backward, communication, steps_s, wire, counted, collectives = [], [], [], [], [], 0, 0.0
    per_rank_steps: dict[int, int] = {}
    for (rank, end), point in sorted(intervals.items()):
        steps = point.get("train/steps", 0.0)
        if steps <= 0:
            continue
        per_rank_steps[rank] = per_rank_steps.get(rank, 0) + int(steps)
        compute.append(sum(point.get(f"time/{p}", 0.0) for p in COMPUTE_PHASES) / steps)
        backward.append(point.get("time/backward", 0.0) / steps)
        communication.append(point.get("time/communication", 0.0) / steps)
        wire.append(point.get("comm/bytes", 0.0) / steps)
        if "comm/collectives" in point:
            collectives += point["comm/collectives"]
            counted += int(steps)
        if "train/time" in point:
            # a checkpoint after step c is written before step c + 1: an interval that holds it is
            # no step time (the checkpoint is its own term, checkpoint_s / every)
            holds = any(end - steps <= c < end for c in written)
            if rank in last_time and not holds:
                steps_s.append((point["train/time"] - last_time[rank]) / steps)
            last_time[rank] = point["train/time"]
    if not compute:
        raise UsageError(f"run {result.record.id} recorded no timed training steps to calibrate from")
    low, median, high = _quartiles(compute)
    options = parsed_options(config.optimizer, config.optimizer_options)
    workers = result.record.workers
    traffic = Traffic(collective, workers, statistics.mean(wire), collectives / counted if counted else None,
                      _peers(config.optimizer, options, workers))
    summary = result.summary
    samples = summary.samples / summary.steps if summary.steps else 0.0
    environment = summary.environment or {}
    cores = int(environment.get("cores") or 0)
    threads = int(config.threads_per_worker or 1)
    outcome = result.result
    return Measured(result.record.id, workers, median, (low, high), statistics.median(communication),
                    statistics.median(steps_s) if steps_s else median + statistics.median(communication),
                    samples, traffic, network_label(result.network) or "not emulated",
                    bool(cores) and workers * threads > cores,
                    outcome.steps_to_accuracy if outcome.reached else None, result.record.created_at,
                    str(environment.get("cpu") or environment.get("host") or "unknown machine"),
                    statistics.median(backward), statistics.median(written.values()) if written else None,
                    result.record.group_id)


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one optimizer at ``workers`` on ``link``."""

    optimizer: str
    workers: int
    link: Link
    compute_s: float
    communication_s: float
    range_s: tuple[float, float]
    samples_per_step: float
    compute_from: str
    traffic_from: str
    steps_to_goal: int | None
    notes: tuple[str, ...] = ()
    overhead_s: float = 0.0          # of communication_s: the phase's part no link explains
    hidden_s: float = 0.0            # of communication_s: the part that runs beside compute
    straggler_factor: float = 1.0    # one worker this many times slower (--inject slow): all wait
    checkpoint_s: float = 0.0        # a checkpoint's seconds over the steps between two

    @property
    def step_s(self) -> float:
        """Compute plus the communication that does not overlap it, times the straggler's
        factor (the others wait for it at every collective), plus the checkpoints' share."""
        return (self.compute_s + self.communication_s - self.hidden_s) * self.straggler_factor + self.checkpoint_s

    @property
    def throughput(self) -> float:
        return self.samples_per_step / self.step_s if self.step_s > 0 else 0.0

    @property
    def time_to_goal_s(self) -> float | None:
        return None if self.steps_to_goal is None else self.steps_to_goal * self.step_s

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "workers": self.workers, "network": self.link.network,
                "step_s": self.step_s, "step_range_s": list(self.range_s), "compute_s": self.compute_s,
                "communication_s": self.communication_s, "hidden_s": self.hidden_s, "throughput": self.throughput,
                "steps_to_goal": self.steps_to_goal, "time_to_goal_s": self.time_to_goal_s,
                "overhead_s": self.overhead_s, "straggler_factor": self.straggler_factor,
                "checkpoint_s": self.checkpoint_s, "compute_from": self.compute_from, "traffic_from": self.traffic_from,
                "link": self.link.to_dict(), "notes": list(self.notes)}


@dataclass
class Calibration:
    """Everything measured for one task: its training runs by optimizer (one configuration
    each) and the links, by network label, fitted to task 0a's sweeps."""

    task: str
    runs: dict[str, list[Measured]] = field(default_factory=dict)
    links: dict[str, Link] = field(default_factory=dict)
    configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)   # optimizer -> its runs' task settings

    def link(self, settings: NetworkSettings | None) -> Link:
        """The link of ``settings`` (None: the machine's own network): fitted to a sweep at that
        network, or nominal in series with the machine's own."""
        label = network_label(settings.to_dict()) if settings else ""
        label = label or "not emulated"
        if label in self.links:
            return self.links[label]
        host = self.links.get("not emulated")
        if host is None or settings is None:
            raise UsageError(f"no task0a sweep on 2 or more workers at {label} to fit the link to: run "
                             f"`mlbench run task0a 2{' ' + ' '.join(settings.to_args()) if settings else ''}` "
                             "(or `mlbench predict ... --calibrate`)")
        return nominal_link(host, settings)

    def predict(self, optimizer: str, workers: int, link: Link, straggler: float = 1.0,
                checkpoints: CheckpointRule | None = None) -> Prediction:
        """Step time of ``optimizer`` at ``workers`` on ``link``; see the module's docstring.
        ``straggler``: one worker that many times slower for the whole run; ``checkpoints``:
        the run's ``--checkpoint-every``, each at the cost the configuration's runs measured."""
        measured = self.runs.get(optimizer)
        if not measured:
            raise UsageError(f"no finished run of {self.task} with --optimizer {optimizer} to calibrate from: run "
                             f"`mlbench run {self.task} 2 --optimizer {optimizer} --max-steps 100` "
                             "(or `mlbench predict ... --calibrate`)")
        settings = self.settings.get(optimizer)
        problem = settings.check(workers) if settings is not None and hasattr(settings, "check") else None
        if problem:
            raise UsageError(f"{self.task} on {workers} workers: {problem}", option="workers")
        notes: list[str] = []
        # a run without emulation first, at the count asked for as below it: tc's shaping costs
        # the cores too
        at = sorted((m for m in measured if m.workers == workers),
                    key=lambda m: (m.network != "not emulated", -m.created_at))
        below = sorted((m for m in measured if m.workers < workers and not m.shared_cores),
                       key=lambda m: (-m.workers, m.network != "not emulated", -m.created_at))
        compute_run = at[0] if at else (below[0] if below else min(measured, key=lambda m: m.workers))
        compute_run = median_of_repeats(compute_run, measured)
        compute_s, (low, high) = compute_run.compute_s, compute_run.compute_range
        scale = _accumulation(settings, workers) / _accumulation(settings, compute_run.workers) if settings else 1.0
        compute_s, low, high = compute_s * scale, low * scale, high * scale
        if compute_run.workers == workers and compute_run.shared_cores:
            notes.append(f"compute measured at {workers} workers sharing the machine's cores ({compute_run.run_id})")
        elif compute_run.workers != workers:
            notes.append(f"compute per worker as measured at {compute_run.workers} ({compute_run.run_id}); "
                         "each worker is taken to have resources of its own")
        traffic_runs = [m for m in measured if m.workers >= 2]
        if not traffic_runs:
            raise UsageError(f"no run of {self.task} with --optimizer {optimizer} on 2 or more workers measured "
                             f"what it sends: run `mlbench run {self.task} 2 --optimizer {optimizer} --max-steps 100`")
        traffic_run = median_of_repeats(min(traffic_runs, key=lambda m: (abs(m.workers - workers), -m.created_at)),
                                        measured)
        traffic = traffic_run.traffic
        if traffic.collectives is None:
            notes.append(f"{traffic_run.run_id} did not count its collectives: one per step is assumed")
        peers = _peers(optimizer, self._parsed_options(optimizer), workers) if traffic.collective == "gossip" else 2
        communication = traffic.seconds(link, workers, peers)
        slowest = traffic.seconds(link, workers, peers, slowest=True)
        encoding_run = self._encoding_run(measured, traffic_run)
        overhead = self._overhead(optimizer, encoding_run) if workers > 1 else 0.0
        if overhead > 0:
            notes.append(f"{format_time(overhead)} a step of {encoding_run.run_id}'s communication phase is not its "
                         "link's (encoding, decoding, copies): added at every count")
            communication, slowest = communication + overhead, slowest + overhead
        waited = self._latency_waited(optimizer, traffic_run, overhead) \
            if workers > 1 and traffic_run.workers == workers else 0.0
        latency = traffic.latency_seconds(link, workers)
        if waited > latency:
            notes.append(f"{traffic_run.run_id}'s {workers} workers shared the machine's cores: its message steps "
                         f"took {format_time(waited)} a step, waiting for a core, and a link's latency passes "
                         "within that wait: its bytes are added to that")
            communication, slowest = communication + waited - latency, slowest + waited - latency
        info = INFO.get(optimizer)
        overlaps = info.overlaps if info is not None else None
        hidden = 0.0
        if overlaps is not None and workers > 1:
            rounds = max(traffic.rounds(), 1e-12)
            if overlaps == "backward":
                buckets = self._buckets(optimizer, traffic, rounds)
                exposed = self._exposed_in_backward(compute_run, buckets)
                if exposed > 0:
                    notes.append(f"{format_time(exposed)} a step of {compute_run.run_id}'s backward pass was its "
                                 "own communication: left out of compute")
                    compute_s, low, high = compute_s - exposed, low - exposed, high - exposed
                window = max(0.0, compute_run.backward_s * scale - exposed)
                hidden = hidden_beside_backward(communication, buckets, window)
            else:
                tau = int(self._parsed_options(optimizer).get("overlap", 0))
                hidden = hidden_beside_steps(communication, rounds, tau, compute_s)
            if hidden > 0:
                notes.append(f"{format_time(hidden)} a step of communication runs beside "
                             f"{'the backward pass' if overlaps == 'backward' else 'the inner steps'}: "
                             "not in the step time")
        samples = compute_run.samples_per_step / compute_run.workers * workers
        if settings is not None and hasattr(settings, "global_batch_size"):
            samples = compute_run.samples_per_step / _global(settings, compute_run.workers) * _global(settings, workers)
        goal_runs = [m.steps_to_goal for m in at if m.steps_to_goal is not None]
        steps_to_goal = int(statistics.median(goal_runs)) if goal_runs else None
        if straggler != 1.0:
            notes.append(f"one worker {straggler:g}x slower: every step waits for it")
        step_s = (compute_s + communication - hidden) * straggler
        checkpoint_s = self._checkpoint_share(optimizer, workers, checkpoints, step_s, notes)
        low_s, high_s = (low + communication - hidden) * straggler, (high + slowest - hidden) * straggler
        return Prediction(optimizer, workers, link, compute_s, communication,
                          (low_s + checkpoint_s, high_s + checkpoint_s), samples,
                          compute_run.run_id, traffic_run.run_id, steps_to_goal, tuple(notes), overhead, hidden,
                          straggler, checkpoint_s)

    def _checkpoint_share(self, optimizer: str, workers: int, rule: CheckpointRule | None, step_s: float,
                          notes: list[str]) -> float:
        """What ``rule``'s checkpoints add to a step of ``step_s`` seconds
        (:meth:`CheckpointRule.seconds_per_step`), each at the median of what the configuration's
        runs at ``workers`` measured (at any count where none did); 0, said in ``notes``, where no
        run of it wrote one: a cost no run measured is not guessed."""
        if rule is None:
            return 0.0
        measured = self.runs.get(optimizer, [])
        costs = [m.checkpoint_s for m in measured if m.workers == workers and m.checkpoint_s is not None] \
            or [m.checkpoint_s for m in measured if m.checkpoint_s is not None]
        if not costs:
            notes.append(f"checkpoint cost unknown: no run of this configuration wrote one (mlbench run "
                         f"{self.task} {workers} --optimizer {optimizer} --checkpoint-every {rule.argument()}); "
                         "left out")
            return 0.0
        cost = statistics.median(costs)
        notes.append(f"a checkpoint {rule.describe(cost)}, {format_time(cost)} each as measured")
        return rule.seconds_per_step(cost, step_s)

    def _buckets(self, optimizer: str, traffic: Traffic, rounds: float) -> list[float]:
        """The byte sizes of the step's gradient buckets, in the order the backward pass makes
        them: DDP's layout (``bucket_mb``); else the step's collectives, of equal size."""
        options = self._parsed_options(optimizer)
        if "bucket_mb" in options:
            return ddp_buckets(traffic.message_bytes(), float(options["bucket_mb"]))
        count = max(1, round(rounds))
        return [traffic.message_bytes() / count] * count

    def _exposed_in_backward(self, run: Measured, buckets: list[float]) -> float:
        """The seconds of ``run``'s backward phase per step that were its own all-reduces: a
        DDP run's backward returns once the last bucket is reduced, so the phase holds what ran
        past the gradients (:func:`hidden_beside_backward`), priced on the link of the run's own
        network. 0 for a run on one worker or on a network no sweep measured."""
        link = self.links.get(run.network)
        if link is None or run.workers < 2:
            return 0.0
        communication = run.traffic.seconds(link, run.workers)
        # the phase is the gradients' time plus what ran past it: solved for the gradients' time
        # with the exposure at the phase's length (the exposure changes little with the window)
        exposed = communication - hidden_beside_backward(communication, buckets, run.backward_s)
        return min(run.backward_s, exposed)

    def _parsed_options(self, optimizer: str) -> dict[str, Any]:
        """The calibration runs' options of ``optimizer``, parsed, with its defaults."""
        return parsed_options(optimizer, self._options(optimizer))

    @staticmethod
    def _encoding_run(measured: list[Measured], traffic_run: Measured) -> Measured:
        """The run whose communication phase gives the optimizer's own cost (encoding, copies):
        ``traffic_run``, or where its workers shared the machine's cores (their phase then holds
        the waits for a core too), the nearest-count run on 2 or more workers with cores of
        their own, if there is one."""
        if not traffic_run.shared_cores:
            return traffic_run
        own = [m for m in measured if m.workers >= 2 and not m.shared_cores]
        if not own:
            return traffic_run
        return median_of_repeats(min(own, key=lambda m: (abs(m.workers - traffic_run.workers), -m.created_at)),
                                 measured)

    def _latency_waited(self, optimizer: str, run: Measured, overhead: float) -> float:
        """The seconds per step that ``run``'s message steps took, where its workers shared the
        machine's cores and its communication phase is longer than its own network's link plus
        ``overhead`` explain: the phase less ``overhead`` and less its bytes' time on that link.
        A message step there also waited for the receiving rank to get a core, and a link's
        latency passes within that wait; moving the bytes takes the cores' time besides. 0 where
        the run had cores of its own, or its link explains its phase."""
        link = self.links.get(run.network)
        if not run.shared_cores or link is None:
            return 0.0
        explained = self._on_own_link(optimizer, run, link)
        if run.communication_s <= explained + overhead:
            return 0.0
        return run.communication_s - overhead - (explained - run.traffic.latency_seconds(link, run.workers))

    def _overhead(self, optimizer: str, run: Measured) -> float:
        """Seconds a step of ``run``'s communication phase spent beyond what its own network's
        link explains: encoding and decoding (PowerSGD's orthogonalisation, signSGD's packing)
        and copies, which the phase holds too (mlbench/optim/base.py). 0 where no sweep measured
        its network, or where the link explains it all."""
        link = self.links.get(run.network)
        if link is None:
            return 0.0
        return max(0.0, run.communication_s - self._on_own_link(optimizer, run, link))

    def _on_own_link(self, optimizer: str, run: Measured, link: Link) -> float:
        """What ``run``'s traffic costs a step on ``link``, the link of its own network."""
        gossip = run.traffic.collective == "gossip"
        peers = _peers(optimizer, self._parsed_options(optimizer), run.workers) if gossip else 2
        return run.traffic.seconds(link, run.workers, peers)

    def _options(self, optimizer: str) -> dict[str, Any]:
        config = self.configuration.get(optimizer, {})
        return {k[4:]: v for k, v in config.items() if k.startswith("opt.")}


def median_of_repeats(run: Measured, pool: Iterable[Measured]) -> Measured:
    """``run`` as the median of its repeats: the runs of ``pool`` in its group (one `mlbench
    run --repeat`) at its worker count and network, each per-step figure their median. One
    run of a calibration carries its noise into every prediction of its optimizer: here two
    optimizers that send the same 8 KB a step measured 2.05 and 1.02 ms of communication."""
    if run.group is None:
        return run
    repeats = sorted((m for m in pool if m.group == run.group and m.workers == run.workers
                      and m.network == run.network), key=lambda m: m.created_at)
    if len(repeats) < 2:
        return run

    def median(figure: Callable[[Measured], float]) -> float:
        return statistics.median(figure(m) for m in repeats)

    checkpoints = [m.checkpoint_s for m in repeats if m.checkpoint_s is not None]
    return dataclasses.replace(
        run, run_id=", ".join(m.run_id for m in repeats), compute_s=median(lambda m: m.compute_s),
        compute_range=(median(lambda m: m.compute_range[0]), median(lambda m: m.compute_range[1])),
        communication_s=median(lambda m: m.communication_s), step_s=median(lambda m: m.step_s),
        backward_s=median(lambda m: m.backward_s),
        traffic=dataclasses.replace(run.traffic, wire_bytes=median(lambda m: m.traffic.wire_bytes)),
        checkpoint_s=statistics.median(checkpoints) if checkpoints else None)


#: DDP's first bucket (torch.distributed's ``_DEFAULT_FIRST_BUCKET_BYTES``): the gradients made
#: first fill it, so that the first all-reduce starts early; the rest fill buckets of
#: ``bucket_cap_mb`` MiB.
DDP_FIRST_BUCKET_BYTES = 1 << 20


def ddp_buckets(message_bytes: float, bucket_mb: float) -> list[float]:
    """The sizes of DDP's gradient buckets for a message of ``message_bytes``, in the order the
    backward pass fills them: the first of at most 1 MiB, then buckets of ``bucket_mb`` MiB."""
    first = min(message_bytes, DDP_FIRST_BUCKET_BYTES)
    buckets, left = [first], message_bytes - first
    cap = max(bucket_mb * (1 << 20), 1.0)
    while left > 0:
        buckets.append(min(cap, left))
        left -= buckets[-1]
    return buckets


def hidden_beside_backward(communication: float, buckets: list[float], backward: float) -> float:
    """Of a step's ``communication``, the seconds that run beside a ``backward`` pass of that
    length, the gradients in ``buckets`` (their bytes, in the order they are made; Li et al.
    2020, DDP). A bucket's all-reduce starts once the backward pass has made its gradients, taken
    to come at an even rate in bytes, and once the one before it is done; each takes its share
    of the communication by bytes. The last bucket is made last, so it always waits; what runs
    past the backward pass is exposed, the rest hidden."""
    total = sum(buckets)
    if communication <= 0 or total <= 0:
        return 0.0
    made = end = 0.0
    for size in buckets:
        made += size
        end = max(end, backward * made / total) + communication * size / total
    return max(0.0, communication - max(0.0, end - backward))


def hidden_beside_steps(communication: float, rounds: float, steps: int, compute: float) -> float:
    """Of a step's ``communication`` (``rounds`` collectives a step, amortised: fewer than one
    where they come every few steps), the seconds that run beside ``steps`` inner steps of
    ``compute`` each (Streaming DiLoCo's tau, Douillard et al. 2025): each collective is hidden
    up to the compute of those steps."""
    if rounds <= 0 or steps <= 0:
        return 0.0
    each = communication / rounds
    return rounds * min(each, steps * compute)


def _accumulation(settings: Any, workers: int) -> float:
    try:
        return float(max(1, settings.accumulation(workers)))
    except (AttributeError, ZeroDivisionError, TypeError):
        return 1.0


def _global(settings: Any, workers: int) -> float:
    try:
        return float(settings.global_batch_size(workers))
    except (AttributeError, TypeError):
        return float(workers)


def _rate_only(repeats: list[tuple[RunRecord, RunResult]]) -> bool:
    """Whether the sweeps ran on emulated links with a rate and no netem (latency, jitter,
    loss): the same path (network namespaces, veth, a rate limiter) at any rate."""
    network = repeats[0][1].network
    return network is not None and bool(network) and not NetworkSettings.from_dict(network).needs_netem


def _configuration(result: RunResult) -> dict[str, str]:
    return {k: v for k, v in result.fingerprint.items() if k not in CARRIED_KEYS}


def calibration_from(store: RunStore, task: str, optimizers: Iterable[str],
                     exclude: Iterable[str] = ()) -> Calibration:
    """The calibration of ``task`` from the store's finished runs: for each optimizer, the runs
    of its newest run's configuration (so that two configurations never mix); the links from
    the finished task-0a sweeps on 2 or more workers, the newest per network with the repeats
    of its group (`--repeat`: the median of their times). ``exclude``: run ids left out (the
    runs a validation predicts)."""
    from mlbench.results.events import read_run_events

    skip = set(exclude)
    calibration = Calibration(task)
    records = [r for r in store.list() if r.state == FINISHED and r.id not in skip]
    sweeps: dict[str, list[tuple[RunRecord, RunResult]]] = {}
    for record in sorted((r for r in records if r.task == "task0a" and r.workers >= 2),
                         key=lambda r: r.created_at):
        result = RunResult.load(record)
        if result.sweep is None:
            continue
        label = network_label(result.network) or "not emulated"
        group = sweeps.get(label, [])
        same_group = bool(group) and record.group_id is not None and group[-1][0].group_id == record.group_id \
            and group[-1][0].workers == record.workers
        sweeps[label] = [*group, (record, result)] if same_group else [(record, result)]
    shared: list[float] = []    # the latency steps of every sweep of :func:`_rate_only` links
    for label, repeats in sweeps.items():   # the newest sweep of each network, with its repeats
        rows = [row for _, result in repeats if result.sweep is not None for row in result.sweep.rows]
        try:
            calibration.links[label] = fit_link(rows, repeats[0][0].workers, label,
                                                ", ".join(record.id for record, _ in repeats))
        except UsageError:
            continue
        if _rate_only(repeats):
            shared += latency_steps(rows, repeats[0][0].workers)
    if shared:   # a rate limit delays no small message: each such sweep sampled the same latency
        alpha = statistics.mean(shared)
        calibration.links = {label: dataclasses.replace(link, alpha_s=alpha) if _rate_only(sweeps[label]) else link
                             for label, link in calibration.links.items()}
    wanted = set(optimizers)
    newest: dict[str, tuple[RunRecord, RunResult]] = {}
    loaded: list[tuple[RunRecord, RunResult]] = []
    for record in sorted((r for r in records if r.task == task), key=lambda r: r.created_at):
        result = RunResult.load(record)
        if result.config is None or result.config.optimizer not in wanted or result.config.faults:
            continue   # a run with faults measures them: its peers' phases hold the waits
        loaded.append((record, result))
        newest[result.config.optimizer] = (record, result)
    for optimizer, (_, lead) in newest.items():
        configuration = _configuration(lead)
        calibration.configuration[optimizer] = configuration
        assert lead.config is not None
        calibration.settings[optimizer] = getattr(lead.config.task, "settings", None)
        calibration.runs[optimizer] = [measure_run(result, read_run_events(record.run_dir))
                                       for record, result in loaded
                                       if result.config is not None and result.config.optimizer == optimizer
                                       and _configuration(result) == configuration]
    return calibration


def predict_run(store: RunStore, record: RunRecord, exclude: Iterable[str] = ()) -> tuple[Prediction, Measured]:
    """A finished training run's predicted step time, from the store's calibration without it
    (nor the runs in ``exclude``: the others a validation checks, so that none is predicted from
    another), and its own measurement: what ``mlbench predict --validate`` and ``status
    --predicted`` show."""
    from mlbench.results.events import read_run_events

    result = RunResult.load(record)
    if result.config is None or result.sweep is not None or not hasattr(result.config.task, "settings"):
        raise UsageError(f"run {record.id}: only training runs have a step time to predict")
    measured = measure_run(result, read_run_events(record.run_dir))
    calibration = calibration_from(store, record.task, [result.config.optimizer], exclude={record.id, *exclude})
    settings = NetworkSettings.from_dict(result.network) if result.network else None
    straggler = whole_run_slowdown(result.config.faults)
    if straggler is None:
        raise UsageError(f"run {record.id}: its slow faults apply for part of the run, which the model "
                         "does not predict (a straggler for the whole run, it does)")
    return calibration.predict(result.config.optimizer, record.workers, calibration.link(settings), straggler,
                               CheckpointRule.of_config(result.config)), measured


def whole_run_slowdown(faults: Iterable[dict[str, Any]]) -> float | None:
    """The factor of the slowest worker of ``--inject slow`` schedules that hold from the start
    for ever (1: none); None where one holds for part of the run only (a start, a length, a
    period), which no one step time describes. Other fault kinds are the goodput's, not the step's."""
    factor = 1.0
    for spec in faults:
        if spec.get("kind") != SLOW:
            continue
        if spec.get("at") or spec.get("for") is not None or periodic(spec):
            return None
        factor = max(factor, float(spec.get("factor") or 1.0))
    return factor


def crossovers(predictions: list[Prediction]) -> list[str]:
    """Where one optimizer overtakes another along the worker counts, per network: one sentence
    each, by time to the goal where both know it, else by step time."""
    by_network: dict[str, dict[str, dict[int, Prediction]]] = {}
    for p in predictions:
        by_network.setdefault(p.link.network, {}).setdefault(p.optimizer, {})[p.workers] = p
    lines = []
    for network, table in by_network.items():
        names = list(table)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                counts = sorted(set(table[a]) & set(table[b]))
                previous: tuple[int, bool] | None = None
                for n in counts:
                    pa, pb = table[a][n], table[b][n]
                    ta, tb = pa.time_to_goal_s, pb.time_to_goal_s
                    a_first = (ta < tb) if ta is not None and tb is not None else pa.step_s < pb.step_s
                    if previous is not None and previous[1] != a_first:
                        ahead, behind = (a, b) if a_first else (b, a)
                        what = "time to goal" if ta is not None and tb is not None else "step time"
                        lines.append(f"at {network}, {ahead} overtakes {behind} by {what} between "
                                     f"{previous[0]} and {n} workers")
                    previous = (n, a_first)
    return lines


def describe_link(link: Link) -> str:
    """One line: the link's fitted latency and bandwidth, and where they come from."""
    rate = format_rate(8.0 / link.beta_s) if link.beta_s > 0 else "unbounded"
    return (f"{link.network}: latency {format_time(link.alpha_s + link.extra_alpha_s)} per message step, "
            f"{rate} at {link.sizes[-1]:.3g}-byte messages ({link.source})")
