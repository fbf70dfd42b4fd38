"""A run's division and why: closed only when it is the task's specification.

Closed division means the specification: the specified data set (run.json's ``data`` identity is
the official one), a worker count that never changed, the task's stop rule and every closed
value (run.json's ``changed`` lists what the run changed when it was created: ``--set`` values,
another optimizer or model, custom or synthetic data, a step cap, ``--no-stop``). A run that
shrank to fewer workers while it trained (``--on-failure shrink``) is open from then on. Every
surface says the division through :func:`run_division`, with its reasons:
``open: data 3,000 training rows, not epsilon's 400,000; momentum=0.9``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlbench.results.faults import worker_sizes, workers_label
from mlbench.results.store import RunRecord
from mlbench.run_config import RunConfig, RunDocument

#: How a reason about the stop rule begins (:func:`stop_reasons`).
STOP = "stop: "


@dataclass(frozen=True)
class Division:
    """``closed`` or ``open``, and what made it open (empty for a closed run)."""

    name: str
    reasons: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """``closed``, or ``open: REASON; REASON`` (``open`` for a run that recorded none)."""
        return f"open: {'; '.join(self.reasons)}" if self.reasons else self.name


def stop_reasons(config: RunConfig) -> list[str]:
    """What makes a run's stop rule other than its task's: the task stops at its goal (full or
    light) or at a time budget (accuracy after time); ``--no-stop`` and a step cap are other
    rules. Said of real data only (synthetic data are open already, and have no goal). Read
    from the config as it is now, so a `resume --max-steps` that changes the cap is said too."""
    if config.data != "real" or config.task.kind == "allreduce":
        return []
    reasons = []
    if not config.stop_at_goal:
        reasons.append(f"{STOP}--no-stop (trains on after the goal)")
    if config.max_steps is not None:
        reasons.append(f"{STOP}--max-steps {config.max_steps}")
    return reasons


def shrink_reason(workers: int, document: RunDocument) -> str | None:
    """``workers 2 -> 1 (shrank)`` for a run whose group shrank, else None."""
    faults = document.extra.get("faults")
    restarts = faults.get("restarts") if isinstance(faults, dict) else None
    sizes = worker_sizes(workers, restarts if isinstance(restarts, list) else [])
    return f"workers {workers_label(sizes)} (shrank)" if len(sizes) > 1 else None


def run_division(record: RunRecord, document: RunDocument | None = None) -> Division:
    """The run's division as it stands now (a shrink makes a closed run open)."""
    document = document if document is not None else RunDocument.load_or_none(record.run_dir)
    if document is None:
        return Division(record.division)
    reasons = [str(reason) for reason in document.changed if not str(reason).startswith(STOP)]
    reasons += stop_reasons(document.config)
    shrunk = shrink_reason(record.workers, document)
    if shrunk:
        reasons.append(shrunk)
    return Division("open" if reasons or record.division == "open" else "closed", tuple(reasons))
