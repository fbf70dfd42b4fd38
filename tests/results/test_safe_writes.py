"""Every file mlbench writes at a path its user chose is written whole and never through a link
(issue 21, item 3): a symbolic link planted at the final name is replaced, not followed; one
planted at the partial file's name is refused in one line; the victim is unchanged either way.

The writers are the real commands: `download` (zip and MLPerf log) and `charts` (the images).
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.results.store import RunStore
from mlbench.safefile import FileInTheWay, open_append, replacing, write_text
from tests.results.recorded import record_run

PRECIOUS = "precious\n"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


def assert_untouched(victim: Path) -> None:
    assert victim.read_text() == PRECIOUS and not victim.is_symlink()


def test_a_link_at_the_target_is_replaced_and_a_link_at_the_partial_file_refused(tmp_path, victim):
    target = tmp_path / "out.txt"
    target.symlink_to(victim)
    write_text(target, "new\n")
    assert not target.is_symlink() and target.read_text() == "new\n"
    assert_untouched(victim)

    part = tmp_path / "out.txt.part"
    for planted in (victim, tmp_path / "would-be-created"):
        part.symlink_to(planted)
        with pytest.raises(FileInTheWay, match=r"out\.txt\.part already exists"):
            write_text(target, "newer\n")
        assert part.is_symlink() and target.read_text() == "new\n"
        assert_untouched(victim)
        assert not (tmp_path / "would-be-created").exists()
        part.unlink()


def test_a_failed_write_leaves_the_old_file_and_no_partial_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), replacing(target) as f:
        f.write(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_appended_files_are_private_and_never_through_a_link(tmp_path, victim):
    log = tmp_path / "rank-0.log"
    with open_append(log) as f:
        f.write(b"one\n")
    with open_append(log) as f:
        f.write(b"two\n")
    assert log.read_bytes() == b"one\ntwo\n" and stat.S_IMODE(log.stat().st_mode) == 0o600
    linked = tmp_path / "rank-1.log"
    linked.symlink_to(victim)
    with pytest.raises(OSError):
        open_append(linked)
    assert_untouched(victim)


def test_download_mlperf_never_writes_through_a_link_at_the_log_or_its_partial_file(tmp_path, victim):
    run = record_run(RunStore(), workers=1, tta=1.0, wall=2.0)
    target = tmp_path / "X.zip"
    log, part = tmp_path / "X.mllog.txt", tmp_path / "X.mllog.txt.part"

    part.symlink_to(victim)  # the reproduction: ln -s victim.txt X.mllog.txt.part
    result = invoke("download", run.id, "-o", target, "--format", "mlperf")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "X.mllog.txt.part already exists" in lines[0], result.output
    assert_untouched(victim)
    assert part.is_symlink() and not log.exists()
    part.unlink()

    log.symlink_to(victim)
    result = invoke("download", run.id, "-o", target, "--format", "mlperf")
    assert result.exit_code == 0, result.output
    assert_untouched(victim)
    assert not log.is_symlink() and log.read_text().startswith(":::MLLOG")
    assert zipfile.is_zipfile(target) and not part.exists()


def test_download_replaces_a_link_at_the_zip_instead_of_writing_its_target(tmp_path, victim):
    run = record_run(RunStore(), workers=1, tta=1.0, wall=2.0)
    target = tmp_path / "run.zip"
    target.symlink_to(victim)
    result = invoke("download", run.id, "-o", target)
    assert result.exit_code == 0, result.output
    assert_untouched(victim)
    assert not target.is_symlink() and zipfile.is_zipfile(target)


def test_charts_never_write_through_a_link_at_an_image_or_its_partial_file(tmp_path, victim):
    pytest.importorskip("matplotlib", reason="charts need matplotlib (pip install 'mlbench-suite[charts]')")
    store = RunStore()
    runs = [record_run(store, workers=k, tta=10.0 / k, wall=12.0 / k) for k in (1, 2)]
    out = tmp_path / "charts"
    out.mkdir()
    image = out / "task1a-speedup.png"
    image.symlink_to(victim)
    result = invoke("charts", *(r.id for r in runs), "--out-dir", out, "--format", "png,svg")
    assert result.exit_code == 0, result.output
    assert_untouched(victim)
    assert not image.is_symlink() and image.read_bytes().startswith(b"\x89PNG")
    assert (out / "task1a-speedup.svg").read_text().lstrip().startswith("<?xml")

    part = out / "task1a-cost.svg.part"
    part.symlink_to(victim)
    result = invoke("charts", *(r.id for r in runs), "--out-dir", out, "--format", "svg")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "task1a-cost.svg.part already exists" in lines[0], result.output
    assert_untouched(victim)
    assert part.is_symlink()
    assert not [p for p in os.listdir(out) if p.endswith(".part") and p != part.name]


def test_a_partial_file_an_interrupted_download_left_is_written_anew_and_a_live_writers_is_refused(tmp_path):
    import fcntl

    target = tmp_path / "run.zip"
    part = tmp_path / "run.zip.part"
    part.write_bytes(b"half a zip, its writer SIGKILLed")   # nobody holds it any more
    write_text(target, "whole\n")
    assert target.read_text() == "whole\n" and not part.exists()

    part.write_bytes(b"being written")
    with open(part, "rb") as held:                             # a live writer's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(FileInTheWay, match=r"run\.zip\.part is being written by another mlbench"):
            write_text(target, "newer\n")
    assert target.read_text() == "whole\n" and part.read_bytes() == b"being written"
    part.unlink()
    hard = tmp_path / "elsewhere"
    hard.write_bytes(b"precious")
    os.link(hard, part)                                        # a hard link planted at the name
    with pytest.raises(FileInTheWay, match="is not a partial file an interrupted mlbench left"):
        write_text(target, "newer\n")
    assert hard.read_bytes() == b"precious"
