"""How a run ended, read from its folder alone: for workers that no mlbench process watches.

Under Slurm or a launcher the user runs (torchrun, srun, mpirun), mlbench does not own the
worker processes; what they recorded in the run folder (rank 0's ``result`` event, any worker's
``error`` event, its log) is then the evidence of how the run went, beside what the scheduler
says about the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from mlbench.results.events import read_rank_events, read_run_events


class Outcome(NamedTuple):
    """What the workers recorded: rank 0's result, the first error, and whether they began."""

    result: dict[str, Any] | None
    error: str | None
    started_at: float | None


def rank_error(run_dir: Path, rank: int) -> str | None:
    """The last error a worker recorded."""
    errors = [e for e in read_rank_events(run_dir / "events" / f"rank-{rank}.jsonl") if e["name"] == "error"]
    return str(errors[-1]["value"]) if errors else None


def log_tail(path: Path) -> str | None:
    """The last non-empty line of a log file."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def read_outcome(run_dir: Path) -> Outcome:
    """The result of rank 0, the earliest worker error ("worker R: ..."), the first event's time."""
    events = read_run_events(run_dir)
    results = [e for e in events if e["name"] == "result" and e.get("rank") == 0]
    errors = [e for e in events if e["name"] == "error"]
    error = f"worker {errors[0]['rank']}: {errors[0]['value']}" if errors else None
    return Outcome(results[-1]["value"] if results else None, error,
                   events[0]["time"] if events else None)
