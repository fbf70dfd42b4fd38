"""A run's configuration: what the CLI asks for, the launcher records and the worker reads.

``run.json`` in a run's folder is the one document of a run: written when the run is created,
read by the launcher (which adds the rendezvous address), by every worker (locally from the
folder, in a pod from the ConfigMap that holds the same file) and by status, compare, charts,
download and the MLLOG export. It is read and written only through :class:`RunDocument`, so its
shape is defined here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlbench.jsonfile import read_json, write_json_atomic
from mlbench.tasks.records import spec_from_dict, spec_to_dict
from mlbench.tasks.spec import AnySpec, TaskSpec

Backend = Literal["gloo", "nccl", "mpi"]
Device = Literal["cpu", "cuda"]
DataSource = Literal["real", "synthetic"]
Precision = Literal["fp32", "bf16"]
Division = Literal["closed", "open"]

#: What a setting does to a run (:data:`CONFIG_ROLES`, and each `mlbench run` option's role in
#: :mod:`mlbench.launch.options`): it changes what the run computes (part of its fingerprint:
#: runs that differ in it are never repeats of each other), only how it is watched, is the seed
#: (the one thing repeats differ in), is the worker count (what a family's rows vary), says how
#: many runs are made, or is filled in while the run goes (the rendezvous, a resume's step).
Role = Literal["computes", "watches", "seed", "workers", "plans", "runtime"]
COMPUTES: Role = "computes"
WATCHES: Role = "watches"
SEED: Role = "seed"
WORKERS: Role = "workers"
PLANS: Role = "plans"
RUNTIME: Role = "runtime"

RUN_JSON = "run.json"
#: The watchdog's least bound by default (``mlbench run --watchdog``), seconds.
DEFAULT_WATCHDOG_S = 60.0


@dataclass
class RunConfig:
    """Everything a worker needs: the resolved task spec and how to run it."""

    task: AnySpec
    workers: int
    backend: Backend = "gloo"
    device: Device = "cpu"
    data: DataSource = "real"
    data_dir: str | None = None
    light: bool = False
    stop_at_goal: bool = True
    time_budget_s: float | None = None
    max_steps: int | None = None
    seed: int = 0
    log_every: int = 50
    timing: bool = True
    threads_per_worker: int = 1
    optimizer: str = "centralized-sgd"
    optimizer_options: dict[str, str] = field(default_factory=dict)
    #: A plug-in optimizer (mlbench.optim.plugins): its spec, class, the copy of its source in
    #: the run folder and that copy's SHA-256, its parsed options; None: a built-in.
    optimizer_plugin: dict[str, Any] | None = None
    #: A model plug-in (mlbench.tasks.models.plugins): its spec, callable, the copy of its source
    #: in the run folder and that copy's SHA-256; None: the task's model (by name) is built.
    model_plugin: dict[str, Any] | None = None
    save_model: bool = False
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    eval_batch_size: int = 1000
    precision: Precision = "fp32"       # bf16: autocast (open division)
    channels_last: bool = False
    graph: bool = True                  # capture the step in a CUDA graph where possible
    #: The watchdog's least bound in seconds (mlbench.results.watchdog); None: no watchdog.
    watchdog_s: float | None = DEFAULT_WATCHDOG_S
    #: Which framework trains (mlbench.frameworks): its worker program, recorded with the run.
    framework: str = "pytorch"
    #: ``--checkpoint-every``: a resumable checkpoint every so many seconds of the run or every
    #: so many steps (at most one of them); neither: checkpoints are not written.
    checkpoint_every_s: float | None = None
    checkpoint_every_steps: int | None = None
    #: ``--checkpoint-every auto[:MTBF]``: the mean time between failures Young/Daly's interval is
    #: made from, with each checkpoint's measured cost (:func:`mlbench.checkpoint_schedule.daly_interval`).
    checkpoint_auto_mtbf_s: float | None = None
    #: ``--checkpoint-dir``: the checkpoints go to DIR/RUN_ID instead of RUN_DIR/checkpoints.
    checkpoint_dir: str | None = None
    #: Set by `mlbench resume`: the step of the checkpoint the workers start from.
    resume_step: int | None = None
    #: ``--inject``: the fault schedules (dicts, :mod:`mlbench.results.faults`); empty: none.
    faults: list[dict[str, Any]] = field(default_factory=list)
    #: ``--on-failure``: ``fail``, ``restart`` (the group again from the newest complete
    #: checkpoint, at most ``max_restarts`` times) or ``shrink`` (the survivors from it, at most
    #: ``max_restarts`` times, 0: until one worker is left; ``workers`` is then the group's
    #: current size, the store's the size it started at).
    on_failure: str = "fail"
    max_restarts: int = 0

    @property
    def checkpoints(self) -> bool:
        """Whether the workers write resumable checkpoints."""
        return (self.checkpoint_every_s is not None or self.checkpoint_every_steps is not None
                or self.checkpoint_auto_mtbf_s is not None)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["task"] = spec_to_dict(self.task)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        data = dict(data)
        data["task"] = spec_from_dict(data["task"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def training_spec(self) -> TaskSpec:
        """The spec of a training task (what the trainer and its runtimes read)."""
        if not isinstance(self.task, TaskSpec):
            raise ValueError(f"{self.task.name} is not a training task")
        return self.task

    @property
    def goal(self) -> float | None:
        """The goal of the task's metric, or None for synthetic data (throughput only) and for
        the all-reduce benchmark."""
        if self.data == "synthetic":
            return None
        return self.task.goal(self.light)


#: The role of every field of :class:`RunConfig` (a test holds it to the fields): what
#: :mod:`mlbench.results.fingerprint` makes a run's fingerprint from. ``data_dir`` is where the
#: data lie, not what they are (the data's identity is run.json's ``data``).
CONFIG_ROLES: dict[str, Role] = {
    "task": COMPUTES, "workers": WORKERS, "backend": COMPUTES, "device": COMPUTES, "data": COMPUTES,
    "data_dir": WATCHES, "light": COMPUTES, "stop_at_goal": COMPUTES, "time_budget_s": COMPUTES,
    "max_steps": COMPUTES, "seed": SEED, "log_every": WATCHES, "timing": WATCHES,
    "threads_per_worker": COMPUTES, "optimizer": COMPUTES, "optimizer_options": COMPUTES,
    "optimizer_plugin": COMPUTES, "model_plugin": COMPUTES, "save_model": WATCHES, "master_addr": RUNTIME,
    "master_port": RUNTIME, "eval_batch_size": COMPUTES, "precision": COMPUTES, "channels_last": COMPUTES,
    "graph": COMPUTES, "watchdog_s": WATCHES, "framework": COMPUTES, "checkpoint_every_s": COMPUTES,
    "checkpoint_every_steps": COMPUTES, "checkpoint_auto_mtbf_s": COMPUTES, "checkpoint_dir": WATCHES,
    "resume_step": RUNTIME, "faults": COMPUTES,
    "on_failure": COMPUTES, "max_restarts": COMPUTES,
}


@dataclass
class RunDocument:
    """``run.json``: the run's identity, division, configuration and the machine it ran on.

    ``extra`` keeps the sections other parts of mlbench add (the network a run is shaped to, a
    cluster job's id, ...) so that reading and writing the document never drops them.
    """

    task: str
    config: RunConfig
    division: Division = "closed"
    changed: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    placement: dict[str, Any] | None = None
    #: The machines the run occupies and whether they are this one, as its launcher recorded
    #: them when the run was created (None: a run.json from before they were recorded).
    nodes: int | None = None
    on_this_machine: bool | None = None
    id: str | None = None
    name: str | None = None
    #: Every `mlbench resume` of the run: from which step, when, with which step cap.
    resumes: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id, "name": self.name, "task": self.task, "division": self.division,
            "changed": list(self.changed), "config": self.config.to_dict(),
            "environment": self.environment, "command": self.command,
        }
        if self.placement is not None:
            data["placement"] = self.placement
        if self.nodes is not None:
            data["nodes"] = self.nodes
        if self.on_this_machine is not None:
            data["on_this_machine"] = self.on_this_machine
        if self.resumes:
            data["resumes"] = [dict(r) for r in self.resumes]
        data.update(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunDocument:
        own = {"id", "name", "task", "division", "changed", "config", "environment", "command",
               "placement", "nodes", "on_this_machine", "resumes"}
        nodes, here = data.get("nodes"), data.get("on_this_machine")
        return cls(task=data["task"], config=RunConfig.from_dict(data["config"]),
                   division=data.get("division", "closed"), changed=list(data.get("changed") or []),
                   environment=dict(data.get("environment") or {}), command=data.get("command"),
                   placement=data.get("placement"),
                   nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else None,
                   on_this_machine=here if isinstance(here, bool) else None,
                   id=data.get("id"), name=data.get("name"),
                   resumes=[dict(r) for r in data.get("resumes") or [] if isinstance(r, dict)],
                   extra={k: v for k, v in data.items() if k not in own})

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> RunDocument:
        """The run.json of ``run_dir`` (OSError if missing, ValueError if not a run document)."""
        data = read_json(Path(run_dir) / RUN_JSON)
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{Path(run_dir) / RUN_JSON} is not a run document ({err})") from None

    @classmethod
    def load_or_none(cls, run_dir: str | os.PathLike) -> RunDocument | None:
        """The document, or None when it is missing or unreadable (a run deleted half-way)."""
        try:
            return cls.load(run_dir)
        except (OSError, ValueError):
            return None

    def save(self, run_dir: str | os.PathLike) -> None:
        """Write run.json atomically (a reader never sees half a document)."""
        write_json_atomic(Path(run_dir) / RUN_JSON, self.to_dict())


@dataclass(frozen=True)
class Occupancy:
    """The machines a run occupied (what a run costs, what its MLPerf platform says) and whether
    they were this one (a run here costs nothing unless a price is given)."""

    nodes: int
    on_this_machine: bool


def occupancy(run_dir: str | os.PathLike, launcher: str, workers: int) -> Occupancy:
    """What run.json records; for a run.json from before it did, the rule of that time: a run of
    the ``local`` launcher occupied this one machine, any other run one machine per worker."""
    document = RunDocument.load_or_none(run_dir)
    legacy_local = launcher == "local"
    nodes = document.nodes if document is not None and document.nodes is not None else None
    here = document.on_this_machine if document is not None else None
    return Occupancy(nodes if nodes is not None else (1 if legacy_local else max(1, workers)),
                     here if here is not None else legacy_local)
