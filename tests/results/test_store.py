"""The run store's catalog over time and under trouble: schema versions and migrations, private
permissions, read-only and corrupt catalogs, and a disk that fills up during a run."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench.results import catalog
from mlbench.results.events import FileSink
from mlbench.results.store import SCHEMA_VERSION, RunStore, StoreError
from tests.results.recorded import record_run

# The catalog as the first mlbench wrote it (before the schema carried a version): copied here
# so that a store written by that release stays readable whatever the code's schema becomes.
V1_SCHEMA = """
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


def write_v1_store(home: Path) -> None:
    """A store as the first release left it: WAL catalog, user_version 0, one finished run."""
    (home / "runs" / "0123abcd" / "events").mkdir(parents=True)
    (home / "runs" / "0123abcd" / "run.json").write_text(json.dumps({"id": "0123abcd", "task": "task1a"}))
    db = sqlite3.connect(home / "runs.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO runs (id, name, task, workers, state, division, created_at, started_at, "
               "finished_at, result, seed) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
               ("0123abcd", "old-run", "task1a", 2, "finished", "closed", 1.0e9, 1.0e9 + 1, 1.0e9 + 60,
                json.dumps({"reached": True, "time_to_accuracy": 42.0}), 7))
    db.commit()
    db.close()


def user_version(home: Path) -> int:
    with sqlite3.connect(home / "runs.db") as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


# -- versions and migrations ----------------------------------------------------------------

def test_a_store_written_by_the_first_schema_is_read_and_gets_its_version(tmp_path):
    home = tmp_path / "home"
    write_v1_store(home)
    assert user_version(home) == 0
    store = RunStore(home)
    old = store.get("old-run")
    assert (old.id, old.state, old.workers, old.seed) == ("0123abcd", "finished", 2, 7)
    assert old.result == {"reached": True, "time_to_accuracy": 42.0}
    assert user_version(home) == SCHEMA_VERSION >= 1
    new = store.create(task="task2a", workers=1, division="closed", run_json={"task": "task2a"})
    assert [r.id for r in RunStore(home).list()] == ["0123abcd", new.id]


def test_migrations_run_in_order_once_and_keep_every_row(tmp_path, monkeypatch):
    home = tmp_path / "home"
    write_v1_store(home)
    RunStore(home)
    # a later release adds a column: its migration runs on a store of today's version
    monkeypatch.setattr(catalog, "MIGRATIONS", (*catalog.MIGRATIONS, "ALTER TABLE runs ADD COLUMN note TEXT;"))
    monkeypatch.setattr(catalog, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    store = RunStore(home)
    assert user_version(home) == SCHEMA_VERSION + 1
    assert store.get("0123abcd").result["time_to_accuracy"] == 42.0
    RunStore(home)  # already migrated: ALTER TABLE would fail if it ran again
    with sqlite3.connect(home / "runs.db") as db:
        assert "note" in [row[1] for row in db.execute("PRAGMA table_info(runs)")]


def test_a_store_of_a_newer_mlbench_is_refused_in_one_line(tmp_path):
    home = tmp_path / "home"
    RunStore(home)
    with sqlite3.connect(home / "runs.db") as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 5}.*newer mlbench"):
        RunStore(home)
    with pytest.raises(StoreError, match="newer mlbench"):
        RunStore(home, read_only=True).list()


# -- permissions ------------------------------------------------------------------------------

def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_is_created_private_to_its_user(tmp_path):
    old_umask = os.umask(0o022)
    try:
        store = RunStore(tmp_path / "home")
        run = store.create(task="task1a", workers=1, division="closed", run_json={"task": "task1a"})
        sink = FileSink(run.run_dir, 0)
        sink.write({"time": 1.0, "rank": 0, "epoch": 0.0, "step": 0, "name": "x", "value": 1})
        sink.close()
    finally:
        os.umask(old_umask)
    home = tmp_path / "home"
    for folder in (home, home / "runs", run.run_dir, run.run_dir / "events", run.run_dir / "logs"):
        assert mode(folder) == 0o700, folder
    for file in (home / "runs.db", run.run_dir / "run.json", run.run_dir / "events" / "rank-0.jsonl"):
        assert mode(file) == 0o600, file
    for extra in home.glob("runs.db-*"):  # SQLite gives WAL and shared memory the catalog's mode
        assert mode(extra) == 0o600, extra


def test_a_store_of_the_first_release_is_made_private_when_opened(tmp_path):
    home = tmp_path / "home"
    write_v1_store(home)
    os.chmod(home, 0o755)
    os.chmod(home / "runs", 0o755)
    RunStore(home)
    assert mode(home) == mode(home / "runs") == 0o700


# -- errors are one line ------------------------------------------------------------------

# Runs CLI commands in one process (in-process click, one interpreter start for all of them) and
# prints, per command, its exit code, output and any exception that escaped as a traceback would.
DRIVER = r"""
import json, sys
from click.testing import CliRunner
import mlbench.cli.commands
from mlbench.cli import cli
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(cli, args)
    escaped = r.exception if r.exception is not None and not isinstance(r.exception, SystemExit) else None
    print(json.dumps({"code": r.exit_code, "out": r.stdout, "err": r.stderr,
                      "escaped": repr(escaped) if escaped is not None else None}))
"""


def commands(*argvs: list[str], shell: str = 'exec "$@"', shell_args: tuple[str, ...] = ()) -> list[dict]:
    """The results of several `mlbench` commands run by DRIVER, inside ``shell`` (see in_private_mounts)."""
    if shell == 'exec "$@"':
        proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], capture_output=True,
                              text=True, timeout=240, env=dict(os.environ))
    else:
        proc = in_private_mounts(shell, *shell_args, sys.executable, "-c", DRIVER, json.dumps(argvs))
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(argvs) and not any(r["escaped"] for r in results), results
    return results


def one_line(result: dict) -> str:
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result
    return lines[0]


def test_a_corrupt_catalog_is_one_line_for_every_command():
    home = Path(os.environ["MLBENCH_HOME"])
    RunStore(home)
    (home / "runs.db").write_bytes(b"this is not a database\n" * 500)
    for shm in home.glob("runs.db-*"):
        shm.unlink()
    argvs = (["status"], ["status", "abc"], ["download", "abc"], ["compare", "--task", "task1a"],
             ["run", "task0a", "1"])
    for result in commands(*argvs):
        assert result["code"] == 1, result
        line = one_line(result)
        assert "runs.db" in line and "corrupt" in line, line


def in_private_mounts(shell: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``sh -c SHELL sh ARGS`` in a mount namespace of its own: what it mounts there (a
    read-only bind, a small tmpfs) vanishes with it and is never seen by the rest of the machine."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a read-only or full file system")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, "sh", *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def on_a_full_store(size: str, shell: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``sh -c SHELL sh ARGS`` with the run store (``$MLBENCH_HOME``) on a tmpfs of ``size`` of its
    own, in a private mount namespace (:func:`in_private_mounts`); skips where no tmpfs can be
    mounted."""
    mount = (f'mkdir -p "$MLBENCH_HOME" && mount -t tmpfs -o size={size},mode=0700 mlbench-full "$MLBENCH_HOME" '
             '|| exit 99; ')
    proc = in_private_mounts(mount + shell, *args, timeout=timeout)
    if proc.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    return proc


def test_a_read_only_store_is_read_by_status_download_compare_and_refused_by_run_in_one_line(tmp_path):
    home = Path(os.environ["MLBENCH_HOME"])
    store = RunStore()
    runs = [record_run(store, workers=k, tta=10.0 / k, wall=12.0 / k) for k in (1, 2)]
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    out.mkdir()
    listed, one, got, compared, ran = commands(
        ["status"], ["status", runs[1].id], ["download", runs[0].id, "-o", str(out / "run.zip")],
        ["compare", *[r.id for r in runs]], ["run", "task0a", "1", "--max-size", "16"],
        shell='mount --bind -o ro "$1" "$1" && shift && exec "$@"', shell_args=(str(home),))
    assert listed["code"] == 0 and all(r.id in listed["out"] for r in runs), listed
    assert one["code"] == 0 and "finished" in one["out"], one
    assert got["code"] == 0 and (out / "run.zip").stat().st_size > 0, got
    assert compared["code"] == 0 and "2.00x" in compared["out"], compared
    assert ran["code"] == 1, ran
    line = one_line(ran)
    assert "read-only" in line and str(home) in line, line
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before


def test_a_read_only_store_that_does_not_exist_yet_has_no_runs(tmp_path):
    store = RunStore(tmp_path / "nothing-here", read_only=True)
    assert store.list() == []
    assert not (tmp_path / "nothing-here").exists()


def test_a_disk_that_fills_during_a_run_fails_the_run_with_that_reason():
    """A real run on a 1 MiB file system: its metric events fill it; the run still ends
    `failed`, and the reason says the disk is full instead of leaving it `running`."""
    shell = ('"$1" -m mlbench run task2a 1 --data synthetic --max-steps 100000 --log-every 1 '
             '>/dev/null 2>"$MLBENCH_HOME.err"; echo "exit $?"; '
             '"$1" -c "from mlbench.results.store import RunStore; import json; '
             'r = RunStore(read_only=True).list()[-1]; print(json.dumps([r.state, r.reason]))"')
    proc = on_a_full_store("1m", shell, sys.executable, timeout=280)
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "exit 1", proc.stdout + proc.stderr
    state, reason = json.loads(lines[-1])
    assert state == "failed", proc.stdout
    assert "no space left" in reason.lower() and os.environ["MLBENCH_HOME"] in reason, reason
    err = Path(os.environ["MLBENCH_HOME"] + ".err").read_text()
    assert "Traceback" not in err, err


# -- a run's folder and its row exist together; delete works on a full disk (issue 21, 6 and 7) --

def store_contents(store: RunStore) -> tuple[list[str], list[str]]:
    """(the catalog's run ids, the run folders), each sorted."""
    return sorted(r.id for r in store.list()), sorted(p.name for p in store.runs_dir.iterdir())


def test_a_row_that_cannot_be_written_leaves_no_run_folder():
    store = RunStore()
    kept = record_run(store, workers=1, tta=1.0, wall=2.0)
    with pytest.raises(OverflowError):  # SQLite's INTEGER is 64-bit signed: the INSERT fails
        store.create(task="task0a", workers=1, division="closed", run_json={}, seed=2**64)
    assert store_contents(store) == ([kept.id], [kept.id])


def test_a_run_folder_that_cannot_be_written_records_no_run_in_one_line():
    store = RunStore()
    kept = record_run(store, workers=1, tta=1.0, wall=2.0)
    store.runs_dir.rename(store.home / "runs-aside")
    store.runs_dir.write_text("a file where the run folders should be\n")
    with pytest.raises(StoreError, match="cannot write the run store at"):
        store.create(task="task0a", workers=1, division="closed", run_json={})
    assert [r.id for r in store.list()] == [kept.id]


def test_a_seed_out_of_range_is_a_usage_error_and_records_nothing():
    store = RunStore()
    for args, text in ((["--seed", "99999999999999999999"], "--seed 99999999999999999999: give a whole "
                                                             "number from 0 to 9223372036854775807"),
                       (["--seed", "-1"], "--seed -1: give a whole number from 0 to 9223372036854775807"),
                       (["--seed", str(2**63 - 1), "--repeat", "2"], "uses seeds up to 9223372036854775808")):
        result = commands(["run", "task0a", "1", "--max-size", "16", *args])[0]
        assert result["code"] == 2, result
        assert text in one_line(result)
    assert store_contents(store) == ([], [])


FULL_DISK_DRIVER = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from mlbench.results.store import RunStore
from tests.results.recorded import record_run

home = Path(os.environ["MLBENCH_HOME"])
store = RunStore(home)
runs = [record_run(store, workers=1, tta=1.0, wall=2.0) for _ in range(4)]
if sys.argv[2] == "no-reserve":  # given up already (a run ended on this full disk): the logs free space
    (home / ".space-reserve").unlink()
    for run in runs:
        (run.run_dir / "logs" / "rank-0.log").write_bytes(os.urandom(128 * 1024))
fd = os.open(home / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
for size in (65536, 4096, 512, 1):  # until not one more byte fits
    try:
        while True:
            os.write(fd, b"x" * size)
    except OSError:
        pass
os.close(fd)
st = os.statvfs(home)

def mlbench(*args):
    proc = subprocess.run([sys.executable, "-m", "mlbench", *args], capture_output=True, text=True, timeout=120)
    return [proc.returncode, proc.stdout, proc.stderr]

out = {"free": st.f_bavail * st.f_frsize, "runs": [r.id for r in runs],
       "record": mlbench("run", "task0a", "1", "--max-size", "16", "--record-only"),
       "delete": mlbench("delete", "-y", runs[0].id, runs[1].id)}
store = RunStore(home, read_only=True)
out["rows"] = sorted(r.id for r in store.list())
out["folders"] = sorted(p.name for p in store.runs_dir.iterdir())
print(json.dumps(out))
"""


@pytest.mark.parametrize("reserve", ["reserve", "no-reserve"])
def test_delete_works_on_a_full_disk_and_a_new_run_is_refused_without_a_trace(reserve):
    """A real store on a 2 MiB tmpfs filled to the last byte: `delete` removes the runs (folders
    and rows), with the store's space reserve or, once that is spent, with the space the run
    folders free; `run` is refused in one line, leaving neither a folder nor a row."""
    repo = str(Path(__file__).resolve().parents[2])
    proc = on_a_full_store("2m", 'exec "$@"', sys.executable, "-c", FULL_DISK_DRIVER, repo, reserve)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["free"] == 0, out
    code, _, err = out["record"]
    assert code == 1 and len(err.strip().splitlines()) == 1 and "no space left" in err, out["record"]
    code, stdout, err = out["delete"]
    assert code == 0 and err == "", out["delete"]
    kept = sorted(out["runs"][2:])
    assert stdout.count("Deleted run") == 2
    assert out["rows"] == kept and out["folders"] == kept, out
