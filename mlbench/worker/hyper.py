"""The task's hyper-parameters as the optimizer layer takes them: numbers, no task.

The optimizers (:mod:`mlbench.optim`) know no task: the worker reads the task's settings and
hands them a :class:`~mlbench.optim.hyper.Hyper` (the SGD family's momentum, Nesterov and weight
decay; the peak of the rate rule at this worker count; the task's reference optimizer and, where
it is Adam or AdamW, the task's betas, eps and rate scale). ``mlbench check-optimizer``'s test bed
makes its own from task 1a's settings the same way.
"""

from __future__ import annotations

from mlbench.optim.hyper import Hyper
from mlbench.tasks.spec import TaskSpec


def task_hyper(spec: TaskSpec, workers: int) -> Hyper:
    """What the optimizers of a run of ``spec`` on ``workers`` workers read of the task."""
    settings = spec.settings
    values = settings.optimizer_values()
    betas = (values["beta1"], values["beta2"]) if "beta1" in values and "beta2" in values else None
    return Hyper(momentum=settings.momentum, nesterov=settings.nesterov, weight_decay=settings.weight_decay,
                 peak_lr=settings.peak_lr(workers), reference=spec.optimizer, betas=betas,
                 eps=values.get("eps"), lr_scale=values.get("lr_scale"))
