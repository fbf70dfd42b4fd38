"""The run store: a SQLite catalog of runs plus one folder per run.

``$MLBENCH_HOME`` (default ``~/.local/share/mlbench``) holds ``runs.db`` and ``runs/<id>/`` with
``run.json`` (what was asked for: spec, division, worker configuration, environment), the
workers' metric events (``events/rank-<r>.jsonl``) and logs (``logs/``). The catalog is the index
that `status` lists; the folder is the record that `download` packs. SQLite in WAL mode lets the
supervisor of a running benchmark update a run while the CLI reads it. The catalog's schema
versions, read-only opening and one-line errors are in :mod:`mlbench.results.catalog`.

Runs hold hyper-parameters, host names and logs, so the store is its user's alone, as the
cluster config is: folders are created with mode 700 and files with mode 600.

A run's configuration is frozen when the run is created: the sections of run.json that say what
it computes (:data:`FROZEN_SECTIONS`) are kept in the catalog's ``frozen_runs`` table with their
SHA-256, written in the same transaction as the run's row and never updated, so that `mlbench
resume` can refuse a run.json edited since (:meth:`RunStore.frozen`). The catalog, not a
read-only copy in the run folder, because a file's mode 0o444 stops no one who can edit run.json
beside it (its owner may chmod it, or replace it as mlbench replaces run.json), a folder copied
or restored from elsewhere carries whatever copy it holds, and a cluster's run folder is copied
back and forth between the results service and this machine, while the catalog is one file that
only mlbench writes, through SQL, in the store that created the run (the service's, for a run
on a cluster, which is where its resume is checked). A run created before this has no frozen
record and resumes as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.errors import RunNotFound
from mlbench.jsonfile import read_json, write_json_atomic  # noqa: F401  (read_json: part of this API)
from mlbench.results.catalog import SCHEMA_VERSION, StoreError  # noqa: F401  (part of this API)
from mlbench.results.catalog import (Catalog, StoreReadOnly, disk_full, free_bytes, release_space,
                                     reserve_space)

PENDING, RUNNING, FINISHED, FAILED, CANCELLED = "pending", "running", "finished", "failed", "cancelled"
ACTIVE_STATES = (PENDING, RUNNING)
#: The files of a run folder that the results service serves and a cluster's mirror copies:
#: run.json, the summary of checkpoints kept on a cluster's volume (checkpoints.json), the mark
#: of a cluster's run that ended for good (:data:`SETTLED_FILE`), the ranks' events and the
#: logs; not the partial file of a log being written (``NAME.part``, mlbench.safefile), which is
#: gone, renamed, by the time a mirror that listed it reads it.
RUN_FOLDER_FILES = re.compile(r"^(run\.json|checkpoints\.json|settled|events/rank-\d+\.jsonl"
                              r"|logs/[A-Za-z0-9_.-]+(?<!\.part))$")
#: In the run folder of a cluster's run: written by the cluster's supervisor once the run has
#: ended and none of its pods is left, so that nothing writes to the folder any more (a worker
#: asked to stop writes its last checkpoint and log lines after its run was marked ended); a
#: mirror's copy of the folder is whole only then (mlbench.launch.k8s_mirror)
SETTLED_FILE = "settled"

#: The sections of run.json that say what a run computes, frozen when it is created: its task,
#: division and what made it open, its configuration and its data's identity. The other
#: sections (environment, command, placement, network, nodes, a launcher's job, resumes, faults)
#: describe where and how it ran and are rewritten while it goes.
FROZEN_SECTIONS = ("task", "division", "changed", "config", "data")

_COLUMNS = ("id", "name", "task", "workers", "state", "division", "optimizer", "launcher",
            "created_at", "started_at", "finished_at", "reason", "result", "supervisor_pid",
            "seed", "group_id")


#: A list of runs (``list`` inside :class:`RunStore` is its method).
Records = list["RunRecord"]
#: What a search of the runs reads: these columns, joined by spaces.
_SEARCHED = ("id", "name", "task", "optimizer", "state")


def _matching(words: tuple[str, ...]) -> tuple[list[str], list[Any]]:
    """SQL conditions (and their arguments) for runs whose searched columns hold every word, any case."""
    text = " || ' ' || ".join(f"coalesce({column}, '')" for column in _SEARCHED)
    return [f"instr(lower({text}), ?) > 0" for _ in words], [word.lower() for word in words]


def frozen_text(run_json: dict[str, Any]) -> str:
    """The frozen sections of ``run_json`` as canonical JSON (sorted keys, no spaces)."""
    frozen = {key: run_json[key] for key in FROZEN_SECTIONS if key in run_json}
    return json.dumps(frozen, sort_keys=True, separators=(",", ":"), default=str)


def default_home() -> Path:
    env = os.environ.get("MLBENCH_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "mlbench"


@dataclass
class RunRecord:
    """One row of the catalog (the run's folder holds the rest)."""

    id: str
    name: str
    task: str
    workers: int
    state: str
    division: str
    optimizer: str = "centralized-sgd"
    launcher: str = "local"
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    reason: str | None = None
    result: dict[str, Any] | None = None
    supervisor_pid: int | None = None
    seed: int | None = None
    group_id: str | None = None
    run_dir: Path = field(default=Path("."), repr=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def missed_goal(self) -> bool:
        """Finished, with a goal, after training to its last epoch without reaching it. A run
        stopped by --max-steps or --time-budget ran to the limit its user set (accuracy after
        time), and one without a goal (synthetic data) cannot miss it."""
        result = self.result or {}
        return (self.state == FINISHED and result.get("goal") is not None and not result.get("reached")
                and result.get("stop_reason") == "max-epochs")


class RunStore:
    """Create, find, update and delete runs.

    ``read_only`` (`status`, `download`, `compare`, `charts`): create nothing, read the catalog
    with SQLite's ``mode=ro``; a store that does not exist yet has no runs. Such a store still
    writes where it can (``status`` records that a run's supervisor vanished), but a store that
    cannot be written keeps the state it recorded.
    """

    def __init__(self, home: str | os.PathLike | None = None, read_only: bool = False):
        self.home = Path(home) if home is not None else default_home()
        self.runs_dir = self.home / "runs"
        self.db_path = self.home / "runs.db"
        self.read_only = read_only
        self.catalog = Catalog(self.home, read_only)
        if read_only:
            self.catalog.check_readable()
            return
        created = not self.home.exists()
        try:
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.runs_dir.mkdir(exist_ok=True, mode=0o700)
        except OSError as err:
            raise StoreError(f"cannot create the run store at {self.home} ({err.strerror}); "
                             "set MLBENCH_HOME to a writable folder") from None
        if self.catalog.prepare() == 0 and not created:
            # a store of the first release (or an empty folder given as MLBENCH_HOME): make it
            # private as a new one is; a store the user opened up again later is left as it is
            for folder in (self.home, self.runs_dir):
                try:
                    os.chmod(folder, 0o700)
                except OSError:  # someone else's folder: theirs to decide
                    pass
        reserve_space(self.home)

    def _record(self, row: tuple) -> RunRecord:
        data = dict(zip(_COLUMNS, row))
        data["result"] = json.loads(data["result"]) if data["result"] else None
        return RunRecord(run_dir=self.runs_dir / data["id"], **data)

    # -- creating -------------------------------------------------------------------------
    def create(self, *, task: str, workers: int, division: str, run_json: dict[str, Any],
               name: str | None = None, optimizer: str = "centralized-sgd", launcher: str = "local",
               seed: int | None = None, group_id: str | None = None,
               files: dict[str, bytes] | None = None) -> RunRecord:
        """A new run in state `pending`, with its folder and run.json written, and ``files``
        (a path relative to the folder: its bytes; a plug-in's source) beside it.

        The folder and the catalog row exist together or not at all: the folder is written
        first (nothing is recorded when it cannot be: a full disk), and removed again when the
        row cannot be added, so that no run folder is left that no command lists."""
        run_id = secrets.token_hex(4)
        name = name or f"{task}-{workers}w-{run_id[:4]}"
        run_dir = self.runs_dir / run_id
        try:
            run_dir.mkdir(mode=0o700)
        except OSError as err:
            raise self.catalog.os_error(err) from None
        try:
            try:
                (run_dir / "events").mkdir(mode=0o700)
                (run_dir / "logs").mkdir(mode=0o700)
                for relative, data in (files or {}).items():
                    path = run_dir / relative
                    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    with open(path, "xb") as out:
                        out.write(data)
                write_json_atomic(run_dir / "run.json", {"id": run_id, "name": name, **run_json})
            except OSError as err:
                raise self.catalog.os_error(err) from None
            frozen = frozen_text(run_json)
            with self.catalog.connect(write=True) as db:
                db.execute(
                    "INSERT INTO runs (id, name, task, workers, state, division, optimizer, launcher, "
                    "created_at, seed, group_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, name, task, workers, PENDING, division, optimizer, launcher, time.time(),
                     seed, group_id))
                db.execute("INSERT INTO frozen_runs (id, sha256, frozen) VALUES (?,?,?)",
                           (run_id, hashlib.sha256(frozen.encode()).hexdigest(), frozen))
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)  # ours: created above
            raise
        return self.get(run_id)

    # -- reading --------------------------------------------------------------------------
    def list(self) -> list[RunRecord]:
        with self.catalog.connect() as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs ORDER BY created_at").fetchall()
        return [self._record(r) for r in rows]

    def newest(self, limit: int, before: tuple[float, str] | None = None,
               words: tuple[str, ...] = ()) -> Records:
        """Up to ``limit`` runs, newest first (by creation time, then id), of those created before
        ``before`` (a run's ``(created_at, id)``: the last one of the previous page; None: from
        the newest) whose id, name, task, optimizer or state hold every one of ``words`` (any
        case). The catalog's index on creation time finds them without reading the others, and
        a page ends where the previous one did, whatever was created or deleted since."""
        clauses, args = _matching(words)
        if before is not None:
            clauses.append("(created_at, id) < (?, ?)")
            args += list(before)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        with self.catalog.connect() as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs {where}"
                              "ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit)).fetchall()
        return [self._record(r) for r in rows]

    def count(self, words: tuple[str, ...] = ()) -> int:
        """How many runs there are (of those that hold every one of ``words``, as :meth:`newest`)."""
        clauses, args = _matching(words)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self.catalog.connect() as db:
            return int(db.execute(f"SELECT COUNT(*) FROM runs{where}", args).fetchone()[0])

    def get(self, ref: str) -> RunRecord:
        """A run by id, by name, or by a unique prefix of its id."""
        with self.catalog.connect() as db:
            cols = ", ".join(_COLUMNS)
            rows = db.execute(f"SELECT {cols} FROM runs WHERE id = ? OR name = ?", (ref, ref)).fetchall()
            if not rows and ref:
                rows = db.execute(f"SELECT {cols} FROM runs WHERE id LIKE ?",
                                  (ref.replace("%", "").replace("_", "") + "%",)).fetchall()
        if not rows:
            raise RunNotFound(f"no run {ref!r}; `mlbench status` lists the runs")
        if len(rows) > 1:
            ids = ", ".join(r[0] for r in rows[:5])
            raise RunNotFound(f"{ref!r} matches several runs ({ids}); give more of the id")
        return self._record(rows[0])

    def frozen(self, run_id: str) -> dict[str, Any] | None:
        """The sections of run.json frozen when run ``run_id`` was created
        (:data:`FROZEN_SECTIONS`); None for a run created before they were kept. A record whose
        hash does not match it (a catalog edited by hand or damaged) is refused in one line."""
        with self.catalog.connect() as db:
            row = db.execute("SELECT sha256, frozen FROM frozen_runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        sha256, text = row
        if hashlib.sha256(text.encode()).hexdigest() != sha256:
            raise StoreError(f"run {run_id}: the configuration the run catalog {self.db_path} froze when "
                             "the run was created does not match its SHA-256; the catalog was edited or "
                             "damaged")
        return json.loads(text)

    # -- updating -------------------------------------------------------------------------
    def update(self, run_id: str, **values: Any) -> None:
        if "result" in values and values["result"] is not None:
            values["result"] = json.dumps(values["result"])
        sets = ", ".join(f"{k} = ?" for k in values)
        with self.catalog.connect(write=True) as db:
            db.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*values.values(), run_id))

    def put(self, values: dict[str, Any]) -> None:
        """Insert or replace a catalog row as given: a mirror of another store keeps its ids."""
        row: dict[str, Any] = {k: values.get(k) for k in _COLUMNS}
        if row["result"] is not None:
            row["result"] = json.dumps(row["result"])
        (self.runs_dir / row["id"]).mkdir(exist_ok=True, mode=0o700)
        with self.catalog.connect(write=True) as db:
            db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(_COLUMNS)}) "
                       f"VALUES ({', '.join('?' * len(_COLUMNS))})", tuple(row.values()))

    def mark_running(self, run_id: str, supervisor_pid: int) -> None:
        self.update(run_id, state=RUNNING, started_at=time.time(), supervisor_pid=supervisor_pid)

    def mark_started(self, run_id: str, started_at: float | None = None) -> bool:
        """A pending run is running (once: False when it has moved on already), for launchers
        whose workers no local supervisor owns (Slurm jobs, workers started by the user)."""
        with self.catalog.connect(write=True) as db:
            cursor = db.execute("UPDATE runs SET state = ?, started_at = ? WHERE id = ? AND state = ?",
                                (RUNNING, started_at or time.time(), run_id, PENDING))
            return cursor.rowcount > 0

    def reopen(self, run_id: str) -> bool:
        """An ended run is pending again (`mlbench resume`): its end, reason, result and the last
        start's supervisor pid are cleared (a pending run with its old, dead supervisor would be
        marked failed by the next reader's reconcile, and resumed by a second `resume`), the rest
        kept; False (no change) when it is active."""
        with self.catalog.connect(write=True) as db:
            cursor = db.execute("UPDATE runs SET state = ?, finished_at = NULL, reason = NULL, result = NULL, "
                                "supervisor_pid = NULL WHERE id = ? AND state NOT IN (?, ?)",
                                (PENDING, run_id, *ACTIVE_STATES))
            return cursor.rowcount > 0

    def mark_ended(self, run_id: str, state: str, reason: str | None = None,
                   result: dict[str, Any] | None = None) -> bool:
        """End an active run; a run ends once: False (and no change) when it has already ended.

        The check is in the UPDATE itself, so a reader holding a stale record (``status``
        reconciling a run whose supervisor has just marked it finished and exited) cannot
        overwrite the outcome. A run that failed on a full disk says so in its reason, and is
        recorded even then: the space reserve is given up for it when nothing else is left. A
        store that cannot be written (read-only) keeps the state it had (False).
        """
        if state == FAILED and disk_full(self.home):
            free = free_bytes(self.home)
            reason = (f"no space left on the device of the run store {self.home} ({free} bytes free)"
                      + (f"; {reason}" if reason else ""))
        values: dict[str, Any] = {"state": state, "finished_at": time.time(), "reason": reason}
        if result is not None:
            values["result"] = json.dumps(result)
        try:
            return self._end(run_id, values)
        except StoreReadOnly:
            if self.read_only:
                return False
            raise
        except StoreError:
            if not release_space(self.home):
                raise
            return self._end(run_id, values)

    def _end(self, run_id: str, values: dict[str, Any]) -> bool:
        sets = ", ".join(f"{k} = ?" for k in values)
        with self.catalog.connect(write=True) as db:
            cursor = db.execute(f"UPDATE runs SET {sets} WHERE id = ? AND state IN (?, ?)",
                                (*values.values(), run_id, *ACTIVE_STATES))
            return cursor.rowcount > 0

    def delete(self, run_id: str) -> None:
        """Remove a run's folder, then its catalog row; works on a full disk.

        SQLite needs space to journal the DELETE (a WAL file, its index): the folder goes first,
        and what it frees is often enough; when it is not, the space reserve is given up for the
        row, as for recording how a run ended. A store that cannot be written is refused before
        anything is removed."""
        self.catalog.check_writable()
        shutil.rmtree(self.runs_dir / run_id, ignore_errors=True)
        try:
            self._delete_row(run_id)
        except StoreReadOnly:
            raise
        except StoreError:
            if not release_space(self.home):
                raise
            self._delete_row(run_id)

    def _delete_row(self, run_id: str) -> None:
        with self.catalog.connect(write=True) as db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            db.execute("DELETE FROM frozen_runs WHERE id = ?", (run_id,))
