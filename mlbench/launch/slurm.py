"""Runs as Slurm jobs: what `mlbench run --slurm`, `status`, `cancel` and `delete` do there.

`create` records the run (launcher ``slurm``) and writes its batch script
(:mod:`mlbench.launch.slurm_script`) into the run folder; `start_detached` submits it with
``sbatch`` and keeps the job id in run.json; `run_attached` also follows the job to its end
(the launchers' one follow loop, :meth:`~mlbench.launch.base.Launcher.follow`). No mlbench
process needs to live while the job runs: `reconcile` asks Slurm about the job
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

from mlbench.errors import MlbenchError, UsageError
from mlbench.frameworks import FRAMEWORKS, PYTORCH, get_framework
from mlbench.launch import slurm_jobs as jobs
from mlbench.launch.base import EventCallback, Launcher, LauncherOption
from mlbench.launch.faults import FAIL, RESTART, SHRINK
from mlbench.launch.plan import LauncherAbilities, RunRequest, WorkerResources
from mlbench.launch.run_folder import log_path, log_tail, logs_dir, rank_error, read_outcome
from mlbench.launch.slurm_script import SCRIPT_NAME, SlurmOptions, render_script
from mlbench.results.faults import KILL, SLOW, STALL
from mlbench.results.goodput import FAULTS_SECTION
from mlbench.results.store import CANCELLED, FAILED, FINISHED, RunRecord
from mlbench.run_config import RunDocument
from mlbench.safefile import write_text

CANCEL_WAIT_SECONDS = 60.0
# srun's line for a task that ended badly, e.g. "srun: error: node1: task 1: Killed"
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d\-,]+): (.+)$")
_CONSEQUENCES = ("Terminated",)  # tasks that srun ended because another one failed


#: --sbatch-option lines that set the job's node count (sbatch: -N, --nodes=MIN[-MAX]).
_NODES_LINE = re.compile(r"^(?:-N\s*|--nodes[=\s]+)(\d+)(?:-(\d+))?$")


def job_id(run: RunRecord) -> str | None:
    """The Slurm job of ``run`` (None until it was submitted)."""
    document = RunDocument.load_or_none(run.run_dir)
    return (document.extra.get("slurm") or {}).get("job_id") if document else None


def _last_start(run: RunRecord) -> float | None:
    """When the workers last started anew: the latest resume or restart (inside the job) that
    run.json records; the errors of the workers before it are an earlier attempt's."""
    document = RunDocument.load_or_none(run.run_dir)
    if document is None:
        return None
    restarts = (document.extra.get(FAULTS_SECTION) or {}).get("restarts") or []
    moments = [float(entry["at"]) for entry in [*document.resumes, *restarts] if "at" in entry]
    return max(moments, default=None)


def _describe(job: str, state: jobs.JobState | None) -> str | None:
    if state is None or not state.active:
        return None
    if state.state in jobs.STARTING:
        return f"Slurm job {job} is {state.state.lower()}" + (f" ({state.reason})" if state.reason else "")
    return f"Slurm job {job} is {state.state.lower()}"


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
    detail = log_tail(logs_dir(run.run_dir) / f"slurm-{job}.out")
    text = f"Slurm job {job} {state.state}" + (f" ({state.reason})" if state.reason else "")
    if state.exit_code:
        text += f", exit code {state.exit_code}"
    return f"{text}: {detail}" if detail else text


def _srun_blame(run: RunRecord, job: str) -> str | None:
    """The task srun saw fail first (not one it ended because of that), with its own record."""
    try:
        lines = (logs_dir(run.run_dir) / f"slurm-{job}.out").read_text(errors="replace").splitlines()
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
        detail = rank_error(run.run_dir, rank) or log_tail(log_path(run.run_dir, rank))
        return f"worker {rank} {what}" + (f": {detail}" if detail else "")
    return None


_SLURM_OPTIONS = (
    LauncherOption("--partition", "partition", "Slurm partition of the job."),
    LauncherOption("--account", "account", "Slurm account charged for the job."),
    LauncherOption("--time", "time", "Slurm time limit of the job, e.g. 01:00:00."),
    LauncherOption("--gpus-per-task", "gpus_per_task", "GPUs per worker (Slurm job).", type=int),
    LauncherOption("--cpus-per-task", "cpus_per_task", "CPU cores, and threads, per worker (Slurm job) [1].",
                   type=int),
    LauncherOption("--constraint", "constraint", "Slurm node features the job needs, e.g. ib."),
    LauncherOption("--sbatch-option", "sbatch_options",
                   "A further #SBATCH line, e.g. --sbatch-option=--nodes=2 (repeatable).",
                   multiple=True, metavar="OPTION"),
    LauncherOption("--iface", "iface", "Network interface of the workers' traffic between nodes "
                                       "(Slurm job) [the one that reaches rank 0]."),
)


class SlurmLauncher(Launcher):
    """Runs as a Slurm batch job of one task per worker (``sbatch``), followed with squeue and
    scontrol; the run folder must be on a file system that the nodes share."""

    name = "slurm"
    label = "Slurm"
    choose_option = LauncherOption(
        "--slurm", "slurm", is_flag=True,
        help="Submit the run as a Slurm job (sbatch) and follow it; the run store (MLBENCH_HOME) "
             "must be on a file system the nodes share.")
    how_to_choose = "add --slurm"
    options = _SLURM_OPTIONS
    follow_seconds = 2.0
    resumable = True  # the batch script is submitted again; the run folder is on shared storage
    # the supervisor inside the job (launch/slurm_supervisor.py) injects, restarts and shrinks
    # (a new step with fewer tasks); link-down needs an emulated network, which Slurm runs do not
    # have; the tasks of a step derive each one's address from the step's variables
    # (worker/launcher_env.slurm_peers: TensorFlow's workers)
    abilities = LauncherAbilities(frameworks=tuple(FRAMEWORKS), peer_addresses=True,
                                  fault_kinds=(KILL, STALL, SLOW), policies=(FAIL, RESTART, SHRINK))
    unreachable_seconds = 120.0  # how long a follow waits for an unreachable controller

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._last_note: str | None = None

    def job_options(self) -> SlurmOptions:
        """The job's options from the values of this launcher's `mlbench run` options."""
        values = self.settings.options
        cpus = values.get("cpus_per_task")  # 0 is refused by validate(), not taken for "not given"
        return SlurmOptions(
            partition=values.get("partition"), account=values.get("account"), time=values.get("time"),
            gpus_per_task=values.get("gpus_per_task"), cpus_per_task=1 if cpus is None else cpus,
            constraint=values.get("constraint"), extra=list(values.get("sbatch_options") or ()),
            iface=values.get("iface")).validate()

    def check_options(self) -> None:
        self.job_options()

    def occupied_nodes(self, request: RunRequest, resources: WorkerResources | None) -> int:
        """The allocation's nodes: as many as ``--sbatch-option=--nodes=N`` asks (at most one per
        worker), else one per worker, the most Slurm may spread the tasks over; corrected to the
        allocation's own count once the job runs."""
        nodes = request.workers
        for line in self.job_options().extra:
            match = _NODES_LINE.match(line.strip())
            if match:
                nodes = int(match.group(2) or match.group(1))
        return max(1, min(nodes, request.workers))

    def create(self, request: RunRequest) -> RunRecord:
        """Validate the request for the cluster and record a pending run with its batch script."""
        options = self.job_options()
        jobs.require("sbatch")
        resources = WorkerResources(threads=options.cpus_per_task, gpus=options.gpus_per_task or 0,
                                    placement={"slurm": options.to_dict()}, local_torch=True)
        record = self.record(request, resources)
        try:
            config = RunDocument.load(record.run_dir).config
            framework = get_framework(config.framework)
            if framework is not PYTORCH and options.iface:
                raise UsageError(f"--iface: the {framework.title} worker picks its network itself; leave out --iface")
            script = render_script(record.id, record.name, record.run_dir, record.workers,
                                   config.backend, options, sys.executable, framework.worker,
                                   supervised=config.checkpoints or bool(config.faults) or config.on_failure != "fail")
        except MlbenchError:
            self.store.delete(record.id)
            raise
        write_text(record.run_dir / SCRIPT_NAME, script, mode=0o600)
        return record

    def start_detached(self, record: RunRecord) -> None:
        """Submit the run's batch script; the job id is kept in run.json (``slurm.job_id``)."""
        try:
            job = jobs.submit(record.run_dir / SCRIPT_NAME)
        except MlbenchError as err:
            self.store.mark_ended(record.id, FAILED, reason=f"the job could not be submitted: {err}")
            raise
        document = RunDocument.load(record.run_dir)
        document.extra["slurm"] = {"job_id": job, "script": SCRIPT_NAME, "submitted_at": time.time()}
        document.save(record.run_dir)

    def before_resume(self, record: RunRecord) -> None:
        """The ended job goes from run.json's ``slurm`` to its ``earlier_jobs``, so that the run, pending again, is
        not taken for that job's end before its new job is submitted."""
        super().before_resume(record)
        document = RunDocument.load(record.run_dir)
        ended = document.extra.pop("slurm", None)
        if ended:
            document.extra.setdefault("slurm_earlier_jobs", []).append(ended)
        document.save(record.run_dir)

    def where(self, record: RunRecord) -> str:
        return f"as Slurm job {job_id(record)}"

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        """Submit the job and follow it to its end (Ctrl-C cancels it)."""
        self.start_detached(record)
        self.settings.progress(f"Submitted Slurm job {job_id(record)} ({record.workers} task(s)); the batch "
                               f"script is {record.run_dir / SCRIPT_NAME}")
        try:
            return self.follow(self.store.get(record.id), on_event)
        except KeyboardInterrupt:
            return self.cancel(self.store.get(record.id))

    def refresh(self, record: RunRecord) -> RunRecord:
        """The run as Slurm says now, with a progress line when the job's state changes; raises
        MlbenchError while the controller cannot be asked."""
        job = job_id(record)
        record, state = self._reconcile(self.store.get(record.id))
        note = _describe(job, state) if job else None
        if note and note != self._last_note:
            self.settings.progress(note)
            self._last_note = note
        return record

    def cancel(self, record: RunRecord) -> RunRecord:
        """``scancel`` the job, wait until Slurm has ended it, and record how it ended."""
        job = job_id(record)
        if job is None:  # never submitted
            self.store.mark_ended(record.id, CANCELLED, reason="cancelled by the user before its job was submitted")
            return self.store.get(record.id)
        jobs.cancel(job)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        state = jobs.query(job)
        while state is not None and state.active and time.monotonic() < deadline:
            time.sleep(0.5)
            state = jobs.query(job)
        if state is None or state.active or state.state == "CANCELLED":
            self.store.mark_ended(record.id, CANCELLED, reason=f"cancelled by the user (scancel {job})")
            return self.store.get(record.id)
        return self._reconcile(self.store.get(record.id))[0]  # it ended some other way first

    def reconcile(self, record: RunRecord) -> RunRecord:
        """The run as Slurm and its workers' records say it is now; as last recorded when Slurm
        cannot be asked from here (no Slurm commands on this machine, the controller down)."""
        try:
            return self._reconcile(record)[0]
        except MlbenchError:
            return record

    def _reconcile(self, run: RunRecord) -> tuple[RunRecord, jobs.JobState | None]:
        store = self.store
        job = job_id(run) if run.active else None
        if job is None:
            return run, None
        state = jobs.query(job)
        if state is not None and state.active:
            if state.state not in jobs.STARTING:
                store.mark_started(run.id)
                self._record_allocation(run, state)
            return store.get(run.id), state
        outcome = read_outcome(run.run_dir, since=_last_start(run))
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

    @staticmethod
    def _record_allocation(run: RunRecord, state: jobs.JobState) -> None:
        """run.json's node count becomes the allocation's, once Slurm has made it."""
        if state.nodes is None:
            return
        document = RunDocument.load_or_none(run.run_dir)
        if document is not None and document.nodes != state.nodes:
            document.nodes = state.nodes
            document.save(run.run_dir)
