"""The run store's SQLite catalog (``runs.db``): its schema versions, read-only opening, and
SQLite's errors as one sentence.

- **Versions.** ``PRAGMA user_version`` holds the schema version. ``MIGRATIONS[v]`` takes a
  catalog from version v to v+1; opening a writable store applies the missing ones in one
  transaction, so a store written by any earlier release opens in a later one. Version 0 is a
  catalog without a version: an empty file, or one written before versions were recorded, whose
  table is exactly version 1's (``CREATE ... IF NOT EXISTS`` leaves it as it is). Version 2 adds
  ``frozen_runs``, each run's configuration as it was created (``RunStore.frozen``); the runs of
  an older catalog have no row there. A catalog of a newer mlbench is refused rather than
  guessed at.
- **Read-only.** `status`, `download`, `compare` and `charts` only read, so they open the catalog
  with SQLite's ``mode=ro`` and create nothing: they work on a store mounted read-only, owned by
  someone else, or on a full disk. SQLite's WAL mode needs a writable ``runs.db-shm`` beside the
  catalog; where that cannot be had, the catalog is read as ``immutable`` (nothing can write it
  then either).
- **Errors.** Every ``sqlite3.Error`` becomes a :class:`StoreError`, one line that says what is
  wrong (read-only, full disk, corrupt, locked) and what to do, never a traceback.
- **A full disk.** A writable store keeps :data:`RESERVE_BYTES` allocated in ``.space-reserve``;
  when the disk fills during a run, the reserve is given up so that how the run ended can still
  be recorded (see ``RunStore.mark_ended``), and it is taken again when a store is next opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path
from collections.abc import Iterator
from urllib.parse import quote

from mlbench.errors import MlbenchError

#: Version 1: the catalog of the first release (one table of runs, an index on names).
_V1 = """
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
#: Version 2: the sections of each run's run.json that say what it computes, frozen when it is
#: created (canonical JSON and its SHA-256; mlbench.results.store.FROZEN_SECTIONS), in a table
#: of their own so that the runs table that every reader queries stays version 1's.
_V2 = """
CREATE TABLE IF NOT EXISTS frozen_runs (
    id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    frozen TEXT NOT NULL
);
"""
#: MIGRATIONS[v] is the SQL that takes a catalog from version v to v + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)
#: Indexes that make reads faster without changing what they read, by name: made when a writable
#: store is opened and one is missing, whatever the catalog's version (a release without them
#: reads a catalog with them as before). ``runs_created``: the runs newest first, a page at a
#: time (``RunStore.newest``), without reading the others.
INDEXES = {"runs_created": "CREATE INDEX IF NOT EXISTS runs_created ON runs(created_at, id)"}
SCHEMA_VERSION = len(MIGRATIONS)
#: The oldest version whose table today's queries read unchanged (read-only opens never migrate).
OLDEST_READABLE = 0
RESERVE_FILE = ".space-reserve"
RESERVE_BYTES = 256 * 1024
#: Less free space than this on the store's disk counts as a full disk.
FULL_BELOW = 1 << 20
BUSY_SECONDS = 30.0


class StoreError(MlbenchError):
    """The run store's catalog cannot be read or written; the message says why and what to do."""


class StoreReadOnly(StoreError):
    """The run store cannot be written (a read-only mount, another user's files)."""


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged user may still write on the file system of ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(path: Path) -> bool:
    free = free_bytes(path)
    return free is not None and free < FULL_BELOW


def reserve_space(home: Path) -> None:
    """Allocate the reserve unless it exists or would leave the disk full (best effort)."""
    target = home / RESERVE_FILE
    free = free_bytes(home)
    if target.exists() or free is None or free < 2 * RESERVE_BYTES:
        return
    tmp = home / f"{RESERVE_FILE}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.write(fd, os.urandom(RESERVE_BYTES))  # incompressible: a compressing FS keeps it
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def release_space(home: Path) -> bool:
    """Give the reserve back to the disk; False when there was none."""
    try:
        (home / RESERVE_FILE).unlink()
        return True
    except OSError:
        return False


class Catalog:
    """Connections to ``HOME/runs.db`` and the translation of SQLite's errors."""

    def __init__(self, home: Path, read_only: bool = False):
        self.home = home
        self.path = home / "runs.db"
        self.read_only = read_only

    # -- opening --------------------------------------------------------------------------
    def prepare(self) -> int:
        """Create the catalog (mode 600) if missing and bring it to SCHEMA_VERSION; returns the
        version it had (0 for a new catalog or one of the first release)."""
        if not self.path.exists():
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError as err:
                raise self.os_error(err) from None
        try:
            with self.connect(write=True) as db:
                db.execute("PRAGMA journal_mode=WAL")
                found = self._version(db)
                if found == SCHEMA_VERSION:
                    self._add_indexes(db)
        except StoreError:
            if not disk_full(self.home):
                raise
            # a full disk: SQLite cannot make the WAL index a writable connection needs, yet a
            # current catalog needs nothing written, and `delete` must still free space
            with self.connect(read=True) as db:
                found = self._version(db)
            if found == SCHEMA_VERSION:
                return found
            raise
        if found == SCHEMA_VERSION:
            return found
        with self.connect(write=True) as db:
            db.isolation_level = None  # explicit BEGIN IMMEDIATE: one migrator at a time
            db.execute("BEGIN IMMEDIATE")
            try:
                found = self._version(db)  # another process may have migrated meanwhile
                for version in range(found, SCHEMA_VERSION):
                    for statement in MIGRATIONS[version].split(";"):
                        if statement.strip():
                            db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._add_indexes(db)
            return found

    @staticmethod
    def _add_indexes(db: sqlite3.Connection) -> None:
        """The :data:`INDEXES` the catalog lacks (looked up first: nothing is written when none is)."""
        present = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        for name, statement in INDEXES.items():
            if name not in present:
                db.execute(statement)

    def check_readable(self) -> None:
        """Refuse, in one line, a catalog this release cannot read without migrating it."""
        if self.path.exists():
            with self.connect() as db:
                version = self._version(db)
            if version < OLDEST_READABLE:
                raise StoreError(f"the run catalog {self.path} has schema version {version}, too old "
                                 "to read without upgrading it; run `mlbench status` once with write "
                                 "access to the store")

    def _version(self, db: sqlite3.Connection) -> int:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StoreError(f"the run catalog {self.path} has schema version {version}, written by a "
                             f"newer mlbench (this one reads up to version {SCHEMA_VERSION}); upgrade "
                             "mlbench (pip install -U mlbench) or set MLBENCH_HOME to another store")
        return version

    @contextlib.contextmanager
    def connect(self, write: bool = False, read: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection inside a transaction (committed on success); SQLite errors -> StoreError.
        ``read``: a read-only connection even to a writable store."""
        try:
            db = self._open_read() if read else self._open(write)
            try:
                with db:
                    yield db
            finally:
                db.close()
        except sqlite3.Error as err:
            raise self.error(err) from None

    def _open(self, write: bool) -> sqlite3.Connection:
        if write:
            return sqlite3.connect(self._uri("rw"), uri=True, timeout=BUSY_SECONDS)
        if self.read_only:
            return self._open_read()
        db = sqlite3.connect(self._uri("rw"), uri=True, timeout=BUSY_SECONDS)
        try:
            db.execute("PRAGMA user_version").fetchone()  # opens the file (and the WAL index) now
            return db
        except sqlite3.OperationalError:
            db.close()
            if not disk_full(self.home):
                raise
        # a full disk leaves no room for the WAL index of a writable connection: read as the
        # read-only commands do (`delete` finds its runs so, and frees space)
        return self._open_read()

    def _open_read(self) -> sqlite3.Connection:
        if not self.path.exists():  # nothing recorded yet: an empty catalog, and nothing created
            db = sqlite3.connect(":memory:")
            db.executescript("".join(MIGRATIONS))
            return db
        try:
            db = sqlite3.connect(self._uri("ro"), uri=True, timeout=BUSY_SECONDS)
            db.execute("PRAGMA user_version").fetchone()  # opens the file (and the WAL index) now
            return db
        except sqlite3.OperationalError as err:
            if _code(err).startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(err):
                raise
            # no writable runs.db-shm can be had (read-only mount, another user's folder, a full
            # disk): read the file as it is
            return sqlite3.connect(self._uri("ro") + "&immutable=1", uri=True, timeout=BUSY_SECONDS)

    def _uri(self, mode: str) -> str:
        return f"file:{quote(str(self.path.absolute()))}?mode={mode}"

    # -- errors ----------------------------------------------------------------------------
    def _writable(self) -> bool:
        return os.access(self.home, os.W_OK) and (not self.path.exists() or os.access(self.path, os.W_OK))

    def check_writable(self) -> None:
        """Refuse, in one line, a store this process cannot write (before removing anything)."""
        if not self.home.exists():
            raise self.missing_error()
        if not self._writable():
            raise self._read_only_error("permission denied or a read-only file system")

    def os_error(self, err: OSError) -> StoreError:
        """One sentence for a failed write of a file in the store (a run folder, the catalog)."""
        if not self.home.exists():
            return self.missing_error()
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return self._read_only_error(err.strerror or str(err))
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return self._full_error()
        return StoreError(f"cannot write the run store at {self.home} ({err.strerror or err}); "
                          "set MLBENCH_HOME to a writable folder")

    def missing_error(self) -> StoreError:
        """The store's folder is gone (deleted or moved while a dashboard or a run used it)."""
        return StoreError(f"the run store at {self.home} no longer exists (its folder was deleted or "
                          "moved); restore it, or start the command again to begin a new, empty store there")

    def _read_only_error(self, detail: str) -> StoreReadOnly:
        return StoreReadOnly(f"the run store at {self.home} is read-only ({detail}); commands that "
                             "record runs need a store they can write: set MLBENCH_HOME to a "
                             "writable folder or fix its permissions")

    def _full_error(self) -> StoreError:
        free = free_bytes(self.home)
        left = f", {free} bytes free" if free is not None else ""
        return StoreError(f"no space left on the device of the run store {self.home}{left}; free some "
                          "space there or set MLBENCH_HOME to a folder on another disk")

    def error(self, err: sqlite3.Error) -> StoreError:
        """One sentence for a failed SQLite call: what is wrong and what to do."""
        code, message = _code(err), str(err)
        if not self.home.exists():
            return self.missing_error()
        if self.path.exists() and not os.access(self.path, os.R_OK):
            return StoreError(f"cannot read the run catalog {self.path} (permission denied); it belongs "
                              "to another user: set MLBENCH_HOME to a store of your own")
        if code.startswith("SQLITE_READONLY") or "readonly" in message or (
                code.startswith(("SQLITE_CANTOPEN", "SQLITE_IOERR")) and not self._writable()):
            return self._read_only_error(message)
        if code == "SQLITE_FULL" or "disk is full" in message or (
                code.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN")) and disk_full(self.home)):
            return self._full_error()
        if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "not a database" in message \
                or "malformed" in message:
            return StoreError(f"the run catalog {self.path} is corrupt ({message}); move it away "
                              f"(mv {self.path} {self.path}.corrupt) and mlbench starts an empty one; "
                              f"the run folders in {self.home / 'runs'} are kept")
        if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in message:
            return StoreError(f"the run catalog {self.path} stayed locked by another mlbench process "
                              f"for {BUSY_SECONDS:.0f}s; try again when it has finished")
        return StoreError(f"the run catalog {self.path} cannot be used ({message}); check the "
                          f"folder {self.home} and its disk")


def _code(err: sqlite3.Error) -> str:
    """SQLite's error name (Python 3.11+), else ''."""
    return str(getattr(err, "sqlite_errorname", "") or "")
