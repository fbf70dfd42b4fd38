"""The results service's HTTP API over a run store (JSON in and out).

Two secrets, both random and kept in a Kubernetes Secret. The CLI reads the *admin* token from
the Secret with the user's own credentials and may do everything. The *worker* secret is never
given to a pod: the workers of a run hold that run's own token,
:func:`~mlbench.results.http_sink.run_token` (an HMAC of the run id under the worker secret),
which may only post events and heartbeats to that run; a ``result`` event is accepted only from rank 0 of a run
that has not ended. Requests without a valid token are refused (401), the worker secret on
anything else gets 403; only ``/healthz`` (for the kubelet's probes) is open, and it says
nothing but "ok". The token travels in ``X-Mlbench-Token`` rather than ``Authorization`` because
the CLI reaches the service through the API server's service proxy, where ``Authorization``
carries the user's own Kubernetes credentials.

The HTTP side (limits, timeouts, logs) and :func:`~mlbench.server.httpd.serve` are
:mod:`mlbench.server.httpd`.

    GET    /v1/runs                        the catalog           POST /v1/runs  create a run
    GET    /v1/runs/RUN                    one run (id, name or id prefix)
    GET    /v1/runs/RUN/files              {path: size} of run.json, events/*, logs/*
    GET    /v1/runs/RUN/file?path=P&offset=N   the bytes of a file from offset N (0 to 2^63-1;
                                           past the file's end: none)
    POST   /v1/runs/RUN/events             the run's token: {"rank": r, "events": [...]} -> {"next_seq": n}
                                           (200: all of them stored; n: the rank's lowest number
                                           not stored yet)
    POST   /v1/runs/RUN/heartbeat          the run's token: a worker's heartbeat -> {"stored": bool}
                                           (and "stalled": {"ranks": [...], "reason": ...} once
                                           the service's watchdog failed the run)
    POST   /v1/runs/RUN/cancel | /fail     end an active run (and delete its pods)
    POST   /v1/runs/RUN/resume             {"max_steps": N | 0 (none) | null (its own)}: an ended
                                           run pending again from its newest checkpoint
    DELETE /v1/runs/RUN                    end it if active, delete its pods and its record
"""

from __future__ import annotations

import hmac
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlbench.errors import MlbenchError, RunNotFound, UsageError
from mlbench.launch.base import reopen_from_checkpoint
from mlbench.results.checkpoints import CHECKPOINTS_FOLDER
from mlbench.results.events import event_problem
from mlbench.results.heartbeat import Beat, on_clock_of_receiver, write_beat
from mlbench.results.http_sink import run_token
from mlbench.results.offsets import seek_within
from mlbench.results.store import ACTIVE_STATES, CANCELLED, RUN_FOLDER_FILES, RunRecord, RunStore
from mlbench.server.eventlog import EventLog
from mlbench.server.watch import HeartbeatWatch

MAX_CHUNK = 8 * 1024 * 1024
_CREATE_FIELDS = ("task", "workers", "division", "run_json", "name", "optimizer", "launcher",
                  "seed", "group_id")


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def record_json(record: RunRecord) -> dict[str, Any]:
    data = asdict(record)
    data.pop("run_dir", None)
    return data


class ResultsService:
    """What the API does, independent of HTTP. ``supervisor`` ends runs on the cluster."""

    def __init__(self, home: str | Path, worker_token: str, admin_token: str, supervisor: Any = None):
        if not worker_token or not admin_token or worker_token == admin_token:
            raise MlbenchError("the results service needs two different, non-empty tokens; set "
                               "MLBENCH_WORKER_TOKEN and MLBENCH_ADMIN_TOKEN")
        self.store = RunStore(home)
        #: the runs' checkpoints on a cluster (mlbench.launch.k8s_objects.CHECKPOINT_DIR): one
        #: folder per run, mounted into its pods
        self.checkpoints = Path(home) / CHECKPOINTS_FOLDER
        self.events = EventLog(self.store.runs_dir)
        self.tokens = {"worker": worker_token.encode(), "admin": admin_token.encode()}
        self.supervisor = supervisor
        # judges the heartbeats posted here that no supervisor judges (started by serve())
        self.watch = HeartbeatWatch(self.store)

    def scope_of(self, token: str | None) -> str | None:
        """'admin', 'worker' (the worker secret itself) or None for the token a request presented."""
        if not token:
            return None
        for scope in ("admin", "worker"):
            if hmac.compare_digest(token.encode(), self.tokens[scope]):
                return scope
        return None

    def is_run_token(self, token: str | None, run_id: str) -> bool:
        """Whether ``token`` is the own token of run ``run_id`` (see run_token)."""
        expected = run_token(self.tokens["worker"].decode(), run_id)
        return bool(token) and hmac.compare_digest(str(token).encode(), expected.encode())

    def run(self, ref: str) -> RunRecord:
        try:
            return self.store.get(ref)
        except RunNotFound as err:
            raise HttpError(404, str(err)) from None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        missing = [k for k in ("task", "workers", "division", "run_json") if k not in body]
        if missing:
            raise HttpError(400, f"missing fields: {', '.join(missing)}")
        record = self.store.create(**{k: body[k] for k in _CREATE_FIELDS if k in body})
        config = body["run_json"].get("config") if isinstance(body["run_json"], dict) else None
        if isinstance(config, dict) and config.get("checkpoint_dir") == str(self.checkpoints):
            # the run's pods mount this folder of the volume as theirs: made here, by the pods'
            # user, before they start (the kubelet would make a missing one as root)
            (self.checkpoints / record.id).mkdir(parents=True, exist_ok=True, mode=0o700)
        return record_json(record)

    def files(self, record: RunRecord) -> dict[str, int]:
        found: dict[str, int] = {}
        for path in sorted(record.run_dir.rglob("*")):
            relative = path.relative_to(record.run_dir).as_posix()
            if path.is_file() and RUN_FOLDER_FILES.match(relative):
                found[relative] = path.stat().st_size
        return found

    def read(self, record: RunRecord, relative: str, offset: int) -> bytes:
        if not RUN_FOLDER_FILES.match(relative):
            raise HttpError(400, f"no such file {relative!r}")
        try:
            with open(record.run_dir / relative, "rb") as f:
                seek_within(f, offset)  # past the end: nothing (mlbench.results.offsets says why)
                return f.read(MAX_CHUNK)
        except FileNotFoundError:
            raise HttpError(404, f"run {record.id} has no file {relative}") from None

    def post_events(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        record = self.run(run_id)
        if record.id != run_id:
            raise HttpError(404, f"no run {run_id!r}")
        rank, events = body.get("rank"), body.get("events")
        if not (isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < record.workers
                and isinstance(events, list)):
            raise HttpError(400, f"expected {{\"rank\": 0..{record.workers - 1}, \"events\": [...]}}")
        for i, event in enumerate(events):
            problem = event_problem(event)
            seq = event.get("seq") if isinstance(event, dict) else None
            if problem is None and not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0):
                problem = "'seq' must be an integer >= 0"
            if problem is None and event["rank"] != rank:
                problem = f"its rank {event['rank']} is not the batch's rank {rank}"
            if problem:
                raise HttpError(400, f"event {i} of the batch: {problem}")
            if event["name"] == "result" and (rank != 0 or record.state not in ACTIVE_STATES):
                who = f"rank {rank}" if rank != 0 else f"a run that is {record.state}"
                raise HttpError(403, f"a result is accepted only from rank 0 of a running run, not "
                                     f"from {who}")
        return {"next_seq": self.events.append(run_id, rank, events)}

    def post_heartbeat(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store a worker's heartbeat where a local worker writes its own (``RUN_DIR/heartbeats``),
        on this service's clock, for the watchdog: the pod supervisor's for a Kubernetes run, this
        service's own (:mod:`mlbench.server.watch`) for workers that no supervisor owns. A
        heartbeat of a run that has ended is not stored (its pods are being deleted); the answer
        then carries the watchdog's verdict if that ended it, for the workers to act on."""
        record = self.run(run_id)
        if record.id != run_id:
            raise HttpError(404, f"no run {run_id!r}")
        beat = Beat.from_json(body)
        if beat is None or not 0 <= beat.rank < record.workers:
            raise HttpError(400, f"expected a heartbeat of rank 0..{record.workers - 1} "
                                 "(fields: rank, time, started, step, stepped_at, phase, ...)")
        if record.state not in ACTIVE_STATES:
            stall = self.watch.verdict(run_id)
            return {"stored": False, **({"stalled": {"ranks": list(stall.ranks), "reason": stall.reason}}
                                        if stall is not None else {})}
        received = time.time()
        write_beat(record.run_dir, on_clock_of_receiver(beat, received))
        if not (self.supervisor is not None and record.launcher == "kubernetes"):
            self.watch.received(run_id, received)
        return {"stored": True}

    def end(self, record: RunRecord, state: str, reason: str) -> dict[str, Any]:
        if self.supervisor is not None:
            self.supervisor.end_run(record.id, state, reason)
        elif record.active:
            self.store.mark_ended(record.id, state, reason=reason)
        return record_json(self.store.get(record.id))

    def resume(self, record: RunRecord, body: dict[str, Any]) -> dict[str, Any]:
        """`mlbench resume` of a cluster run: its folder and checkpoints are on this service's
        volume, so the run is made ready here (:func:`reopen_from_checkpoint`); the CLI then
        creates its pods as for a new start. A run that cannot resume is a 400 with the reason."""
        cap = body.get("max_steps")
        if cap is not None and not (isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0):
            raise HttpError(400, "max_steps must be a whole number of steps (0: no cap) or null")
        try:
            return record_json(reopen_from_checkpoint(self.store, record, cap))
        except UsageError as err:
            raise HttpError(400, str(err)) from None

    def delete(self, record: RunRecord) -> None:
        self.end(record, CANCELLED, "deleted by the user")
        self.store.delete(record.id)
        shutil.rmtree(self.checkpoints / record.id, ignore_errors=True)
        self.events.forget(record.id)
        self.watch.forget(record.id)

