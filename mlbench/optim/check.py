"""``mlbench check-optimizer``: the checks the built-in optimizers pass, run against any optimizer.

A researcher's plug-in should be sound before it is benchmarked: a wrong all-reduce, a byte
count that flatters it or ranks that drift apart would make every number of its runs a lie. So
the optimizer (a built-in or a plug-in, from the run folder's kind of copy of its source) trains
a small MLP on synthetic data in real processes with real ``torch.distributed`` (gloo on
127.0.0.1), and is held to what its descriptor claims (:class:`OptimizerInfo`):

- **exact** (when it claims ``exact``): k workers with batch b end with the parameters of one
  process with batch k*b after N steps, to the tolerance of the built-ins' tests (``rtol`` 1e-5,
  ``atol`` 1e-6); the one process runs the same optimizer, so that no formula of ours is assumed.
- **bytes**: what it reports in ``bytes_sent`` against what its process really sent: the TCP
  payload of its sockets (Linux's ``tcp_info.tcpi_bytes_sent``), which sees every collective,
  DDP's C++ all-reduce included. gloo adds headers to every message, hence the tolerance.
- **same-model**, or **consensus** for a method that declares ``ranks_differ``: bit-identical
  parameters on every rank after N steps; or the consensus distance (1/k) sum_i |x_i - mean|^2,
  with the check that evaluation sees one model (``state_for_eval`` averages, then gives each
  rank its own model back, bit for bit).
- **determinism**: the same seed twice gives bit-identical parameters on every rank.
- **finite**: no NaN or inf in any parameter or loss.

Every process computes with one thread (the same summation order each time). A collective that
one rank never joins would wait for ever: the group's timeout bounds it, and the checker ends
its processes after that.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import queue
import socket
import struct
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.errors import peer_consequence
from mlbench.optim.descriptors import OptimizerInfo, optimizer_info
from mlbench.optim.plugins import Plugin, resolve_optimizer

#: The MLP: inputs, hidden units, classes (71,178 parameters: payload dominates gloo's headers).
FEATURES, HIDDEN, CLASSES = 128, 512, 10
#: What trains, for the report's header.
CHECKED = (f"an MLP ({FEATURES}-{HIDDEN}-{CLASSES}, {FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES:,} "
           "parameters) on synthetic data, gloo on 127.0.0.1, task 1a's momentum and weight decay")
#: The learning rate of every step.
LR = 0.05
#: Exactness tolerance of the built-ins' tests (tests/optim/test_centralized.py).
EXACT_RTOL, EXACT_ATOL = 1e-5, 1e-6
#: Bytes: the measured payload may differ from the reported by this fraction of the larger ...
BYTES_RELATIVE = 0.10
#: ... plus this many bytes per step and rank (gloo's message headers, ~600 B per collective).
BYTES_PER_STEP_AND_RANK = 2048
#: Where struct tcp_info (linux/tcp.h) holds tcpi_bytes_sent (Linux >= 4.19).
_TCPI_BYTES_SENT = 200
REFERENCE = -1  # the role of the one-process reference


@dataclass(frozen=True)
class Settings:
    """How the optimizer is exercised."""

    workers: int = 2
    steps: int = 5
    batch: int = 8
    seed: int = 0
    timeout_s: float = 60.0


@dataclass(frozen=True)
class Job:
    """What a process needs to build the optimizer (picklable: a spawned process gets it)."""

    name: str
    options: dict[str, str]
    record: dict[str, Any] | None = None   # a plug-in's, as run.json has it
    folder: str | None = None              # where its copy lies


@dataclass(frozen=True)
class Subject:
    """The optimizer under check: what it claims (its descriptor, its parsed options) and its job."""

    spec: str
    info: OptimizerInfo
    values: dict[str, Any]
    job: Job
    plugin: Plugin | None = None

    @property
    def label(self) -> str:
        return self.plugin.label if self.plugin is not None else self.info.name


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: the check, PASS, FAIL or SKIP, and what was measured."""

    name: str
    status: str
    detail: str


@dataclass
class _Trained:
    """What one role sends back (tensors as flat fp32 vectors)."""

    params: Any = None
    again: Any = None
    eval_params: Any = None
    restored: bool = True
    losses: list[float] = field(default_factory=list)
    reported: int = 0
    measured: int | None = None


def prepare(spec: str, options: dict[str, str], workers: int, folder: Path) -> Subject:
    """The optimizer ``spec`` names with its options checked for ``workers`` workers (the run's
    refusals, one line, :class:`mlbench.errors.UsageError`); a plug-in's source is copied into ``folder`` the
    way a run keeps it, and the processes execute that copy."""
    plugin = resolve_optimizer(spec)
    info = optimizer_info(spec) if plugin is None else plugin.info
    values = info.parse_options(options, workers)
    if plugin is None:
        return Subject(spec, info, values, Job(info.name, dict(options)))
    for relative, data in plugin.loaded.copies().items():
        copy = folder / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(data)
    return Subject(spec, info, values, Job(info.name, dict(options), plugin.record(values), str(folder)), plugin)


def wire_bytes_sent() -> int | None:
    """TCP payload bytes this process has sent on its open TCP sockets (retransmissions
    included), or None where the system does not say (not Linux, a kernel before 4.19)."""
    total = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < _TCPI_BYTES_SENT + 8:
                return None
            total += struct.unpack_from("Q", info, _TCPI_BYTES_SENT)[0]
        except OSError:
            continue
        finally:
            sock.close()
    return total


def run_checks(subject: Subject, settings: Settings, context: Any, folder: Path) -> list[CheckResult]:
    """Train in ``settings.workers`` processes (and one reference process when the optimizer
    claims to be exact), started from the multiprocessing ``context``; the checks' results."""
    roles = list(range(settings.workers)) + ([REFERENCE] if subject.info.claims_exact(subject.values) else [])
    results = context.Queue()
    procs = {role: context.Process(target=_role_main, args=(role, subject.job, settings, str(folder), results),
                                   daemon=True)
             for role in roles}
    for proc in procs.values():
        proc.start()
    got: dict[int, _Trained] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + 2 * settings.timeout_s + 60
    try:
        while len(got) + len(errors) < len(roles) and time.monotonic() < deadline:
            try:
                role, ok, payload = results.get(timeout=0.2)
            except queue.Empty:
                for role, proc in procs.items():
                    if role not in got and role not in errors and proc.exitcode not in (None, 0):
                        errors[role] = f"the process ended with exit code {proc.exitcode}"
                continue
            if ok:
                got[role] = pickle.loads(payload)
            else:
                errors[role] = payload
    finally:
        for proc in procs.values():
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
    missing = [role for role in roles if role not in got and role not in errors]
    if errors or missing:
        return [CheckResult("run", "FAIL", _failure(errors, missing, settings))]
    return _evaluate(subject, settings, got)


def _failure(errors: dict[int, str], missing: list[int], settings: Settings) -> str:
    def who(role: int) -> str:
        return "the one-process reference" if role == REFERENCE else f"rank {role}"
    # a rank's own error first: its peers' timeouts only follow from it, and a closed connection
    # from a peer that already ended (which of the two a loaded machine shows first varies)
    ordered = sorted(errors.items(), key=lambda item: (peer_consequence(item[1]), item[0]))
    if ordered:
        role, message = ordered[0]
        hint = " (a rank that skips a collective makes its peers wait)" if "timed out" in message.lower() else ""
        return f"{who(role)}: {message}{hint}"
    return (f"{', '.join(who(r) for r in missing)} did not finish in {2 * settings.timeout_s + 60:.0f} s "
            "(a rank that skips a collective makes its peers wait)")


# -- in each process -----------------------------------------------------------------------------
def _role_main(role: int, job: Job, settings: Settings, folder: str, results: Any) -> None:
    """One process: a rank of the k-worker group, or the one-process reference."""
    log = os.open(os.path.join(folder, f"role{role}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)   # a plug-in's prints and tracebacks stay out of the report
    os.dup2(log, 2)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        world, rank = (1, 0) if role == REFERENCE else (settings.workers, role)
        store = os.path.join(folder, "store-reference" if role == REFERENCE else "store-group")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=settings.timeout_s))
        try:
            batch = settings.batch * (settings.workers if role == REFERENCE else 1)
            trained = _train(job, settings, world, rank, batch, measure=role != REFERENCE)
            if role != REFERENCE:
                trained.again = _train(job, settings, world, rank, batch, measure=False).params
            dist.barrier()
        finally:
            dist.destroy_process_group()
        results.put((role, True, pickle.dumps(trained)))
    except Exception as err:  # one line for the report, the traceback in the log
        traceback.print_exc()
        results.put((role, False, _one_line(err)))


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text and type(err).__module__.startswith("mlbench") else \
        f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _train(job: Job, settings: Settings, world: int, rank: int, batch: int, measure: bool) -> _Trained:
    import torch
    import torch.distributed as dist
    from torch import nn

    from mlbench.optim.base import OptimizerContext, flat_params
    from mlbench.optim.catalog import build_optimizer
    from mlbench.tasks.task1a import TASK1A
    from mlbench.timing import PhaseTimer

    torch.manual_seed(settings.seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    x, y = _data(settings.steps * settings.workers * settings.batch, settings.seed)
    ctx = OptimizerContext(model=model, spec=TASK1A, world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options=job.options)
    optimizer = build_optimizer(job.name, ctx, job.record, Path(job.folder) if job.folder else None)
    out = _Trained()
    if measure:   # a barrier's own bytes, measured, then subtracted (DDP's start-up broadcast is before)
        dist.barrier()
        before = wire_bytes_sent()
        dist.barrier()
        start = wire_bytes_sent()
    for step in range(settings.steps):
        lo = (step * world + rank) * batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(optimizer.module(x[lo:lo + batch]), y[lo:lo + batch])
        loss.backward()
        optimizer.step(LR)
        out.losses.append(float(loss.detach()))
    if measure:
        dist.barrier()
        end = wire_bytes_sent()
        if before is not None and start is not None and end is not None:
            out.measured = (end - start) - (start - before)
    out.reported = int(optimizer.bytes_sent)
    params = [p for p in model.parameters()]
    out.params = flat_params(params).clone()
    restore = optimizer.state_for_eval()
    out.eval_params = flat_params(params).clone()
    if restore is not None:
        restore()
    out.restored = _same_bits(flat_params(params), out.params)
    return out


def _data(samples: int, seed: int) -> tuple[Any, Any]:
    """Gaussian inputs labelled by a random linear teacher: a task the MLP can learn."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(samples, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


# -- the verdicts --------------------------------------------------------------------------------
def _evaluate(subject: Subject, settings: Settings, got: dict[int, _Trained]) -> list[CheckResult]:
    ranks = [got[r] for r in range(settings.workers)]
    return [_exact(subject, settings, ranks, got.get(REFERENCE)), _bytes(settings, ranks),
            _same_model(subject, settings, ranks), _determinism(ranks), _finite(ranks, got.get(REFERENCE))]


def _same_bits(a: Any, b: Any) -> bool:
    """Bit-identical fp32 vectors (a NaN equals itself: determinism is about bits, not values)."""
    import torch

    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def _max_diff(a: Any, b: Any) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _exact(subject: Subject, settings: Settings, ranks: list[_Trained], reference: _Trained | None) -> CheckResult:
    if reference is None:
        return CheckResult("exact", "SKIP", f"{subject.info.name} does not claim that k workers equal one "
                                            "process with k times the batch")
    import torch

    k, b = settings.workers, settings.batch
    worst = max(range(k), key=lambda r: _max_diff(ranks[r].params, reference.params))
    diff = _max_diff(ranks[worst].params, reference.params)
    close = all(torch.allclose(t.params, reference.params, rtol=EXACT_RTOL, atol=EXACT_ATOL) for t in ranks)
    what = (f"{k} workers x batch {b} against 1 process x batch {k * b} after {settings.steps} steps: "
            f"max |difference| {diff:.1e} (rank {worst}; tolerance {EXACT_ATOL:g} + {EXACT_RTOL:g} x |value|)")
    return CheckResult("exact", "PASS" if close else "FAIL", what)


def _bytes(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    if any(t.measured is None for t in ranks):
        return CheckResult("bytes", "SKIP", "this system does not report the bytes a TCP socket sent "
                                            "(Linux 4.19 or later does)")
    measured = sum(t.measured or 0 for t in ranks)
    reported = sum(t.reported for t in ranks)
    allowed = BYTES_RELATIVE * max(measured, reported) + BYTES_PER_STEP_AND_RANK * settings.steps * len(ranks)
    change = f"{(reported - measured) / measured:+.1%}" if measured else "n/a"
    what = (f"reported {reported:,} B, sent on the wire {measured:,} B by all {len(ranks)} ranks in "
            f"{settings.steps} steps ({change}; tolerance {BYTES_RELATIVE:.0%} + "
            f"{BYTES_PER_STEP_AND_RANK // 1024} KiB per step and rank for gloo's headers)")
    return CheckResult("bytes", "PASS" if abs(measured - reported) <= allowed else "FAIL", what)


def _same_model(subject: Subject, settings: Settings, ranks: list[_Trained]) -> CheckResult:
    import torch

    k, steps = settings.workers, settings.steps
    if not subject.info.claims_ranks_differ(subject.values):
        differing = [r for r in range(1, k) if not _same_bits(ranks[r].params, ranks[0].params)]
        if not differing:
            return CheckResult("same-model", "PASS", f"bit-identical parameters on all {k} ranks after {steps} steps")
        r = differing[0]
        return CheckResult("same-model", "FAIL",
                           f"rank {r}'s parameters differ from rank 0's after {steps} steps by up to "
                           f"{_max_diff(ranks[r].params, ranks[0].params):.1e} (the optimizer does not "
                           "declare ranks_differ)")
    stacked = torch.stack([t.params for t in ranks])
    distance = float(((stacked - stacked.mean(dim=0)) ** 2).sum(dim=1).mean())
    what = f"ranks differ by design; consensus distance (1/k) sum |x_i - mean|^2 = {distance:.3e} after {steps} steps"
    if not all(t.restored for t in ranks):
        return CheckResult("consensus", "FAIL", f"{what}; after evaluation a rank did not get its own model back "
                                                "(state_for_eval's restore)")
    if not all(_same_bits(t.eval_params, ranks[0].eval_params) for t in ranks):
        return CheckResult("consensus", "FAIL", f"{what}; but the ranks evaluate different models "
                                                "(state_for_eval must give every rank the same, e.g. "
                                                "mlbench.optim.base.ConsensusEvaluation)")
    if not math.isfinite(distance):
        return CheckResult("consensus", "FAIL", what)
    return CheckResult("consensus", "PASS", f"{what}; every rank evaluates the same model")


def _determinism(ranks: list[_Trained]) -> CheckResult:

    differing = [r for r, t in enumerate(ranks) if not _same_bits(t.params, t.again)]
    if differing:
        r = differing[0]
        return CheckResult("determinism", "FAIL",
                           f"the same seed twice: rank {r}'s parameters differ by up to "
                           f"{_max_diff(ranks[r].params, ranks[r].again):.1e}")
    return CheckResult("determinism", "PASS", "the same seed twice gives bit-identical parameters on every rank")


def _finite(ranks: list[_Trained], reference: _Trained | None) -> CheckResult:
    import torch

    trained = ranks + ([reference] if reference is not None else [])
    bad = [r for r, t in enumerate(trained)
           if not bool(torch.isfinite(t.params).all()) or not all(math.isfinite(v) for v in t.losses)]
    first, last = ranks[0].losses[0], ranks[0].losses[-1]
    if bad:
        who = "the reference" if bad[0] >= len(ranks) else f"rank {bad[0]}"
        return CheckResult("finite", "FAIL", f"NaN or inf in the parameters or losses of {who}")
    return CheckResult("finite", "PASS",
                       f"no NaN or inf in parameters or losses (rank 0's loss {first:.4f} -> {last:.4f})")
