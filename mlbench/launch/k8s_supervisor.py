"""The supervisor of runs on a cluster: the part of `mlbench serve` that watches worker pods.

It runs inside the cluster, next to the run store, so a run ends properly even when the laptop
that started it is closed: every few seconds it lists the pods of runs and, for each active run,
decides as the local launcher does: all workers succeeded -> finished (with rank 0's result);
one failed, was evicted or lost its node -> failed with that pod's reason; pods still waiting
after the run's schedule timeout (no capacity, an image that cannot be pulled) -> failed with
the scheduler's or the kubelet's reason, never a hang; pods that all run but one of which makes
no progress -> failed naming its rank, as the watchdog (:func:`mlbench.results.watchdog.judge`)
says from the heartbeats the workers post to the results service beside it (stored in the run's
folder; see :mod:`mlbench.results.heartbeat`). Whenever a run ends, for whatever reason,
each pod's log is saved into the run's folder, then its pods, headless Service and ConfigMap are
deleted; the results and the logs stay in the store.

It also applies a run's injected faults (``--inject``, :mod:`mlbench.launch.injector`) on the
fault clock that starts when the run's pods all run: ``kill`` deletes the rank's pod at once (no
grace period: a lost machine does not wait), ``slow`` is recorded as each window begins (the
worker slows itself, :mod:`mlbench.worker.straggler`). A run that fails is put down to the fault
that explains it, in its reason and its fault events, as a local run's supervisor does, so that
`status`, `compare` and goodput read a cluster run's faults as a local run's.

With ``--on-failure restart`` a run whose worker failed, stalled or lost its pod (a kill) is
not ended but restarted, as a local run is, by the recovery every supervisor shares
(:mod:`mlbench.launch.recovery`): the group's pods are deleted (a second's grace); once they are
gone (or in a final phase, their containers ended: their objects are then removed at once), the
run goes back to its newest complete checkpoint (kept on the service's volume, which its pods
mount: :data:`mlbench.launch.k8s_objects.CHECKPOINT_DIR`) and records the restart in its
run.json, the run's ConfigMap gets that run.json (the checkpoint to go on from), and once the
back-off is over the pods are created again from it (:func:`mlbench.launch.k8s_objects.worker_pods`,
as the CLI created them). With ``--on-failure shrink`` only the survivors get pods, ranked in
their order, from their renumbered checkpoint files; the group's size is run.json's from then on.
The restarts allowed are counted from run.json since the run's latest resume, so a supervisor
started again goes on counting.

Its service account may only list pods, read their logs, delete pods, services and configmaps,
create pods and read and patch configmaps (the last two for restarts; see
:func:`mlbench.launch.k8s_objects.role_rules`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlbench.errors import MlbenchError, RunNotFound
from mlbench.extras import needs
from mlbench.jsonfile import write_json_atomic
from mlbench.launch.injector import Process
from mlbench.launch.recovery import BACKING_OFF, ENDING, Recovery
from mlbench.launch.k8s_objects import (
    RANK_LABEL,
    RUN_LABEL,
    SCHEDULE_TIMEOUT_S,
    configmap_run_json,
    run_name,
    worker_pods,
)
from mlbench.results import watchdog
from mlbench.results.checkpoints import SUMMARY_FILE, checkpoint_root, complete_checkpoints
from mlbench.results.events import events_path, read_rank_events
from mlbench.results.heartbeat import read_beats
from mlbench.results.watchdog import Stall
from mlbench.run_config import RunDocument
from mlbench.safefile import open_append, write_text
from mlbench.results.store import (
    CANCELLED,
    FAILED,
    FINISHED,
    PENDING,
    RUNNING,
    SETTLED_FILE,
    RunRecord,
    RunStore,
)

POLL_SECONDS = 2.0
RESTART_GRACE_S = 1          # the ending group's pods: SIGTERM, then SIGKILL a second later
RESTART_END_TIMEOUT_S = 120  # a group whose pods do not go within this is not restarted: the run fails
LOG_LIMIT_BYTES = 64 << 20   # a pod's log kept in the run store: its first 64 MiB
LOG_TIMEOUT_S = 30
_WAITING_PROBLEMS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                     "CreateContainerError", "CrashLoopBackOff")


@dataclass
class PodState:
    """What the supervisor needs to know of one worker pod."""

    name: str
    rank: int
    phase: str                 # Pending, Running, Succeeded, Failed, Unknown
    created: float
    deleting: bool = False
    ended: float | None = None
    killed: bool = False       # by the system: evicted, OOM-killed, a signal
    problem: str | None = None  # why it failed, or why it is not running yet
    log: str | None = None      # the container's termination message (its last log lines)
    exit_code: int | None = None  # the worker's, once its container ended with one that is not 0


def _stamp(value: Any) -> float | None:
    return value.timestamp() if value is not None else None


def pod_state(pod: Any) -> PodState:
    """A :class:`PodState` from a kubernetes client ``V1Pod``."""
    status = pod.status
    problems, ended, log, killed, code = [], None, None, bool(status.reason), None
    if status.reason:
        problems.append(f"{status.reason}: {status.message}" if status.message else status.reason)
    for container in status.container_statuses or []:
        state = container.state
        if state and state.terminated and state.terminated.exit_code:
            term = state.terminated
            ended, log, code = _stamp(term.finished_at), term.message, term.exit_code
            killed = killed or term.exit_code >= 128 or term.reason == "OOMKilled"
            last = [line for line in (term.message or "").splitlines() if line.strip()][-1:]
            problems.append(f"exit code {term.exit_code} ({term.reason or 'Error'})"
                            + (f": {last[0].strip()[:300]}" if last else ""))
        elif state and state.waiting and state.waiting.reason in _WAITING_PROBLEMS:
            problems.append(f"{state.waiting.reason}: {state.waiting.message or ''}".rstrip(": "))
    for condition in status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            problems.append(f"{condition.reason or 'not scheduled'}: {condition.message or ''}".rstrip(": "))
    return PodState(name=pod.metadata.name, rank=int(pod.metadata.labels.get(RANK_LABEL, -1)),
                    phase=status.phase or "Pending", created=_stamp(pod.metadata.creation_timestamp) or 0.0,
                    deleting=pod.metadata.deletion_timestamp is not None, ended=ended, killed=killed,
                    problem="; ".join(problems) or None, log=log, exit_code=code)


class PodProcess:
    """A worker pod as the injector sees a worker process: reachable (``pid`` non-zero) once its
    container runs, so that a moment that falls due while it starts is struck when it runs; ended
    (``poll`` not None) once it is deleted, ended, or gone."""

    def __init__(self, pod: PodState | None):
        self.pod = pod

    @property
    def pid(self) -> int:
        return 1 if self.pod is not None and self.pod.phase == "Running" else 0

    def poll(self) -> int | None:
        if self.pod is None or self.pod.deleting or self.pod.phase not in ("Pending", "Running"):
            return 0 if self.pod is not None and self.pod.phase == "Succeeded" else 1
        return None


def _group_size(run: RunRecord, document: RunDocument | None) -> int:
    """The run's group size now: run.json's (smaller than the run's after a shrink)."""
    return document.config.workers if document is not None else run.workers


def _pending_since(run: RunRecord, document: RunDocument | None) -> float:
    """When the run last became pending: its creation, or its latest resume (run.json)."""
    resumes = document.resumes if document is not None else []
    return max([run.created_at, *(float(r["at"]) for r in resumes if isinstance(r.get("at"), (int, float)))])


@dataclass
class Verdict:
    """How an active run stands now: FAILED (with the reason and the pod to blame), FINISHED or RUNNING."""

    state: str
    reason: str | None = None
    pod: PodState | None = None
    rank: int | None = None     # the rank to blame when there is no pod to: its pod disappeared

    @property
    def blamed(self) -> list[int]:
        if self.pod is not None:
            return [self.pod.rank]
        return [self.rank] if self.rank is not None else []


#: the exit code of a worker that stopped on request (SIGTERM), with its peers when it writes checkpoints
STOPPED_EXIT_CODE = 143


def judge(run: RunRecord, pods: list[PodState], now: float, schedule_timeout: float,
          pending_since: float | None = None, workers: int | None = None) -> Verdict | None:
    """The new state of an active run from its pods, or None when nothing changed.
    ``pending_since``: when the run last became pending (its creation, or its latest `mlbench
    resume`), from which its pods have ``schedule_timeout`` to be created; ``workers``: the
    group's size now (run.json's, smaller than the run's after ``--on-failure shrink``).

    A worker whose pod is deleted gets SIGTERM; in a run that writes checkpoints it asks its
    peers to stop with it (they agree at their next clock check and exit 143 after a checkpoint).
    So workers that all stopped so, beside a pod deleted or gone, followed it: the deleted pod is
    to blame, not them (seen on the real node: a deleted worker's peer was named the failure)."""
    size = workers if workers is not None else run.workers
    failed = [p for p in pods if p.phase in ("Failed", "Unknown")]
    ranks = {p.rank for p in pods}
    gone = [p for p in pods if p.deleting and p.phase != "Succeeded"]
    vanished = run.state == RUNNING and bool(run.started_at) and len(ranks) < size
    if failed and (gone or vanished) and all(p.exit_code == STOPPED_EXIT_CODE for p in failed):
        failed = []
    if failed:
        # the first to end; on a tie (seconds), the one the system killed: its peers only lost it
        pod = min(failed, key=lambda p: (p.ended or now, not p.killed, p.rank))
        how = "failed" if pod.phase == "Failed" else "was lost with its node"
        reason = f"worker {pod.rank} (pod {pod.name}) {how}: {pod.problem or 'no reason given'}"
        return Verdict(FAILED, reason, pod)
    if gone:
        return Verdict(FAILED, f"worker {gone[0].rank} (pod {gone[0].name}) was deleted before the run "
                               "ended (evicted, preempted, or deleted by hand)", gone[0])
    if vanished:
        missing = min(set(range(size)) - ranks)
        return Verdict(FAILED, f"the pod of worker {missing} disappeared while the run trained", rank=missing)
    if len(pods) == size and all(p.phase == "Succeeded" for p in pods):
        return Verdict(FINISHED)
    waiting = [p for p in pods if p.phase == "Pending"]
    limit = f"{schedule_timeout / 60:.0f} minutes" if schedule_timeout >= 120 else f"{schedule_timeout:.0f}s"
    if waiting:
        pod = min(waiting, key=lambda p: (p.created, p.rank))
        if now - pod.created > schedule_timeout:
            return Verdict(FAILED, f"worker {pod.rank} (pod {pod.name}) did not start within {limit}: "
                                   f"{pod.problem or 'it was never scheduled'}", pod)
    elif not pods and now - (pending_since or run.created_at) > schedule_timeout:
        return Verdict(FAILED, f"no worker pods were created within {limit}")
    if run.state == PENDING and len(pods) == size and not waiting:
        return Verdict(RUNNING)
    return None


class PodSupervisor:
    """Polls the pods of runs in ``namespace`` and ends runs as :func:`judge` says."""

    def __init__(self, store: RunStore, core: Any, namespace: str, interval: float = POLL_SECONDS):
        self.store = store
        self.core = core
        self.namespace = namespace
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # heartbeats stored before this supervisor started say nothing of now (the service was
        # down, or restarted: the pods' heartbeats did not get through meanwhile)
        self.started = time.time()
        # by run id: each run's recovery (mlbench.launch.recovery: its faults, injector and
        # restarts), and when its newest group was started after a restart (the watchdog's clock)
        self._recoveries: dict[str, Recovery] = {}
        self._ending_since: dict[str, float] = {}
        self._restarted_at: dict[str, float] = {}
        self._summaries: dict[str, dict[str, Any]] = {}   # by run id: the checkpoints' summary last kept
        self._settled: set[str] = set()   # ended runs whose folder is marked final (SETTLED_FILE)

    @classmethod
    def in_cluster(cls, store: RunStore, namespace: str) -> PodSupervisor:
        """Kubernetes access from the pod's service account (or $KUBECONFIG outside a cluster)."""
        with needs("kubernetes"):
            from kubernetes import client, config

        try:
            if os.environ.get("KUBECONFIG"):
                config.load_kube_config()
            else:
                config.load_incluster_config()
        except config.ConfigException as err:
            raise MlbenchError(f"`mlbench serve --namespace {namespace}` needs Kubernetes access ({err}); "
                               "run it in a pod with its service account, or set KUBECONFIG") from None
        return cls(store, client.CoreV1Api(), namespace)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pod-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception as err:
                print(f"supervisor: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr)
            self._stop.wait(self.interval)

    def check_once(self) -> None:
        """One round: judge every active run on its pods; delete the pods of ended runs."""
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=RUN_LABEL).items
        by_run: dict[str, list[PodState]] = {}
        for pod in listed:
            by_run.setdefault(pod.metadata.labels[RUN_LABEL], []).append(pod_state(pod))
        now = time.time()
        runs = [r for r in self.store.list() if r.launcher == "kubernetes"]
        active = {r.id: r for r in runs if r.active}
        for run in active.values():
            pods = by_run.get(run.id, [])
            document = self._document(run)
            # resumed: its folder settles again when it ends (a mark left by an earlier end
            # goes whether or not this supervisor saw it: it may have started since)
            self._settled.discard(run.id)
            (run.run_dir / SETTLED_FILE).unlink(missing_ok=True)
            recovery = self._recoveries.get(run.id)
            if recovery is not None and recovery.state in (ENDING, BACKING_OFF):
                self._restart_when_gone(run, recovery, pods, now)
                continue
            self._summarize_checkpoints(run, document)
            verdict = judge(run, pods, now, self._schedule_timeout(document), _pending_since(run, document),
                            _group_size(run, document))
            if verdict is None:
                stall = self.watch(run, pods, now, document)
                if stall is not None:
                    self.failed(run, document, stall.ranks, stall.reason, now, pods)
                else:
                    self.inject(run, pods, document)
                continue
            if verdict.state == RUNNING:
                self.store.update(run.id, state=RUNNING, started_at=now)
                self.inject(self.store.get(run.id), pods, document)
            elif verdict.state == FINISHED:
                self._finish(run)
            else:
                self.failed(run, document, verdict.blamed, self._reason(run, verdict), now, pods)
        for run_id in set(by_run) - set(active):
            self.cleanup(run_id)
        self._settle(runs, by_run)
        for kept in (self._recoveries, self._ending_since, self._restarted_at, self._summaries):
            for run_id in set(kept) - set(active):
                del kept[run_id]

    def failed(self, run: RunRecord, document: RunDocument | None, ranks: Sequence[int], reason: str,
               now: float, pods: list[PodState]) -> None:
        """Workers ``ranks`` of a running run failed, stalled or lost their pods: what
        ``--on-failure`` does is the recovery's decision (:mod:`mlbench.launch.recovery`, the
        rule of every supervisor): restart the group (its pods deleted here, created again once
        they are gone and the back-off is over) or end the run failed, naming the injected
        faults it is put down to."""
        if document is None:
            self.end_run(run.id, FAILED, reason)
            return
        decision = self._recovery(run).failure(ranks, reason, now)
        if not decision.goes_on:
            self.end_run(run.id, FAILED, decision.reason + decision.given_up)
            return
        # the group ends; once its pods are gone (no worker writes a checkpoint any more) the
        # restart is recorded and the new group created: the next rounds (_restart_when_gone)
        self._ending_since[run.id] = now
        self._keep_logs(run)
        for pod in pods:
            if not pod.deleting:
                self._delete(self.core.delete_namespaced_pod, pod.name, grace_period_seconds=RESTART_GRACE_S)

    def _restart_when_gone(self, run: RunRecord, recovery: Recovery, pods: list[PodState], now: float) -> None:
        """The pods of a group being restarted: once all are gone, go back to the newest complete
        checkpoint (:meth:`Recovery.group_ended`, as every supervisor does) and give the run's
        ConfigMap the run.json that names it; once the back-off is over, create the group's pods
        again. A fault due meanwhile is recorded as missed."""
        recovery.tick([])
        if recovery.state == BACKING_OFF:
            if recovery.may_start(now):
                self._start_group(run, recovery)
            return
        # a deleted pod in a final phase (its kubelet reports every container ended, for good:
        # restartPolicy Never) runs no worker any more, none that writes a checkpoint; but where
        # the kubelet had to kill its containers (a stopped or hung worker's group), its object
        # stayed for rounds of the kubelet's own after that, until it had reclaimed the pod
        # (14 s idle, about a minute on the loaded node, before the new pods, which take the
        # same names, could be created). It is removed now, as `kubectl delete --force` would,
        # and the next round finds the group gone. A pod whose kubelet reports no final phase
        # (a lost node) is still waited for.
        for ended in pods:
            if ended.deleting and ended.phase in ("Succeeded", "Failed"):
                self._delete(self.core.delete_namespaced_pod, ended.name, grace_period_seconds=0)
        if pods:
            since = self._ending_since.get(run.id, now)
            if now - since > RESTART_END_TIMEOUT_S:
                assert recovery.decision is not None
                self.end_run(run.id, FAILED, f"{recovery.decision.reason}; not restarted: its pods "
                                             f"({', '.join(p.name for p in pods)}) did not end within "
                                             f"{RESTART_END_TIMEOUT_S:.0f}s")
            return
        self._ending_since.pop(run.id, None)
        entry = recovery.group_ended()
        document = RunDocument.load(run.run_dir)
        self.core.patch_namespaced_config_map(run_name(run.id), self.namespace,
                                              {"data": {"run.json": configmap_run_json(document.to_dict())}})
        print(f"supervisor: run {run.id}: {recovery.line(entry)}", file=sys.stderr, flush=True)
        if recovery.may_start():
            self._start_group(run, recovery)

    def _start_group(self, run: RunRecord, recovery: Recovery) -> None:
        """Create the pods of the run's next group from the run.json its ConfigMap holds."""
        document = RunDocument.load(run.run_dir)
        name = run_name(run.id)
        owner = self.core.api_client.sanitize_for_serialization(
            self.core.read_namespaced_config_map(name, self.namespace))
        for pod in worker_pods(run.id, document, owner):
            self.core.create_namespaced_pod(self.namespace, pod)
        recovery.started()
        self._restarted_at[run.id] = time.time()

    def _summarize_checkpoints(self, run: RunRecord, document: RunDocument | None) -> None:
        """Keep the summary of a checkpointing run's complete checkpoints in its run folder
        (:data:`~mlbench.results.checkpoints.SUMMARY_FILE`) when it changed: they are on this
        service's volume, which the CLI's copy of the run folder and its `status` cannot list."""
        if document is None or not document.config.checkpoints or not document.config.checkpoint_dir:
            return
        root = checkpoint_root(run.run_dir, document.config.checkpoint_dir)
        if not root.is_dir():
            return
        done = complete_checkpoints(root, _group_size(run, document)).to_dict()
        if self._summaries.get(run.id) != done:
            write_json_atomic(run.run_dir / SUMMARY_FILE, done)
            self._summaries[run.id] = done

    def _settle(self, runs: list[RunRecord], by_run: dict[str, list[PodState]]) -> None:
        """Mark the folder of each ended run whose pods are all gone as final
        (:data:`~mlbench.results.store.SETTLED_FILE`), after its checkpoints' last summary: a
        worker asked to stop (its pod deleted, the run cancelled) writes a last checkpoint and
        log lines after the run was marked ended, and the CLI's copy of the folder, whole only
        once the mark is there, must have them (seen on the loaded CI box: `status` said 'newest
        at step 80' of a run whose pods wrote 81)."""
        for run in runs:
            if run.active or run.id in by_run or run.id in self._settled:
                continue
            mark = run.run_dir / SETTLED_FILE
            if not mark.exists() and run.run_dir.is_dir():
                self._summarize_checkpoints(run, self._document(run))
                write_text(mark, f"{time.time():.3f}\n", mode=0o600)
            self._settled.add(run.id)

    def _recovery(self, run: RunRecord) -> Recovery:
        """The run's recovery (its faults, injector and restarts from run.json); one object per
        run, so no save undoes another's."""
        if run.id not in self._recoveries:
            self._recoveries[run.id] = Recovery(run.run_dir, send=self._kill_pod)
        return self._recoveries[run.id]

    def inject(self, run: RunRecord, pods: list[PodState], document: RunDocument | None) -> None:
        """Apply what of a running run's ``--inject`` schedules fell due, and see whether a
        restarted group is back. Its fault clock started when its pods all ran
        (``started_at``); a supervisor that starts again (the service's pod was replaced) goes
        on with it, past the moments its run.json says were struck."""
        if document is None or run.state != RUNNING or not run.started_at:
            return
        if not document.config.faults and run.id not in self._recoveries:
            return
        recovery = self._recovery(run)
        recovery.start_clock(run.started_at)
        by_rank = {p.rank: p for p in pods}
        procs: list[Process] = [PodProcess(by_rank.get(rank)) for rank in range(recovery.workers)]
        recovery.tick(procs)

    def _kill_pod(self, proc: Process, sig: int) -> None:
        """``kill`` on a cluster: the rank's pod is deleted at once, as a machine is lost (the
        planner refuses the faults a pod cannot be given: a stall)."""
        assert isinstance(proc, PodProcess) and proc.pod is not None
        self._delete(self.core.delete_namespaced_pod, proc.pod.name, grace_period_seconds=0)

    @staticmethod
    def _document(run: RunRecord) -> RunDocument | None:
        try:
            return RunDocument.load_or_none(run.run_dir)
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def _schedule_timeout(document: RunDocument | None) -> float:
        placement = (document.placement if document else None) or {}
        return float(placement.get("schedule_timeout_s") or SCHEDULE_TIMEOUT_S)

    def watch(self, run: RunRecord, pods: list[PodState], now: float,
              document: RunDocument | None) -> Stall | None:
        """The watchdog's verdict on a running run's heartbeats (None: no rank stalled, no
        watchdog, or the pods do not all run yet). Its clock starts when the pods all ran, or
        when this supervisor started, whichever is later; a pod that succeeded is done."""
        watchdog_s = document.config.watchdog_s if document is not None else None
        if run.state != RUNNING or not run.started_at or not watchdog_s:
            return None
        # a heartbeat of a worker of an earlier start says nothing of this one's: its pod is
        # deleted at once, its container stopped later by the kubelet, and it goes on posting
        # until then (seen in CI: a resumed run failed on its old rank 0's beat, 'stopped answering')
        group_start = max(_pending_since(run, document), self._restarted_at.get(run.id, 0.0))
        beats = {rank: beat if beat is not None and beat.time >= self.started and beat.started >= group_start
                 else None for rank, beat in read_beats(run.run_dir, _group_size(run, document)).items()}
        exited = {p.rank for p in pods if p.phase == "Succeeded"}
        since = max(run.started_at, self.started, self._restarted_at.get(run.id, 0.0))
        return watchdog.judge(beats, now, watchdog_s, since, exited)

    def _reason(self, run: RunRecord, verdict: Verdict) -> str:
        """Prefer the failed worker's own last error line (as a local run does) to its exit code."""
        pod = verdict.pod
        if pod is not None and pod.phase == "Failed":
            errors = [e for e in read_rank_events(events_path(run.run_dir, pod.rank))
                      if e["name"] == "error"]
            if errors:
                return f"worker {pod.rank} (pod {pod.name}) failed: {errors[-1]['value']}"
        return verdict.reason or "failed"

    def _keep_logs(self, run: RunRecord) -> None:
        """Each worker pod's log outlives the pod, as ``RUN_DIR/logs/rank-R.log`` (where a local
        worker writes its own; `mlbench logs` reads it). A log the API server cannot give (no
        kubelet behind it, a pod that never started) is replaced by the pod's termination
        message (its last lines), when it has one. A group restarted (``--on-failure restart``)
        adds its pods' logs after the earlier groups', as a local restart's workers append to
        their rank's log."""
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=f"{RUN_LABEL}={run.id}").items
        (run.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for pod in map(pod_state, listed):
            path = run.run_dir / "logs" / f"rank-{pod.rank}.log"
            try:
                text = self.core.read_namespaced_pod_log(pod.name, self.namespace, limit_bytes=LOG_LIMIT_BYTES,
                                                         _request_timeout=LOG_TIMEOUT_S)
            except Exception:
                if pod.log:
                    with open_append(path) as f:  # mode 600, as every log of a run
                        f.write(f"--- last lines of pod {pod.name} ({pod.problem}) ---\n{pod.log.rstrip()}\n"
                                .encode())
                continue
            if path.exists():   # an earlier group's
                with open_append(path) as f:
                    f.write(text.encode())
            else:
                write_text(path, text, mode=0o600, unique=True)

    def _finish(self, run: RunRecord) -> None:
        events = read_rank_events(events_path(run.run_dir, 0))
        results = [e for e in events if e["name"] == "result"]
        if results:
            self.end_run(run.id, FINISHED, None, result=results[-1]["value"])
        else:
            self.end_run(run.id, FAILED, "the workers exited without a result")

    def end_run(self, run_id: str, state: str, reason: str | None,
                result: dict[str, Any] | None = None) -> None:
        """Record how an active run ended (once), then delete its objects. The pods' logs are
        kept first: a mirror that sees the run ended copies its folder one last time."""
        with self._lock:
            try:
                run = self.store.get(run_id)
            except RunNotFound:
                run = None
            if run is not None and run.active:
                try:
                    self._summarize_checkpoints(run, self._document(run))   # the stop's checkpoint too
                    self._keep_logs(run)
                except Exception as err:
                    print(f"supervisor: logs of run {run_id} not kept: {type(err).__name__}: "
                          f"{str(err)[:300]}", file=sys.stderr)
                self.store.mark_ended(run_id, state, reason=reason, result=result)
        self.cleanup(run_id, at_once=state in (FAILED, CANCELLED))

    def cleanup(self, run_id: str, at_once: bool = False) -> None:
        """Delete a run's pods, headless Service and ConfigMap (what is already gone is fine).

        ``at_once``: the pods of a failed or cancelled run, whose logs are kept already, go
        without a grace period: a stopped or hung worker cannot answer SIGTERM, a cancelled one
        has nothing left to save (its run has ended), and waiting for either only keeps the
        node's resources (on a loaded node, past the 90 s within which the run's objects go; a
        kubelet still starting a cancelled run's containers took longer than that)."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{RUN_LABEL}={run_id}").items
        grace = {"grace_period_seconds": 0} if at_once else {}
        calls = [(self.core.delete_namespaced_pod, p.metadata.name, grace) for p in pods]
        calls += [(self.core.delete_namespaced_service, run_name(run_id), {}),
                  (self.core.delete_namespaced_config_map, run_name(run_id), {})]
        for delete, name, options in calls:
            self._delete(delete, name, **options)

    def _delete(self, delete: Any, name: str, **options: Any) -> None:
        """One object of the namespace deleted (``delete``: the client's call for its kind);
        one that is gone already is fine."""
        with needs("kubernetes"):
            from kubernetes.client.exceptions import ApiException
        try:  # the raw answer: some client versions fail to parse the Status that deletes return
            delete(name, self.namespace, _preload_content=False, **options)
        except ApiException as err:
            if err.status != 404:
                raise
