"""Everything a worker process needs to know, as written into ``run.json`` by the CLI.

The same document drives a worker on this machine and in a pod: the worker never looks at the
run catalog, only at its run folder (or, in a cluster, at the copy the launcher mounts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mlbench.tasks.spec import TaskSpec, spec_from_dict, spec_to_dict


@dataclass
class RunConfig:
    task: TaskSpec
    workers: int
    backend: str = "gloo"
    device: str = "cpu"
    data: str = "real"                  # "real" or "synthetic"
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
    save_model: bool = False
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    eval_batch_size: int = 1000
    precision: str = "fp32"             # "fp32" or "bf16" (autocast; open division)
    channels_last: bool = False
    graph: bool = True                  # capture the step in a CUDA graph where possible

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["task"] = spec_to_dict(self.task)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        data = dict(data)
        data["task"] = spec_from_dict(data["task"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def goal(self) -> float | None:
        """Target test accuracy, or None for synthetic data (throughput only)."""
        if self.data == "synthetic":
            return None
        return self.task.goal(self.light)
