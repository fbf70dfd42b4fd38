"""The run store: a SQLite catalog of runs plus one folder per run.

``$MLBENCH_HOME`` (default ``~/.local/share/mlbench``) holds ``runs.db`` and ``runs/<id>/`` with
``run.json`` (what was asked for: spec, division, worker configuration, environment), the
workers' metric events (``events/rank-<r>.jsonl``) and logs (``logs/``). The catalog is the index
that `status` lists; the folder is the record that `download` packs. SQLite in WAL mode lets the
supervisor of a running benchmark update a run while the CLI reads it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.errors import MlbenchError, RunNotFound

PENDING, RUNNING, FINISHED, FAILED, CANCELLED = "pending", "running", "finished", "failed", "cancelled"
ACTIVE_STATES = (PENDING, RUNNING)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    workers INTEGER NOT NULL,
    state TEXT NOT NULL,
    division TEXT NOT NULL,
    optimizer TEXT NOT NULL DEFAULT 'centralized-sgd',
    launcher TEXT NOT NULL DEFAULT 'local',
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    reason TEXT,
    result TEXT,
    supervisor_pid INTEGER,
    seed INTEGER,
    group_id TEXT
);
CREATE INDEX IF NOT EXISTS runs_name ON runs(name);
"""

_COLUMNS = ("id", "name", "task", "workers", "state", "division", "optimizer", "launcher",
            "created_at", "started_at", "finished_at", "reason", "result", "supervisor_pid",
            "seed", "group_id")


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


class RunStore:
    """Create, find, update and delete runs."""

    def __init__(self, home: str | os.PathLike | None = None):
        self.home = Path(home) if home is not None else default_home()
        self.runs_dir = self.home / "runs"
        try:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MlbenchError(f"cannot create the run store at {self.home} ({err.strerror}); "
                               "set MLBENCH_HOME to a writable folder") from None
        self.db_path = self.home / "runs.db"
        with closing(self._connect()) as db, db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _record(self, row: tuple) -> RunRecord:
        data = dict(zip(_COLUMNS, row))
        data["result"] = json.loads(data["result"]) if data["result"] else None
        return RunRecord(run_dir=self.runs_dir / data["id"], **data)

    # -- creating -------------------------------------------------------------------------
    def create(self, *, task: str, workers: int, division: str, run_json: dict[str, Any],
               name: str | None = None, optimizer: str = "centralized-sgd", launcher: str = "local",
               seed: int | None = None, group_id: str | None = None) -> RunRecord:
        """A new run in state `pending`, with its folder and run.json written."""
        run_id = secrets.token_hex(4)
        name = name or f"{task}-{workers}w-{run_id[:4]}"
        run_dir = self.runs_dir / run_id
        (run_dir / "events").mkdir(parents=True)
        (run_dir / "logs").mkdir()
        run_json = {"id": run_id, "name": name, **run_json}
        write_json_atomic(run_dir / "run.json", run_json)
        now = time.time()
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT INTO runs (id, name, task, workers, state, division, optimizer, launcher, "
                "created_at, seed, group_id) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, name, task, workers, PENDING, division, optimizer, launcher, now, seed,
                 group_id))
        return self.get(run_id)

    # -- reading --------------------------------------------------------------------------
    def list(self) -> list[RunRecord]:
        with closing(self._connect()) as db:
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM runs ORDER BY created_at").fetchall()
        return [self._record(r) for r in rows]

    def get(self, ref: str) -> RunRecord:
        """A run by id, by name, or by a unique prefix of its id."""
        with closing(self._connect()) as db:
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

    # -- updating -------------------------------------------------------------------------
    def update(self, run_id: str, **values: Any) -> None:
        if "result" in values and values["result"] is not None:
            values["result"] = json.dumps(values["result"])
        sets = ", ".join(f"{k} = ?" for k in values)
        with closing(self._connect()) as db, db:
            db.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*values.values(), run_id))

    def put(self, values: dict[str, Any]) -> None:
        """Insert or replace a catalog row as given: a mirror of another store keeps its ids."""
        row = {k: values.get(k) for k in _COLUMNS}
        if row["result"] is not None:
            row["result"] = json.dumps(row["result"])
        (self.runs_dir / row["id"]).mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.execute(f"INSERT OR REPLACE INTO runs ({', '.join(_COLUMNS)}) "
                       f"VALUES ({', '.join('?' * len(_COLUMNS))})", tuple(row.values()))

    def mark_running(self, run_id: str, supervisor_pid: int) -> None:
        self.update(run_id, state=RUNNING, started_at=time.time(), supervisor_pid=supervisor_pid)

    def mark_started(self, run_id: str, started_at: float | None = None) -> bool:
        """A pending run is running (once: False when it has moved on already), for launchers
        whose workers no local supervisor owns (Slurm jobs, workers started by the user)."""
        with closing(self._connect()) as db, db:
            cursor = db.execute("UPDATE runs SET state = ?, started_at = ? WHERE id = ? AND state = ?",
                                (RUNNING, started_at or time.time(), run_id, PENDING))
            return cursor.rowcount > 0

    def mark_ended(self, run_id: str, state: str, reason: str | None = None,
                   result: dict[str, Any] | None = None) -> bool:
        """End an active run; a run ends once: False (and no change) when it has already ended.

        The check is in the UPDATE itself, so a reader holding a stale record (``status``
        reconciling a run whose supervisor has just marked it finished and exited) cannot
        overwrite the outcome.
        """
        values: dict[str, Any] = {"state": state, "finished_at": time.time(), "reason": reason}
        if result is not None:
            values["result"] = json.dumps(result)
        sets = ", ".join(f"{k} = ?" for k in values)
        with closing(self._connect()) as db, db:
            cursor = db.execute(f"UPDATE runs SET {sets} WHERE id = ? AND state IN (?, ?)",
                                (*values.values(), run_id, *ACTIVE_STATES))
            return cursor.rowcount > 0

    def delete(self, run_id: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        shutil.rmtree(self.runs_dir / run_id, ignore_errors=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file (synced, one per process) and rename, so a reader never
    sees half a file, even after a power loss."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
