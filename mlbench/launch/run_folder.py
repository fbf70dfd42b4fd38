"""A run's folder: where its files are, and how the run ended read from them alone.

Every launcher and the follow loop find a worker's events and log through the paths here. Under
Slurm or a launcher the user runs (torchrun, srun, mpirun), mlbench does not own the worker
processes; what they recorded in the run folder (rank 0's ``result`` event, any worker's
``error`` event, its log) is then the evidence of how the run went, beside what the scheduler
says about the job.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from mlbench.results.checkpoints import (
    Rejected,
    checkpoint_root,
    discard_incomplete_checkpoints,
    newest_valid,
    set_aside,
)
from mlbench.results.events import events_path, read_rank_events, read_run_events
from mlbench.results.faults import worker_sizes
from mlbench.results.goodput import FAULTS_SECTION
from mlbench.results.heartbeat import HEARTBEATS_DIR
from mlbench.results.store import FROZEN_SECTIONS
from mlbench.run_config import CONFIG_ROLES, RUNTIME, RunDocument

LOGS_DIR = "logs"
#: run.json's list of the checkpoints a resume or restart set aside: step, why, where it is kept.
REJECTED_CHECKPOINTS = "rejected_checkpoints"


def logs_dir(run_dir: Path) -> Path:
    """Where the run's logs are: its workers', its supervisor's, its network's, its job's."""
    return run_dir / LOGS_DIR


def log_path(run_dir: Path, rank: int) -> Path:
    """Where worker ``rank``'s output is kept: written there by a local worker, saved there by a
    cluster's supervisor when the worker's pod ends."""
    return logs_dir(run_dir) / f"rank-{rank}.log"


def ranks_with_output(run_dir: Path, workers: int) -> list[int]:
    """The ranks whose log in the run folder holds a byte (:func:`log_path`: a running pod's
    output is not there yet)."""
    ranks = []
    for rank in range(workers):
        try:
            if log_path(run_dir, rank).stat().st_size:
                ranks.append(rank)
        except OSError:
            pass
    return ranks


def back_to_newest_checkpoint(run_dir: Path, document: RunDocument, workers: int,
                              verified: tuple[int | None, list[Rejected]] | None = None) -> int | None:
    """Make the run's next start of ``workers`` go on from its newest valid checkpoint, and
    return its step (None: there is none, the next start begins at step 0). The one path of a
    resume (`mlbench resume`), a restart (``--on-failure``, local and in a Slurm job) and a
    requeued Slurm job. The checkpoints newer than it go: a worker killed while writing left its
    partial file there, in the way of that step's next write; a complete one that fails its
    manifest's check is set aside, said in one line on standard error and recorded in run.json's
    ``rejected_checkpoints``. ``document``'s ``resume_step`` names the step (the caller saves the
    document with what else it records). The last group's heartbeats go: the watchdog would take
    them for a stall of the new workers. Call it only while no worker of the run is alive (they
    are the only writers). ``verified``: :func:`~mlbench.results.checkpoints.newest_valid`'s
    answer when the caller has just read every file for it (a resume), not read again."""
    root = checkpoint_root(run_dir, document.config.checkpoint_dir)
    discard_incomplete_checkpoints(root, workers)
    newest, rejected = verified if verified is not None else newest_valid(root, workers)
    for checkpoint in rejected:   # newer than the newest valid one: out of the way of their steps' next writes
        kept = set_aside(root, checkpoint.step)
        line = checkpoint.line(kept)
        print(f"mlbench: {line}; going on from {f'step {newest}' if newest is not None else 'the start'}",
              file=sys.stderr, flush=True)
        document.extra.setdefault(REJECTED_CHECKPOINTS, []).append(
            {"step": checkpoint.step, "reason": checkpoint.reason, "folder": str(kept), "at": time.time()})
    document.config.resume_step = newest
    shutil.rmtree(run_dir / HEARTBEATS_DIR, ignore_errors=True)
    return newest


#: The fields of run.json's ``config`` that mlbench itself rewrites after the run is created,
#: left out when a resume compares run.json with the configuration frozen at creation: the
#: rendezvous address and port (each start's supervisor), the checkpoint a start goes on from
#: (:func:`back_to_newest_checkpoint`) and the step cap (`mlbench resume --max-steps`, which
#: may change it). ``workers`` is compared with the group's size after its last recorded shrink
#: (``faults.restarts``) instead. The sections other than :data:`FROZEN_SECTIONS` (the
#: launcher's job and corrected ``nodes``/``on_this_machine``, ``resumes``, ``faults``, the
#: environment, placement and network) are not frozen at all.
REWRITTEN_CONFIG = frozenset({*(name for name, role in CONFIG_ROLES.items() if role == RUNTIME), "max_steps"})
_ABSENT = object()


def changes_since_created(frozen: dict[str, Any], document: dict[str, Any]) -> list[str]:
    """What differs between run.json as it is now (``document``) and as it was created
    (``frozen``: the catalog's record, :meth:`~mlbench.results.store.RunStore.frozen`), one
    ``PATH OLD -> NEW`` per value (``config.task.settings.batch_per_worker 100 -> 50``), in the
    document's order; empty when the run is as it was recorded. Both sides are read through
    :class:`RunDocument` first, so a field that a later mlbench adds with its default, or a key
    it does not know, is no change; ``100`` and ``100.0`` are."""
    old, new = _comparable(frozen), _comparable(document)
    created = old.get("config", {}).get("workers") if isinstance(old.get("config"), dict) else None
    if isinstance(created, int):
        faults = document.get(FAULTS_SECTION)
        restarts = faults.get("restarts") if isinstance(faults, dict) else None
        old["config"]["workers"] = worker_sizes(created, restarts if isinstance(restarts, list) else [])[-1]
    return _differences("", old, new)


def _comparable(document: dict[str, Any]) -> dict[str, Any]:
    """The frozen sections of ``document`` as this mlbench reads and writes them, without the
    fields mlbench rewrites (:data:`REWRITTEN_CONFIG`)."""
    sections = {key: document[key] for key in FROZEN_SECTIONS if key in document}
    try:
        normal = RunDocument.from_dict(sections).to_dict()
        sections = {key: normal[key] for key in FROZEN_SECTIONS if key in normal}
    except (KeyError, TypeError, ValueError, AttributeError):
        pass   # a record this mlbench cannot read as a run: compared as it stands
    sections = json.loads(json.dumps(sections, default=str))
    if isinstance(sections.get("config"), dict):
        for name in REWRITTEN_CONFIG:
            sections["config"].pop(name, None)
    return sections


def _differences(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [*old, *(key for key in new if key not in old)]
        return [change for key in keys
                for change in _differences(f"{path}.{key}" if path else key, old.get(key, _ABSENT),
                                           new.get(key, _ABSENT))]
    if old is not _ABSENT and new is not _ABSENT and _canonical(old) == _canonical(new):
        return []
    return [f"{path} {_shown(old)} -> {_shown(new)}"]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(none)"
    text = value if isinstance(value, str) and value else _canonical(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


class Outcome(NamedTuple):
    """What the workers recorded: rank 0's result, the first error, and whether they began."""

    result: dict[str, Any] | None
    error: str | None
    started_at: float | None


def rank_error(run_dir: Path, rank: int, since: float | None = None) -> str | None:
    """The last error a worker recorded (``since``: at or after that unix time, by the group
    started then: an earlier group's error is not this one's)."""
    errors = [e for e in read_rank_events(events_path(run_dir, rank)) if e["name"] == "error"
              and (since is None or float(e.get("time") or 0.0) >= since)]
    return str(errors[-1]["value"]) if errors else None


def permanent_failure(run_dir: Path, ranks: Iterable[int], codes: Mapping[int, int | None] | None = None) -> str | None:
    """Why the failure of ``ranks`` is one no restart can mend (:mod:`mlbench.worker.failures`),
    or None: the class a failed rank recorded right after its last error, else its exit code."""
    from mlbench.worker.failures import PERMANENT_EVENT, PERMANENT_EXIT

    for rank in ranks:
        events = read_rank_events(events_path(run_dir, rank))
        last = max((i for i, e in enumerate(events) if e["name"] == "error"), default=None)
        if last is not None and last + 1 < len(events) and events[last + 1]["name"] == PERMANENT_EVENT:
            return str(events[last + 1]["value"])
        if codes is not None and codes.get(rank) == PERMANENT_EXIT:
            return f"a failure worker {rank} found permanent (its exit code {PERMANENT_EXIT})"
    return None


def log_tail(path: Path) -> str | None:
    """The last non-empty line of a log file."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def read_outcome(run_dir: Path, since: float | None = None) -> Outcome:
    """The result of rank 0, the earliest worker error ("worker R: ..."), the first event's time;
    ``since``: errors recorded before it (by the workers of an attempt that was restarted or
    resumed since) are not this start's."""
    events = read_run_events(run_dir)
    results = [e for e in events if e["name"] == "result" and e.get("rank") == 0]
    errors = [e for e in events if e["name"] == "error" and (since is None or e["time"] >= since)]
    error = f"worker {errors[0]['rank']}: {errors[0]['value']}" if errors else None
    return Outcome(results[-1]["value"] if results else None, error,
                   events[0]["time"] if events else None)


def worker_hosts(run_dir: Path) -> set[str]:
    """The machines the run's workers reported (each worker's ``environment`` event)."""
    return {str(e["value"]["host"]) for e in read_run_events(run_dir)
            if e["name"] == "environment" and isinstance(e.get("value"), dict) and e["value"].get("host")}
