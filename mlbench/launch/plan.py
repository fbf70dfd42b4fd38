"""From what the user asked for to a run record ready to launch.

Resolves the task spec with the user's overrides, decides the division (closed only when every
closed-division value is untouched, the reference optimizer is used and the data are real),
validates what can be validated before any process starts, and writes ``run.json``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlbench.errors import DataError, UsageError
from mlbench.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, PYTORCH, Framework, check_framework, get_framework
from mlbench.network.settings import NetworkSettings
from mlbench.optim.descriptors import REFERENCE_OPTIMIZER
from mlbench.results.division import stop_reasons
from mlbench.results.environment import cuda_available, cuda_device_count, describe_environment, usable_cores
from mlbench.results.faults import LINK_DOWN, SLOW, policy_text
from mlbench.results.store import RunRecord, RunStore
from mlbench.run_config import DEFAULT_WATCHDOG_S, Backend, DataSource, Device, Precision, RunConfig
from mlbench.tasks.classification import ClassificationSettings
from mlbench.tasks.models.plugins import ModelPlugin, is_builtin_model, resolve_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.registry import get_task
from mlbench.tasks.spec import AllreduceSpec, TaskSpec
from mlbench.tasks.task0a.sweep import with_max_size

if TYPE_CHECKING:
    from mlbench.tasks.data.identity import DataIdentity

BACKENDS = ("gloo", "nccl", "mpi")


@dataclass
class RunRequest:
    """Everything `mlbench run` accepts, independent of the terminal."""

    task: str
    workers: int
    overrides: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    data: DataSource = "real"
    data_dir: str | None = None
    light: bool = False
    stop_at_goal: bool = True
    time_budget_s: float | None = None
    max_steps: int | None = None
    seed: int = 0
    backend: Backend | None = None
    device: Device | None = None
    optimizer: str | None = None      # None: the task's reference (closed division)
    optimizer_options: dict[str, str] = field(default_factory=dict)
    log_every: int = 50
    timing: bool = True
    save_model: bool = False
    precision: Precision = "fp32"
    channels_last: bool = False
    graph: bool = True
    name: str | None = None
    group_id: str | None = None
    max_size: float | None = None     # task0a: the largest message, in elements
    network: NetworkSettings | None = None  # an emulated network (mlbench.network); None: as is
    data_pvc: str | None = None       # clusters: a PersistentVolumeClaim holding the data set
    watchdog_s: float | None = DEFAULT_WATCHDOG_S  # mlbench.results.watchdog; None: off
    checkpoint_every_s: float | None = None   # --checkpoint-every DURATION
    checkpoint_every_steps: int | None = None  # --checkpoint-every Nsteps
    checkpoint_auto_mtbf_s: float | None = None  # --checkpoint-every auto[:MTBF] (0.0: the schedule's)
    checkpoint_dir: str | None = None          # --checkpoint-dir DIR
    framework: str = DEFAULT_FRAMEWORK  # mlbench.frameworks: which worker program trains
    faults: list[dict[str, Any]] = field(default_factory=list)  # --inject, parsed (mlbench.launch.faults)
    on_failure: str = "fail"                   # --on-failure fail|restart|shrink (mlbench.launch.faults)
    max_restarts: int = 0                      # --on-failure restart:N|shrink:N
    threads_per_worker: int | None = None      # None: one per worker on CPUs, a pod's or task's CPUs


_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*$")


#: The longest time budget or timeout a run may be given: 30 days.
MAX_DURATION_S = 30 * 86400


#: The checkpoint interval ``--on-failure restart|shrink`` implies when --checkpoint-every is not given:
#: a restart goes back at most this much training (docs/faults.md).
DEFAULT_RESTART_CHECKPOINT_S = 60.0


#: The least --watchdog: heartbeats come once a second, so a shorter bound would blame the living.
MIN_WATCHDOG_S = 5.0


def parse_watchdog(text: str) -> float | None:
    """--watchdog: a duration of at least MIN_WATCHDOG_S, or 'off' (None)."""
    if text.strip().lower() == "off":
        return None
    seconds = parse_duration(text)
    if seconds < MIN_WATCHDOG_S:
        raise UsageError(f"--watchdog {text}: at least {MIN_WATCHDOG_S:.0f}s (the workers' heartbeats "
                         "come once a second), or off", option="watchdog")
    return seconds


_STEPS = re.compile(r"^\s*(\d+)\s*steps?\s*$")


def parse_checkpoint_auto(text: str) -> float | None:
    """``--checkpoint-every auto[:MTBF]``: the mean time between failures it names (0.0 for
    ``auto`` alone: the --inject schedule's), or None for any other value."""
    head, sep, mtbf = (text or "").strip().partition(":")
    if head != "auto":
        return None
    if not sep:
        return 0.0
    try:
        return parse_duration(mtbf)
    except UsageError:
        raise UsageError(f"--checkpoint-every {text!r}: auto:MTBF takes the mean time between failures as a "
                         "duration (auto:2h, auto:90s)", option="checkpoint_every") from None


def parse_checkpoint_every(text: str) -> tuple[float | None, int | None]:
    """--checkpoint-every: a duration ('2m', '90s': seconds, first item) or a step count
    ('500steps': steps, second item)."""
    match = _STEPS.match(text or "")
    if match:
        steps = int(match.group(1))
        if steps < 1:
            raise UsageError(f"--checkpoint-every {text}: at least 1 step", option="checkpoint_every")
        return None, steps
    try:
        return parse_duration(text), None
    except UsageError:
        raise UsageError(f"--checkpoint-every {text!r}: give a duration (2m, 90s) or a step count "
                         "(500steps)", option="checkpoint_every") from None


def _auto_mtbf(request: RunRequest) -> float:
    """The mean time between failures of ``--checkpoint-every auto[:MTBF]``: the one given, else
    the mean interval of the --inject schedules that fail a worker (kill, stall), combined as
    rates add; a UsageError when there is neither."""
    if request.checkpoint_auto_mtbf_s:
        return float(request.checkpoint_auto_mtbf_s)
    rates = []
    for spec in request.faults:
        if spec.get("kind") not in ("kill", "stall"):
            continue
        bounds = spec.get("every_range")
        mean = (float(bounds[0]) + float(bounds[1])) / 2 if bounds else spec.get("every")
        if mean:
            rates.append(1.0 / float(mean))
    if not rates:
        raise UsageError("--checkpoint-every auto needs the mean time between failures: give it (auto:2h), or "
                         "an --inject kill or stall schedule with every=", option="checkpoint_every")
    return 1.0 / sum(rates)


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m', '2h' -> seconds."""
    match = _DURATION.match(text or "")
    if not text or not text.strip() or not match or not any(match.groups()):
        raise UsageError(f"invalid duration {text!r}; use e.g. 90s, 10m, 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"invalid duration {text!r}: it must be longer than 0 seconds")
    if total > MAX_DURATION_S:
        raise UsageError(f"invalid duration {text!r}: at most {MAX_DURATION_S // 86400:.0f} days "
                         f"({MAX_DURATION_S // 3600:.0f}h)")
    return total


#: The largest seed: the run catalog keeps seeds as SQLite's 64-bit signed INTEGER.
MAX_SEED = 2**63 - 1


def check_seed(seed: int, repeat: int = 1) -> None:
    """Refuse a seed outside 0..MAX_SEED, or one whose ``repeat`` runs (seeds SEED..SEED+REPEAT-1)
    would go past it, before anything is recorded."""
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed {seed}: give a whole number from 0 to {MAX_SEED}", option="seed")
    if seed + repeat - 1 > MAX_SEED:
        raise UsageError(f"--seed {seed} with --repeat {repeat} uses seeds up to {seed + repeat - 1}; "
                         f"the largest seed is {MAX_SEED}", option="seed")


@dataclass
class WorkerResources:
    """What each worker gets when it runs elsewhere than this machine (a pod on a cluster).

    Its threads and GPUs, not this machine's, decide the device and the threads per worker;
    ``placement`` (image, namespace, pod sizes) is recorded in run.json.
    """

    threads: int
    gpus: int = 0
    placement: dict[str, Any] = field(default_factory=dict)
    # the workers run this machine's Python environment (a Slurm cluster sharing its file
    # system), so its PyTorch backends and a port's framework are checked here; False: the
    # worker image's (pods)
    local_torch: bool = False


def _device_and_backend(request: RunRequest,
                        resources: WorkerResources | None = None) -> tuple[Device, Backend]:
    has_gpu = cuda_available() if resources is None else resources.gpus > 0
    device = request.device or ("cuda" if has_gpu else "cpu")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: choose cpu or cuda", option="device")
    if device == "cuda" and not has_gpu:
        where = ("to PyTorch on this machine" if resources is None
                 else "on the cluster's nodes (nvidia.com/gpu)")
        raise UsageError(f"--device cuda: no CUDA GPU is visible {where}; use --device cpu", option="device")
    backend = request.backend or ("nccl" if device == "cuda" else "gloo")
    if backend == "nccl" and device == "cuda" and resources is None:
        backend = _gloo_when_gpus_are_shared(request, backend)
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}", option="backend")
    if backend == "nccl" and device != "cuda":
        raise UsageError("--backend nccl needs GPUs (--device cuda); use --backend gloo on CPUs", option="backend")
    if resources is not None and not resources.local_torch:  # the image's PyTorch runs the workers
        if backend == "mpi":
            raise UsageError("--backend mpi: the worker image's PyTorch has no MPI support; "
                             "use gloo or nccl", option="backend")
        return device, backend
    if backend == "gloo" and device == "cpu":
        return device, backend   # every PyTorch build for Linux, macOS and Windows has gloo
    import torch.distributed as dist
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                 "mpi": dist.is_mpi_available()}
    if not available[backend]:
        raise UsageError(f"--backend {backend}: this PyTorch build has no {backend} support", option="backend")
    return device, backend


def _gloo_when_gpus_are_shared(request: RunRequest, backend: Backend) -> Backend:
    """NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), and a run on this machine
    puts worker r on GPU r mod the GPUs seen. With more workers than GPUs, the default backend is
    gloo (its collectives stage CUDA tensors through host memory, as the original MLBench ran
    several workers per GPU); asked for by name, NCCL is a usage error before anything starts."""
    gpus = cuda_device_count()
    if request.workers <= gpus:
        return backend
    if request.backend == "nccl":
        raise UsageError(f"--backend nccl: {request.workers} workers on this machine's {gpus} GPU"
                         f"{'s' if gpus != 1 else ''}; NCCL needs a GPU per worker: use --backend gloo "
                         f"or at most {gpus} worker{'s' if gpus != 1 else ''}", option="backend")
    return "gloo"


def _override_text(value: Any) -> str:
    """A ``--set`` value as a user typed it (``0.9``, ``50,75``, ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_override_text(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def build_config(request: RunRequest, resources: WorkerResources | None = None,
                 model_plugin: ModelPlugin | None = None) -> tuple[RunConfig, list[str]]:
    """The worker configuration and the list of closed-division values the request changed
    (``model_plugin``: ``request.model`` as :func:`create_run` has already loaded it; else a
    model that is no built-in's name is loaded here)."""
    if request.workers < 1:
        raise UsageError(f"the number of workers must be at least 1, not {request.workers}", option="workers")
    check_seed(request.seed)
    if request.data not in ("real", "synthetic"):
        raise UsageError(f"--data {request.data}: choose real or synthetic", option="data")
    task = get_task(request.task)
    framework = check_framework(request.framework, task.name,
                                installed_here=resources is None or resources.local_torch)
    if "cuda" not in framework.supports and request.device is None:
        request = dataclasses.replace(request, device="cpu")  # the ports run on CPUs
    overrides = dict(request.overrides)
    if request.model:
        if not isinstance(task, TaskSpec) or "model" not in task.settings.override_keys():
            raise UsageError(f"--model chooses or replaces the model of task1a and task2a; change {task.name}'s "
                             "model with --set NAME=VALUE (see `mlbench tasks`)", option="model")
        if model_plugin is None and not is_builtin_model(request.model):
            model_plugin = resolve_model(request.model)
        if model_plugin is not None:
            overrides["model"] = model_plugin.label  # the run's spec names the plug-in and its source
        else:
            overrides["model"] = request.model.strip().lower()
    given = request.overrides.get("model")
    if not request.model and given is not None and isinstance(task, TaskSpec) \
            and "model" in task.settings.override_keys() and not is_builtin_model(str(given)):
        from mlbench.tasks.models import MODEL_NAMES

        raise UsageError(f"--set model={given}: unknown model; valid models are {', '.join(MODEL_NAMES)} "
                         "(a plug-in is given with --model FILE.py:NAME)", option="overrides")
    if "model" in overrides and isinstance(task, TaskSpec) and "model" in task.settings.override_keys() \
            and model_plugin is None \
            and (overrides["model"] == "logreg") != (task.settings.value_of("model") == "logreg"):
        raise UsageError(f"model {overrides['model']} does not fit {task.name}'s data set ({task.settings.dataset})",
                         option="model")
    spec, changed_keys = resolve(task, overrides)
    problem = spec.settings.check(request.workers) if isinstance(spec, TaskSpec) else None
    if problem:
        raise UsageError(f"{spec.name} on {request.workers} workers: {problem}", option="overrides")
    changed = [f"{key}={_override_text(overrides[key])}" for key in changed_keys]  # what made it open, in words
    if request.max_size is not None:
        spec, capped = with_max_size(spec, request.max_size)
        changed += capped
    reference = spec.optimizer if isinstance(spec, TaskSpec) else REFERENCE_OPTIMIZER
    if isinstance(spec, AllreduceSpec) and request.optimizer not in (None, reference):
        raise UsageError(f"{spec.name} measures the all-reduce itself and takes no --optimizer")
    optimizer = request.optimizer or reference
    if optimizer != reference:
        changed.append(f"optimizer={optimizer}")
    if request.data == "synthetic":
        changed.append("data=synthetic")
    if request.precision not in ("fp32", "bf16"):
        raise UsageError(f"--precision {request.precision}: choose fp32 or bf16", option="precision")
    if request.precision != "fp32":
        changed.append(f"precision={request.precision}")
    if request.data_dir is not None and request.data == "real":
        path = Path(request.data_dir).expanduser()
        if not path.is_dir():
            raise UsageError(f"--data-dir {request.data_dir}: no such folder", option="data_dir")
        data_dir: str | None = str(path.resolve())
    else:
        data_dir = None
    if request.max_steps is not None and request.max_steps < 1:
        raise UsageError("--max-steps must be at least 1", option="max_steps")
    if request.log_every < 1:
        raise UsageError("--log-every must be at least 1", option="log_every")
    _check_faults(request, spec)
    if request.checkpoint_auto_mtbf_s is not None:
        request = dataclasses.replace(request, checkpoint_auto_mtbf_s=_auto_mtbf(request))
    if request.on_failure in ("restart", "shrink") and request.checkpoint_every_s is None \
            and request.checkpoint_every_steps is None and request.checkpoint_auto_mtbf_s is None:
        request = dataclasses.replace(request, checkpoint_every_s=DEFAULT_RESTART_CHECKPOINT_S)
    checkpoints = (request.checkpoint_every_s is not None or request.checkpoint_every_steps is not None
                   or request.checkpoint_auto_mtbf_s is not None)
    if checkpoints and isinstance(spec, AllreduceSpec):
        raise UsageError(f"{spec.name} trains nothing and has no state to checkpoint: leave out --checkpoint-every")
    if request.checkpoint_dir is not None and not checkpoints:
        raise UsageError("--checkpoint-dir says where checkpoints go: add --checkpoint-every DURATION|Nsteps",
                         option="checkpoint_dir")
    checkpoint_dir = None
    if request.checkpoint_dir is not None:
        folder = Path(request.checkpoint_dir).expanduser()
        if not folder.is_dir():
            raise UsageError(f"--checkpoint-dir {request.checkpoint_dir}: no such folder", option="checkpoint_dir")
        checkpoint_dir = str(folder.resolve())
    device, backend = _device_and_backend(request, resources)
    threads = _threads_per_worker(request, resources)
    config = RunConfig(
        task=spec, workers=request.workers, backend=backend, device=device, data=request.data,
        data_dir=data_dir, light=request.light, stop_at_goal=request.stop_at_goal,
        time_budget_s=request.time_budget_s, max_steps=request.max_steps, seed=request.seed,
        log_every=request.log_every, timing=request.timing, threads_per_worker=threads,
        optimizer=optimizer, optimizer_options=dict(request.optimizer_options),
        model_plugin=model_plugin.record() if model_plugin is not None else None,
        save_model=request.save_model, precision=request.precision,
        channels_last=request.channels_last, graph=request.graph, watchdog_s=request.watchdog_s,
        checkpoint_every_s=request.checkpoint_every_s, checkpoint_every_steps=request.checkpoint_every_steps,
        checkpoint_auto_mtbf_s=request.checkpoint_auto_mtbf_s,
        checkpoint_dir=checkpoint_dir, framework=framework.name,
        faults=[dict(f) for f in request.faults], on_failure=request.on_failure, max_restarts=request.max_restarts)
    _check_port_options(config, request, framework)
    return config, changed + stop_reasons(config)


def _threads_per_worker(request: RunRequest, resources: WorkerResources | None) -> int:
    """The threads each worker trains with: ``--threads-per-worker``, else a pod's or Slurm
    task's CPUs, else one. One by default whatever the worker count, so that every worker of a
    scaling study has the same resources (the original's one worker per node): a 1-worker run
    given all the cores beside 2-worker runs of one thread each measured the threads, not the
    workers (a 32x "speedup")."""
    threads = request.threads_per_worker
    if threads is None:
        return resources.threads if resources is not None else 1
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UsageError(f"--threads-per-worker {threads!r}: give a whole number of at least 1",
                         option="threads_per_worker")
    cores = usable_cores()
    if resources is None and threads > cores:
        raise UsageError(f"--threads-per-worker {threads}: this machine has {cores} usable cores",
                         option="threads_per_worker")
    return threads


def _check_faults(request: RunRequest, spec: Any) -> None:
    """--inject and --on-failure against the run (before anything is recorded): each fault's
    rank is one of its workers; a restart resumes training from checkpoints and a straggler
    slows training steps, so neither fits the all-reduce benchmark."""
    for fault in request.faults:
        if not 0 <= fault["rank"] < request.workers:
            raise UsageError(f"--inject {fault['text']}: rank {fault['rank']} is not a worker of a "
                             f"{request.workers}-worker run (ranks 0 to {request.workers - 1})", option="inject")
    down = next((f for f in request.faults if f["kind"] == LINK_DOWN), None)
    if down is not None and request.network is None:
        raise UsageError(f"--inject {down['text']}: a link-down takes down the worker's emulated link: "
                         "add --bandwidth/--latency (docs/network.md)", option="inject")
    if (request.faults or request.on_failure != "fail") and request.backend == "mpi":
        raise UsageError("--inject and --on-failure act on one process per worker; --backend mpi starts "
                         "one mpirun: use gloo", option="inject")
    if isinstance(spec, AllreduceSpec):
        if request.on_failure in ("restart", "shrink"):
            raise UsageError(f"--on-failure {request.on_failure}: {spec.name} trains nothing to go on with "
                             "from a checkpoint", option="on_failure")
        if any(f["kind"] == SLOW for f in request.faults):
            raise UsageError(f"--inject slow: {spec.name} has no training steps to slow; use kill or stall",
                             option="inject")
    if request.on_failure == "shrink":
        _check_shrink(request, spec)


def _check_shrink(request: RunRequest, spec: Any) -> None:
    """``--on-failure shrink``: the survivors go on at a smaller size, which needs another
    worker to go on with, and a task whose data order and learning rate are stated for any
    size (the classification tasks: docs/faults.md)."""
    text = policy_text(request.on_failure, request.max_restarts)
    if request.workers < 2:
        raise UsageError(f"--on-failure {text}: a 1-worker run has no survivors to shrink to; use restart",
                         option="on_failure")
    if request.max_restarts > request.workers - 1:
        raise UsageError(f"--on-failure {text}: a {request.workers}-worker run shrinks at most "
                         f"{request.workers - 1} times (to one worker)", option="on_failure")
    if isinstance(spec, TaskSpec) and not isinstance(spec.settings, ClassificationSettings):
        raise UsageError(f"--on-failure {text}: {spec.name} keeps per-rank data state (its shards' "
                         "positions); shrink is offered for the classification tasks (1a, 2a); use restart",
                         option="on_failure")


def _features_used(config: RunConfig, request: RunRequest) -> dict[str, str]:
    """The run features (:data:`mlbench.frameworks.FEATURES`) the run asks for, in their order,
    each with the option as the run gave it."""
    asked = {
        "optimizers": (config.optimizer != getattr(config.task, "optimizer", config.optimizer)
                       or bool(request.optimizer_options), "--optimizer/--opt"),
        "model-plugins": (config.model_plugin is not None, "--model"),
        "cuda": (config.device != "cpu", "--device cuda"),
        "time-budget": (config.time_budget_s is not None, "--time-budget"),
        "bf16": (config.precision != "fp32", "--precision"),
        "save-model": (config.save_model, "--save-model"),
        "channels-last": (config.channels_last, "--channels-last"),
        "backends": (config.backend != "gloo", f"--backend {config.backend}"),
        "network": (request.network is not None, "an emulated network"),
        "faults": (bool(config.faults), "--inject"),
        "recovery": (config.on_failure != "fail", f"--on-failure {config.on_failure}"),
        "checkpoints": (config.checkpoints, "--checkpoint-every"),
    }
    return {name: given for name, (used, given) in asked.items() if used}


def _check_port_options(config: RunConfig, request: RunRequest, framework: Framework) -> None:
    """The first run feature the framework's record does not support (a port trains the closed
    division's algorithm on CPUs): one line naming its option, before anything is recorded."""
    for feature, given in _features_used(config, request).items():
        if feature not in framework.supports:
            raise UsageError(framework.refusal(feature, given), option="framework")


def prepare_data(config: RunConfig) -> DataIdentity | None:
    """Download / convert / validate the data set once, here, before any worker starts, and say
    what it is (:mod:`mlbench.tasks.data.identity`: recorded in run.json as ``data``; data other
    than the official data set make the run open division); None for synthetic data.

    A missing or corrupt data set, or one too small for a step of the run's settings
    (``TrainingSettings.check_data``), is then one error line before a run is even recorded, the
    download happens once rather than in every worker, and epsilon's one-time conversion to the
    binary cache is done before the workers, which then load it in seconds.
    """
    if config.data != "real" or not isinstance(config.task, TaskSpec):
        return None
    from mlbench.launch.forked import import_torch

    import_torch()   # first, so that the local supervisor may still fork its ranks after reading the data
    from mlbench.tasks.datasets import get_dataset  # torch: not for synthetic data

    from mlbench.tasks.data.identity import data_identity

    prepared = get_dataset(config.task.settings.dataset).prepare(config.data_dir)
    problem = config.task.settings.check_data(prepared, config.workers)
    if problem:
        raise DataError(f"{config.task.name}: {problem}")
    return data_identity(config.task.settings.dataset, config.data_dir)


@dataclass(frozen=True)
class LauncherAbilities:
    """What a launcher does with a run beyond starting PyTorch workers: each launcher declares
    it (:attr:`mlbench.launch.base.Launcher.abilities`) and :func:`create_run` checks a request
    against it before anything is recorded, so that no other code asks a launcher's name.
    ``frameworks``: whose workers it starts; ``peer_addresses``: whether it can give every
    worker an address of its own (a framework with ``peers``, TensorFlow, needs that for more
    than one worker); ``fault_kinds``: the ``--inject`` kinds it applies; ``policies``: the
    ``--on-failure`` policies it carries out; ``checkpoint_dir``: where its workers keep
    checkpoints when not in the run folder, a path the same for them and for its supervisor (a
    cluster's volume; ``--checkpoint-dir`` is then refused: :func:`create_run` sets it)."""

    frameworks: tuple[str, ...] = (PYTORCH.name,)
    peer_addresses: bool = False
    fault_kinds: tuple[str, ...] = ()
    policies: tuple[str, ...] = ("fail",)
    checkpoint_dir: str | None = None

    def check(self, config: RunConfig, label: str) -> None:
        """One UsageError line for what ``config`` asks that ``label`` runs cannot do."""
        framework = get_framework(config.framework)
        if framework.name not in self.frameworks:
            titles = ", ".join(FRAMEWORKS[name].title for name in self.frameworks)
            raise UsageError(f"--framework {framework.name}: {label} runs start {titles} workers only so far; "
                             "run on this machine", option="framework")
        if framework.peers and config.workers > 1 and not self.peer_addresses:
            raise UsageError(f"--framework {framework.name} on {config.workers} workers: every {framework.title} "
                             f"worker listens on an address of its own, which {label} runs cannot yet give each "
                             "worker before it starts; run one worker, another framework, or on this machine",
                             option="framework")
        for fault in config.faults:
            if fault["kind"] not in self.fault_kinds:
                offered = f"they apply {', '.join(self.fault_kinds)}" if self.fault_kinds else "they apply none"
                raise UsageError(f"--inject {fault['text']}: {label} runs cannot inject a {fault['kind']} "
                                 f"({offered}); run on this machine", option="inject")
        if config.on_failure not in self.policies:
            raise UsageError(f"--on-failure {config.on_failure}: {label} runs carry out "
                             f"{' or '.join(self.policies)} only; run on this machine", option="on_failure")
        if self.checkpoint_dir and config.checkpoint_dir not in (None, self.checkpoint_dir):
            raise UsageError(f"--checkpoint-dir {config.checkpoint_dir}: {label} runs keep their checkpoints "
                             "on the results service's volume; leave it out", option="checkpoint_dir")


def create_run(store: RunStore, request: RunRequest, launcher: str, *, nodes: int, on_this_machine: bool,
               abilities: LauncherAbilities, label: str, check_data: bool = True,
               resources: WorkerResources | None = None,
               network: dict[str, Any] | None = None, plugin_limit: int | None = None) -> RunRecord:
    """Validate the request (and, locally, the data) and record a new pending run of
    ``launcher``, which says the machines it occupies (``nodes``, whether ``on_this_machine``),
    what it can do (``abilities``, its runs named ``label`` in a refusal), how its emulated
    ``network`` is applied and the largest plug-in source it ships
    (``plugin_limit``; None: its workers share the run folder) (:class:`mlbench.launch.base.Launcher`,
    through which runs are created)."""
    from mlbench.optim.descriptors import check_optimizer, with_grad_hook
    from mlbench.optim.plugins import resolve_optimizer

    # a plug-in is read and checked here, before the run exists; the run keeps its source
    plugin = resolve_optimizer(request.optimizer) if request.optimizer else None
    model_plugin = resolve_model(request.model) if request.model else None
    files: dict[str, bytes] = {}
    for kind, given, loaded in (("optimizer", request.optimizer, plugin.loaded if plugin else None),
                                ("model", request.model, model_plugin.loaded if model_plugin else None)):
        if loaded is None:
            continue
        if plugin_limit is not None and loaded.bundle.size > plugin_limit:
            count = len(loaded.bundle.files)
            raise UsageError(f"{kind} plug-in {given}: its {'source is' if count == 1 else f'{count} files are'} "
                             f"{loaded.bundle.size:,} bytes; a {launcher} run ships it to the workers in at most "
                             f"{plugin_limit:,} bytes")
        for path, data in loaded.copies().items():
            if files.get(path, data) != data:
                raise UsageError(f"model plug-in {given}: its files and the optimizer plug-in's are both kept "
                                 f"as {path}; rename one", option="model")
            files[path] = data
    if plugin is not None:
        request = dataclasses.replace(request, optimizer=plugin.label)
    config, changed = build_config(request, resources, model_plugin)
    abilities.check(config, label)
    if config.checkpoints and abilities.checkpoint_dir:
        config.checkpoint_dir = abilities.checkpoint_dir
    if plugin is None:
        optimizer = check_optimizer(config.optimizer, request.optimizer_options, request.workers)
    else:
        optimizer = plugin.info
        options = optimizer.parse_options(request.optimizer_options, request.workers)
        config.optimizer_plugin = plugin.record(options)
    if config.on_failure == "shrink" \
            and not optimizer.claims_exact(optimizer.parse_options(request.optimizer_options, None)):
        raise UsageError(f"--on-failure shrink: optimizer {config.optimizer} keeps state that differs by rank "
                         "(error feedback, local models): survivors cannot go on without the lost rank's; "
                         "use restart, or an all-reduce optimizer such as centralized-sgd", option="on_failure")
    spec = config.task
    if isinstance(spec, TaskSpec) and spec.settings.needs_averaged_gradient and not optimizer.takes_grad_hook:
        # task 3a clips the averaged gradient between the all-reduce and the update
        usable = ", ".join(with_grad_hook())
        raise UsageError(f"optimizer {config.optimizer} cannot clip the averaged gradient that {spec.name} "
                         f"clips (it never holds it); use one of {usable}", option="optimizer")
    identity = prepare_data(config) if check_data else None
    if identity is not None and not identity.official:
        changed.append(f"data {identity.reason}")
    division = "open" if changed else "closed"
    run_json = {
        "task": request.task,
        "division": division,
        "changed": changed,
        "config": config.to_dict(),
        "environment": describe_environment(),
        "command": os.environ.get("MLBENCH_COMMAND_LINE"),
        "nodes": nodes,
        "on_this_machine": on_this_machine,
    }
    if identity is not None:
        run_json["data"] = identity.to_dict()
    if resources is not None:
        run_json["placement"] = resources.placement
    if network:
        run_json["network"] = network
    return store.create(task=request.task, workers=request.workers, division=division,
                        run_json=run_json, name=request.name, optimizer=config.optimizer,
                        launcher=launcher, seed=request.seed, group_id=request.group_id,
                        files=files or None)
