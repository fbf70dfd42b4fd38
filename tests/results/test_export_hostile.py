"""Exporters fail loudly, in one line (issue 57, item 6), read back by each tool's own reader.

A metric event's name is written by workers and plug-ins, so it can be anything, and MLflow's
file store makes it a file's path. A recorded run holds series named ``train/../../escape``,
``train/`` and five ``../`` then ``escape`` (under the store's ``DIR/<experiment>/<run>/metrics/``
that path is beside ``DIR``), ``time//abs``, ``comm/a\\x00b`` and one of rank 1 going up six
folders, and events named ``../../escape``, ``/abs`` and ``a\\x00b``, which are no series (their
names have no series' prefix) and are not exported. Exported to each tool, every series comes
back under its safe key (docs/exporters.md, "Names"), which MLflow's own validation takes, and
nothing is written outside the export folder. Two names that would share a key, and a name
longer than MLflow takes, are refused in one line naming them, before anything is written.

Unwritable folders, in two ways that hold for root (the tests run as root, who writes in a
folder of mode 0555 all the same, and for whom os.access says yes there): a path under a file
(``FILE/sub``, which nobody can create), and an empty folder on a read-only tmpfs, mounted in a
private mount namespace by ``unshare --mount`` as benchmarks/audit.py mounts its full disk
(skipped without root and unshare(1)). The second is the audit's case: W&B saw the folder
unwritable and wrote the run into $TMPDIR, exiting 0. Each export is `mlbench export` in a
fresh interpreter (whose tempfile module reads TMPDIR anew), with TMPDIR a fresh folder that
must stay empty.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # (registers the commands)
from mlbench.cli import cli
from mlbench.errors import UsageError
from mlbench.results.events import FileSink
from mlbench.results.exporters import export_runs
from mlbench.results.store import RunRecord, RunStore
from tests.helpers import mlbench, requires, run_ids
from tests.results.recorded import T0, record_run
from tests.results.test_export import READERS

pytestmark = requires("tensorboard", "mlflow", "wandb")

TOOLS = ("tensorboard", "mlflow", "wandb")
REPO = Path(__file__).resolve().parents[2]

#: (rank, event name) -> (the key every tool holds its series under, its value)
HOSTILE = {
    (0, "train/../../escape"): ("train/__/__/escape", 1.25),
    (0, "train/" + "../" * 5 + "escape"): ("train/" + "__/" * 5 + "escape", 2.5),
    (0, "time//abs"): ("time/_/abs", 3.75),
    (0, "comm/a\x00b"): ("comm/a_b", 5.0),
    (1, "eval/" + "../" * 6 + "escape"): ("rank1/eval/" + "__/" * 6 + "escape", 6.25),
}
#: events whose names are no series: never exported, under any name
NOT_SERIES = ("../../escape", "/abs", "a\x00b")


def add_events(record: RunRecord, events: dict[tuple[int, str], float]) -> None:
    """Events of ``record`` at step 25, appended to its ranks' files as a worker appends them."""
    for rank in sorted({rank for rank, _ in events}):
        sink = FileSink(record.run_dir, rank)
        for (r, name), value in events.items():
            if r == rank:
                sink.write({"time": T0 + 3.0, "rank": rank, "epoch": 0.5, "step": 25, "name": name,
                            "value": value})
        sink.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("hostile-store")
    store = RunStore(home)
    hostile = record_run(store, workers=2)
    add_events(hostile, {**{key: value for key, (_, value) in HOSTILE.items()},
                         **{(0, name): 9.0 for name in NOT_SERIES}})
    sharing = record_run(store, workers=1)
    add_events(sharing, {(0, "train/a\x00b"): 1.0, (0, "train/a_b"): 2.0})
    long = record_run(store, workers=1)
    add_events(long, {(0, "train/" + "x" * 300): 1.0})
    return {"home": home, "hostile": hostile, "sharing": sharing, "long": long, "plain": record_run(store, workers=1)}


def all_paths(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def check_hostile_series(tool: str, out: Path, run_id: str) -> None:
    """Each hostile series under its safe key with its value, a key MLflow's own validation takes;
    no raw name among the keys."""
    from mlflow.utils.validation import _validate_metric_name

    series, _, _ = READERS[tool](out, run_id)
    for (_, name), (key, value) in HOSTILE.items():
        assert series.get(key) == [(25, value)], f"{tool}: {name!r} as {key!r}: {sorted(series)}"
    for key in series:
        _validate_metric_name(key)  # (raises for a name MLflow refuses)
        assert ".." not in key.split("/") and "\x00" not in key and not key.startswith("/"), key


@pytest.mark.parametrize("tool", TOOLS)
def test_hostile_metric_names_are_exported_under_safe_keys_and_nothing_outside(runs, tool, tmp_path):
    box = tmp_path / "box"
    out = box / "out"
    box.mkdir()
    export_runs([runs["hostile"]], tool, out)
    check_hostile_series(tool, out, runs["hostile"].id)
    assert [p.name for p in box.iterdir()] == ["out"], all_paths(box)
    assert list(tmp_path.iterdir()) == [box]


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("which, says", [
    ("sharing", ["'train/a\\x00b'", "'train/a_b'", "would both be exported as 'train/a_b'"]),
    ("long", ["'train/xxxx", "306 characters", "at most 250"]),
])
def test_names_that_share_a_key_or_are_too_long_are_refused_in_one_line(runs, tool, which, says, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["export", runs[which].id, "--to", tool, str(out)],
                                env={"MLBENCH_HOME": str(runs["home"])})
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert all(part in result.output for part in says), result.output
    assert runs[which].id in result.output and not out.exists()


def mount_read_only(folder: Path) -> list[str]:
    """The command prefix that runs a command with an empty read-only tmpfs mounted on
    ``folder``, in a mount namespace of its own (exit 99: it could not be mounted)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a read-only mount needs root and unshare(1)")
    shell = 'mount -t tmpfs -o ro,size=1m mlbench-read-only "$0" || exit 99; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell, str(folder)]


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("where", ["under-a-file", "read-only-mount"])
def test_an_unwritable_folder_is_one_line_exit_2_and_nothing_in_tmpdir(runs, tool, where, tmp_path):
    scratch, elsewhere = tmp_path / "tmpdir", tmp_path / "other"
    scratch.mkdir()
    elsewhere.mkdir()
    if where == "under-a-file":
        (tmp_path / "file").write_text("not a folder\n")
        out, prefix = tmp_path / "file" / "sub", []
    else:
        out = tmp_path / "ro"
        out.mkdir()
        prefix = mount_read_only(out)
    env = {**os.environ, "MLBENCH_HOME": str(runs["home"]), "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([*prefix, sys.executable, "-m", "mlbench", "export", runs["plain"].id, "--to", tool,
                           str(out)], capture_output=True, text=True, timeout=240, env=env, cwd=elsewhere)
    if proc.returncode == 99:
        pytest.skip("cannot mount a tmpfs here")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and str(out) in proc.stderr, proc.stderr
    assert f"--to {tool}: cannot" in proc.stderr, proc.stderr
    assert all_paths(scratch) == [] and all_paths(elsewhere) == []
    assert not out.exists() or all_paths(out) == []


def test_a_wandb_run_written_anywhere_but_the_folder_asked_is_removed_and_refused(runs, tmp_path, monkeypatch):
    """W&B writes a run into tempfile.gettempdir() when os.access denies it its folder (its
    ``try_create_root_dir``), which can happen where a real write passes: access(2) judges by
    the real user, not the effective one, and by mode bits, not by a network file system's own
    rules. Here os.access denies the folder asked for, which mlbench's own write passed: W&B
    falls back, and the export must say so in one line and leave nothing in $TMPDIR."""
    out, scratch = tmp_path / "wb", tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read from TMPDIR again)
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        return False if Path(path).resolve() == out.resolve() else real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(UsageError) as refused:
        export_runs([runs["plain"]], "wandb", out)
    message = str(refused.value)
    assert "\n" not in message and str(out) in message and str(scratch) in message, message
    assert all_paths(scratch) == [], all_paths(scratch)
    assert all_paths(out) == [], all_paths(out)


def test_a_live_export_checks_its_folder_first_and_names_series_as_an_export_does(runs, tmp_path):
    from mlbench.results.live_export import LiveExport, parse_targets

    (tmp_path / "file").write_text("not a folder\n")
    target = tmp_path / "file" / "sub"
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "2", "--log-to", f"wandb:{target}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and str(target) in proc.stderr, proc.stderr
    assert "cannot create the folder" in proc.stderr and run_ids() == []
    assert parse_targets([f"mlflow:{tmp_path / 'new' / 'ml'}"]) and not (tmp_path / "new").exists()

    said: list[str] = []
    box = tmp_path / "box"
    live = LiveExport([(tool, box / tool) for tool in TOOLS], runs["hostile"], said.append)
    live.poll()
    live.close(runs["hostile"])
    assert [line for line in said if not line.startswith("Logged to")] == [], said
    for tool in TOOLS:
        check_hostile_series(tool, box / tool, runs["hostile"].id)
    assert sorted(p.name for p in box.iterdir()) == sorted(TOOLS)


def test_a_live_export_of_names_that_share_a_key_stops_in_one_line_and_leaves_nothing(runs, tmp_path):
    from mlbench.results.live_export import LiveExport

    said: list[str] = []
    live = LiveExport([("tensorboard", tmp_path / "tb")], runs["sharing"], said.append)
    live.poll()
    live.close(runs["sharing"])
    (line,) = said
    assert line.startswith("--log-to tensorboard: stopped (") and "would both be exported as 'train/a_b'" in line
    assert "\n" not in line and "mlbench export" not in line  # (an export after the run would refuse it too)
    assert all_paths(tmp_path / "tb") == []


@pytest.mark.parametrize("name, key", [
    ("../../escape", "__/__/escape"), ("/abs", "_/abs"), ("a\x00b", "a_b"), ("a//b/", "a/_/b/_"),
    ("..x/.y/...", "__x/_y/___"), ("", "_"), ("eval/précision:1", "eval/pr_cision_1"),
    ("train/loss", "train/loss"), ("rank1/time/communication", "rank1/time/communication"),
    ("allreduce/fp32/busbw_gbps", "allreduce/fp32/busbw_gbps"),
])
def test_the_safe_key_of_a_name(name, key):
    import posixpath

    from mlflow.utils.validation import _validate_metric_name

    from mlbench.results.export import safe_key

    assert safe_key(name) == key
    _validate_metric_name(key)
    assert posixpath.normpath(key) == key and safe_key(key) == key
