"""Runs as Slurm jobs: what `mlbench run --slurm`, `status`, `cancel` and `delete` do there.

`create_run` records the run (launcher ``slurm``) and writes its batch script
(:mod:`mlbench.launch.slurm_script`) into the run folder; `start_detached` submits it with
``sbatch`` and keeps the job id in run.json; `run_attached` also follows the job to its end,
feeding the usual progress callback from rank 0's event file as the local launcher does. No
mlbench process needs to live while the job runs: `reconcile` asks Slurm about the job
(:mod:`mlbench.launch.slurm_jobs`) and, once it has ended, maps Slurm's end state to mlbench's
with the reason, taking the workers' own record (rank 0's result, a worker's error) as evidence:

==================  ===========================================================
COMPLETED           finished with rank 0's result (failed if a worker recorded an error)
CANCELLED           cancelled
FAILED              failed: the worker srun saw fail first, with its error
TIMEOUT             failed: the job reached its time limit
NODE_FAIL           failed: a node of the job failed
OUT_OF_MEMORY       failed: a task ran out of memory
other ends          failed, with Slurm's state and reason
==================  ===========================================================
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any
from collections.abc import Callable

from mlbench.errors import MlbenchError, UsageError
from mlbench.launch import slurm_jobs as jobs
from mlbench.launch.base import EventCallback, Launcher
from mlbench.launch.plan import RunRequest, WorkerResources
from mlbench.launch.plan import create_run as plan_run
from mlbench.launch.run_folder import log_tail, rank_error, read_outcome
from mlbench.launch.slurm_script import SCRIPT_NAME, SlurmOptions, render_script
from mlbench.results.events import EventTail
from mlbench.results.store import CANCELLED, FAILED, FINISHED, RunRecord, RunStore
from mlbench.run_config import RunDocument

LAUNCHER = "slurm"
FOLLOW_SECONDS = 2.0
CANCEL_WAIT_SECONDS = 60.0
UNREACHABLE_SECONDS = 120.0  # how long a following CLI waits for an unreachable controller
Progress = Callable[[str], None]
# srun's line for a task that ended badly, e.g. "srun: error: node1: task 1: Killed"
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d\-,]+): (.+)$")
_CONSEQUENCES = ("Terminated",)  # tasks that srun ended because another one failed


def create_run(store: RunStore, request: RunRequest, options: SlurmOptions) -> RunRecord:
    """Validate the request for the cluster and record a pending run with its batch script."""
    options.validate()
    jobs.require("sbatch")
    resources = WorkerResources(threads=options.cpus_per_task, gpus=options.gpus_per_task or 0,
                                placement={"slurm": options.to_dict()}, local_torch=True)
    record = plan_run(store, request, launcher=LAUNCHER, resources=resources)
    try:
        config = RunDocument.load(record.run_dir).config
        script = render_script(record.id, record.name, record.run_dir, record.workers,
                               config.backend, options, sys.executable)
    except MlbenchError:
        store.delete(record.id)
        raise
    (record.run_dir / SCRIPT_NAME).write_text(script, encoding="utf-8")
    return record


def job_id(run: RunRecord) -> str | None:
    document = RunDocument.load_or_none(run.run_dir)
    return (document.extra.get("slurm") or {}).get("job_id") if document else None


def start_detached(store: RunStore, run: RunRecord) -> str:
    """Submit the run's batch script; the job id is kept in run.json (``slurm.job_id``)."""
    try:
        job = jobs.submit(run.run_dir / SCRIPT_NAME)
    except MlbenchError as err:
        store.mark_ended(run.id, FAILED, reason=f"the job could not be submitted: {err}")
        raise
    document = RunDocument.load(run.run_dir)
    document.extra["slurm"] = {"job_id": job, "script": SCRIPT_NAME, "submitted_at": time.time()}
    document.save(run.run_dir)
    return job


def run_attached(store: RunStore, run: RunRecord, on_event: Callable[[dict[str, Any]], None] | None = None,
                 progress: Progress | None = None) -> RunRecord:
    """Submit the job and follow it to its end (Ctrl-C cancels it)."""
    job = start_detached(store, run)
    say = progress or _quiet
    say(f"Submitted Slurm job {job} ({run.workers} task(s)); the batch script is {run.run_dir / SCRIPT_NAME}")
    tail = EventTail(run.run_dir / "events" / "rank-0.jsonl")
    last_note, misses = None, 0
    try:
        while True:
            try:
                record, state = _reconcile(store, store.get(run.id))
                misses = 0
            except MlbenchError:  # the controller blipped (a restart); the job goes on meanwhile
                misses += 1
                if misses * FOLLOW_SECONDS > UNREACHABLE_SECONDS:
                    raise
                record, state = store.get(run.id), None
            note = _describe(job, state)
            if note and note != last_note:
                say(note)
                last_note = note
            if on_event is not None:
                for event in tail.read_new():
                    on_event(event)
            if not record.active:
                return record
            time.sleep(FOLLOW_SECONDS)
    except KeyboardInterrupt:
        return cancel(store, store.get(run.id))


def _quiet(_: str) -> None:
    """No progress lines."""


def _describe(job: str, state: jobs.JobState | None) -> str | None:
    if state is None or not state.active:
        return None
    if state.state in jobs.STARTING:
        return f"Slurm job {job} is {state.state.lower()}" + (f" ({state.reason})" if state.reason else "")
    return f"Slurm job {job} is {state.state.lower()}"


def cancel(store: RunStore, run: RunRecord) -> RunRecord:
    """``scancel`` the job, wait until Slurm has ended it, and record how it ended."""
    job = job_id(run)
    if job is None:  # never submitted
        store.mark_ended(run.id, CANCELLED, reason="cancelled by the user before its job was submitted")
        return store.get(run.id)
    jobs.cancel(job)
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    state = jobs.query(job)
    while state is not None and state.active and time.monotonic() < deadline:
        time.sleep(0.5)
        state = jobs.query(job)
    if state is None or state.active or state.state == "CANCELLED":
        store.mark_ended(run.id, CANCELLED, reason=f"cancelled by the user (scancel {job})")
        return store.get(run.id)
    return _reconcile(store, store.get(run.id))[0]  # it ended some other way first


def reconcile(store: RunStore, run: RunRecord) -> RunRecord:
    """The run as Slurm and its workers' records say it is now; as last recorded when Slurm
    cannot be asked from here (no Slurm commands on this machine, the controller down)."""
    try:
        return _reconcile(store, run)[0]
    except MlbenchError:
        return run


def _reconcile(store: RunStore, run: RunRecord) -> tuple[RunRecord, jobs.JobState | None]:
    job = job_id(run) if run.active else None
    if job is None:
        return run, None
    state = jobs.query(job)
    if state is not None and state.active:
        if state.state not in jobs.STARTING:
            store.mark_started(run.id)
        return store.get(run.id), state
    outcome = read_outcome(run.run_dir)
    if state is None:  # forgotten by the controller, and no accounting to ask
        if outcome.result is not None and outcome.error is None:
            store.mark_ended(run.id, FINISHED, result=outcome.result)
        else:
            store.mark_ended(run.id, FAILED, reason=outcome.error or
                             f"Slurm job {job} ended and Slurm no longer knows how (no accounting); "
                             "its workers recorded no result")
    elif state.state == "COMPLETED" and outcome.result is not None and outcome.error is None:
        store.mark_ended(run.id, FINISHED, result=outcome.result)
    elif state.state == "CANCELLED":
        store.mark_ended(run.id, CANCELLED, reason=f"Slurm job {job} was cancelled (scancel)")
    else:
        store.mark_ended(run.id, FAILED, reason=failure_reason(run, job, state, outcome.error))
    return store.get(run.id), state


def failure_reason(run: RunRecord, job: str, state: jobs.JobState, first_error: str | None) -> str:
    """Why the job failed, in the words of the local launcher where the evidence allows."""
    document = RunDocument.load_or_none(run.run_dir)
    limit = ((document.placement or {}).get("slurm") or {}).get("time") if document else None
    if state.state == "TIMEOUT":
        return f"timed out: Slurm ended job {job} at its time limit" + (f" (--time {limit})" if limit else "")
    if state.state == "NODE_FAIL":
        return f"node failure: a node of Slurm job {job} failed" + (f" ({state.reason})" if state.reason else "")
    if state.state == "OUT_OF_MEMORY":
        return f"out of memory: a task of Slurm job {job} exceeded its memory"
    blamed = _srun_blame(run, job)
    if blamed:
        return blamed
    if first_error:
        return first_error
    if state.state == "COMPLETED":
        return f"Slurm job {job} completed but its workers recorded no result"
    detail = log_tail(run.run_dir / "logs" / f"slurm-{job}.out")
    text = f"Slurm job {job} {state.state}" + (f" ({state.reason})" if state.reason else "")
    if state.exit_code:
        text += f", exit code {state.exit_code}"
    return f"{text}: {detail}" if detail else text


def _srun_blame(run: RunRecord, job: str) -> str | None:
    """The task srun saw fail first (not one it ended because of that), with its own record."""
    try:
        lines = (run.run_dir / "logs" / f"slurm-{job}.out").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        match = _SRUN_TASK.search(line.strip())
        if not match or match.group(3).strip() in _CONSEQUENCES:
            continue
        rank = int(re.split(r"[-,]", match.group(2))[0])
        what = match.group(3).strip()  # "Killed", "Exited with exit code 1", ...
        what = "was killed" if what == "Killed" else re.sub(r"^exited with exit code", "exited with code",
                                                             what[0].lower() + what[1:])
        detail = rank_error(run.run_dir, rank) or log_tail(run.run_dir / "logs" / f"rank-{rank}.log")
        return f"worker {rank} {what}" + (f": {detail}" if detail else "")
    return None


class SlurmLauncher(Launcher):
    """Runs as a Slurm batch job of one task per worker (``sbatch``), followed with squeue and
    scontrol; the run folder must be on a file system that the nodes share."""

    name = LAUNCHER

    def __init__(self, store: RunStore, options: SlurmOptions | None = None, progress: Progress | None = None):
        super().__init__(store)
        self.options = options
        self.progress = progress

    def create(self, request: RunRequest) -> RunRecord:
        if self.options is None:
            raise UsageError("a Slurm run needs the job's options (mlbench run ... --slurm)")
        return create_run(self.store, request, self.options)

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        return run_attached(self.store, record, on_event, self.progress)

    def start_detached(self, record: RunRecord) -> None:
        start_detached(self.store, record)

    def cancel(self, record: RunRecord) -> RunRecord:
        return cancel(self.store, record)

    def reconcile(self, record: RunRecord) -> RunRecord:
        return reconcile(self.store, record)
