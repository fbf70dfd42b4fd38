"""The supervisor inside a Slurm job: ``python -m mlbench.launch.slurm_supervisor RUN_DIR -- SRUN...``.

The batch script of a run that checkpoints, injects faults or restarts on failure
(:mod:`mlbench.launch.slurm_script`) hands over to this module on the batch node, the first node
of the allocation, where nothing of mlbench otherwise lives while the job runs. It does there
what the local supervisor (:mod:`mlbench.launch.supervisor`) does on one machine, with the same
code for the record (:mod:`mlbench.launch.injector`):

- a job that Slurm started again (``sbatch --requeue``, ``scontrol requeue``, a preemption;
  ``SLURM_RESTART_COUNT`` > 0) goes on from the newest complete checkpoint, recorded as a
  resume in run.json as `mlbench resume` records one;
- each attempt is one job step (``srun --kill-on-bad-exit``: one task failing ends the step);
  ``--inject kill|stall`` is applied to a task's process, found by the pid and host of its
  heartbeat (by pid on this node, through ``srun --overlap`` on another one), ``slow`` by the
  worker itself;
- a failed step is restarted from the newest checkpoint as a new step while
  ``--on-failure restart[:N]`` allows, recorded in run.json's ``faults`` as a local restart is,
  so that `status`, `compare` and goodput read a Slurm run as a local one; with
  ``--on-failure shrink[:N]`` the new step has one task fewer per rank to blame (``srun
  --ntasks``), the survivors renumbered in their order, as a local shrink's.

Who is blamed, for a shrink: the rank of the injected fault the failure is put down to; else
the ranks a failed task's watchdog named in its error event (the task srun names is the peer
whose watchdog exited, not the stalled one); else the tasks srun named as failed.

A stalled task is found by its peers' own watchdog (the workers of a Slurm step watch each
other), which ends the step. SIGTERM (scancel, a requeue) ends the step and this process
without a restart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mlbench.launch.recovery import Recovery
from mlbench.launch.run_folder import back_to_newest_checkpoint
from mlbench.launch.supervisor import free_ports
from mlbench.results.events import read_run_events
from mlbench.results.faults import FAULT_CLOCK_ENV
from mlbench.results.heartbeat import HEARTBEATS_DIR, read_beats
from mlbench.results.watchdog import blamed_ranks
from mlbench.run_config import RunDocument

POLL_SECONDS = 0.2
# srun's line for a task that ended badly, e.g. "srun: error: node1: task 1: Killed"
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d\-,]+): (.+)$")


class SlurmTask:
    """One task (rank) of the running step, as the injector sees a worker process: its pid and
    host from its heartbeat (pid 0 before its first beat: starting, not reachable yet)."""

    def __init__(self, run_dir: Path, rank: int, workers: int, step: subprocess.Popen):
        self.run_dir, self.rank, self.workers, self.step = run_dir, rank, workers, step

    def _beat(self) -> Any:
        return read_beats(self.run_dir, self.workers).get(self.rank)

    @property
    def pid(self) -> int:
        beat = self._beat()
        return beat.pid if beat is not None else 0

    def poll(self) -> int | None:
        """None while it runs (before its first heartbeat too, as long as its step runs: it is
        starting, and ``pid`` is 0 until it has beaten); its step's exit code once that ended."""
        if self.step.poll() is not None:
            return self.step.returncode
        beat = self._beat()
        if beat is None or not beat.pid:
            return None
        if beat.host == socket.gethostname():
            try:
                os.kill(beat.pid, 0)
            except ProcessLookupError:
                return 0
        return None

    def send(self, sig: int) -> None:
        beat = self._beat()
        if beat is None or not beat.pid:
            return
        if beat.host == socket.gethostname():
            try:
                os.kill(beat.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            return
        subprocess.run(["srun", f"--jobid={os.environ.get('SLURM_JOB_ID', '')}", "--overlap", f"--nodelist={beat.host}",
                        "--nodes=1", "--ntasks=1", "kill", "-s", str(int(sig)), str(beat.pid)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)


def _send(task: Any, sig: int) -> None:
    task.send(sig)


def resume_if_requeued(run_dir: Path, workers: int, env: dict[str, str]) -> int | None:
    """A job that Slurm started again goes on from the newest complete checkpoint, recorded in
    run.json as a resume; returns its step (None: a first start, or no checkpoint yet)."""
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    if not restarts.isdigit() or int(restarts) == 0:
        return None
    document = RunDocument.load(run_dir)
    newest = back_to_newest_checkpoint(run_dir, document, workers)
    document.resumes.append({"from_step": newest or 0, "at": time.time(), "max_steps": document.config.max_steps,
                             "after": "requeued",
                             "reason": f"Slurm started job {env.get('SLURM_JOB_ID')} again "
                                       f"(restart {restarts}: requeued or preempted)"})
    document.save(run_dir)
    return newest


def with_ntasks(command: list[str], tasks: int) -> list[str]:
    """The srun command with ``--ntasks=TASKS`` (the group's size now: smaller than the job's
    allocation after a shrink, in this job or in the one before a requeue)."""
    kept = [part for part in command if not part.startswith("--ntasks=")]
    at = kept.index("srun") + 1 if "srun" in kept else 0
    return [*kept[:at], f"--ntasks={tasks}", *kept[at:]]


def watchdog_verdict(run_dir: Path, since: float) -> tuple[list[int], str]:
    """The first verdict of a task's watchdog in an error event written since ``since`` (unix
    seconds: the step's start): the ranks it blamed, as its reason names them, and the reason;
    ([], "") without such an event."""
    for event in read_run_events(run_dir):
        if event["name"] == "error" and event["time"] >= since and isinstance(event["value"], str):
            blamed = blamed_ranks(event["value"])
            if blamed:
                return list(blamed), event["value"]
    return [], ""


class JobSupervisor:
    """Runs the job's steps one attempt after another (see the module's docstring); what a
    failed step leads to is the recovery's decision (:mod:`mlbench.launch.recovery`), as for
    every supervisor."""

    def __init__(self, run_dir: Path, command: list[str]):
        self.run_dir, self.command = run_dir, command
        self.recovery = Recovery(run_dir, _send)
        # The fault clock of a resumed or requeued job goes on from the seconds its last
        # supervisor recorded (else its latest fault's moment), as a local run's does: a schedule
        # strikes each of its moments once over the run, not again in every job.
        self.clock_start = self.recovery.start_clock()
        self.stopping = False
        self.step: subprocess.Popen | None = None

    @property
    def workers(self) -> int:
        """The group's size now (smaller than the job's allocation after a shrink)."""
        return self.recovery.workers

    def _terminate(self, signum: int, frame: Any) -> None:
        self.stopping = True
        if self.step is not None and self.step.poll() is None:
            self.step.send_signal(signal.SIGTERM)

    def run(self) -> int:
        """The job's steps until one succeeds, the policy gives up or Slurm stops the job; the
        seconds the fault clock ran are recorded in run.json whichever way it ends."""
        signal.signal(signal.SIGTERM, self._terminate)
        resume_if_requeued(self.run_dir, self.workers, dict(os.environ))
        try:
            return self._steps()
        finally:
            self.recovery.save_clock()

    def _steps(self) -> int:
        while True:
            started = time.time()
            code, failed = self._attempt()
            if code == 0 or self.stopping:
                return code
            hung, verdict = watchdog_verdict(self.run_dir, started)
            reason = f"Slurm step of {', '.join(f'task {r}' for r in failed) or 'the workers'} failed " \
                     f"(srun exit code {code}){f': {verdict}' if verdict else ''}"
            # who is blamed: the ranks a task's watchdog named (srun names the peer whose watchdog
            # exited, not the stalled task), else those srun named; the injected faults that
            # explain the failure come first (the recovery's rule)
            blamed = hung or failed
            if self.recovery.policy == "shrink" and not blamed and not self._open_faults():
                print(f"mlbench: {reason}; not shrunk (srun named no failed task to leave out)",
                      file=sys.stderr, flush=True)
                return code
            decision = self.recovery.failure(blamed, reason)
            if not decision.goes_on:
                what = "shrunk" if self.recovery.policy == "shrink" else "restarted"
                print(f"mlbench: {decision.reason}; not {what}{decision.given_up}", file=sys.stderr, flush=True)
                return code
            entry = self.recovery.group_ended()   # srun ended the step: no task of it is alive
            print(f"mlbench: {self.recovery.line(entry)}", file=sys.stderr, flush=True)
            while not self.recovery.may_start() and not self.stopping:   # the back-off
                self.recovery.tick([])
                time.sleep(POLL_SECONDS)
            if self.stopping:
                return code
            self.recovery.started()

    def _open_faults(self) -> bool:
        record = self.recovery.record
        return record is not None and record.culprit([]) is not None

    def _attempt(self) -> tuple[int, list[int]]:
        """One step: srun's exit code and the tasks srun named as failed first."""
        shutil.rmtree(self.run_dir / HEARTBEATS_DIR, ignore_errors=True)  # pids of this step's tasks only
        env = dict(os.environ, MASTER_PORT=str(free_ports("", 1)[0]), **{FAULT_CLOCK_ENV: repr(self.clock_start)})
        failed: list[int] = []
        step = self.step = subprocess.Popen(with_ntasks(self.command, self.workers), env=env, stdin=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True, errors="replace")
        reader = threading.Thread(target=self._read_errors, args=(step, failed), daemon=True)
        reader.start()
        tasks = [SlurmTask(self.run_dir, rank, self.workers, step) for rank in range(self.workers)]
        clock_saved = False
        while step.poll() is None:
            if self.stopping and not clock_saved:
                # Slurm SIGKILLs the job KillWait seconds after its SIGTERM (scancel, a requeue),
                # perhaps before the step's tasks have written their checkpoints and ended: the
                # clock is saved at the stop, not only when this process gets to its end
                self.recovery.save_clock()
                clock_saved = True
            if not self.stopping:
                self.recovery.tick(tasks)
            time.sleep(POLL_SECONDS)
        reader.join(timeout=10)
        return step.returncode, failed

    @staticmethod
    def _read_errors(step: subprocess.Popen, failed: list[int]) -> None:
        """srun's messages go on to the job's output; the tasks it names as failed (not those it
        ended because of them) are kept."""
        assert step.stderr is not None
        for line in step.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            match = _SRUN_TASK.search(line.strip())
            if match and match.group(3).strip() != "Terminated" and not failed:
                failed.extend(int(r) for r in re.split(r"[-,]", match.group(2)) if r.isdigit())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m mlbench.launch.slurm_supervisor RUN_DIR -- SRUN_COMMAND...", file=sys.stderr)
        return 2
    return JobSupervisor(Path(args[0]), args[2:]).run()


if __name__ == "__main__":
    sys.exit(main())
