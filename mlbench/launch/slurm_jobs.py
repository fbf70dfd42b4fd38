"""Talking to Slurm: submit, ask about, and cancel one job, through Slurm's own commands.

Slurm's Python bindings (pyslurm) follow each Slurm release separately and are not packaged for
the versions clusters run, so mlbench calls the commands every login node has, reading their
machine-readable output: ``sbatch --parsable`` (the job id), ``squeue --json`` (Slurm 21.08+;
``--noheader --format`` with a ``|`` separator where the JSON plugin is missing) and, once the
controller has forgotten a finished job (``MinJobAge``), ``sacct --parsable2`` when the cluster
keeps accounting. (Slurm's manuals: sbatch, squeue, sacct, scancel.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mlbench.errors import MlbenchError, UsageError

COMMAND_TIMEOUT = 60.0
# Slurm's job states (squeue manual, JOB STATE CODES) in which the job has not ended yet
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
          "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
STARTING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"}


@dataclass(frozen=True)
class JobState:
    """What Slurm says about a job: its state (e.g. RUNNING, TIMEOUT), why, and its exit code."""

    state: str
    reason: str | None = None
    exit_code: str | None = None  # "CODE:SIGNAL", as sacct writes it
    nodes: int | None = None      # the allocation's node count, where squeue says it

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise UsageError(f"--slurm: `{command}` is not on PATH; run mlbench on a machine of the "
                         "Slurm cluster (a login node), where Slurm's commands are installed")
    return path


def _run(args: list[str], umask: int = -1) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                              stdin=subprocess.DEVNULL, umask=umask)
    except FileNotFoundError:
        raise UsageError(f"--slurm: `{args[0]}` is not on PATH; run mlbench on a machine of the "
                         "Slurm cluster (a login node)") from None
    except subprocess.TimeoutExpired:
        raise MlbenchError(f"`{' '.join(args[:2])}` did not answer within {COMMAND_TIMEOUT:.0f}s; "
                           "is the Slurm controller reachable (`sinfo`)?") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def submit(script: Path, test_only: bool = False) -> str:
    """``sbatch --parsable SCRIPT``: the job id (``--test-only``: sbatch's verdict, nothing queued)."""
    args = [require("sbatch"), "--test-only" if test_only else "--parsable", str(script)]
    # Slurm creates the job's output file with the umask sbatch ran with (SLURM_UMASK): the
    # run's logs are its user's alone, as the rest of the run folder
    proc = _run(args, umask=0o077)
    if proc.returncode != 0:
        raise MlbenchError(f"sbatch refused the job: {_last_line(proc.stderr or proc.stdout)}")
    if test_only:
        return _last_line(proc.stderr + proc.stdout)
    return proc.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"


def cancel(job_id: str) -> None:
    proc = _run([require("scancel"), job_id])
    if proc.returncode != 0:
        raise MlbenchError(f"scancel {job_id} failed: {_last_line(proc.stderr)}")


def _json_state(job: dict) -> JobState:
    """One job of ``squeue --json`` (Slurm 22.05 writes strings; 23.02+ lists and objects)."""
    state = job.get("job_state")
    if isinstance(state, list):
        state = state[0] if state else "UNKNOWN"
    exit_code = job.get("exit_code")
    if isinstance(exit_code, dict):  # {"status": [...], "return_code": {"number": N}, "signal": {...}}
        code = exit_code.get("return_code")
        signal = (exit_code.get("signal") or {}).get("id")
        code = code.get("number") if isinstance(code, dict) else code
        exit_text = f"{code or 0}:{(signal.get('number') if isinstance(signal, dict) else signal) or 0}"
    elif isinstance(exit_code, int):  # a wait status: code in the high byte, signal in the low
        exit_text = f"{exit_code >> 8}:{exit_code & 0x7F}"
    else:
        exit_text = None
    reason = job.get("state_reason")
    nodes = job.get("node_count")
    if isinstance(nodes, dict):  # 23.02+: {"set": true, "infinite": false, "number": N}
        nodes = nodes.get("number") if nodes.get("set", True) else None
    return JobState(str(state), None if reason in (None, "None") else str(reason), exit_text,
                    nodes if isinstance(nodes, int) and nodes > 0 else None)


def query_squeue_json(job_id: str) -> JobState | str | None:
    """The job from ``squeue --json``; None when Slurm no longer knows it; the error text when
    this squeue cannot write JSON."""
    proc = _run([require("squeue"), "--json", "--jobs", job_id])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        return proc.stderr or "squeue --json failed"
    try:
        jobs = json.loads(proc.stdout).get("jobs", [])
    except ValueError:
        return "squeue --json wrote no JSON"
    for job in jobs:
        if str(job.get("job_id")) == job_id:
            return _json_state(job)
    return None


def query_squeue_text(job_id: str) -> JobState | None:
    """The job from ``squeue --format`` (every state; ``|``-separated); None when forgotten."""
    proc = _run([require("squeue"), "--noheader", "--states=all", "--jobs", job_id, "--format=%T|%D|%r"])
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise MlbenchError(f"squeue failed: {_last_line(proc.stderr)}")
    for line in proc.stdout.splitlines():
        state, _, rest = line.strip().partition("|")
        nodes, _, reason = rest.partition("|")
        if state:
            return JobState(state, None if reason in ("", "None") else reason, None,
                            int(nodes) if nodes.isdigit() and int(nodes) > 0 else None)
    return None


def query_sacct(job_id: str) -> JobState | None:
    """The job from Slurm's accounting; None when the cluster keeps none (or not this job)."""
    if shutil.which("sacct") is None:
        return None
    proc = _run(["sacct", "--jobs", job_id, "--allocations", "--noheader", "--parsable2",
                 "--format=State,ExitCode,Reason"])
    if proc.returncode != 0:  # "Slurm accounting storage is disabled", among others
        return None
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|")
        if fields and fields[0]:
            reason = fields[2] if len(fields) > 2 and fields[2] not in ("", "None") else None
            # "CANCELLED by 1000": the state is the first word
            return JobState(fields[0].split()[0], reason, fields[1] if len(fields) > 1 else None)
    return None


def query(job_id: str) -> JobState | None:
    """What Slurm knows about the job now; None when it has forgotten it and keeps no accounting."""
    found = query_squeue_json(job_id)
    if isinstance(found, str):  # no JSON support in this Slurm
        found = query_squeue_text(job_id)
    return found if found is not None else query_sacct(job_id)
