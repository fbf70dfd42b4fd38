"""``mlbench check-optimizer``: the checks the built-in optimizers pass, run against any optimizer.

A researcher's plug-in should be sound before it is benchmarked: a wrong all-reduce, a byte
count that flatters it or ranks that drift apart would make every number of its runs a lie. So
the optimizer (a built-in or a plug-in, from the run folder's kind of copy of its source) trains
a small MLP on synthetic data in real processes with real ``torch.distributed`` (gloo on
127.0.0.1), and is held to what its descriptor claims (:class:`OptimizerInfo`). By default it
runs at 2 and at 4 workers, because some defects need a rank >= 2. It trains for at least 20
steps and two of the method's periods (``OptimizerInfo.period``), in whole periods, so that a
round's synchronisation and a defect of a later step both show.

- **exact** (when it claims ``exact``): k workers with batch b end with the parameters of one
  process with batch k*b after N steps, to ``rtol`` 1e-9 and ``atol`` 1e-10; the one process runs
  the same optimizer, so that no formula of ours is assumed. Both train in float64 for this
  check (the other checks train in fp32): the order of an all-reduce's sums differs from one
  process's, and Adam's normalisation turns that fp32 rounding of a near-zero gradient into a
  whole step's difference (1e-5 after 20 steps of AdamW here), which would hide a defect as
  small and fail a sound method.
- **bytes**: what each rank reports in ``bytes_sent`` against what that rank's process really
  sent: the TCP payload of its sockets (Linux's ``tcp_info.tcpi_bytes_sent``), which sees every
  collective, DDP's C++ all-reduce included. Per rank, since a sum over the ranks hides a rank
  that counts the others' bytes. gloo adds headers to every message, hence the tolerance.
- **same-model**, or **consensus** for a method that declares ``ranks_differ``: bit-identical
  parameters on every rank after N steps; or the consensus distance (1/k) sum_i |x_i - mean|^2,
  with the check that evaluation (``state_for_eval``) shows every rank the same model.
- **restore**: after evaluation, every rank holds its own parameters again, bit for bit, whatever
  the method declares. Evaluation must not change the training.
- **communication**: with k > 1, the ranks' sockets send bytes in each of the method's periods
  (in the whole run where it declares none). A method that never synchronises fails here.
- **progress**: the model that evaluation shows ends with a lower loss on the check's data than
  the initial model. A method whose evaluated (global) model never moves fails here.
- **memory**: after a warm-up of about half the run, each rank's allocated memory (glibc's
  ``mallinfo2``) grows by at most :data:`MEMORY_PER_STEP` bytes per step. Keeping one more
  model-sized tensor each step (278 KiB here) is four times over it. The resident size is
  reported beside it but not judged: it moves with how the heap reuses freed pages.
- **random-stream**: the checker seeds torch's default generator with the run's seed before the
  model is built, as the workers do (mlbench/worker/trainer.py): the same stream on every rank,
  so that every rank draws the same initial model. Anything an optimizer draws from it is
  therefore the same on every rank, and reseeding it makes its draws ignore the run's seed. So
  after the steps and evaluation the stream must be as the model's initialisation left it; an
  optimizer's own random numbers come from a ``torch.Generator`` of its own.
- **determinism**: the same seed twice gives bit-identical parameters on every rank.
- **finite**: no NaN or inf in any parameter or loss.

Every process computes with one thread (the same summation order each time). A collective that
one rank never joins would wait for ever: the group's timeout bounds it, and the checker ends
its processes after that. Each process writes its progress to a file of its own: each step it
finishes, with the number of collectives it has issued. A failed run then names the rank that
stopped joining the collectives and the step where it did, not the first peer that timed out
waiting for it.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import pickle
import queue
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.errors import peer_consequence
from mlbench.optim.descriptors import OptimizerInfo, optimizer_info
from mlbench.optim.hyper import Hyper
from mlbench.optim.plugins import Plugin, resolve_optimizer
from mlbench.worker.hyper import task_hyper
from mlbench.worker.wire import wire_bytes_sent

#: The MLP: inputs, hidden units, classes (71,178 parameters: payload dominates gloo's headers).
FEATURES, HIDDEN, CLASSES = 128, 512, 10
PARAMETERS = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
#: What trains, for the report's header.
CHECKED = (f"an MLP ({FEATURES}-{HIDDEN}-{CLASSES}, {PARAMETERS:,} "
           "parameters) on synthetic data, gloo on 127.0.0.1, task 1a's momentum and weight decay")
#: The worker counts of a default check: two, and more than two (a rank >= 2 exists).
DEFAULT_WORKERS = (2, 4)
#: The fewest steps of a default check (defects of a later step show), raised to two periods.
DEFAULT_STEPS = 20
#: The learning rate of every step.
LR = 0.05
#: Exactness tolerance in float64 (fp32's rounding, amplified by Adam, is 1e-5 after 20 steps).
EXACT_RTOL, EXACT_ATOL = 1e-9, 1e-10
#: Bytes: the measured payload may differ from the reported by this fraction of the larger ...
BYTES_RELATIVE = 0.10
#: ... plus this many bytes per step, rank and peer (gloo's message headers, ~600 B per message:
#: a ring all-reduce sends 2 (k-1) messages per rank).
BYTES_PER_STEP_AND_PEER = 2048
#: Memory: the most a rank's allocated memory may grow per step after the warm-up. A quarter of
#: the model's fp32 size: a leak of one model-sized tensor per step is four times over it, while
#: the built-ins grow by less than a tenth of it (6 KiB per step at most, at 2 and 4 workers).
MEMORY_PER_STEP = PARAMETERS * 4 // 4
#: After a rank's error, how long past the group's timeout its peers get to report theirs
#: (they wait in a collective that times out too); a rank silent after that is stuck.
GRACE_S = 5.0
REFERENCE = -1  # the role of the one-process reference


@dataclass(frozen=True)
class Settings:
    """How the optimizer is exercised: at ``workers`` workers for ``steps`` steps; ``period`` is
    the method's declared period (None: not declared)."""

    workers: int = 2
    steps: int = DEFAULT_STEPS
    batch: int = 8
    seed: int = 0
    timeout_s: float = 60.0
    period: int | None = None

    @property
    def every(self) -> int:
        """The steps of one period (1 where none is declared)."""
        return self.period or 1

    @property
    def window(self) -> int:
        """The last steps, whole periods and about half the run, over which memory is measured."""
        return self.every * max(1, (self.steps // 2) // self.every)


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
    exact: Any = None                   # a k-worker rank's parameters after the float64 run
    eval_params: Any = None
    restored: bool = True
    losses: list[float] = field(default_factory=list)
    reported: int = 0
    measured: int | None = None
    initial_loss: float = math.nan      # the initial model's, on the check's data
    eval_loss: float = math.nan         # the evaluated model's, after the steps
    wire: list[int | None] = field(default_factory=list)   # payload sent since the start, after each step
    # (allocated, resident) bytes before the first step and after each step
    memory: list[tuple[int | None, int | None]] = field(default_factory=list)
    stream_kept: bool = True            # torch's default generator as the model's initialisation left it
    seed_now: int = 0                   # torch.initial_seed() after the steps and evaluation


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


def settings_for(subject: Subject, workers: int, steps: int = DEFAULT_STEPS, seed: int = 0,
                 timeout_s: float = 60.0) -> Settings:
    """The set-up of a check of ``subject`` at ``workers`` workers: at least ``steps`` steps and
    two of its periods, in whole periods (refuses, one line, options that do not fit ``workers``)."""
    values = subject.info.parse_options(subject.job.options, workers)
    period = subject.info.communication_period(values)
    every = period or 1
    n = max(steps, 2 * every)
    return Settings(workers=workers, steps=-(-n // every) * every, seed=seed, timeout_s=timeout_s, period=period)


def describe_settings(settings: Settings, subject: Subject) -> str:
    """The header's set-up: workers, batch, steps and, where declared, the periods they cover."""
    periods = ""
    if settings.period is not None and settings.period > 1:
        name = subject.info.period if isinstance(subject.info.period, str) else "period"
        periods = f" ({settings.steps // settings.period} periods of {name}={settings.period})"
    return f"{settings.workers} workers x batch {settings.batch}, {settings.steps} steps{periods}"


def allocated_bytes() -> int | None:
    """The bytes this process holds from malloc (glibc's ``mallinfo2``: the heap's chunks in use
    plus the mapped ones), or None without glibc 2.33. What a CPU tensor takes, and no more:
    unlike the resident size, it does not depend on how the heap reuses or returns freed pages.
    Over ten steps the resident size read a leak of one model-sized tensor per step as anything
    from nothing to all of it, and a built-in's steady state as up to half a model per step."""
    import ctypes

    class _Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Info
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def run_checks(subject: Subject, settings: Settings, context: Any, folder: Path) -> list[CheckResult]:
    """Train in ``settings.workers`` processes (and one reference process when the optimizer
    claims to be exact), started from the multiprocessing ``context``, with their logs, their
    progress and the group's rendezvous in ``folder``; the checks' results."""
    exact = subject.info.claims_exact(subject.values)
    roles = list(range(settings.workers)) + ([REFERENCE] if exact else [])
    results = context.Queue()
    procs = {role: context.Process(target=_role_main, args=(role, subject.job, settings, str(folder), results,
                                                            exact),
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
                        deadline = min(deadline, time.monotonic() + settings.timeout_s + GRACE_S)
                continue
            if ok:
                got[role] = pickle.loads(payload)
            else:
                errors[role] = payload
                # its peers time out in their collective within the group's timeout, or are stuck
                deadline = min(deadline, time.monotonic() + settings.timeout_s + GRACE_S)
    finally:
        for proc in procs.values():
            proc.join(timeout=0 if errors else 5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
    missing = [role for role in roles if role not in got and role not in errors]
    if errors or missing:
        return [CheckResult("run", "FAIL", _failure(errors, missing, settings, folder))]
    return _evaluate(subject, settings, got)


# -- where each rank got to ----------------------------------------------------------------------
@dataclass
class _Position:
    """A rank's progress as its file says: the run (1: the measured steps, 2: the same steps
    again, for determinism, 3: in float64, for exactness), the last step of it finished, the
    phase, and the collectives it had issued after each finished step and when it last wrote (its
    error: the one it waited in)."""

    run: int = 0
    finished: int = 0
    phase: str = "start"   # start, steps, done (its steps are over), end (the final barrier)
    seqs: dict[int, int] = field(default_factory=dict)
    now: int | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return self.run, self.finished, ("start", "steps", "done", "end").index(self.phase)

    def where(self, steps: int) -> str:
        again = {2: " of the second run (determinism)", 3: " of the float64 run (exactness)"}.get(self.run, "")
        if self.phase in ("start", "steps") and self.run:
            return f"in step {self.finished + 1}{again}"
        if self.phase == "done":
            return f"after step {steps}, the last{again}"
        if self.phase == "end":
            return "in the final barrier"
        return "before its first step"


def _read_position(folder: Path, role: int) -> _Position:
    position = _Position()
    try:
        lines = (folder / f"progress{role}").read_text().splitlines()
    except OSError:
        return position
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        run, what, seq = int(parts[0]), parts[1], None if parts[2] == "-" else int(parts[2])
        position.now = seq
        if what == "begin":
            position.run, position.finished, position.phase = run, 0, "steps"
            position.seqs = {} if seq is None else {0: seq}
        elif what.isdigit():
            position.finished = int(what)
            if seq is not None:
                position.seqs[position.finished] = seq
        elif what in ("done", "end"):
            position.phase = what
    return position


def _failure(errors: dict[int, str], missing: list[int], settings: Settings, folder: Path) -> str:
    def who(role: int) -> str:
        return "the one-process reference" if role == REFERENCE else f"rank {role}"

    def ranks(roles: list[int]) -> str:
        return (f"rank {roles[0]}" if len(roles) == 1 else
                "ranks " + ", ".join(str(r) for r in roles[:-1]) + f" and {roles[-1]}")

    hint = " (a rank that skips a collective makes its peers wait)"
    # a rank's own error first: its peers' timeouts only follow from it, and a closed connection
    # from a peer that already ended (which of the two a loaded machine shows first varies)
    ordered = sorted(errors.items(), key=lambda item: (peer_consequence(item[1]), item[0]))
    if ordered and not peer_consequence(ordered[0][1]):
        role, message = ordered[0]
        return f"{who(role)}: {message}"
    group = [r for r in range(settings.workers) if r in errors or r in missing]
    positions = {r: _read_position(folder, r) for r in group}
    waiting = sorted(r for r in group if r in errors)
    stuck = sorted(r for r in group if r in missing)
    steps = settings.steps

    def where(roles: list[int]) -> str:
        places: dict[str, list[int]] = {}
        for r in roles:
            places.setdefault(positions[r].where(steps), []).append(r)
        return "; ".join(f"{ranks(rs)} {place}" for place, rs in places.items())

    if stuck and waiting:   # alive, no error: stuck outside any collective (a collective times out)
        p = positions[stuck[0]]
        return (f"{ranks(stuck)} stopped {p.where(steps)} (the last step it finished: {p.finished}): it joined "
                f"no collective since, neither finishing nor timing out, while {where(waiting)} timed out "
                f"waiting after {settings.timeout_s:g} s")
    if waiting:
        lowest = min(positions[r].key for r in waiting)
        behind = [r for r in waiting if positions[r].key == lowest]
        ahead = [r for r in waiting if positions[r].key != lowest]
        if ahead:
            b = positions[behind[0]]
            step = b.finished + 1
            return (f"{ranks(ahead)} stopped joining the collectives in step {step} and went on ({where(ahead)}), "
                    f"while {ranks(behind)} timed out waiting {b.where(steps)} after {settings.timeout_s:g} s"
                    f"{_counts(positions, ahead, behind, step)}{hint}")
        role, message = ordered[0]
        return f"{ranks(waiting)} timed out {where(waiting)}: {message}{hint if 'timed out' in message.lower() else ''}"
    if ordered:
        role, message = ordered[0]
        return f"{who(role)}: {message}"
    return (f"{', '.join(who(r) for r in missing)} did not finish in {2 * settings.timeout_s + 60:.0f} s "
            f"({where(stuck)}){hint}")


def _counts(positions: dict[int, _Position], ahead: list[int], behind: list[int], step: int) -> str:
    """The collectives each side issued in ``step`` (those ahead finished it; those behind wait in
    their last), where every rank's count says."""
    b = positions[behind[0]]
    issued = []
    for r in ahead:
        p = positions[r]
        if p.run != b.run or step not in p.seqs or step - 1 not in p.seqs:
            return ""
        issued.append(f"rank {r} issued {p.seqs[step] - p.seqs[step - 1]}")
    if b.now is None or step - 1 not in b.seqs:
        return ""
    return (f"; in step {step} {', '.join(issued)} collectives, while rank {behind[0]} waits in its "
            f"collective {b.now - b.seqs[step - 1]} of that step")


# -- in each process -----------------------------------------------------------------------------
def _collectives() -> int | None:
    """The collectives this process has issued on the default group (None where torch does not say)."""
    from mlbench.optim.base import collectives_issued

    return collectives_issued()


class _Progress:
    """This process's progress file: one line per step it finishes, as it finishes it (written
    straight to the file, so that a process that is killed later has said where it was)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.run = 0

    def mark(self, what: int | str) -> None:
        seq = _collectives()
        os.write(self.fd, f"{self.run} {what} {'-' if seq is None else seq}\n".encode())


def _role_main(role: int, job: Job, settings: Settings, folder: str, results: Any, claims_exact: bool) -> None:
    """One process: a rank of the k-worker group (which trains a third time, in float64, when the
    optimizer claims exactness), or the one-process float64 reference."""
    log = os.open(os.path.join(folder, f"role{role}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)   # a plug-in's prints and tracebacks stay out of the report
    os.dup2(log, 2)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    progress = _Progress(os.path.join(folder, f"progress{role}"))
    try:
        world, rank = (1, 0) if role == REFERENCE else (settings.workers, role)
        store = os.path.join(folder, "store-reference" if role == REFERENCE else "store-group")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=settings.timeout_s))
        try:
            batch = settings.batch * (settings.workers if role == REFERENCE else 1)
            progress.run = 1
            if role == REFERENCE:
                trained = _train(job, settings, world, rank, batch, measure=False, progress=progress,
                                 dtype=torch.float64)
            else:
                trained = _train(job, settings, world, rank, batch, measure=True, progress=progress)
                progress.run = 2
                trained.again = _train(job, settings, world, rank, batch, measure=False, progress=progress).params
                if claims_exact:
                    progress.run = 3
                    trained.exact = _train(job, settings, world, rank, batch, measure=False, progress=progress,
                                           dtype=torch.float64).params
            progress.mark("end")
            dist.barrier()
        except Exception:
            progress.mark("error")   # while the group still counts the collective it waited in
            raise
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


def _train(job: Job, settings: Settings, world: int, rank: int, batch: int, measure: bool,
           progress: _Progress, dtype: Any = None) -> _Trained:
    """One training of the check's MLP; in fp32 unless ``dtype`` (float64 for exactness)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from mlbench.optim.base import OptimizerContext, flat_params
    from mlbench.optim.catalog import build_optimizer
    from mlbench.timing import PhaseTimer

    torch.manual_seed(settings.seed)   # as every worker seeds it: the same stream on every rank
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    stream = torch.get_rng_state()     # the task's stream from here on: the optimizer leaves it alone
    x, y = _data(settings.steps * settings.workers * settings.batch, settings.seed)
    if dtype is not None:   # the same fp32 draws, widened
        model.to(dtype)
        x = x.to(dtype)
    ctx = OptimizerContext(model=model, hyper=bed_hyper(), world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options=job.options)
    optimizer = build_optimizer(job.name, ctx, job.record, Path(job.folder) if job.folder else None)
    out = _Trained(initial_loss=_loss(model, x, y))
    if measure:   # a barrier's own bytes, measured, then subtracted (DDP's start-up broadcast is before)
        dist.barrier()
        before = wire_bytes_sent()
        dist.barrier()
        start = wire_bytes_sent()
        out.memory.append(_memory_now())
    progress.mark("begin")
    for step in range(settings.steps):
        lo = (step * world + rank) * batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(optimizer.module(x[lo:lo + batch]), y[lo:lo + batch])
        loss.backward()
        optimizer.step(LR)
        out.losses.append(float(loss.detach()))
        progress.mark(step + 1)
        if measure:
            now = wire_bytes_sent()
            out.wire.append(None if now is None or start is None else now - start)
            out.memory.append(_memory_now())
    progress.mark("done")
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
    out.eval_loss = _loss(model, x, y)
    if restore is not None:
        restore()
    out.restored = _same_bits(flat_params(params), out.params)
    out.stream_kept = torch.equal(torch.get_rng_state(), stream)
    out.seed_now = int(torch.initial_seed())
    return out


def bed_hyper() -> Hyper:
    """Task 1a's momentum, Nesterov and weight decay (:data:`CHECKED`), with the bed's constant
    rate :data:`LR` as the schedule's peak: the same for the ranks and the one-process reference,
    so that an absolute rate (``--opt lr=``) means the same in both."""
    from mlbench.tasks.task1a import TASK1A

    return dataclasses.replace(task_hyper(TASK1A, 1), peak_lr=LR)


def _memory_now() -> tuple[int | None, int | None]:
    """The allocated bytes and the resident memory (reported beside them, not judged: see
    :func:`allocated_bytes`)."""
    from mlbench.worker.sysmetrics import current_rss_bytes

    return allocated_bytes(), current_rss_bytes()


def _loss(model: Any, x: Any, y: Any) -> float:
    """The model's cross-entropy on all of the check's samples (the bare model: a wrapper such as
    DDP would communicate in its forward pass)."""
    import torch

    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


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
            _same_model(subject, settings, ranks), _restore(ranks), _communication(settings, ranks),
            _progress(settings, ranks), _memory(settings, ranks), _random_stream(settings, ranks),
            _determinism(ranks), _finite(ranks, got.get(REFERENCE))]


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
    worst = max(range(k), key=lambda r: _max_diff(ranks[r].exact, reference.params))
    diff = _max_diff(ranks[worst].exact, reference.params)
    close = all(torch.allclose(t.exact, reference.params, rtol=EXACT_RTOL, atol=EXACT_ATOL) for t in ranks)
    what = (f"{k} workers x batch {b} against 1 process x batch {k * b} after {settings.steps} steps in float64: "
            f"max |difference| {diff:.1e} (rank {worst}; tolerance {EXACT_ATOL:g} + {EXACT_RTOL:g} x |value|)")
    return CheckResult("exact", "PASS" if close else "FAIL", what)


def _bytes(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    if any(t.measured is None for t in ranks):
        return CheckResult("bytes", "SKIP", "this system does not report the bytes a TCP socket sent "
                                            "(Linux 4.19 or later does)")
    measured = [t.measured or 0 for t in ranks]
    reported = [t.reported for t in ranks]
    headers = BYTES_PER_STEP_AND_PEER * settings.steps * (settings.workers - 1)

    def excess(r: int) -> float:   # how far rank r is off, in units of its tolerance
        return abs(measured[r] - reported[r]) / (BYTES_RELATIVE * max(measured[r], reported[r]) + headers)

    worst = max(range(len(ranks)), key=excess)
    change = (f"{(reported[worst] - measured[worst]) / measured[worst]:+.1%}" if measured[worst] else "n/a")
    tolerance = (f"tolerance per rank {BYTES_RELATIVE:.0%} + {BYTES_PER_STEP_AND_PEER // 1024} KiB per step "
                 "and peer for gloo's headers")
    what = (f"reported {sum(reported):,} B, sent on the wire {sum(measured):,} B by all {len(ranks)} ranks in "
            f"{settings.steps} steps; each rank against its own sockets, the farthest rank {worst}: reported "
            f"{reported[worst]:,} B, sent {measured[worst]:,} B ({change}; {tolerance})")
    return CheckResult("bytes", "PASS" if excess(worst) <= 1 else "FAIL", what)


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
    if not all(_same_bits(t.eval_params, ranks[0].eval_params) for t in ranks):
        return CheckResult("consensus", "FAIL", f"{what}; but the ranks evaluate different models "
                                                "(state_for_eval must give every rank the same, e.g. "
                                                "mlbench.optim.base.ConsensusEvaluation)")
    if not math.isfinite(distance):
        return CheckResult("consensus", "FAIL", what)
    return CheckResult("consensus", "PASS", f"{what}; every rank evaluates the same model")


def _restore(ranks: list[_Trained]) -> CheckResult:
    changed = [r for r, t in enumerate(ranks) if not t.restored]
    if changed:
        return CheckResult("restore", "FAIL", f"after evaluation rank {changed[0]} does not hold its own parameters "
                                              "again (state_for_eval changed them, and what it returned did not "
                                              "give them back bit for bit)")
    return CheckResult("restore", "PASS", "after evaluation every rank holds its own parameters again, bit for bit")


def _communication(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    k, n, every = settings.workers, settings.steps, settings.every
    if any(v is None for t in ranks for v in t.wire):
        return CheckResult("communication", "SKIP", "this system does not report the bytes a TCP socket sent "
                                                    "(Linux 4.19 or later does)")
    declared = settings.period is not None
    windows = [(lo, lo + every) for lo in range(0, n, every)] if declared else [(0, n)]

    def sent(lo: int, hi: int) -> int:   # by all ranks in steps lo+1..hi
        return sum((t.wire[hi - 1] or 0) - ((t.wire[lo - 1] or 0) if lo else 0) for t in ranks)

    totals = [sent(lo, hi) for lo, hi in windows]
    silent = [w for w, total in zip(windows, totals) if total <= 0]
    if silent:
        lo, hi = silent[0]
        steps = f"step {hi}" if hi - lo == 1 else f"steps {lo + 1}-{hi}"
        which = f" ({len(silent)} of its {len(windows)} periods silent)" if declared else ""
        return CheckResult("communication", "FAIL", f"no rank sent a byte on the wire in {steps}{which}: "
                                                    f"{k} workers that never synchronise train {k} separate models")
    if declared:
        return CheckResult("communication", "PASS",
                           f"the {k} ranks sent bytes on the wire in each of its {len(windows)} periods of {every} "
                           f"step{'s' if every > 1 else ''}: at least {min(totals):,} B in one")
    return CheckResult("communication", "PASS",
                       f"the {k} ranks sent {totals[0]:,} B on the wire in the {n} steps (the method declares no "
                       "period, OptimizerInfo.period, so the run is one)")


def _progress(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    def gain(r: int) -> float:
        t = ranks[r]
        return t.initial_loss - t.eval_loss if math.isfinite(t.eval_loss) else -math.inf

    worst = min(range(len(ranks)), key=gain)
    t = ranks[worst]
    samples = settings.steps * settings.workers * settings.batch
    what = (f"the evaluated model's loss on the check's {samples} samples: {t.initial_loss:.4f} initially, "
            f"{t.eval_loss:.4f} after {settings.steps} steps (rank {worst}, the least gain)")
    if gain(worst) > 0:
        return CheckResult("progress", "PASS", what)
    return CheckResult("progress", "FAIL", f"{what}: the model evaluation sees (state_for_eval) did not learn")


def _memory(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    window = settings.window

    def growth(t: _Trained, which: int) -> float | None:
        """Bytes per step from the warm-up's end to the last step. Each end is the least of the
        three steps up to it: a temporary alive at one step alone (a collective's buffer that
        gloo frees on its thread) is not growth, while a leak shifts all three alike."""
        values = [m[which] for m in t.memory]
        if len(values) != settings.steps + 1 or None in values:
            return None
        warm = settings.steps - window

        def settled(i: int) -> int:
            return min(v or 0 for v in values[max(0, i - 2):i + 1])
        return (settled(settings.steps) - settled(warm)) / window

    allocated = [growth(t, 0) for t in ranks]
    resident = [growth(t, 1) for t in ranks]
    # the resident size only for the record: how the heap reuses or returns freed pages moves it
    # by up to half a model per step either way, a leak's and a built-in's alike
    also = "" if None in resident else f"; resident: up to {max(g or 0.0 for g in resident) / 1024:+.1f} KiB per step"
    if None in allocated:
        return CheckResult("memory", "SKIP", f"this system does not say what a process allocated (glibc 2.33's "
                                             f"mallinfo2 does){also}")
    grew = [g or 0.0 for g in allocated]
    worst = max(range(len(ranks)), key=lambda r: grew[r])
    detail = (f"allocated memory grew by up to {grew[worst] / 1024:+.1f} KiB per step over steps "
              f"{settings.steps - window + 1}-{settings.steps}, after {settings.steps - window} steps of warm-up "
              f"(rank {worst}{also}; limit {MEMORY_PER_STEP / 1024:.0f} KiB per step, a quarter of the model's "
              f"{PARAMETERS * 4 / 1024:.0f} KiB)")
    return CheckResult("memory", "PASS" if grew[worst] <= MEMORY_PER_STEP else "FAIL", detail)


def _random_stream(settings: Settings, ranks: list[_Trained]) -> CheckResult:
    reseeded = [r for r, t in enumerate(ranks) if t.seed_now != settings.seed]
    drawn = [r for r, t in enumerate(ranks) if not t.stream_kept]
    same = "every rank seeds it with the run's seed, so its draws are the same on every rank"
    own = "draw from a torch.Generator of the optimizer's own, seeded with the rank where the ranks must differ"
    if reseeded:
        r = reseeded[0]
        return CheckResult("random-stream", "FAIL",
                           f"rank {r}'s torch default generator was seeded again (torch.initial_seed() is "
                           f"{ranks[r].seed_now}, not the run's {settings.seed}): its draws ignore the run's seed; "
                           f"{own}")
    if drawn:
        return CheckResult("random-stream", "FAIL",
                           f"the optimizer draws from torch's default generator on {len(drawn)} of "
                           f"{len(ranks)} ranks: {same}; {own}")
    return CheckResult("random-stream", "PASS", "torch's default generator is as the run's seed and the model's "
                                                "initialisation left it on every rank (the same stream on every "
                                                "rank, as the workers seed it): the optimizer draws none of it")


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
